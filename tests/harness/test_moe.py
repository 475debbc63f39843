"""A mixture-of-experts decoder (tiny Mixtral) with each of transformers' expert implementations,
eager on the card, compiled with Inductor and with the standalone compiler: results equal the CPU's
and the host fallbacks are exactly the ones listed here, each with its reason."""

import pytest
import torch

from vspyre.harness.models import MOE_EXPERTS, tiny_granitemoe, tiny_mixtral, tiny_qwen3_moe
from vspyre.compat import dynamo_counters
from vspyre.runtime import routing
from vspyre.inductor.wrapper import compiled_fallbacks, reset_compiled_fallbacks

# Host fallbacks per forward (2 layers), by expert implementation and path. Everything else runs
# on the card: routing softmax, topk (library.topk), one_hot (scatter + a device-side range
# check), expert gathers (library.gather_rows), index_add (library.index_add), histc.
EXPECTED = {
    # "eager" experts: the loop over the experts a batch hit is host control flow over nonzero's
    # results (which experts, which tokens); nonzero runs on the card (library.nonzero_ranks /
    # nonzero_select) with its count read back, a sync as on CUDA, not a fallback. Compiled, Dynamo
    # breaks the graph at each nonzero (a data-dependent size): those run as eager kernels.
    ("eager", "eager"): {},
    ("eager", "inductor"): {},
    ("eager", "spyre_standalone"): {},
    # "batched_mm": gather each token's expert weights, one batched matmul - all on the card.
    ("batched_mm", "eager"): {},
    ("batched_mm", "inductor"): {},
    ("batched_mm", "spyre_standalone"): {},
    # "grouped_mm": the sort by expert, the expert counts (histc, cumsum), and the grouped matmul
    # (torch._grouped_mm eagerly; transformers' grouped_mm_fallback op in compiled graphs of this
    # fp32 model) as one systolic matmul per expert a token went to (library.grouped_mm), the
    # offsets read back: a sync, not a fallback.
    ("grouped_mm", "eager"): {},
    ("grouped_mm", "inductor"): {},
    ("grouped_mm", "spyre_standalone"): {},
}


# the grouped matmul op per path: torch._grouped_mm eagerly, transformers' op in compiled graphs
OP = {"eager": "aten::_grouped_mm", "inductor": "transformers::grouped_mm_fallback",
      "spyre_standalone": "transformers::grouped_mm_fallback"}


def _run_against_the_cpu(case, path):
    """One forward of ``case`` on ``path`` (eager or a compiler) with fresh counters, checked
    against the CPU's output."""
    ref = case.output()
    dev = case.clone().to("spyre")
    model = dev.model if path == "eager" else torch.compile(dev.model, backend=path)
    torch._dynamo.reset()
    dynamo_counters.clear()
    reset_compiled_fallbacks()
    torch.spyre.reset_fallback_stats()
    routing.reset_sync_stats()
    with torch.no_grad():
        out = dev.output_fn(model(**dev.inputs))
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("path", ["eager", "inductor", "spyre_standalone"])
@pytest.mark.parametrize("experts", MOE_EXPERTS)
def test_mixtral_on_the_card(experts, path):
    _run_against_the_cpu(tiny_mixtral(experts=experts), path)
    assert torch.spyre.fallback_stats() == EXPECTED[(experts, path)]
    # compiled, only the "eager" experts' loop breaks the graph (at nonzero's data-dependent size)
    breaks = sum(dynamo_counters["graph_break"].values())
    assert (breaks > 0) == (experts == "eager" and path != "eager"), dict(dynamo_counters["graph_break"])
    if path == "inductor":
        assert compiled_fallbacks() == {}
    if experts == "grouped_mm":   # two grouped matmuls per layer, each reads its offsets back once
        assert routing.sync_stats() == {OP[path]: 2 * 2}
    elif experts == "eager":      # per layer: nonzero finds the experts hit, then one where() per expert hit
        assert 2 * 2 <= routing.sync_stats()["aten::nonzero"] <= 2 * (1 + 4)
    else:
        assert routing.sync_stats() == {}


_SLOW = pytest.mark.slow     # the same expert path as GraniteMoE's: compiled runs kept out of the fast suite


@pytest.mark.parametrize("family, path", [
    (tiny_granitemoe, "eager"), (tiny_granitemoe, "inductor"), (tiny_granitemoe, "spyre_standalone"),
    (tiny_qwen3_moe, "eager"), pytest.param(tiny_qwen3_moe, "inductor", marks=_SLOW),
    pytest.param(tiny_qwen3_moe, "spyre_standalone", marks=_SLOW)],
    ids=lambda v: getattr(v, "__name__", v))
def test_other_moe_families_take_the_same_grouped_path(family, path):
    """GraniteMoE (its own router: top-k, then softmax) and Qwen3-MoE use transformers' shared
    expert implementations; their default grouped path runs on the card like Mixtral's."""
    _run_against_the_cpu(family(experts="grouped_mm"), path)
    assert torch.spyre.fallback_stats() == {} and compiled_fallbacks() == {}
    assert sum(routing.sync_stats().values()) == 2 * 2


def test_routing_ops_on_the_card_match_the_cpu():
    torch.manual_seed(0)
    logits = torch.randn(12, 8)
    probs = torch.softmax(logits, -1)
    w, i = torch.topk(probs.to("spyre"), 2)
    rw, ri = torch.topk(probs, 2)
    assert torch.equal(i.cpu(), ri) and torch.equal(w.cpu(), rw)
    # transformers counts tokens per expert with an integer histc off the CPU (the CPU has none):
    # on the card it equals the CPU's float histc
    counts = torch.histc(ri.reshape(-1).to(torch.int32).to("spyre"), bins=8, min=0, max=8)
    assert counts.dtype == torch.int32
    assert torch.equal(counts.cpu().float(), torch.histc(ri.reshape(-1).float(), bins=8, min=0, max=8))
    mask = torch.nn.functional.one_hot(ri.to("spyre"), 9)
    assert torch.equal(mask.cpu(), torch.nn.functional.one_hot(ri, 9))
    assert torch.spyre.fallback_stats() == {}
    with pytest.raises(RuntimeError, match="out of bounds"):       # a device-side range check
        torch.nn.functional.one_hot(ri.to("spyre"), 4)
    assert torch.equal((i + 1).cpu(), ri + 1)                     # the card stays usable


def test_one_hot_async_assert_compiles_to_a_device_check():
    f = torch.compile(lambda i: torch.nn.functional.one_hot(i, 5).sum(0))
    i = torch.tensor([0, 3, 4, 1])
    assert torch.equal(f(i.to("spyre")).cpu(), torch.nn.functional.one_hot(i, 5).sum(0))
    assert compiled_fallbacks() == {}
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match="device-side assertion failed: one_hot: Class values must be smaller"):
        torch.compile(lambda i: torch.nn.functional.one_hot(i, 5).sum(0))(torch.tensor([0, 7]).to("spyre"))
