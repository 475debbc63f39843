"""The quantised matmuls on the card: ``torch._scaled_mm`` (fp8, per-tensor and per-row scales,
bias, fp16/bf16/fp32/fp8 results) and ``torch._int_mm`` (int8 x int8 -> int32) as one systolic
matmul each with the dequantisation in its epilogue, at the 8-bit systolic rate; eager kernels,
the standalone compiler and the Inductor extension; against the CPU."""

import pytest
import torch

from vspyre import hardware
from vspyre.compat import dynamo_reset
from vspyre.conformance.sweep import assert_close_fp8
from vspyre.ir import library

FP8 = hardware.fp8_dtypes()
pytestmark = pytest.mark.skipif(len(FP8) != 2, reason="this torch lacks the fp8 dtypes")
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# the inputs are exact fp8 values, so the card and the CPU differ only by the order of the fp32
# sums and the result's rounding (fp16 results are the card's DLFloat16: 9 mantissa bits)
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-4), torch.float16: dict(rtol=4e-3, atol=2e-2),
       torch.bfloat16: dict(rtol=1.6e-2, atol=5e-2)}


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _fp8(m: int, n: int, dtype=E4M3, seed: int = 0) -> torch.Tensor:
    return (torch.randn(m, n, generator=_g(seed)) * 3).to(dtype)


def _operands(m, k, n, dtype=E4M3, rowwise=False, bias_dtype=None, seed=0):
    a, w = _fp8(m, k, dtype, seed), _fp8(n, k, dtype, seed + 1)
    if rowwise:
        sa, sb = torch.rand(m, 1, generator=_g(seed + 2)) + 0.25, torch.rand(1, n, generator=_g(seed + 3)) + 0.25
    else:
        sa, sb = torch.tensor(0.75), torch.tensor(1.5)
    bias = torch.randn(n, generator=_g(seed + 4)).to(bias_dtype) if bias_dtype is not None else None
    return a, w.t(), sa, sb, bias          # mat2 column-major, as _scaled_mm takes the weight


def _dequantised(a, b, sa, sb, bias, odt):
    """The reference: dequantise to fp32 and multiply."""
    y = (a.float() @ b.float()) * sa * sb
    return (y + bias.float() if bias is not None else y).to(odt)


def _dev(*ts):
    return [t.to("spyre") if isinstance(t, torch.Tensor) else t for t in ts]


