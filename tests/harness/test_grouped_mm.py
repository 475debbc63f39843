"""The experts' grouped matmul on the card (library.grouped_mm) and estimate-only routing
(vspyre.runtime.routing, `vspyre estimate --routing`)."""

from __future__ import annotations

import json

import pytest
import torch

from vspyre import cli
from vspyre.runtime import profiler, routing


def _ref(x, w, offs):
    """Per-group matmuls on the host; rows after the last group zero."""
    out = torch.zeros(x.shape[0], w.shape[2], dtype=x.dtype)
    start = 0
    for g, end in enumerate(offs.tolist()):
        out[start:end] = x[start:end] @ w[g]
        start = end
    return out


@pytest.mark.parametrize("offs", [[3, 3, 10], [0, 0, 10], [10, 10, 10], [2, 5, 7]],
                         ids=["empty-middle", "empty-first", "empty-last", "rows-after-last-group"])
def test_grouped_mm_equals_the_cpu(offs):
    torch.manual_seed(0)
    x, w = torch.randn(10, 16), torch.randn(3, 16, 8)
    o = torch.tensor(offs, dtype=torch.int32)
    torch.spyre.reset_fallback_stats()
    routing.reset_sync_stats()
    with profiler.profile(record_segments=False) as p:
        got = torch._grouped_mm(x.to("spyre"), w.to("spyre"), offs=o.to("spyre"))
    ref = _ref(x, w, o)
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-5, atol=1e-5)
    if offs[-1] == 10:       # the CPU's kernel leaves rows after the last group unset: compare where defined
        torch.testing.assert_close(got.cpu(), torch._grouped_mm(x, w, offs=o), rtol=1e-5, atol=1e-5)
    assert torch.spyre.fallback_stats() == {}
    assert routing.sync_stats() == {"aten::_grouped_mm": 1}          # the offsets read back once
    nonempty = sum(1 for a, b in zip([0] + offs, offs) if b > a)
    assert sum(1 for k in p.kernels if k.name == "grouped_mm") == nonempty   # one matmul per non-empty group


