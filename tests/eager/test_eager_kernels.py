"""Eager ATen ops as device kernels (vspyre.eager): results, reuse, variants, reports."""

import ast
import pathlib

import pytest
import torch
import torch.nn.functional as F

from vspyre import eager

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: dict(rtol=1.3e-6, atol=1e-5), torch.float16: dict(rtol=4e-3, atol=2e-3),
       torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}


def _r(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


# (name, fn, inputs): each runs on the card (device kernels only) and on the CPU
CASES = {
    "add_broadcast": (lambda x, y: x + y, [(4, 8), (8,)]),
    "mul_scalar": (lambda x: x * 2.5, [(4, 8)]),
    "div_sub": (lambda x, y: (x - y) / (y.abs() + 1), [(3, 5), (3, 5)]),
    "exp_tanh_gelu": (lambda x: F.gelu(torch.tanh(x).exp()), [(6, 7)]),
    "silu_transposed": (lambda x: F.silu(x.t()), [(5, 9)]),
    "sum_mean_amax": (lambda x: torch.stack([x.sum(-1), x.mean(-1), x.amax(-1)]), [(4, 16)]),
    "argmax": (lambda x: x.argmax(-1), [(4, 16)]),
    "softmax": (lambda x: torch.softmax(x, -1), [(2, 3, 16)]),
    "log_softmax_dim0": (lambda x: torch.log_softmax(x, 0), [(6, 5)]),
    "mm": (lambda a, b: a @ b, [(8, 32), (32, 5)]),
    "bmm": (lambda a, b: torch.bmm(a, b), [(2, 8, 16), (2, 16, 4)]),
    "linear": (lambda x, w, b: F.linear(x, w, b), [(3, 4, 16), (8, 16), (8,)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (16,), w, b), [(3, 16), (16,), (16,)]),
    "where_gt": (lambda x, y: torch.where(x > 0, x, y), [(4, 8), (4, 8)]),
    "cat": (lambda x, y: torch.cat([x, y], 1), [(3, 4), (3, 2)]),
    "conv2d": (lambda x, w: F.conv2d(x, w, padding=1), [(1, 3, 8, 8), (4, 3, 3, 3)]),
    "batch_norm_eval": (lambda x, m, v: F.batch_norm(x, m, v.abs() + 0.5, training=False), [(2, 3, 4, 4), (3,), (3,)]),
    "sdpa_causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                    [(1, 2, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16)]),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("name", list(CASES))
def test_eager_kernel_matches_cpu(name, dtype):
    fn, shapes = CASES[name]
    xs = [_r(*s, dtype=dtype, seed=i) for i, s in enumerate(shapes)]
    want = fn(*[x.float() for x in xs])
    with torch.spyre.fallback_mode("strict"):          # a host fallback would raise
        got = fn(*[x.to("spyre") for x in xs])
    assert sum(torch.spyre.eager_kernel_stats()["calls"].values()) >= 1
    if not want.dtype.is_floating_point:
        assert torch.equal(got.cpu(), want)
    else:
        torch.testing.assert_close(got.cpu().float(), want, **TOL[dtype])


def test_a_second_shape_reuses_the_built_kernel():
    eager.reset_stats(drop_programs=True)
    for shape in [(3, 4), (5, 7), (5, 7), (2, 9)]:
        a, b = _r(*shape), _r(*shape, seed=1)
        assert torch.equal((a.to("spyre") * b.to("spyre")).cpu(), a * b)
    st = eager.stats()
    assert st["calls"]["aten::mul.Tensor"] == 4
    assert st["builds"]["aten::mul.Tensor"] == 1          # once per op, dtypes and rank
    assert st["reuses"]["aten::mul.Tensor"] == 2          # two new shapes, no new build
    _r(2, 3, 4).to("spyre") * 2.0                          # another rank: another build
    assert eager.stats()["builds"]["aten::mul.Tensor"] == 2


def test_in_place_out_and_overlapping_variants():
    x = _r(5, 5)
    d = x.to("spyre")
    d.add_(d.t())                                          # reads what it writes, in another layout
    assert torch.equal(d.cpu(), x + x.t())
    out = torch.empty(0, device="spyre")
    torch.mul(d, 2, out=out)                               # out= is resized
    assert out.shape == (5, 5) and torch.equal(out.cpu(), (x + x.t()) * 2)
    o16 = torch.empty(5, 5, dtype=torch.float16, device="spyre")
    torch.add(d, 1, out=o16)                               # out= casts (to the card's fp16 rounding)
    torch.testing.assert_close(o16.cpu(), ((x + x.t()) + 1).half(), **TOL[torch.float16])
    v = torch.zeros(4, 6, device="spyre")
    v[1:3, 2:5].mul_(0).add_(3)                            # a strided view with an offset
    want = torch.zeros(4, 6)
    want[1:3, 2:5] = 3
    assert torch.equal(v.cpu(), want)
    assert torch.spyre.fallback_stats() == {}


def test_bad_input_is_a_clear_error_and_the_card_stays_usable():
    i = torch.arange(6, device="spyre").view(2, 3)
    with pytest.raises(RuntimeError, match="can't be cast"):
        i.add_(0.5)                                        # int64 in-place with a float result
    with pytest.raises(RuntimeError, match="broadcast"):
        torch.ones(3, device="spyre").add_(torch.ones(2, 3, device="spyre"))
    with pytest.raises(RuntimeError, match=r"broadcast.*torch.Size\(\[4\]\)"):
        torch.ones(3, device="spyre") + torch.ones(4, device="spyre")
    assert torch.equal((i * 2).cpu(), torch.arange(6).view(2, 3) * 2)


def test_no_tile_form_is_a_counted_host_fallback():
    a = torch.arange(12, device="spyre").view(3, 4)
    got = a @ a.t()                                        # integer matmul: no systolic form
    assert torch.equal(got.cpu(), torch.arange(12).view(3, 4) @ torch.arange(12).view(3, 4).t())
    assert torch.spyre.fallback_stats() == {"aten::mm": 1}
    assert eager.stats()["declined"] == {"aten::mm": 1}
    torch.median(a.float())                                # no tile form at all
    assert torch.spyre.fallback_stats()["aten::median"] == 1


def test_eager_kernels_are_in_the_profile_and_can_be_turned_off():
    x = _r(16, 64).to("spyre")
    with torch.spyre.profile() as prof:
        torch.softmax(x @ x.t(), -1)
    names = [(k.name, k.source) for k in prof.kernels if k.extra.get("kind") != "relayout"]
    assert names == [("matmul", "eager"), ("softmax", "eager")], names
    assert prof.total_est_us > 0 and all(k.est_us > 0 for k in prof.kernels)
    with torch.spyre.eager_kernels(False):
        torch.softmax(x @ x.t(), -1)
    assert torch.spyre.fallback_stats() == {"aten::mm": 1, "aten::_softmax": 1}


def test_estimate_only_mode_costs_eager_kernels():
    with torch.spyre.estimate_only():
        a = torch.empty(64, 128, device="spyre")
        with torch.spyre.profile() as prof:
            b = torch.relu(a @ a.t())
        assert not torch.spyre.has_values(b)
    assert [k.name for k in prof.kernels if k.extra.get("kind") != "relayout"] == ["matmul", "relu"]
    assert prof.total_est_us > 0


def test_fp16_layer_norm_statistics_are_fp32_eager_and_compiled():
    x, w = _r(4, 16, dtype=torch.float16), _r(16, dtype=torch.float16)
    dx, dw = x.to("spyre"), w.to("spyre")
    out, mean, rstd = torch.ops.aten.native_layer_norm(dx, [16], dw, None, 1e-5)
    meta = torch.ops.aten.native_layer_norm(dx.to("meta"), [16], dw.to("meta"), None, 1e-5)
    assert [t.dtype for t in (out, mean, rstd)] == [t.dtype for t in meta] == [torch.float16, torch.float32,
                                                                               torch.float32]
    torch.testing.assert_close(mean.cpu(), x.float().mean(-1, keepdim=True), rtol=1e-5, atol=1e-5)


def test_the_device_layer_does_not_import_the_compilers():
    root = pathlib.Path(eager.__file__).parents[1] / "device"
    for f in root.glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.split(".")[0] in ("eager", "standalone", "inductor", "harness"), (f, node.module)


def test_a_factory_kernel_is_keyed_on_its_dtype_and_its_scalars_types():
    """arange(12) into float32, then into int64 (transformers' position ids after a float arange of the
    same length): the second must not reuse the first's float32 result type; nor 0.0 stand for 0."""
    for first, second in (({"dtype": torch.float32}, {}), ({}, {"dtype": torch.float32})):
        a = torch.arange(12, device="spyre", **first)
        b = torch.arange(12, device="spyre", **second)
        assert (a.dtype, b.dtype) == (torch.arange(12, **first).dtype, torch.arange(12, **second).dtype)
        assert torch.equal(b.cpu(), torch.arange(12, **second))
    c, d = torch.arange(0.0, 5.0, device="spyre"), torch.arange(0, 5, device="spyre")
    assert (c.dtype, d.dtype) == (torch.float32, torch.int64)
    assert torch.equal(d.cpu(), torch.arange(0, 5))
