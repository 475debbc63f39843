"""Estimate-only mode: device memory accounted without host pages, kernels planned and costed
without running, and no way to read the values that were never computed."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from vspyre import hardware
from vspyre.harness import models
from vspyre.runtime import profiler


def _rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def test_allocations_are_accounted_without_host_memory():
    before, rss = torch.spyre.memory_allocated(), _rss_bytes()
    with torch.spyre.estimate_only():
        x = torch.empty(1024, 1024, 1024, dtype=torch.float16, device="spyre")     # 2 GiB
        assert torch.spyre.memory_allocated() - before == 2 << 30
        x.fill_(1.0)                                          # nothing to write: no pages touched
        assert not torch.spyre.has_values(x)
        assert _rss_bytes() - rss < 64 << 20
    del x
    assert torch.spyre.memory_allocated() == before
    assert not torch.spyre.is_estimate_only()


@pytest.mark.parametrize("read", ["cpu", "item", "tolist", "copy_into_values"])
def test_reading_a_value_raises_and_says_why(read):
    with torch.spyre.estimate_only():
        y = torch.empty(4, 8, device="spyre") * 2
        s = y.sum()
    keep = torch.ones(4, 8, device="spyre")
    with pytest.raises(RuntimeError, match="has no values: it was produced in estimate-only mode"):
        {"cpu": lambda: y.cpu(), "item": lambda: s.item(),
         "tolist": lambda: y.tolist(), "copy_into_values": lambda: keep.copy_(y)}[read]()
    assert (keep * 2).sum().item() == 64.0              # the card stays usable


def test_item_inside_the_mode_is_reported_as_data_dependent():
    with torch.spyre.estimate_only():
        x = torch.empty(8, device="spyre")
        with pytest.raises(RuntimeError, match=r"item\(\) \(a data-dependent read"):
            if x.sum() > 0:
                pass


def test_host_fallback_runs_on_shapes_counted_and_costed_on_the_host_link():
    torch.spyre.reset_fallback_stats()
    with torch.spyre.estimate_only(), profiler.profile() as p:
        x = torch.empty(256, 64, dtype=torch.float16, device="spyre")
        c = torch.special.bessel_j0(x)                                      # no device kernel: a host fallback
        assert c.shape == (256, 64) and c.dtype == torch.float16 and not torch.spyre.has_values(c)
        v = torch.ops.aten.t(c)                              # views stay views of device memory
        assert v.untyped_storage().data_ptr() == c.untyped_storage().data_ptr()
        with pytest.raises(torch.spyre.EstimateOnlyError, match="aten::nonzero.*data-dependent"):
            torch.nonzero(x)
    assert torch.spyre.fallback_stats().get("aten::special_bessel_j0.out") == 1
    (ev,) = [f for f in p.fallbacks if f.op == "aten::special_bessel_j0.out"]
    assert ev.bytes_moved == 2 * 256 * 64 * 2                # input up, result down
    assert ev.est_us == pytest.approx(ev.bytes_moved / hardware.get_config().host_link_bandwidth * 1e6)


def test_out_of_memory_is_the_same_error_at_the_same_allocation():
    def fill(est: bool) -> tuple[int, str]:
        kept = []
        cap = torch.spyre.memory_allocated() + (10 << 20)
        with hardware.override(device_memory_bytes=cap, ecc_bytes=0), torch.spyre.estimate_only(est):
            for i in range(100):
                try:
                    kept.append(torch.empty(3 << 20, dtype=torch.uint8, device="spyre"))
                except torch.OutOfMemoryError as e:
                    return i, str(e)
        raise AssertionError("no OOM")
    assert fill(False) == fill(True) == (3, fill(False)[1])


@pytest.mark.parametrize("path", ["eager", "compiled"])
def test_writing_into_a_tensor_with_values_raises(path):
    x = torch.ones(64, device="spyre")
    torch._dynamo.reset()
    f = (lambda t: t.mul_(2)) if path == "eager" else torch.compile(lambda t: t.mul_(2), backend="inductor")
    with torch.spyre.estimate_only():
        with pytest.raises(Exception, match="estimate-only mode (cannot write buffer|would write)"):
            f(x)
    assert x.sum().item() == 64.0


@pytest.mark.parametrize("backend", ["inductor", "spyre_standalone"])
def test_estimate_only_and_functional_runs_give_the_same_kernels_and_estimates(backend):
    def run(est: bool):
        torch._dynamo.reset()
        case = models.tiny_llama(batch=1, seq=16)
        model, ids = case.model.eval(), case.inputs["input_ids"]
        with torch.spyre.estimate_only(est), torch.no_grad():
            if est:   # no values anywhere: weights and inputs allocated on the card, never written
                model = model.to_empty(device="spyre")
                ids = torch.empty(ids.shape, dtype=ids.dtype, device="spyre")
            else:
                model, ids = model.to("spyre"), ids.to("spyre")
            compiled = torch.compile(model, backend=backend)
            compiled(input_ids=ids)
            with profiler.profile() as p:
                out = compiled(input_ids=ids).logits
        return [(k.name, k.est_us, k.bytes_moved) for k in p.kernels], [f.op for f in p.fallbacks], out

    ka, fa, out_a = run(False)
    kb, fb, out_b = run(True)
    assert ka and ka == kb and fa == fb
    assert out_a.shape == out_b.shape and torch.spyre.has_values(out_a) and not torch.spyre.has_values(out_b)


def test_a_meta_built_8b_model_moves_to_the_card_without_host_memory():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, torch_dtype=torch.float16)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg).to(torch.float16)
    before, rss = torch.spyre.memory_allocated(), _rss_bytes()
    with torch.spyre.estimate_only():
        model.to_empty(device="spyre")
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        assert weights > 15e9                                # 8.0B parameters: 16 GB of fp16, accounted
        assert torch.spyre.memory_allocated() - before >= weights
    assert _rss_bytes() - rss < 256 << 20
    del model
    assert torch.spyre.memory_allocated() <= before + (1 << 20)


def test_the_mode_is_off_while_dynamo_compiles_and_back_when_the_graph_runs():
    """Compile-time evaluation of graph constants (Inductor's constant folding) has values; the
    compiled graph runs in the mode; torch._dynamo.reset() keeps the device's compile callbacks."""
    from vspyre.compat import dynamo_callback_handler as handler
    from vspyre.device import module

    seen = []

    def backend(gm, example_inputs):                      # runs while Dynamo compiles
        seen.append(torch.spyre.is_estimate_only())
        return gm.forward

    torch._dynamo.reset()
    assert module._compile_started in handler.start_callbacks and module._compile_ended in handler.end_callbacks
    with torch.spyre.estimate_only():
        x = torch.empty(8, device="spyre")
        y = torch.compile(lambda t: t * 2, backend=backend)(x)
        assert torch.spyre.is_estimate_only() and not torch.spyre.has_values(y)
    assert seen == [False]
    assert not torch.spyre.is_estimate_only()


def test_a_tensor_without_values_prints():
    """Printing never fails: libraries read a tensor's repr (torchao's int8 matmul looks for
    "FakeTensor" in it)."""
    with torch.spyre.estimate_only():
        t = torch.empty(3, 4, dtype=torch.int8, device="spyre")
        text = repr(t)
        assert text.startswith("tensor([no values: estimate-only, size (3, 4)]") and "dtype=torch.int8" in text
    assert "1., 2." in repr(torch.tensor([1.0, 2.0]).to("spyre"))
