"""Regressions of the standalone compiler found by the OpInfo conformance sweep (issue 7) and the
parity harness (issue 6): complex intermediates, 0-d reductions, trunc division, fp16 softmin,
dynamic shapes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vspyre.standalone as S


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    S.reset_report()
    yield
    torch._dynamo.reset()


def _compile(fn, dynamic=False):
    return torch.compile(fn, backend="spyre_standalone", fullgraph=True, dynamic=dynamic)


def _dev(*xs):
    return [x.to("spyre") for x in xs]


def test_complex_intermediate_is_refused_not_silently_wrong():
    # irfft of a real input makes a complex64 intermediate (_to_copy), which the card cannot hold:
    # the compiler must refuse, naming the op and dtype (it used to return wrong values)
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(0))
    with pytest.raises(Exception, match=r"spyre_standalone: unsupported: aten::_to_copy produces a "
                                        r"complex64 tensor of shape \[5, 7\]"):
        _compile(lambda a: torch.fft.irfft(a))(*_dev(x))


@pytest.mark.parametrize("fn", [
    lambda a: a.sum(0, keepdim=True),
    lambda a: a.sum(-1),
    lambda a: torch.logsumexp(a, 0, keepdim=True),
    lambda a: a.amax(0, keepdim=True),
    lambda a: a.mean(),
], ids=["sum_keepdim", "sum_dim", "logsumexp_keepdim", "amax_keepdim", "mean"])
def test_reduction_of_0d_input_is_0d(fn):
    x = torch.tensor(-1.25)
    want = fn(x)
    got = _compile(fn)(*_dev(x))
    assert got.shape == want.shape == torch.Size([])
    torch.testing.assert_close(got.cpu(), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
def test_div_trunc_rounds_toward_zero(dtype):
    a = torch.tensor([-8.4765625, 7.5, -7.5, 3.0, -0.25]).to(dtype) if dtype.is_floating_point \
        else torch.tensor([-7, 7, -9, 3, 0])
    b = torch.tensor([-1.765625, 2.0, 2.0, -2.0, 3.0]).to(dtype) if dtype.is_floating_point \
        else torch.tensor([2, -2, 4, 3, 5])
    fn = lambda x, y: torch.div(x, y, rounding_mode="trunc")   # noqa: E731
    got = _compile(fn)(*_dev(a, b))
    torch.testing.assert_close(got.cpu(), fn(a, b))
    # 0-d operands (the sweep's first sample) and a Python scalar divisor
    got = _compile(fn)(*_dev(a[0], b[0]))
    torch.testing.assert_close(got.cpu(), fn(a[0], b[0]))
    torch._dynamo.reset()
    g = lambda x: torch.div(x, 3, rounding_mode="trunc")    # noqa: E731
    torch.testing.assert_close(_compile(g)(*_dev(a)).cpu(), g(a))


def test_softmin_fp16_neg_is_the_softmax_prologue():
    # softmin = softmax(-x): a separate neg kernel stored -x rounded to DL16 (9 mantissa bits),
    # which the exponent amplified to 2.4e-3 (10 fp16 ulps) on this sample
    x = torch.tensor([-8.4765625, -1.765625, -4.32421875, -2.400390625, -7.94921875], dtype=torch.float16)
    want = F.softmin(x.float(), 0)
    got = _compile(lambda a: F.softmin(a, 0))(*_dev(x))
    torch.testing.assert_close(got.cpu().float(), want, atol=1e-3, rtol=3.9e-3)
    rep = S.report()
    assert rep["fusions"].get("softmax_prologue") == 1 and rep["graphs"][0].kernels == 1


def test_masked_softmin_prologue_reads_mask_and_fill():
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1)).half()
    m = torch.rand(4, 6, generator=torch.Generator().manual_seed(2)) > 0.3

    def fn(a, mask):
        return torch.softmax(-torch.where(mask, a, -3.0), -1)
    got = _compile(fn)(*_dev(x, m))
    torch.testing.assert_close(got.cpu().float(), fn(x.float(), m), atol=1e-3, rtol=3.9e-3)
    assert S.report()["graphs"][0].kernels == 1


def test_log_softmax_prologue_and_escaping_intermediate():
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(3))

    def fused(a):
        return F.log_softmax(a * 0.5, -1)

    def escapes(a):           # the scaled value is an output too: no prologue fusion
        h = a * 0.5
        return torch.softmax(h, -1), h
    torch.testing.assert_close(_compile(fused)(*_dev(x)).cpu(), fused(x), atol=1e-5, rtol=1e-5)
    assert S.report()["fusions"].get("softmax_prologue") == 1
    torch._dynamo.reset()
    S.reset_report()
    got = _compile(escapes)(*_dev(x))
    for g, w in zip(got, escapes(x)):
        torch.testing.assert_close(g.cpu(), w, atol=1e-5, rtol=1e-5)
    assert "softmax_prologue" not in S.report()["fusions"]


def test_dynamic_shapes_view_at_two_shapes():
    def fn(x, y):
        b, s = y.shape
        return (x.view(b, s, -1) * 2).sum(-1) + y
    f = _compile(fn, dynamic=True)
    for b, s in [(2, 3), (3, 5)]:
        x = torch.randn(b * s * 4, generator=torch.Generator().manual_seed(b))
        y = torch.randn(b, s, generator=torch.Generator().manual_seed(s))
        torch.testing.assert_close(f(*_dev(x, y)).cpu(), fn(x, y))


def test_dynamic_shapes_fused_matmul_and_attention_shapes_are_evaluated_per_call():
    # fusions bake meta shapes (mm_shape, out_shape, bshape) into node arguments; with dynamic
    # shapes they are SymInts, which reached ATen as "GenericList" (llama-decode's recompile
    # variant): they must be evaluated from the inputs at every call
    def fn(x, w, q, k, v):
        b, s, d = x.shape
        h = torch.relu((x.reshape(b * s, d) @ w).view(b, s, -1))
        att = torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1) @ v
        return h, att
    f = _compile(fn, dynamic=True)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 16, generator=g)
    for b, s in [(2, 5), (3, 7)]:
        x = torch.randn(b, s, 8, generator=g)
        q, k, v = (torch.randn(b * 2, s, 8, generator=g) for _ in range(3))
        got = f(*_dev(x, w, q, k, v))
        for gt, want in zip(got, fn(x, w, q, k, v)):
            torch.testing.assert_close(gt.cpu(), want, atol=1e-4, rtol=1e-4)
    rep = S.report()
    assert rep["fusions"].get("attention", 0) >= 1 and rep["fusions"].get("linear_act", 0) >= 1
    assert rep["fallback_ops"] == 0     # size arithmetic (sym_size, operator.mul) is not a host fallback


def test_dynamic_shapes_strict_mode_accepts_size_arithmetic():
    torch.spyre.set_fallback_mode("strict")
    try:
        f = _compile(lambda x: x.view(x.shape[0] * x.shape[1], -1).sum(-1), dynamic=True)
        for n in (2, 3):
            x = torch.randn(n, n + 1, 4)
            torch.testing.assert_close(f(*_dev(x)).cpu(), x.view(n * (n + 1), -1).sum(-1))
    finally:
        torch.spyre.set_fallback_mode("allow")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_layer_norm_over_two_dims_is_one_program(dtype):
    # normalized_shape (2, 3): it used to run the device's eager native_layer_norm, which
    # decomposes into fp16 intermediates (1.5e-3 off in fp16); now the norm program over the
    # flattened last dims, stats included
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*s, generator=g).to(dtype) for s in ((2, 2, 3), (2, 3), (2, 3)))

    def fn(x, w, b):
        return torch.ops.aten.native_layer_norm(x, [2, 3], w, b, 1e-5)
    torch.spyre.reset_fallback_stats()
    got = _compile(fn)(*_dev(x, w, b))
    want = fn(x.float(), w.float(), b.float())
    for gt, wt in zip(got, want):
        assert gt.shape == wt.shape
        torch.testing.assert_close(gt.cpu().float(), wt, atol=1e-3, rtol=3.9e-3)
    assert not any("native_batch_norm" in k for k in torch.spyre.fallback_stats())
    assert S.report()["fallback_calls"] == {}


def test_integer_bitwise_ops_are_native_and_exact():
    """``a & b`` on int32 once ran as an uncounted-in-the-report host fallback: now the registry's
    bitwise ops, on the card, with integer semantics."""
    def f(a, b):
        return (a & b) | (a ^ 3), ~a, a << 2, b >> 1, (a > 0) & (b > 0)
    a = torch.randint(-100, 100, (64, 33), dtype=torch.int32)
    b = torch.randint(-100, 100, (64, 33), dtype=torch.int32)
    torch.spyre.reset_fallback_stats()
    out = _compile(f)(*_dev(a, b))
    for o, r in zip(out, f(a, b)):
        assert o.dtype == r.dtype and torch.equal(o.cpu(), r)
    assert torch.spyre.fallback_stats() == {}
    rep = S.compiler.report()
    assert rep["fallback_ops"] == 0 and rep["fallback_calls"] == {}
    assert any("bitwise" in k or "lshift" in k for k in rep["native"])


@pytest.mark.parametrize("op,args", [("sqrt", [-1.0]), ("log", [0.0]), ("truediv", [1.0, 0.0]),
                                     ("exp", [1000.0]), ("maximum", [1.0, float("nan")]),
                                     ("maximum", [float("nan"), 1.0]), ("minimum", [float("nan"), 1.0]),
                                     ("pow", [2.0, 200.0]), ("truediv", [7, 2]), ("floordiv", [-7, 2])])
def test_constant_folding_has_the_registrys_semantics_in_fp32(op, args):
    """Folding immediates gives what the card computes (fp32, nan/inf as torch), not Python's
    ``math`` (which raises on sqrt(-1) or log(0)) nor fp64."""
    from vspyre.ir.ops import OPS
    from vspyre.standalone.kernels import _fold
    want = OPS[op].fn(*[torch.tensor(a, dtype=torch.float32 if isinstance(a, float) else torch.int64)
                        for a in args]).item()
    got = _fold(op, args)
    assert (got != got and want != want) or got == want


def test_result_kinds_come_from_the_registry():
    from vspyre.standalone.kernels import _result_kind
    assert _result_kind("signbit", ["f"]) == "b"
    assert _result_kind("logical_xor", ["i", "i"]) == "b"
    assert _result_kind("truediv", ["i", "i"]) == "f"
    assert _result_kind("bitwise_and", ["i", "i"]) == "i"
    assert _result_kind("where", ["b", "i", "i"]) == "i"


def test_pointwise_output_keeps_the_strides_eager_gives():
    """A pointwise op on a transposed view: eager (and Inductor) keep the input's layout; the
    standalone compiler used to return a contiguous result (same values, other strides)."""
    def f(x):
        return (x.t() * 2 + 1).relu()
    x = torch.randn(64, 48)
    out = _compile(f)(*_dev(x))
    assert out.stride() == f(x).stride() == (1, 48)
    torch.testing.assert_close(out.cpu(), f(x))


@pytest.mark.parametrize("shape,pad,value", [((2, 3, 5, 7), (1, 2, 0, 3), 0.5), ((4, 9), (-2, 1), 0.0),
                                             ((3, 8), (2, -3, 1, 1), -1.0), ((1, 4, 4), (0, 0, 0, 0, 1, 0), 2.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32], ids=str)
def test_constant_pad_is_native_and_the_report_agrees_with_the_device(shape, pad, value, dtype):
    """constant_pad_nd was a host-fallback node in the report while the device ran it natively
    (the report and the device's counter disagreed): now a kernel (fill the border, copy the
    interior; negative pads crop), and both say 0."""
    x = (torch.randn(shape) * 10).to(dtype)
    v = value if dtype.is_floating_point else int(value)
    torch.spyre.reset_fallback_stats()
    prev = torch.spyre.set_numerics("ieee")          # exact fp16 copies (DL16 rounds every stored value)
    try:
        out = _compile(lambda t: F.pad(t, pad, value=v))(*_dev(x))
    finally:
        torch.spyre.set_numerics(prev)
    assert torch.equal(out.cpu(), F.pad(x, pad, value=v))
    rep = S.compiler.report()
    assert rep["fallback_ops"] == 0 and torch.spyre.fallback_stats() == {}
    assert rep["native"].get("aten::constant_pad_nd") == 1


def _registry_ops():
    import vspyre.standalone.lowerings as L
    return sorted(L.REGISTRY_POINTWISE, key=str)


@pytest.mark.parametrize("op", _registry_ops(), ids=str)
def test_registry_vector_ops_lower_on_the_standalone_compiler(op):
    """A vector op is one registry line: its ATen namesake lowers natively on the standalone
    compiler with the registry's semantics, matching the CPU (nan where the CPU gives nan)."""
    args = []
    for i, a in enumerate(op._schema.arguments):
        if str(a.type) == "Tensor":
            t = torch.rand(6, 37, generator=torch.Generator().manual_seed(i)) * 1.6 - 0.8
            args.append(t > 0 if a.name == "condition" else t)
        else:
            args.append(0.75)
    torch.spyre.reset_fallback_stats()
    out = _compile(lambda *t: op(*t))(*[a.to("spyre") if isinstance(a, torch.Tensor) else a for a in args])
    ref = op(*args)
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert torch.spyre.fallback_stats() == {}
    rep = S.compiler.report()               # (AOTAutograd may normalise the overload: where.Scalar)
    assert rep["fallback_ops"] == 0 and sum(rep["native"].values()) >= 1


def test_stack_is_a_cat_on_the_card_not_a_host_fallback():
    """Interleaved RoPE (Cohere, ERNIE 4.5: ``stack([-x2, x1], -1).flatten(-2)``) ran ``stack`` as
    a host fallback on every attention layer (the family sweep, docs/model-families.md)."""
    def rotate(x):
        return torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).flatten(-2) * 2

    x = torch.randn(1, 4, 16, 16, generator=torch.Generator().manual_seed(0))
    torch.spyre.reset_fallback_stats()
    got = _compile(rotate)(*_dev(x)).cpu()
    assert torch.equal(got, rotate(x))
    assert torch.spyre.fallback_stats() == {} and S.report()["fallback"] == {}
