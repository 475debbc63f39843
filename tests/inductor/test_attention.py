"""Attention at real lengths on both compilers, and weights re-laid once per tensor version."""

import gc

import pytest
import torch
import torch.nn.functional as F

from vspyre.runtime import relayout

from .helpers import Launches

BACKENDS = ["inductor", "spyre_standalone"]


def _compile(f, backend):
    torch._dynamo.reset()
    return torch.compile(f) if backend == "inductor" else torch.compile(f, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["causal", "mask", "gqa"])
def test_sdpa_at_seq_1024_is_one_flash_program(backend, kind):
    torch.manual_seed(0)
    hkv = 2 if kind == "gqa" else 4
    q = torch.randn(1, 4, 1024, 64, dtype=torch.float16)
    k = torch.randn(1, hkv, 1024, 64, dtype=torch.float16)
    v = torch.randn(1, hkv, 1024, 64, dtype=torch.float16)
    mask = torch.rand(1024, 1024) > 0.3 if kind == "mask" else None

    def f(q, k, v, m=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=kind != "mask",
                                              enable_gqa=kind == "gqa")

    args = [q, k, v] + ([mask] if mask is not None else [])
    cf = _compile(f, backend)
    torch.spyre.reset_fallback_stats()
    with torch.no_grad(), Launches() as got:
        out = cf(*[a.to("spyre") for a in args])
    ref = f(*[a.float() if a.is_floating_point() else a for a in args])
    torch.testing.assert_close(out.cpu().float(), ref, atol=2e-2, rtol=2e-2)
    assert not got.fallbacks and not torch.spyre.fallback_stats()
    names = [k.name for k in got.kernels]
    assert names.count("attention") == 1, names
    # the scores never go to device memory: the kernels move about q, k, v and the output, not S x S
    s_bytes = 4 * 1024 * 1024 * 2
    assert sum(k.bytes_moved for k in got.kernels) < s_bytes


def test_eager_sdpa_on_the_card_is_one_device_kernel():
    q = torch.randn(1, 2, 16, 8)
    torch.spyre.reset_fallback_stats()
    with Launches() as got:
        out = F.scaled_dot_product_attention(q.to("spyre"), q.to("spyre"), q.to("spyre"), is_causal=True)
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, q, q, is_causal=True))
    assert torch.spyre.fallback_stats() == {}
    assert [(k.name, k.source) for k in got.kernels] == [("attention", "eager")]
    with torch.spyre.eager_kernels(False):      # without eager kernels: one host fallback, not a dozen
        F.scaled_dot_product_attention(q.to("spyre"), q.to("spyre"), q.to("spyre"), is_causal=True)
    assert torch.spyre.fallback_stats() == {"aten::_scaled_dot_product_fused_attention_overrideable": 1}


@pytest.mark.parametrize("backend", BACKENDS)
def test_weight_is_relaid_once_and_again_after_an_update(backend):
    x = torch.randn(16, 256, dtype=torch.float16).to("spyre")
    # a module's weight (a Parameter, in nn.Linear's [out, in] layout): the planner re-lays it once
    w = torch.nn.Parameter(torch.randn(512, 256, dtype=torch.float16).to("spyre"), requires_grad=False)
    cf = _compile(lambda x, w: F.linear(x, w), backend)
    relayout.clear()
    gc.collect()             # earlier tests' garbage must not be freed inside the measured window
    before = torch.spyre.memory_allocated()
    with torch.no_grad(), Launches() as got:
        for _ in range(10):
            cf(x, w)
        held = torch.spyre.memory_allocated() - before
        w.add_(1.0)                               # an in-place update: the re-laid layout is stale
        cf(x, w)
    assert len([k for k in got.kernels if k.source != "eager"]) == 11
    assert [k.name for k in got.kernels if k.source == "eager"] == ["add"]     # w.add_(1.0) on the card
    assert len(got.relayouts) == 2, [k.name for k in got.relayouts]
    assert all(k.est_us > 0 and "re-lay" in k.segments[0].label for k in got.relayouts)
    s = relayout.stats()
    assert s["in_place_bytes"] >= w.numel() * w.element_size() and s["bytes"] == 0
    assert held < w.numel() * w.element_size(), held    # re-laid in place: no second copy in device memory
    del w
    relayout.stats()                              # swept: the weight is gone, so is its entry
    assert relayout.stats()["entries"] == 0
