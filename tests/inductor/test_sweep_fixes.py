"""Compiled-mode bugs found by the OpInfo conformance sweep (issue #7), kept as regression tests."""

import pytest
import torch
import torch.nn.functional as F

from vspyre.inductor.wrapper import compiled_fallbacks

from .helpers import on_card

torch.manual_seed(0)


@pytest.mark.parametrize("name,f,shape", [
    ("max_pool1d", lambda x: F.max_pool1d(x, 2, 1, padding=1, return_indices=True), (2, 3, 7)),
    ("max_pool2d", lambda x: F.max_pool2d(x, 3, 2, ceil_mode=True, return_indices=True), (1, 2, 3, 6)),
    ("max_pool3d", lambda x: F.max_pool3d(x, 2, 2, return_indices=True), (1, 2, 4, 5, 6)),
])
def test_max_pool_with_indices(name, f, shape):
    """The indices are an index_expr over the window offset the kernel computed (an index
    expression reading an SSA value): it used to raise KeyError '%vN' in the executor."""
    x = torch.randn(shape)
    (vals, idx), got = on_card(f, x)
    want_vals, want_idx = f(x)
    assert torch.equal(vals, want_vals) and torch.equal(idx, want_idx), name
    assert got.kernels and not got.fallbacks


@pytest.mark.parametrize("xs,ws", [((1,), (1, 1)), ((5, 1), (1, 3)), ((2, 3, 1), (2, 1, 4))])
def test_matmul_with_contraction_of_length_one(xs, ws):
    """K == 1: Inductor makes the size-1 reduction("dot") a pointwise node that keeps ops.dot."""
    x, w = torch.randn(xs), torch.randn(ws)
    out, got = on_card(lambda x, w: x @ w, x, w)
    torch.testing.assert_close(out, x @ w)
    assert got.kernels and not got.fallbacks


def test_matmul_with_empty_contraction_is_zeros():
    """K == 0 (linalg.pinv of a singular matrix): no native dot over nothing (Inductor asserts
    'dot not supported for zero-dimension tensors'); the regular mm path gives the zeros."""
    x, w = torch.randn(3, 0), torch.randn(0, 4)
    out, _ = on_card(lambda x, w: x @ w + 1, x, w)
    torch.testing.assert_close(out, torch.ones(3, 4))
    assert any("mm" in op for op in compiled_fallbacks())


def test_fp16_norm_saved_stats_have_the_declared_dtype():
    """For fp16 input the saved mean/rstd are float32 on every device but the CPU (PyTorch's
    decompositions and the card's fake tensors): the compiled kernel writes them as float32."""
    x, w, b = torch.randn(4, 6, dtype=torch.float16), torch.randn(6).half(), torch.randn(6).half()
    f = lambda x, w, b: torch.native_layer_norm(x, [6], w, b, 1e-5)
    (out, mean, rstd), _ = on_card(f, x, w, b)
    assert (out.dtype, mean.dtype, rstd.dtype) == (torch.float16, torch.float32, torch.float32)
    ref = torch.native_layer_norm(x.float(), [6], w.float(), b.float(), 1e-5)
    torch.testing.assert_close(mean, ref[1])
    torch.testing.assert_close(rstd, ref[2], rtol=1e-4, atol=1e-4)


def test_fp16_grid_sample_computes_coordinates_in_fp32():
    """Sample coordinates and weights are fp32 inside the kernel (only stores are DL16-rounded):
    the result is within DL16 rounding of the fp32 computation, where ATen's CPU fp16 kernel
    (half-precision coordinates) is off by up to 2e-2."""
    torch.manual_seed(1)
    x = torch.randn(2, 3, 5, 20, dtype=torch.float16)
    grid = (torch.rand(2, 13, 10, 2) * 2.2 - 1.1).half()
    f = lambda x, g: F.grid_sample(x, g, mode="bilinear", padding_mode="zeros", align_corners=False)
    out, _ = on_card(f, x, grid)
    ref = f(x.float(), grid.float())
    err = (out.float() - ref).abs()
    assert float(err.max()) <= 2.0 ** -9 * float(ref.abs().max()), float(err.max())
