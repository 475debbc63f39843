"""CI subset of the OpInfo sweep in the card's 8-bit dtypes: int8 and both fp8 formats, on eager,
compiled and standalone, vs the CPU. The full 8-bit run is `python -m vspyre.conformance --8bit`
(docs/op-coverage-8bit.md).

As in test_subset.py: a mismatch or crash listed in src/vspyre/conformance/xfails.toml is an xfail
with its reason; anything else that is not a pass (with or without host fallback) fails.
"""

import pytest
import torch

from vspyre import hardware
from vspyre.conformance import sweep as S

# int8: one or two ops per family (fmod: the C-style modulus of compiled integer fmod)
INT8 = ["abs", "neg", "add", "fmod", "remainder", "bitwise_and", "sum", "amax", "permute",
        "index_select", "gt", "where", "cat", "mm"]
MODES = list(S.MODES)

_OPS = {S.op_key(o): o for o in S.load_op_db()}
# fp8: every op_db entry the CPU runs in fp8 on this PyTorch release (2.13: _scaled_mm, its v2
# and eye; 2.14 adds cat, constant_pad_nd, pad and item), so a release that lists more runs more
FP8 = sorted({name for name, o in _OPS.items()
              if any(dt in o.supported_dtypes("cpu") for dt in hardware.fp8_dtypes())})


CASES = [pytest.param(name, torch.int8, mode, id=f"{name}-int8-{mode}")
         for name in INT8 for mode in MODES]
CASES += [pytest.param(name, dt, mode, id=f"{name}-{str(dt)[6:]}-{mode}")
          for name in FP8 for dt in hardware.fp8_dtypes() for mode in MODES
          if dt in _OPS[name].supported_dtypes("cpu")]


@pytest.mark.parametrize("name,dtype,mode", CASES)
def test_op_conformance_8bit(name, dtype, mode):
    torch._dynamo.config.cache_size_limit = 64
    op = _OPS[name]
    assert dtype in op.supported_dtypes("cpu")
    # eye's first 10 samples are 0 x n: take enough to compare non-empty fp8 matrices
    n = (30 if mode == "eager" else 11) if name == "eye" else (3 if mode == "eager" else 1)
    rec = S.run_op(op, dtype, mode, max_samples=n, timeout=60)
    if rec["verdict"] == "xfail":
        pytest.xfail(rec["xfail_reason"])
    assert rec["verdict"] in ("pass", "fallback"), rec
    assert rec["passed"] >= 1, rec


def test_the_fp8_subset_holds_the_scaled_matmuls():
    """Whatever the release lists, the fp8 subset has the scaled matmuls and one creation op."""
    assert {"torch._scaled_mm", "eye"} <= set(FP8), FP8


class _IntMM:
    """torch._int_mm (int8 x int8 -> int32) has no OpInfo: a stand-in entry for run_op."""
    name, variant_test_name = "_int_mm", ""

    def sample_inputs(self, device, dtype, requires_grad=False):
        from torch.testing._internal.opinfo.core import SampleInput
        g = torch.Generator().manual_seed(0)
        for m, k, n in ((32, 32, 32), (17, 64, 40)):
            yield SampleInput(torch.randint(-128, 128, (m, k), generator=g, dtype=dtype),
                              args=(torch.randint(-128, 128, (k, n), generator=g, dtype=dtype),))

    def __call__(self, a, b):
        return torch._int_mm(a, b)


@pytest.mark.parametrize("mode", MODES)
def test_int_mm_is_exact(mode):
    rec = S.run_op(_IntMM(), torch.int8, mode, max_samples=2)
    assert rec["verdict"] == "pass" and rec["passed"] == 2, rec


