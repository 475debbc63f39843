"""CI subset of the OpInfo conformance sweep (issue #7): one or two ops per family,
float32/float16, eager and compiled on the card vs the CPU. The full sweep is `make conformance`.

A mismatch or crash listed in src/vspyre/conformance/xfails.toml is an xfail with its reason;
anything else that is not a pass (with or without host fallback) fails.
"""

import pytest
import torch

from vspyre.conformance import sweep as S

# family -> ops (OpInfo names, variant "" unless given as name.variant)
SUBSET = {
    "unary": ["exp", "abs", "sigmoid"],
    "binary": ["add", "mul"],
    "reduction": ["sum", "amax", "mean"],
    "view": ["permute", "reshape", "transpose"],
    "indexing": ["index_select", "gather", "flip"],
    "matmul": ["mm", "bmm", "nn.functional.linear"],
    "norm/softmax": ["softmax", "nn.functional.layer_norm"],
    "comparison": ["gt", "where"],
    "cat/stack": ["cat", "stack"],
}
DTYPES = [torch.float32, torch.float16]
MODES = ["eager", "compiled"]


def _ops():
    by_key = {S.op_key(o): o for o in S.load_op_db()}
    return by_key


_OPS = None


def _op(name):
    global _OPS
    if _OPS is None:
        _OPS = _ops()
    return _OPS[name]


CASES = [pytest.param(name, dt, mode, id=f"{fam}-{name}-{str(dt)[6:]}-{mode}")
         for fam, names in SUBSET.items() for name in names for dt in DTYPES for mode in MODES]
# eager device kernels in bfloat16 too (cheap: no compile)
CASES += [pytest.param(name, torch.bfloat16, "eager", id=f"{fam}-{name}-bfloat16-eager")
          for fam, names in SUBSET.items() for name in names]


@pytest.mark.parametrize("name,dtype,mode", CASES)
def test_op_conformance(name, dtype, mode):
    torch._dynamo.config.cache_size_limit = 64
    op = _op(name)
    assert dtype in op.supported_dtypes("cpu")
    rec = S.run_op(op, dtype, mode, max_samples=3 if mode == "eager" else 1, timeout=60)
    if rec["verdict"] == "xfail":
        pytest.xfail(rec["xfail_reason"])
    assert rec["verdict"] in ("pass", "fallback"), rec
    assert rec["passed"] >= 1, rec


def test_subset_covers_every_family():
    fams = {S.family(_op(n)) for names in SUBSET.values() for n in names}
    assert set(SUBSET) <= fams, fams


def test_xfails_file_entries_have_reasons():
    exp = S.load_expectations()
    for key, reason in exp.xfail.items():
        assert reason.strip(), key
        assert key[2] in (*S.MODES, "*"), key
    for op, reason in exp.meta_only.items():
        assert reason.strip(), op


def test_mismatch_is_never_a_pass():
    """A wrong device result must produce a mismatch verdict, not a pass."""

    class Wrong:  # a stand-in OpInfo whose device result is off by one
        name, variant_test_name = "wrong_add", ""

        def sample_inputs(self, device, dtype, requires_grad=False):
            from torch.testing._internal.opinfo.core import SampleInput
            yield SampleInput(torch.randn(5, 7, dtype=dtype), args=(torch.randn(5, 7, dtype=dtype),))

        def __call__(self, a, b):
            out = a + b
            return out + 1 if out.device.type == "spyre" else out

    rec = S.run_op(Wrong(), torch.float32, "eager", max_samples=1)
    assert rec["verdict"] == "mismatch", rec


def test_cpu_resident_sample_args_stay_on_the_cpu():
    """tensor_split's tensor_indices_or_sections must be a CPU tensor (on any device): the sweep
    keeps the tensors the OpInfo generator makes on the CPU there (probe on the meta device)."""
    for mode in ("eager", "compiled"):
        torch._dynamo.reset()
        rec = S.run_op(_op("tensor_split"), torch.float32, mode, max_samples=4)
        assert rec["verdict"] == "pass" and rec["passed"] == 4, rec


def test_float64_sample_is_unsupported_with_dtype_named():
    class F64:
        name, variant_test_name = "f64_neg", ""

        def sample_inputs(self, device, dtype, requires_grad=False):
            from torch.testing._internal.opinfo.core import SampleInput
            yield SampleInput(torch.randn(3, dtype=torch.float64))

        def __call__(self, a):
            return -a

    rec = S.run_op(F64(), torch.float32, "eager", max_samples=1)
    assert rec["verdict"] == "unsupported" and "float64" in rec["detail"], rec


def test_report_renders_summary():
    from vspyre.conformance import report
    recs = [{"op": "add", "family": "binary", "dtype": "float32", "mode": m, "verdict": v,
             "fallback_ops": {"aten::add.out": 1} if m == "eager" else {}, "detail": "",
             **({"device_kernels": {"aten::mul.Tensor": 2}} if m == "eager" else {})}
            for m, v in (("eager", "fallback"), ("compiled", "pass"), ("standalone", "mismatch"))]
    md = report.render(recs, "hdr")
    assert "| `add` | binary | float32 | pass (fb) | pass | **MISMATCH** | mul.Tensor | add.out |" in md
    assert "eager/float32 1/1 = 100.0%" in md and "Unexpected mismatches/crashes: 1" in md
