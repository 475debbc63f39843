"""OpInfo conformance sweep: every ``op_db`` entry, on the card, against the CPU.

For each OpInfo op x dtype x mode (``eager`` on the device, ``compiled`` with the default
Inductor backend, ``standalone`` with ``backend="spyre_standalone"``) the sample inputs are moved
to the card (except the arguments ATen wants on the CPU on any device, see ``_cpu_resident``),
the op is run there and the result is compared with the CPU result by
``torch.testing.assert_close`` at PyTorch's default tolerances for the dtype (widened for fp16;
fp8 outputs equal or 1 fp8 ulp apart; integers exact; see ``tolerances``). Each op x dtype x mode gets one verdict:

* ``pass``        all compared samples match,
* ``fallback``    they match, and the op ran (partly) as a counted host fallback
                  (eager: ``torch.spyre.fallback_stats()``; compiled:
                  ``compiled_fallbacks()``) -- counted as a pass, shown in its own column,
* ``unsupported`` the device refused with a clear error (e.g. float64/complex, which the card
                  does not have, or a ``NotImplementedError``), or no sample could run,
* ``mismatch``    a result differs from the CPU's beyond tolerance,
* ``crash``       any other exception, or the per-op timeout.

A mismatch or crash listed in ``xfails.toml`` (with its reason) becomes ``xfail``; one that is not
listed is *unexpected* and makes ``python -m vspyre.conformance --check`` exit non-zero.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import signal
import time
import tomllib
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from torch.utils import _pytree as pytree

from .. import hardware
from ..compat import dynamo_reset

MODES = ("eager", "compiled", "standalone")
VERDICTS = ("pass", "fallback", "unsupported", "mismatch", "crash", "xfail")
XFAILS_PATH = Path(__file__).with_name("xfails.toml")

# Tolerances: torch.testing.assert_close's defaults, except fp16 and fp8. The card computes fp16 as
# DLFloat16 (9 mantissa bits, not IEEE fp16's 10): every value a device kernel writes is rounded
# to 9 bits, i.e. a relative error of up to 2**-10 per store, twice IEEE fp16's 2**-11, and a
# compiled kernel may fuse several ops (several stores on the CPU path, one on the card, or the
# other way round). PyTorch's fp16 default (rtol 1e-3, atol 1e-5) is below one DL16 ulp, so fp16
# uses rtol = 4 * 2**-10 (about 2 DL16 ulps in either rounding direction) and atol 1e-3 (the
# absolute error left after cancellation in sums of O(1) values rounded at 2**-10).
#
# Integer outputs (int8 and the int32 of _int_mm included) are compared exactly (assert_close's
# default for them is rtol = atol = 0): integer arithmetic has one right answer.
#
# fp8 (float8_e4m3fn, float8_e5m2): assert_close has no fp8 tolerance; it compares 1-byte floats
# bitwise only (it rejects any non-zero rtol/atol for them). An fp8 output is one rounding of a
# wider (fp32) result, e.g. _scaled_mm's fp32 accumulation times the scales, and the card's
# systolic array sums K in a different order than the CPU: an fp32 difference of one fp32 ulp can
# move the value across an fp8 rounding boundary, which is then a whole fp8 ulp (2**-3 relative
# for e4m3, 2**-2 for e5m2), so any rtol wide enough to accept it would also accept real errors of
# that size on values that did not straddle a boundary. fp8 outputs are therefore compared by
# ulp distance: equal bit patterns, or adjacent fp8 values (at most FP8_ULPS = 1 apart on the fp8
# number line, +0 and -0 the same); NaN only matches NaN, +-inf only itself.
_DEFAULT_TOL = {
    torch.float32: (1.3e-6, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float16: (4 * 2.0 ** -10, 1e-3),
    **{d: (0.0, 0.0) for d in hardware.fp8_dtypes()},
}
FP8_ULPS = 1

# The dtypes the sweep can run: the card's dtypes (hardware.card_dtypes(), fp8 included) the CPU
# has kernels for. bool and uint8/int16/int32/int64 run too; the default run is the three float
# dtypes, the 8-bit run (docs/op-coverage-8bit.md) is int8 and both fp8 formats.
DEFAULT_DTYPES = ("float32", "float16", "bfloat16")
EIGHT_BIT_DTYPES = ("int8", "float8_e4m3fn", "float8_e5m2")


def parse_dtype(name: str) -> torch.dtype:
    """A card dtype by its torch name ("float8_e4m3fn", "torch.int8"); ValueError otherwise."""
    d = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(d, torch.dtype) or d not in hardware.card_dtypes():
        names = ", ".join(str(x).removeprefix("torch.") for x in hardware.card_dtypes())
        raise ValueError(f"{name!r} is not a dtype of the card (it has {names})")
    return d


def tolerances(dtype: torch.dtype) -> tuple[float, float] | tuple[None, None]:
    """(rtol, atol) used for outputs of ``dtype`` (None, None: assert_close's own defaults).

    For the fp8 dtypes this is (0, 0) and the comparison is by ulp distance (``FP8_ULPS``).
    """
    return _DEFAULT_TOL.get(dtype, (None, None))


def _fp8_ordinal(t: torch.Tensor) -> torch.Tensor:
    """fp8 values as integers in their order on the number line (+0 and -0 both 0)."""
    b = t.contiguous().view(torch.uint8).to(torch.int16)
    mag = b & 0x7F
    return torch.where(b >= 0x80, -mag, mag)


def assert_close_fp8(actual: torch.Tensor, expected: torch.Tensor, ulps: int = FP8_ULPS) -> None:
    """Equal fp8 values or at most ``ulps`` fp8 values apart; NaN == NaN, inf only equal to itself."""
    assert isinstance(actual, torch.Tensor), f"{type(actual).__name__} vs an fp8 tensor"
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} vs {expected.dtype}"
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} vs {tuple(expected.shape)}"
    a, e = actual.float(), expected.float()
    an, en = a.isnan(), e.isnan()
    finite = a.isfinite() & e.isfinite()
    dist = (_fp8_ordinal(actual) - _fp8_ordinal(expected)).abs()
    ok = (an & en) | (finite & (dist <= ulps)) | (~an & ~en & ~finite & (a == e))
    if not bool(ok.all()):
        bad = (~ok).nonzero()[0].tolist()
        n = int((~ok).sum())
        raise AssertionError(
            f"fp8 values are not within {ulps} ulp! Mismatched elements: {n} / {ok.numel()}. "
            f"Greatest ulp distance: {int(dist[finite].max()) if bool(finite.any()) else 'n/a'}; "
            f"first at index {tuple(bad)}: {a[tuple(bad)].item()} vs {e[tuple(bad)].item()}")


# --------------------------------------------------------------------------------------------
# expected failures


@dataclasses.dataclass
class Expectations:
    xfail: dict[tuple[str, str, str], str]   # (op, dtype, mode) -> reason ("*" wildcards)
    meta_only: dict[str, str]                # op -> reason: compare shape/dtype, not values

    def xfail_reason(self, op: str, dtype: str, mode: str) -> str | None:
        for d in (dtype, "*"):
            for m in (mode, "*"):
                r = self.xfail.get((op, d, m))
                if r is not None:
                    return r
        return None


def load_expectations(path: Path = XFAILS_PATH) -> Expectations:
    data = tomllib.loads(path.read_text()) if path.exists() else {}
    xf: dict[tuple[str, str, str], str] = {}
    for e in data.get("xfail", []):
        ops = e["op"] if isinstance(e["op"], list) else [e["op"]]
        modes = e.get("mode", "*")
        for op in ops:
            for mode in (modes if isinstance(modes, list) else [modes]):
                xf[(op, e.get("dtype", "*"), mode)] = e["reason"]
    meta: dict[str, str] = {}
    for e in data.get("meta_only", []):
        for op in e["ops"]:
            meta[op] = e["reason"]
    return Expectations(xf, meta)


# --------------------------------------------------------------------------------------------
# op families (for the CI subset and the report)

_FAMILY_RULES: list[tuple[str, Callable[[Any], bool]]] = [
    ("matmul", lambda o: o.name in {"mm", "bmm", "matmul", "addmm", "baddbmm", "addbmm", "addmv",
                                    "mv", "dot", "vdot", "inner", "outer", "ger", "einsum",
                                    "tensordot", "kron", "chain_matmul", "linalg.multi_dot",
                                    "nn.functional.linear", "nn.functional.bilinear", "addr",
                                    "__rmatmul__", "linalg.vecdot", "addmm.decomposed"}),
    ("linalg", lambda o: o.name.startswith("linalg.") or o.name in {
        "cholesky", "cholesky_inverse", "cholesky_solve", "inverse", "det", "logdet", "slogdet",
        "pinverse", "lu", "lu_solve", "lu_unpack", "qr", "svd", "symeig", "triangular_solve",
        "geqrf", "ormqr", "householder_product", "matrix_exp", "svd_lowrank", "pca_lowrank"}),
    ("fft", lambda o: o.name.startswith("fft.") or o.name in {"stft", "istft"}),
    ("special", lambda o: o.name.startswith("special.")),
    ("conv/pool", lambda o: any(k in o.name for k in ("conv", "pool", "unfold", "fold",
                                                       "interpolate", "upsample", "pad",
                                                       "grid_sample", "affine_grid",
                                                       "pixel_shuffle", "pixel_unshuffle"))),
    ("norm/softmax", lambda o: any(k in o.name for k in ("norm", "softmax", "softmin",
                                                          "log_softmax", "normalize",
                                                          "attention"))),
    ("loss", lambda o: "loss" in o.name or o.name.endswith("cross_entropy")),
    ("random/factory", lambda o: any(k in o.name for k in ("rand", "empty", "dropout", "bernoulli",
                                                            "normal", "multinomial", "uniform",
                                                            "zeros", "ones", "full", "arange",
                                                            "linspace", "logspace", "eye",
                                                            "scalar_tensor", "new_"))),
    ("reduction", lambda o: o.__class__.__name__ == "ReductionOpInfo" or o.name in {
        "sum", "prod", "mean", "amax", "amin", "max", "min", "std", "var", "std_mean",
        "var_mean", "logsumexp", "cumsum", "cumprod", "cummax", "cummin", "logcumsumexp",
        "argmax", "argmin", "median", "nanmedian", "mode", "kthvalue", "aminmax", "norm",
        "count_nonzero", "any", "all", "nansum", "nanmean", "quantile", "nanquantile",
        "histc", "bincount", "topk", "sort", "argsort", "msort", "unique",
        "unique_consecutive", "cumulative_trapezoid", "trapz", "trapezoid", "diff"}),
    ("comparison", lambda o: o.name in {"eq", "ne", "lt", "le", "gt", "ge", "isclose",
                                        "allclose", "equal", "maximum", "minimum", "fmax",
                                        "fmin", "isfinite", "isinf", "isnan", "isposinf",
                                        "isneginf", "isreal", "signbit", "clamp", "clamp_min",
                                        "clamp_max", "clip", "where", "logical_and",
                                        "logical_or", "logical_xor", "logical_not"}),
    ("cat/stack", lambda o: o.name in {"cat", "stack", "hstack", "vstack", "dstack",
                                       "column_stack", "row_stack", "concat", "concatenate",
                                       "chunk", "split", "split_with_sizes", "tensor_split",
                                       "hsplit", "vsplit", "dsplit", "unbind", "block_diag",
                                       "cartesian_prod", "meshgrid", "broadcast_tensors",
                                       "atleast_1d", "atleast_2d", "atleast_3d",
                                       "unsafe_split", "unsafe_chunk", "split_with_sizes_copy",
                                       "unbind_copy"}),
    ("indexing", lambda o: any(k in o.name for k in ("index", "gather", "scatter", "take",
                                                      "masked", "select", "slice", "put",
                                                      "embedding", "nonzero", "__getitem__",
                                                      "searchsorted", "bucketize", "tril",
                                                      "triu", "diag", "narrow", "roll",
                                                      "flip", "rot90", "repeat_interleave"))),
    ("view", lambda o: o.name in {"view", "reshape", "view_as", "reshape_as", "flatten",
                                  "unflatten", "squeeze", "unsqueeze", "permute", "transpose",
                                  "t", "T", "mT", "H", "mH", "adjoint", "movedim", "moveaxis",
                                  "swapaxes", "swapdims", "expand", "expand_as", "contiguous",
                                  "as_strided", "as_strided_scatter", "ravel", "real",
                                  "view_as_real", "squeeze_copy", "unsqueeze_copy",
                                  "permute_copy", "t_copy", "transpose_copy", "view_copy",
                                  "expand_copy", "alias_copy", "repeat", "tile",
                                  "broadcast_to", "resize_", "resize_as_", "clone",
                                  "positive", "conj", "conj_physical", "resolve_conj",
                                  "resolve_neg", "to", "type_as", "_unsafe_masked_index"}),
    ("binary", lambda o: o.__class__.__name__ == "BinaryUfuncInfo"),
    ("unary", lambda o: o.__class__.__name__ == "UnaryUfuncInfo"),
]


def family(op) -> str:
    for name, rule in _FAMILY_RULES:
        try:
            if rule(op):
                return name
        except Exception:
            pass
    return "other"


def op_key(op) -> str:
    """A unique name per op_db entry (name plus variant)."""
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def load_op_db():
    from torch.testing._internal.common_methods_invocations import op_db
    return op_db


# --------------------------------------------------------------------------------------------
# running one op


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float):
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def handler(signum, frame):
        raise _Timeout(f"timed out after {seconds:g} s")

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _leaves(sample) -> list:
    return pytree.tree_leaves((sample.input, sample.args, sample.kwargs))


def _unsupported_dtype(sample) -> torch.dtype | None:
    for leaf in _leaves(sample):
        if isinstance(leaf, torch.Tensor) and leaf.dtype not in hardware.card_dtypes():
            return leaf.dtype
    return None


def _to_device(tree, device: str, keep_on_cpu: list[bool] | None = None):
    """Copy every tensor of ``tree`` to ``device``, except the leaves ``keep_on_cpu`` marks."""
    leaves, spec = pytree.tree_flatten(tree)
    keep = keep_on_cpu if keep_on_cpu is not None and len(keep_on_cpu) == len(leaves) else [False] * len(leaves)
    return pytree.tree_unflatten([x.detach().clone() if k else x.detach().clone().to(device)
                                  if isinstance(x, torch.Tensor) else x for x, k in zip(leaves, keep)], spec)


def _cpu_resident(sample, probe) -> list[bool] | None:
    """Which tensors of a sample stay on the CPU when the op runs on a device.

    OpInfo sample generators make tensors on the device they are given, except the arguments ATen
    wants on the CPU whatever the device (tensor_split's tensor_indices_or_sections, index_put's CPU
    indices, narrow's start), which they make on the CPU; PyTorch's own device tests rely on it. The
    sweep generates its samples on the CPU (the reference needs them there), so ``probe``, the same
    sample generated on the meta device, tells the two kinds apart: a tensor still on the CPU there
    stays on the CPU. None (move everything) when the probe does not match the sample's structure
    or has no meta tensor at all.
    """
    if probe is None:
        return None
    a, sa = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    b, sb = pytree.tree_flatten((probe.input, probe.args, probe.kwargs))
    if sa != sb:
        return None
    keep = []
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return None
        if isinstance(x, torch.Tensor) and (x.shape != y.shape or x.dtype != y.dtype):
            return None
        keep.append(isinstance(y, torch.Tensor) and y.device.type == "cpu")
    if not any(isinstance(y, torch.Tensor) and y.device.type == "meta" for y in b):
        return None     # a generator that ignores its device argument: move everything
    return keep


def _meta_samples(op, dtype):
    """The op's sample generator on the meta device (None once it fails or runs out)."""
    try:
        it = iter(op.sample_inputs("meta", dtype, requires_grad=False))
    except Exception:  # noqa: BLE001 - a generator that cannot run on meta: move everything
        return
    while True:
        rng = torch.get_rng_state()       # the CPU samples draw the same values as without the probe
        try:
            probe = next(it)
        except Exception:  # noqa: BLE001 - StopIteration or a meta-only failure
            return
        finally:
            torch.set_rng_state(rng)
        yield probe


def _to_cpu(tree):
    return pytree.tree_map(lambda x: x.detach().cpu() if isinstance(x, torch.Tensor) else x, tree)


def _clone(tree):
    return pytree.tree_map(lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, tree)


_CLEAR_ERROR = re.compile(r"not supported|unsupported|not implemented|NotImplemented|"
                          r"float64|complex|does not support|spyre", re.I)


# An error that says plainly the card (or its compiler) does not do this: "unsupported".
_CARD_REFUSAL = re.compile(r"UnsupportedKernelOp|not supported by the card|no tile-program form|"
                           r"spyre_standalone: unsupported|standalone: no lowering", re.I)


def _classify_exception(e: BaseException) -> str:
    if isinstance(e, _Timeout):
        return "crash"
    if isinstance(e, (NotImplementedError, TypeError)) and _CLEAR_ERROR.search(str(e)):
        return "unsupported"
    if isinstance(e, NotImplementedError) or _CARD_REFUSAL.search(str(e)):
        return "unsupported"
    return "crash"


def _short(e: BaseException, n: int = 240) -> str:
    """The error's first line; for a wrapper (Dynamo's BackendCompilerFailed, InductorError, ...)
    whose own first line says nothing, the innermost cause's first line too."""
    def first(x: BaseException) -> str:
        text = str(x).strip()
        return f"{type(x).__name__}: {text.splitlines()[0] if text else ''}"
    msg = first(e)
    inner = e
    while inner.__cause__ is not None or getattr(inner, "inner_exception", None) is not None:
        inner = inner.__cause__ or inner.inner_exception
    if inner is not e:
        msg = f"{msg} <- {first(inner)}"
    return msg[:n]


def _compare(actual, expected, dtype, meta_only: bool) -> None:
    actual = _to_cpu(actual)
    if meta_only:
        a, b = pytree.tree_leaves(actual), pytree.tree_leaves(expected)
        assert len(a) == len(b), f"{len(a)} outputs vs {len(b)}"
        for x, y in zip(a, b):
            if isinstance(y, torch.Tensor):
                assert isinstance(x, torch.Tensor) and x.shape == y.shape and x.dtype == y.dtype, \
                    f"meta mismatch {getattr(x, 'shape', x)} vs {y.shape}/{y.dtype}"
        return
    a, b = pytree.tree_leaves(actual), pytree.tree_leaves(expected)
    assert len(a) == len(b), f"{len(a)} outputs vs {len(b)} on the CPU"
    for x, y in zip(a, b):
        if isinstance(y, torch.Tensor) and y.dtype in hardware.fp8_dtypes():
            assert_close_fp8(x, y)
            continue
        # the tolerance follows each output's dtype (an fp32 sample can have fp16 outputs)
        rtol, atol = tolerances(y.dtype) if isinstance(y, torch.Tensor) else (None, None)
        torch.testing.assert_close(x, y, rtol=rtol, atol=atol, equal_nan=True,
                                   check_device=False, check_stride=False, check_layout=False)


def _make_runner(op, mode: str) -> Callable:
    if mode == "eager":
        return op

    def fn(*a, **k):
        return op(*a, **k)

    if mode == "compiled":
        return torch.compile(fn, dynamic=False)
    return torch.compile(fn, backend="spyre_standalone", dynamic=False)


def run_op(op, dtype: torch.dtype, mode: str, *, max_samples: int, timeout: float = 60.0,
           expectations: Expectations | None = None, device: str = "spyre") -> dict:
    """Run one OpInfo op for one dtype and mode; returns its verdict record."""
    from vspyre.inductor.wrapper import compiled_fallbacks, reset_compiled_fallbacks

    exp = expectations or load_expectations()
    key, dname = op_key(op), str(dtype).removeprefix("torch.")
    rec: dict[str, Any] = {"op": key, "family": family(op), "dtype": dname, "mode": mode,
                           "samples": 0, "passed": 0, "fallback_ops": {}, "detail": ""}
    meta_only = key in exp.meta_only or op.name in exp.meta_only
    verdicts: list[str] = []
    details: list[str] = []
    t0 = time.perf_counter()
    if mode != "eager":
        dynamo_reset()
        reset_compiled_fallbacks()
    if mode == "standalone":
        from vspyre import standalone
        standalone.reset_report()
    try:
        with _time_limit(timeout):
            runner = _make_runner(op, mode)
            samples = op.sample_inputs("cpu", dtype, requires_grad=False)
            probes = _meta_samples(op, dtype)
            n = 0
            for sample in samples:
                if n >= max_samples:
                    break
                n += 1
                probe = next(probes, None)
                bad = _unsupported_dtype(sample)
                if bad is not None:
                    verdicts.append("unsupported")
                    details.append(f"sample has {str(bad).removeprefix('torch.')} tensors "
                                   "(the card has no float64/complex)")
                    continue
                cpu_in = _clone((sample.input, sample.args, sample.kwargs))
                try:
                    torch.manual_seed(0)
                    expected = op(cpu_in[0], *cpu_in[1], **cpu_in[2])
                except Exception:
                    n -= 1          # an input the CPU rejects too: not a sample
                    continue
                dev_in = _to_device((sample.input, sample.args, sample.kwargs), device,
                                    _cpu_resident(sample, probe))
                torch.spyre.reset_fallback_stats()
                torch.spyre.reset_eager_kernel_stats()
                try:
                    torch.manual_seed(0)
                    actual = runner(dev_in[0], *dev_in[1], **dev_in[2])
                    if mode != "eager":
                        torch.spyre.synchronize()
                except _Timeout:
                    raise
                except Exception as e:  # noqa: BLE001 - every failure gets a verdict
                    verdicts.append(_classify_exception(e))
                    details.append(_short(e))
                    continue
                if mode == "eager":
                    fb = dict(torch.spyre.fallback_stats())
                    for k, v in torch.spyre.eager_kernel_stats()["calls"].items():
                        rec.setdefault("device_kernels", {})
                        rec["device_kernels"][k] = rec["device_kernels"].get(k, 0) + v
                elif mode == "compiled":
                    fb = compiled_fallbacks()
                else:
                    from vspyre import standalone
                    fb = dict(standalone.report()["fallback_calls"])
                    standalone.reset_report()
                for k, v in fb.items():
                    rec["fallback_ops"][k] = rec["fallback_ops"].get(k, 0) + v
                try:
                    _compare(actual, expected, dtype, meta_only)
                except _Timeout:
                    raise
                except Exception as e:  # noqa: BLE001
                    verdicts.append("mismatch")
                    extra = [ln.strip() for ln in str(e).splitlines() if "Greatest" in ln
                             or "Mismatched elements" in ln]
                    shapes = [tuple(t.shape) for t in pytree.tree_leaves(dev_in)
                              if isinstance(t, torch.Tensor)]
                    details.append((_short(e) + " " + " ".join(extra)
                                    + f" (sample {n - 1}, input shapes {shapes})")[:400])
                    continue
                verdicts.append("fallback" if fb else "pass")
                rec["passed"] += 1
    except _Timeout as e:
        verdicts.append("crash")
        details.append(str(e))
    except Exception as e:  # noqa: BLE001 - sample generation or compile set-up
        verdicts.append(_classify_exception(e))
        details.append(_short(e))
    rec["samples"] = len(verdicts)
    rec["seconds"] = round(time.perf_counter() - t0, 3)
    rec["verdict"] = _aggregate(verdicts)
    if details:
        rec["detail"] = details[0]
    if rec["verdict"] in ("mismatch", "crash"):
        reason = exp.xfail_reason(key, dname, mode) or exp.xfail_reason(op.name, dname, mode)
        if reason is not None:
            rec["verdict"], rec["xfail_reason"] = "xfail", reason
    return rec


def _aggregate(verdicts: list[str]) -> str:
    if not verdicts:
        return "unsupported"     # no sample input the CPU accepts for this dtype
    for v in ("crash", "mismatch"):
        if v in verdicts:
            return v
    if "fallback" in verdicts:
        return "fallback"
    if "pass" in verdicts:
        return "pass"
    return "unsupported"


# --------------------------------------------------------------------------------------------
# the sweep


def select_ops(op_db, names: Iterable[str] | None = None, families: Iterable[str] | None = None):
    ops = list(op_db)
    if names:
        wanted = set(names)
        ops = [o for o in ops if op_key(o) in wanted or o.name in wanted]
    if families:
        fams = set(families)
        ops = [o for o in ops if family(o) in fams]
    return ops


def op_dtypes(op, dtypes: Iterable[torch.dtype]) -> list[torch.dtype]:
    supported = op.supported_dtypes("cpu")
    return [d for d in dtypes if d in supported]


def sweep(ops, dtypes, modes, *, eager_samples: int = 5, compiled_samples: int = 2,
          timeout: float = 60.0, out: Path | None = None, progress: bool = True) -> list[dict]:
    """Run every op x dtype x mode; appends each record to ``out`` (JSON lines) as it goes.

    Records already in ``out`` are kept and not rerun (resume); an entry marked started but not
    finished (the process died in it) becomes a ``crash``.
    """
    exp = load_expectations()
    done: dict[tuple, dict] = {}
    started: set[tuple] = set()
    if out is not None and out.exists():
        for line in out.read_text().splitlines():
            r = json.loads(line)
            k = (r["op"], r["dtype"], r["mode"])
            if r.get("started"):
                started.add(k)
            elif r.get("aborted"):
                started.discard(k)
            else:
                done[k] = r
    if hasattr(signal, "SIGTERM"):
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    jobs = [(op, d, m) for op in ops for d in op_dtypes(op, dtypes) for m in modes]
    fh = out.open("a") if out is not None else None
    results = []
    bar = _progress(len(jobs), progress)
    try:
        for op, d, m in jobs:
            k = (op_key(op), str(d).removeprefix("torch."), m)
            bar.step(f"{k[0]} {k[1]} {m}")
            if k in done:
                results.append(done[k])
                continue
            if k in started:
                rec = {"op": k[0], "family": family(op), "dtype": k[1], "mode": m, "samples": 0,
                       "passed": 0, "fallback_ops": {}, "verdict": "crash",
                       "detail": "the sweep process died in this op"}
                r = exp.xfail_reason(k[0], k[1], m)
                if r:
                    rec["verdict"], rec["xfail_reason"] = "xfail", r
            else:
                if fh:
                    fh.write(json.dumps({"op": k[0], "dtype": k[1], "mode": m, "started": True})
                             + "\n")
                    fh.flush()
                try:
                    rec = run_op(op, d, m, max_samples=eager_samples if m == "eager"
                                 else compiled_samples, timeout=timeout, expectations=exp)
                except KeyboardInterrupt:      # stopped by the user (or SIGTERM): not a crash
                    if fh:
                        fh.write(json.dumps({"op": k[0], "dtype": k[1], "mode": m,
                                             "aborted": True}) + "\n")
                    raise
            results.append(rec)
            if fh:
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
    finally:
        bar.close()
        if fh:
            fh.close()
    return results


class _progress:
    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled:
            try:
                from rich.progress import Progress
                self.bar = Progress(transient=False)
                self.bar.start()
                self.task = self.bar.add_task("conformance", total=total)
            except Exception:  # pragma: no cover - rich missing
                self.bar = None

    def step(self, what: str):
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=what[:48].ljust(48))

    def close(self):
        if self.bar is not None:
            self.bar.stop()


def read_results(path: Path) -> list[dict]:
    """The finished records of a JSON-lines results file (last record per key wins)."""
    recs: dict[tuple, dict] = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        k = (r["op"], r["dtype"], r["mode"])
        if r.get("aborted"):
            if recs.get(k, {}).get("unfinished"):
                del recs[k]
        elif r.get("started"):
            recs.setdefault(k, {"unfinished": True, "op": r["op"], "dtype": r["dtype"], "mode": r["mode"],
                                "verdict": "crash", "family": "?", "fallback_ops": {},
                                "detail": "the sweep process died in this op"})
        else:
            if r.get("verdict") == "crash" and _CARD_REFUSAL.search(r.get("detail", "")):
                r["verdict"] = "unsupported"      # records of runs before this classification
            recs[k] = r
    for r in recs.values():
        r.pop("unfinished", None)
    return list(recs.values())


def rates(results: list[dict]) -> dict[tuple[str, str], tuple[int, int]]:
    """(mode, dtype) -> (passed, total) where pass and fallback count as passed."""
    out: dict[tuple[str, str], list[int]] = {}
    for r in results:
        c = out.setdefault((r["mode"], r["dtype"]), [0, 0])
        c[1] += 1
        c[0] += r["verdict"] in ("pass", "fallback")
    return {k: (v[0], v[1]) for k, v in out.items()}


def unexpected(results: list[dict]) -> list[dict]:
    """Mismatches and crashes not listed in xfails.toml."""
    return [r for r in results if r["verdict"] in ("mismatch", "crash")]
