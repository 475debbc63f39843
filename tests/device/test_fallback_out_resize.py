"""The host fallback's out= path: an op that resizes its (device) outputs to a strided layout."""

from __future__ import annotations

import pytest
import torch

import vspyre  # noqa: F401


def _r(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("m,n,k", [(4, 3, 3), (6, 2, 5), (3, 3, 1)])
def test_lstsq_gels_solution_is_a_strided_view(m, n, k):
    # linalg.lstsq's solution is the top n rows of a column-major [m, k] buffer (strides [1, m]):
    # resizing the device output to [n, k] alone left too little storage for those strides
    # ("setStorage ... out of bounds")
    A, B = _r(m, n), _r(m, k, seed=1)
    want = torch.linalg.lstsq(A, B, driver="gels")
    got = torch.linalg.lstsq(A.to("spyre"), B.to("spyre"), driver="gels")
    for g, w in zip(got, want):
        assert g.device.type == "spyre" and g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g.cpu(), w, atol=1e-4, rtol=1e-4)
    assert got.solution.stride() == want.solution.stride()


def test_out_tensor_resized_to_a_strided_layout():
    A, B = _r(5, 3), _r(5, 2, seed=1)
    want = torch.linalg.lstsq(A, B, driver="gels")
    outs = [torch.empty(0, device="spyre"), torch.empty(0, device="spyre"),
            torch.empty(0, dtype=torch.int64, device="spyre"), torch.empty(0, device="spyre")]
    torch.linalg.lstsq(A.to("spyre"), B.to("spyre"), driver="gels", out=outs)
    torch.testing.assert_close(outs[0].cpu(), want.solution, atol=1e-4, rtol=1e-4)
    # the device tensor is still usable as a normal tensor afterwards
    torch.testing.assert_close((outs[0] * 2).cpu(), want.solution * 2, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_layer_and_group_norm_run_whole(dtype):
    """native_layer_norm is one device kernel (fp32 inside, one rounding) and native_group_norm
    one host fallback (their math composites split into fp16 steps were 2e-3 off); without eager
    kernels layer norm is one host fallback matching the CPU kernel exactly, also for shape [1]."""
    torch.manual_seed(0)
    x, w, b = torch.randn(4, 6, dtype=dtype), torch.randn(6, dtype=dtype), torch.randn(6, dtype=dtype)
    torch.spyre.reset_fallback_stats()
    got = torch.nn.functional.layer_norm(x.to("spyre"), (6,), w.to("spyre"), b.to("spyre"))
    assert torch.spyre.fallback_stats() == {}
    assert torch.spyre.eager_kernel_stats()["calls"] == {"aten::native_layer_norm": 1}
    want = torch.nn.functional.layer_norm(x, (6,), w, b)
    torch.testing.assert_close(got.cpu(), want, **({"rtol": 1e-3, "atol": 2e-3} if dtype == torch.float16 else {}))
    with torch.spyre.eager_kernels(False):
        got = torch.nn.functional.layer_norm(x.to("spyre"), (6,), w.to("spyre"), b.to("spyre"))
    assert dict(torch.spyre.fallback_stats()) == {"aten::native_layer_norm": 1}
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    g = torch.randn(2, 6, 5, dtype=dtype)
    torch.testing.assert_close(torch.nn.functional.group_norm(g.to("spyre"), 3).cpu(),
                               torch.nn.functional.group_norm(g, 3), rtol=0, atol=0)
    one = torch.randn(1)
    assert torch.nn.functional.layer_norm(one.to("spyre"), (1,)).cpu().item() == 0.0