def test_grouped_mm_fp16_and_a_transposed_weight_view():
    torch.manual_seed(1)
    x, w = torch.randn(12, 32).half(), torch.randn(4, 24, 32).half()
    o = torch.tensor([2, 6, 6, 12], dtype=torch.int64)
    got = torch._grouped_mm(x.to("spyre"), w.to("spyre").transpose(-2, -1), offs=o.to("spyre"))
    ref = _ref(x.float(), w.float().transpose(-2, -1), o).half()
    torch.testing.assert_close(got.cpu(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("args, message", [
    (lambda x, w, o: (x, w, o[:2]), r"offsets has 2 entries but the weights \(3, 16, 8\).*3 groups"),
    (lambda x, w, o: (x.half(), w, o), r"input and weights must share a floating dtype.*got input \(10, 16\) "
     r"torch.float16, weights \(3, 16, 8\) torch.float32"),
    (lambda x, w, o: (x, w, o.float()), r"offsets must be a 1-D int32/int64 tensor, got \(3,\) torch.float32"),
    (lambda x, w, o: (x[:, :8], w, o), r"input \(10, 8\) torch.float32 has K=8, weights \(3, 16, 8\)"),
    (lambda x, w, o: (x, w, torch.tensor([3, 2, 10], dtype=torch.int32).to("spyre")),
     r"offsets \[3, 2, 10\] are not non-decreasing"),
])
def test_grouped_mm_bad_input_names_op_dtype_shape(args, message):
    x, w = torch.randn(10, 16).to("spyre"), torch.randn(3, 16, 8).to("spyre")
    o = torch.tensor([3, 3, 10], dtype=torch.int32).to("spyre")
    with pytest.raises(RuntimeError, match="aten::_grouped_mm: " + message):
        torch._grouped_mm(*args(x, w, o))


def test_routing_assumptions():
    assert routing.parse("balanced").split(10, 4) == [3, 3, 2, 2]
    assert routing.parse("skewed:0.5").split(10, 4) == [5, 2, 2, 1]
    assert routing.parse("skewed:1").split(8, 4) == [8, 0, 0, 0]
    assert str(routing.parse(" Skewed:0.25 ")) == "skewed:0.25"
    for bad in ("uniform", "skewed", "skewed:1.5", "skewed:x"):
        with pytest.raises(ValueError, match="expected 'balanced' or 'skewed:F'"):
            routing.parse(bad)


def _expert_time(r: str, rows: int = 512, experts: int = 8) -> tuple[float, dict]:
    with torch.spyre.estimate_only(), routing.routing(r):
        x = torch.empty(rows, 1024, dtype=torch.float16, device="spyre")
        w = torch.empty(experts, 1024, 2048, dtype=torch.float16, device="spyre")
        offs = torch.empty(experts, dtype=torch.int32, device="spyre")
        routing.reset_assumed()
        with profiler.profile(record_segments=False) as p:
            torch._grouped_mm(x, w, offs=offs)
        return sum(k.est_us for k in p.kernels if k.name == "grouped_mm"), routing.assumed()


def test_estimate_only_routing_skewed_costs_more_than_balanced():
    """Each expert's matmul costs max(its compute, its weight read): convex in its rows, so with
    every expert hit a skewed split costs more once the hot expert's matmul is compute-bound
    (4096 routed rows of 1024 x 2048 experts), and the same while every group only pays its weight
    read (512 rows: memory-bound, the weights are read whatever the split)."""
    bal, assumed = _expert_time("balanced", 4096)
    skew, _ = _expert_time("skewed:0.5", 4096)
    assert assumed == {"aten::_grouped_mm": 1}          # no values on the card: sizes by assumption
    assert skew > bal * 1.05, (bal, skew)
    bal, skew = _expert_time("balanced", 512)[0], _expert_time("skewed:0.5", 512)[0]
    assert skew == pytest.approx(bal, rel=0.01)


TINY_MOE = {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
            "vocab_size": 256, "max_position_embeddings": 512, "tie_word_embeddings": False}


def test_cli_estimate_of_a_moe_config_states_its_routing(tmp_path, capsys):
    cfg = tmp_path / "tiny-moe.json"
    cfg.write_text(json.dumps(TINY_MOE))
    out = tmp_path / "out"
    rc = cli.main(["estimate", "--config", str(cfg), "--prompt", "16", "--new-tokens", "1", "--kv", "16",
                   "--routing", "skewed:0.5", "--out", str(out), "--no-progress"])
    assert rc == 0
    report = json.loads((out / "estimate-tiny-moe.json").read_text())
    assert report["routing"] == {"moe": True, "experts": 4, "top_k": 2, "assumption": "skewed:0.5",
                                 "text": routing.parse("skewed:0.5").describe()}
    b = report["backends"]["inductor"]
    assert b["prefill"]["fallbacks"] == {} and b["decode"][0]["fallbacks"] == {}
    assert b["prefill"]["assumed"] == {"transformers::grouped_mm_fallback": 2} and b["prefill"]["syncs"] == {}
    md = (out / "estimate-tiny-moe.md").read_text()
    assert "Routing: **skewed:0.5**" in md and "[routing skewed:0.5]" in md


def test_cli_estimate_bad_routing_is_one_line(tmp_path, capsys):
    cfg = tmp_path / "tiny-moe.json"
    cfg.write_text(json.dumps(TINY_MOE))
    assert cli.main(["estimate", "--config", str(cfg), "--routing", "hot", "--out", str(tmp_path)]) == 2
    assert "routing 'hot': expected 'balanced' or 'skewed:F'" in capsys.readouterr().err


@pytest.mark.parametrize("make", [
    lambda: torch.randn(5, 7) > 0, lambda: torch.randn(3, 4, 5).relu(), lambda: (torch.randn(6, 3) > 0).t(),
    lambda: torch.zeros(4, 3), lambda: torch.tensor([1, 0, 2]), lambda: torch.tensor(3.0)],
    ids=["bool", "3d-float", "transposed", "all-zero", "int", "0-d"])
def test_nonzero_on_the_card_reads_its_count_back(make):
    torch.manual_seed(0)
    x = make()
    torch.spyre.reset_fallback_stats()
    routing.reset_sync_stats()
    got = torch.nonzero(x.to("spyre"))
    assert torch.equal(got.cpu(), torch.nonzero(x))
    assert torch.spyre.fallback_stats() == {} and torch.spyre.sync_stats() == {"aten::nonzero": 1}


def test_nonzero_past_scan_max_is_a_counted_host_fallback():
    from vspyre.ir.library import SCAN_MAX
    x = torch.arange(SCAN_MAX + 1) % 3
    torch.spyre.reset_fallback_stats()
    assert torch.equal(torch.nonzero(x.to("spyre")).cpu(), torch.nonzero(x))
    assert torch.spyre.fallback_stats() == {"aten::nonzero": 1}


@pytest.mark.parametrize("backend", ["inductor", "spyre_standalone"])
def test_compiled_aten_grouped_mm_bf16_stays_on_the_card(backend):
    """bf16 models: transformers calls torch._grouped_mm in compiled graphs too (aten._grouped_mm
    in the graph): a library node on Inductor, a kernel of the standalone compiler."""
    from vspyre.inductor.wrapper import compiled_fallbacks, reset_compiled_fallbacks
    torch.manual_seed(0)
    x, w = torch.randn(12, 32).bfloat16(), torch.randn(4, 32, 16).bfloat16()
    o = torch.tensor([2, 6, 6, 12], dtype=torch.int32)
    torch._dynamo.reset()
    reset_compiled_fallbacks()
    torch.spyre.reset_fallback_stats()
    routing.reset_sync_stats()
    f = torch.compile(lambda a, b, c: torch._grouped_mm(a, b, offs=c) * 2, backend=backend)
    got = f(x.to("spyre"), w.to("spyre"), o.to("spyre"))
    torch.testing.assert_close(got.cpu(), torch._grouped_mm(x, w, offs=o) * 2)
    assert torch.spyre.fallback_stats() == {} and compiled_fallbacks() == {}
    assert routing.sync_stats() == {"aten::_grouped_mm": 1}