@pytest.mark.parametrize("odt", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("rowwise", [False, True], ids=["per_tensor", "per_row"])
@pytest.mark.parametrize("mkn", [(1, 128, 64), (17, 64, 32), (64, 256, 96)], ids=lambda s: "x".join(map(str, s)))
def test_scaled_mm_matches_the_cpu(mkn, rowwise, odt):
    a, b, sa, sb, _ = _operands(*mkn, rowwise=rowwise)
    ref = torch._scaled_mm(a, b, sa, sb, out_dtype=odt)
    torch.testing.assert_close(ref.float(), _dequantised(a, b, sa, sb, None, odt).float(), **TOL[odt])
    got = torch._scaled_mm(*_dev(a, b, sa, sb), out_dtype=odt)
    assert got.device.type == "spyre" and got.dtype == odt and got.shape == ref.shape
    torch.testing.assert_close(got.cpu(), ref, **TOL[odt])
    assert torch.spyre.fallback_stats() == {}
    assert torch.spyre.eager_kernel_stats()["calls"] == {"aten::_scaled_mm": 1}


@pytest.mark.parametrize("bias_dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("rowwise", [False, True], ids=["per_tensor", "per_row"])
def test_scaled_mm_with_bias(rowwise, bias_dtype):
    a, b, sa, sb, bias = _operands(32, 128, 48, rowwise=rowwise, bias_dtype=bias_dtype, seed=5)
    ref = torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.bfloat16)
    got = torch._scaled_mm(*_dev(a, b, sa, sb), bias=bias.to("spyre"), out_dtype=torch.bfloat16)
    torch.testing.assert_close(got.cpu(), ref, **TOL[torch.bfloat16])
    torch.testing.assert_close(got.cpu().float(), _dequantised(a, b, sa, sb, bias, torch.bfloat16).float(),
                               **TOL[torch.bfloat16])
    assert torch.spyre.fallback_stats() == {}


def test_scaled_mm_e5m2_and_an_fp8_result():
    a, b, sa, sb, _ = _operands(16, 64, 32, dtype=E5M2, seed=7)
    got = torch._scaled_mm(*_dev(a, b, sa, sb), out_dtype=torch.float32)
    torch.testing.assert_close(got.cpu(), torch._scaled_mm(a, b, sa, sb, out_dtype=torch.float32), **TOL[torch.float32])
    a, b, sa, sb, _ = _operands(16, 64, 32, seed=8)
    got8 = torch._scaled_mm(*_dev(a, b, sa, sb))            # out_dtype: a's (fp8), rounded once
    ref8 = torch._scaled_mm(a, b, sa, sb)
    assert got8.dtype == E4M3
    assert_close_fp8(got8.cpu(), ref8)                        # within 1 fp8 ulp (a tie's rounding)
    assert torch.spyre.fallback_stats() == {}


def test_scaled_mm_out_variant_and_a_second_shape_reuses_the_kernel():
    a, b, sa, sb, _ = _operands(8, 64, 32)
    out = torch.empty(8, 32, dtype=torch.bfloat16, device="spyre")
    r = torch._scaled_mm(*_dev(a, b, sa, sb), out_dtype=torch.bfloat16, out=out)
    assert r is out
    torch.testing.assert_close(out.cpu(), torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16), **TOL[torch.bfloat16])
    a2, b2, sa2, sb2, _ = _operands(24, 128, 48, seed=3)
    torch._scaled_mm(*_dev(a2, b2, sa2, sb2), out_dtype=torch.bfloat16)
    st = torch.spyre.eager_kernel_stats()
    assert st["reuses"].get("aten::_scaled_mm", 0) >= 1 and torch.spyre.fallback_stats() == {}


@pytest.mark.parametrize("mkn", [(1, 64, 48), (17, 96, 32), (64, 512, 80)], ids=lambda s: "x".join(map(str, s)))
def test_int_mm_is_exact(mkn):
    m, k, n = mkn
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=_g(0))
    b = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=_g(1)).t()
    a[0] = -128                                    # the largest products, all of one sign
    b[:, 0] = -128
    ref = torch._int_mm(a, b)
    got = torch._int_mm(*_dev(a, b))
    assert got.dtype == torch.int32 and torch.equal(got.cpu(), ref)
    assert int(got[0, 0]) == 128 * 128 * k
    assert torch.spyre.fallback_stats() == {} and torch.spyre.eager_kernel_stats()["calls"] == {"aten::_int_mm": 1}


def test_one_program_with_the_scales_in_the_matmul_epilogue():
    a, b, sa, sb, bias = _operands(16, 64, 32, rowwise=True, bias_dtype=torch.bfloat16)
    with torch.spyre.profile() as prof:
        torch._scaled_mm(*_dev(a, b, sa, sb), bias=bias.to("spyre"), out_dtype=torch.bfloat16)
    ks = [k for k in prof.kernels if k.extra.get("kind") != "relayout"]
    assert [k.name for k in ks] == ["scaled_mm"]
    prog = library.scaled_mm(*[library.spec_of(t) for t in (a, b, torch.empty(16, 32, dtype=torch.bfloat16))],
                             tuple(library.spec_of(s.expand(16, 32)) for s in (sa, sb)),
                             library.spec_of(bias.expand(16, 32)))
    kinds = [type(op).__name__ for op in prog.body]
    assert kinds.count("Matmul") == 1 and kinds.count("Store") == 1
    assert [op.op for op in prog.body if type(op).__name__ == "Compute"] == ["mul", "mul", "add"]


