"""Compiled-mode bugs found by the decoder-family sweep (issue 22, docs/model-families.md)."""

import torch


def _scalar_into_cat(x, s):
    return torch.cat([x, s.expand(x.shape[0], 1)], dim=1) * 2


def test_a_masked_load_at_one_address_is_planned_and_computed():
    """``cat`` of a broadcast scalar (RoPE caches of Gemma3 and Apertus in a dynamic decode step):
    the load's mask moves with the kernel's dims, its address with none. Planning it raised
    ValueError in the access analysis; it is one stick, in both modes."""
    x, s = torch.randn(4, 7), torch.randn(1)
    got = torch.compile(_scalar_into_cat, dynamic=True)(x.to("spyre"), s.to("spyre")).cpu()
    assert torch.allclose(got, _scalar_into_cat(x, s))
    with torch.spyre.estimate_only():
        y = torch.compile(_scalar_into_cat, dynamic=True)(torch.empty(4, 7, device="spyre"),
                                                          torch.empty(1, device="spyre"))
    assert y.shape == (4, 8) and not torch.spyre.has_values(y)


def _bmm_expanded(a, b):
    return torch.bmm(a, b.expand(-1, 8, -1))


def test_a_matmul_with_an_operand_broadcast_along_the_contraction():
    """A bmm whose second operand is expanded along the contraction (the linear attention of
    BailingHybrid): the fused kernel failed to build ("both operands must vary along the
    contraction dim"); it is the sum of products on the vector unit."""
    from vspyre.runtime import profiler

    a, b = torch.randn(2, 4, 8), torch.randn(2, 1, 5)
    with profiler.profile() as p:
        got = torch.compile(_bmm_expanded)(a.to("spyre"), b.to("spyre")).cpu()
    assert torch.allclose(got, _bmm_expanded(a, b), atol=1e-5)
    assert p.kernels and not p.fallbacks