@pytest.mark.parametrize("dt", hardware.fp8_dtypes(), ids=lambda d: str(d)[6:])
def test_fp8_comparison_is_exact_or_one_ulp(dt):
    x = torch.tensor([0.0, 1.0, -1.5, 3.0, float("nan")]).to(dt)
    S.assert_close_fp8(x, x.clone())
    S.assert_close_fp8(torch.tensor([-0.0]).to(dt), torch.tensor([0.0]).to(dt))
    bits = x.view(torch.uint8).clone()
    bits[1:4] += 1                                  # each one fp8 ulp away
    S.assert_close_fp8(bits.view(dt), x)
    bits[2] += 1                                    # two ulps
    with pytest.raises(AssertionError, match="within 1 ulp"):
        S.assert_close_fp8(bits.view(dt), x)
    with pytest.raises(AssertionError):             # NaN matches only NaN
        S.assert_close_fp8(torch.tensor([float("nan")]).to(dt), torch.tensor([1.0]).to(dt))
    tiny = torch.tensor([1], dtype=torch.uint8).view(dt)      # smallest subnormal
    neg_tiny = torch.tensor([0x81], dtype=torch.uint8).view(dt)
    S.assert_close_fp8(tiny, torch.zeros(1).to(dt))
    with pytest.raises(AssertionError):             # -tiny .. +tiny is two ulps across zero
        S.assert_close_fp8(tiny, neg_tiny)


def test_fp8_mismatch_is_never_a_pass():
    """An fp8 device result two ulps off is a mismatch (one ulp off passes)."""

    class Off:  # a stand-in OpInfo: x + 1 in fp8, its first element ``ulps`` off on the card
        name, variant_test_name = "fp8_off", ""

        def __init__(self, ulps):
            self.ulps = ulps

        def sample_inputs(self, device, dtype, requires_grad=False):
            from torch.testing._internal.opinfo.core import SampleInput
            yield SampleInput(torch.linspace(-2, 2, 8).to(dtype))

        def __call__(self, x):
            out = (x.float() + 1).to(x.dtype)
            if x.device.type == "spyre":
                bits = out.cpu().view(torch.uint8).clone()
                bits[0] += self.ulps
                out = bits.view(x.dtype).to(x.device)
            return out

    for dt in hardware.fp8_dtypes():
        assert S.run_op(Off(1), dt, "eager", max_samples=1)["verdict"] in ("pass", "fallback")
        rec = S.run_op(Off(2), dt, "eager", max_samples=1)
        assert rec["verdict"] == "mismatch" and "within 1 ulp" in rec["detail"], rec


def test_8bit_dtypes_parse_and_others_are_refused():
    for name in S.EIGHT_BIT_DTYPES:
        assert S.parse_dtype(name) in hardware.card_dtypes()
    assert S.parse_dtype("torch.float8_e5m2") is torch.float8_e5m2
    with pytest.raises(ValueError, match="float64"):
        S.parse_dtype("float64")


def test_8bit_report_block_goes_into_the_main_report(tmp_path):
    from vspyre.conformance import report
    main, eight = tmp_path / "op-coverage.md", tmp_path / "op-coverage-8bit.md"
    f32 = [{"op": "add", "family": "binary", "dtype": "float32", "mode": m, "verdict": "pass",
            "fallback_ops": {}, "detail": ""} for m in S.MODES]
    b8 = [{"op": "add", "family": "binary", "dtype": d, "mode": m, "verdict": v,
           "fallback_ops": {}, "detail": ""}
          for d in ("int8", "float8_e4m3fn") for m, v in zip(S.MODES, ("pass", "fallback", "xfail"))]
    report.write(f32, main, "hdr")
    report.write(b8, eight, "hdr8", "8-bit title")
    text8 = eight.read_text()
    assert text8.startswith("# 8-bit title") and "1 fp8 ulp" in text8 and "integer outputs" in text8
    report.write_summary_block(b8, eight, main)
    text = main.read_text()
    assert "[op-coverage-8bit.md](op-coverage-8bit.md)" in text
    assert "| int8 | 1/1 = 100.0% | 1/1 = 100.0% | 0/1 = 0.0% |" in text
    assert text.index("<!-- end: op-coverage-8bit -->") < text.index("## Failing families")
    assert "fp8" not in report.render(f32)                 # the float report's text is unchanged
    report.write(f32, main, "hdr")                          # regenerated: the block stays, once
    again = main.read_text()
    assert again.count("<!-- generated: op-coverage-8bit -->") == 1 and "| int8 |" in again
    report.write_summary_block(b8[:3], eight, main)         # replaced, not added
    assert main.read_text().count("<!-- generated: op-coverage-8bit -->") == 1