def _est(m, k, n, kind):
    with torch.spyre.estimate_only():
        if kind == "fp16":
            x, w = torch.empty(m, k, dtype=torch.float16, device="spyre"), torch.empty(k, n, dtype=torch.float16,
                                                                                        device="spyre")
            f = lambda: x @ w  # noqa: E731
        elif kind == "fp8":
            x, w = torch.empty(m, k, dtype=E4M3, device="spyre"), torch.empty(n, k, dtype=E4M3, device="spyre").t()
            s = torch.empty((), device="spyre")
            f = lambda: torch._scaled_mm(x, w, s, s, out_dtype=torch.float16)  # noqa: E731
        else:
            x, w = torch.empty(m, k, dtype=torch.int8, device="spyre"), torch.empty(n, k, dtype=torch.int8,
                                                                                     device="spyre").t()
            f = lambda: torch._int_mm(x, w)  # noqa: E731
        f()                                            # a transposed weight is re-laid once
        with torch.spyre.profile() as prof:
            f()
    (k_,) = [k_ for k_ in prof.kernels if k_.extra.get("kind") != "relayout"]
    return k_


def test_the_8bit_matmuls_cost_the_dtypes_systolic_rate():
    m, k, n = 4096, 2048, 4096                         # compute-bound on the card, also in 8 bits
    k16, k8, ki = _est(m, k, n, "fp16"), _est(m, k, n, "fp8"), _est(m, k, n, "int8")
    cfg = hardware.get_config()
    flops = 2 * m * k * n
    assert k8.roofline_us == pytest.approx(flops / cfg.peak_matmul_flops(E4M3) * 1e6, rel=0.05)
    assert k16.roofline_us == pytest.approx(flops / cfg.peak_fp16_flops * 1e6, rel=0.05)
    assert k16.est_us / k8.est_us > 1.6 and k16.est_us / ki.est_us > 1.6
    with hardware.override(fp8_speedup=1.0):            # the rate comes from the hardware config
        slow = _est(m, k, n, "fp8")
    assert slow.est_us > k8.est_us * 1.5 and slow.roofline_us == pytest.approx(k16.roofline_us, rel=0.05)


def test_hardware_rates():
    cfg = hardware.get_config()
    assert cfg.fp8_speedup == 2.0 and cfg.int8_speedup == 2.0
    assert [cfg.matmul_speedup(d) for d in (E4M3, E5M2, torch.int8, torch.float16, torch.bfloat16)] == [2, 2, 2, 1, 1]
    assert cfg.peak_matmul_flops(E4M3) == pytest.approx(2 * cfg.peak_fp16_flops)


def _raises(fn, *words):
    with pytest.raises(RuntimeError) as exc:
        fn()
    msg = str(exc.value)
    for w in words:
        assert w in msg, msg


def test_bad_input_is_a_clear_error_and_the_card_stays_usable():
    a, b, sa, sb, _ = _operands(16, 64, 32)
    da, db, dsa, dsb = _dev(a, b, sa, sb)
    bf = torch.bfloat16
    _raises(lambda: torch._scaled_mm(da.half(), db.half(), dsa, dsb, out_dtype=bf),
            "aten::_scaled_mm", "float16", "(16, 64)")
    wrong_k = _fp8(32, 128).t().to("spyre")
    _raises(lambda: torch._scaled_mm(da, wrong_k, dsa, dsb, out_dtype=bf), "aten::_scaled_mm", "K=64", "K=128",
            "(128, 32)")
    _raises(lambda: torch._scaled_mm(da, db, torch.ones(15, 1, device="spyre"), torch.ones(1, 32, device="spyre"),
                                     out_dtype=bf), "aten::_scaled_mm", "(15, 1)")
    _raises(lambda: torch._int_mm(torch.zeros(16, 64, dtype=torch.int8, device="spyre"),
                                  torch.zeros(64, 32, dtype=torch.int16, device="spyre")),
            "aten::_int_mm", "int16", "(64, 32)")
    _raises(lambda: torch._int_mm(torch.zeros(16, 64, dtype=torch.int8, device="spyre"),
                                  torch.zeros(48, 32, dtype=torch.int8, device="spyre")),
            "aten::_int_mm", "K=64", "K=48", "(48, 32) int8")
    got = torch._scaled_mm(da, db, dsa, dsb, out_dtype=bf)            # still usable
    torch.testing.assert_close(got.cpu(), torch._scaled_mm(a, b, sa, sb, out_dtype=bf), **TOL[bf])
    assert torch.spyre.fallback_stats() == {}


@pytest.mark.parametrize("backend", ["spyre_standalone", "inductor"])
def test_compiled_quantised_linear_runs_on_the_card(backend):
    """A quantised linear as a graph: the scaled matmul (per-row scales, bias) and an int8 matmul,
    with the pointwise work around them; no host fallback on either compiler."""
    a, b, sa, sb, bias = _operands(8, 128, 64, rowwise=True, bias_dtype=torch.bfloat16, seed=11)
    xi = torch.randint(-128, 128, (5, 64), dtype=torch.int8, generator=_g(3))
    wi = torch.randint(-128, 128, (32, 64), dtype=torch.int8, generator=_g(4))

    def fn(a, b, sa, sb, bias, xi, wi):
        y = torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.bfloat16)
        return torch.relu(y) * 2, torch._int_mm(xi, wi.t()) + 1

    dynamo_reset()
    try:
        c = torch.compile(fn, backend=backend)
        with torch.spyre.profile() as prof:
            got = c(*_dev(a, b, sa, sb, bias, xi, wi))
    finally:
        dynamo_reset()
    ref = fn(a, b, sa, sb, bias, xi, wi)
    torch.testing.assert_close(got[0].cpu(), ref[0], **TOL[torch.bfloat16])
    assert torch.equal(got[1].cpu(), ref[1])
    names = [k.name for k in prof.kernels]
    # Inductor: both are native matmuls, the relu * 2 and the + 1 their epilogues, in the same kernel
    assert ("spyre_red_fused__scaled_mm_mul_relu_0" if backend == "inductor" else "scaled_mm") in names
    # the standalone compiler: the + 1 joins the int8 matmul by its linear_act pattern
    assert ("spyre_red_fused__int_mm_add_t_1" if backend == "inductor" else "_int_mm_act") in names
    assert torch.spyre.fallback_stats() == {}
    if backend == "inductor":
        from vspyre.inductor import wrapper
        assert not any("scaled_mm" in k or "int_mm" in k for k in wrapper.compiled_fallbacks())


@pytest.mark.parametrize("backend", ["inductor", "spyre_standalone"])
def test_both_compilers_fuse_the_w8a8_dequantisation_into_the_int8_matmul(backend):
    """int8 x int8 -> int32, the per-token and per-channel scales, the cast to 16 bits: one kernel
    (the int32 product is never stored), exact in its integer part."""
    xi = torch.randint(-127, 128, (24, 256), dtype=torch.int8, generator=_g(5))
    wi = torch.randint(-127, 128, (48, 256), dtype=torch.int8, generator=_g(6))
    sa, sb = torch.rand(24, 1, generator=_g(7)) * 1e-3, torch.rand(1, 48, generator=_g(8)) * 1e-3

    def fn(x, w, sa, sb):
        return (torch._int_mm(x, w.t()).float() * sa * sb).to(torch.bfloat16)

    dynamo_reset()
    try:
        c = torch.compile(fn, backend=backend)
        c(*_dev(xi, wi, sa, sb))
        with torch.spyre.profile() as prof:
            got = c(*_dev(xi, wi, sa, sb))
    finally:
        dynamo_reset()
    torch.testing.assert_close(got.cpu(), fn(xi, wi, sa, sb), rtol=0, atol=0)
    ks = [k for k in prof.kernels if k.extra.get("kind") != "relayout"]
    assert len(ks) == 1 and "int_mm" in ks[0].name
    assert torch.spyre.fallback_stats() == {}
