"""The op registry: every operation of a tile program, its semantics and its cost, side by side.

One :class:`OpDef` per op kind. ``eval`` is what the runtime executes (both fast and checked
mode call it; fast mode over the whole iteration space, checked mode per tile), ``cost`` is what
the latency model charges for one tile. Nothing else in vspyre defines what an op does or costs,
so the executor and the latency model cannot drift apart.

Value convention (host side): a value over dims ``(d0, .., dn-1)`` is a torch tensor with one
axis per iteration dim, of size 1 along dims it does not vary in (it broadcasts). Float values
are held in fp32 whatever their card dtype (the card accumulates in fp32; fp16 rounding, DL16 or
IEEE, happens where a kernel writes device memory: ``numerics.store_cast``). Integer values are
int64, predicates bool.

Cost convention: ``cost(cfg, op, tile)`` returns a :class:`Cost` for one tile, where ``tile``
(:class:`TileCtx`) gives the tile's extent per dim, the program analysis and the access layout
(``access_layout``). Cycles are core clock cycles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import sympy
import torch

from ..hardware import HardwareConfig, fp8_dtypes
from .indexing import affine_form, compile_expr, free_names, sym
from .program import REDUCTIONS, RING_COMBINE, Compute, Load, Matmul, Program, Reduce, Store

__all__ = ["OpDef", "OPS", "Cost", "TileCtx", "Access", "access_layout", "result_dtype", "REDUCE_IMPL"]


@dataclass(frozen=True)
class Cost:
    unit: str            # "dma_in", "dma_out", "vector", "systolic", "ring", "none"
    cycles: float
    flops: int = 0
    bytes: int = 0       # bytes moved by DMA / ring (stick-rounded for DMA)
    elems: int = 0       # elements actually needed (compulsory-traffic accounting)


@dataclass(frozen=True)
class Access:
    """How one Load/Store moves data: along ``unit_var`` in whole sticks (``contiguous``), or one
    stick per element (a transposed operand, a gather without runs). ``probe``, when set, counts
    the sticks a tile really touches by evaluating the address (and the mask) over the tile: views
    with FloorDiv/ModularIndexing, broadcasts, masked loads (``cat``), convolution windows."""

    dims: frozenset[str]      # iteration dims the address depends on (the DMA box)
    itemsize: int
    unit_var: str | None      # dim with address stride 1, if any
    contiguous: bool
    reason: str               # human-readable: why (for the text form and the docs)
    relayout: bool = False    # re-laid once before the kernel (restickify), then read in sticks
    run: int | None = None    # for a gather: length of its stride-1 runs along unit_var
    stride: int | None = None  # for an affine access without a stride-1 dim: the smallest stride
    probe: Callable[[Mapping[str, int]], tuple[int, int]] | None = field(default=None, compare=False, repr=False)

    def sticks(self, ext: Mapping[str, int], stick_bytes: int) -> tuple[int, int]:
        """(sticks moved, elements needed) for a tile with these extents."""
        if not self.dims:
            return 1, 1
        elems = 1
        for d in self.dims:
            elems *= ext[d]
        if elems == 0:                   # an empty tile moves nothing
            return 0, 0
        if self.probe is not None:
            return self.probe(ext)
        if self.contiguous:
            inner = ext[self.unit_var] if self.run is None else max(1, min(ext[self.unit_var], self.run))
            return (elems // inner) * math.ceil(inner * self.itemsize / stick_bytes), elems
        if self.stride is not None and self.unit_var is not None and self.stride * self.itemsize < stick_bytes:
            e = ext[self.unit_var]                    # a strided row still shares sticks
            return (elems // e) * math.ceil(((e - 1) * self.stride + 1) * self.itemsize / stick_bytes), elems
        return elems, elems


@dataclass
class TileCtx:
    program: Program
    ext: Mapping[str, int]                 # tile extent per iteration dim
    access: Mapping[int, Access]           # op index -> access layout (Load/Store)
    index: int = 0                         # op index being costed
    dma_bytes_per_cycle: float = 0.0       # one core's device-memory rate (bytes/cycle) in this schedule

    @property
    def analysis(self):
        return self.program.analysis

    def elems(self, value: str) -> int:
        n = 1
        for d in self.analysis.dims[value]:
            n *= self.ext[d]
        return n


@dataclass(frozen=True)
class CostCategory:
    """A kind of work on the card with one cost formula: every op names its category, so an op's
    cost is its category's formula (with the op's own ``flops`` per element), never a formula of
    its own."""

    name: str
    unit: str            # what does the work: "vector", "systolic", "dma_in", "dma_out", "ring", "none"
    doc: str             # the formula, in words
    formula: Callable[[HardwareConfig, "OpDef", Any, TileCtx], Cost]


CATEGORIES: dict[str, CostCategory] = {}


def _category(name: str, unit: str, doc: str):
    def deco(formula):
        CATEGORIES[name] = CostCategory(name, unit, doc, formula)
        return formula
    return deco


@dataclass(frozen=True)
class OpDef:
    name: str
    category: str                                    # its cost: ``CATEGORIES[category]``'s formula
    doc: str
    fn: Callable[..., torch.Tensor] | None = None   # vector semantics on host tensors
    arity: int | None = None
    flops: int = 1                                   # flops per result element (fma: 2, a cast: 0)
    # the result dtype (``result_dtype``): "promote" (torch's promotion: the widest float, int64
    # registers for integers, bool for bools), "float" (integers and bools become float32: division,
    # transcendentals), "nobool" (promote, bools counting as integers: square), "bool", "explicit"
    result: str = "promote"
    # computed in its result's dtype, not in fp32 registers: bit-level float ops (nextafter), whose
    # fp16 answer is not the fp32 answer rounded
    exact_width: bool = False

    @property
    def unit(self) -> str:
        return CATEGORIES[self.category].unit

    @property
    def transcendental(self) -> bool:
        return self.category == "transcendental"

    def cost(self, cfg: HardwareConfig, op: Any, t: TileCtx) -> Cost:
        return CATEGORIES[self.category].formula(cfg, self, op, t)


OPS: dict[str, OpDef] = {}

# Same semantics, computed in place into the first argument's storage: the fast executor uses
# these when that argument is a temporary that dies at this op (saves a pass over memory).
INPLACE: dict[str, str] = {"add": "add_", "sub": "sub_", "mul": "mul_", "truediv": "div_", "relu": "relu_",
                           "neg": "neg_", "abs": "abs_", "exp": "exp_", "sigmoid": "sigmoid_", "tanh": "tanh_",
                           "sqrt": "sqrt_", "rsqrt": "rsqrt_", "log": "log_", "erf": "erf_", "square": "square_"}


def _register(d: OpDef) -> OpDef:
    if d.name in OPS:
        raise ValueError(f"op {d.name} registered twice")
    OPS[d.name] = d
    return d


# ----------------------------------------------------------------------- vector unit
def _lanes_cycles(cfg: HardwareConfig, elems: int, factor: float) -> float:
    lanes = cfg.vector_ops_per_cycle_per_core
    return math.ceil(elems / lanes) * factor


@_category("elementwise", "vector", "ceil(elements / vector lanes) cycles; flops = elements x the op's flops")
def _elementwise_cost(cfg: HardwareConfig, d: OpDef, op: Any, t: TileCtx) -> Cost:
    n = t.elems(op.out)
    return Cost("vector", _lanes_cycles(cfg, n, 1.0), flops=n * d.flops)


@_category("transcendental", "vector",
           "ceil(elements / vector lanes) x transcendental_factor cycles (exp, log, division, special functions)")
def _transcendental_cost(cfg: HardwareConfig, d: OpDef, op: Any, t: TileCtx) -> Cost:
    n = t.elems(op.out)
    return Cost("vector", _lanes_cycles(cfg, n, cfg.transcendental_factor), flops=n * d.flops)


def _vec(name: str, fn: Callable, arity: int, doc: str, transcendental: bool = False,
         result: str | None = None, flops: int = 1, exact_width: bool = False) -> None:
    result = result or ("float" if transcendental else "promote")
    _register(OpDef(name, "transcendental" if transcendental else "elementwise", doc, fn, arity, flops, result,
                    exact_width))


def _f(x):
    return x if x.is_floating_point() else x.to(torch.float32)


_vec("add", torch.add, 2, "a + b")
_vec("sub", torch.sub, 2, "a - b")
_vec("mul", torch.mul, 2, "a * b")
_vec("truediv", lambda a, b: torch.true_divide(a, b), 2, "a / b (true division; multi-cycle)", True)
_vec("floordiv", lambda a, b: torch.div(a, b, rounding_mode="floor"), 2, "floor(a / b)")
# Inductor's div_rn (floor division of floats is floor(div_rn(a, b))): division rounded to nearest
# even, IEEE. The card's divide already rounds that way (truediv), so the same op and cost.
_vec("div_rn", lambda a, b: torch.true_divide(a, b), 2, "a / b rounded to nearest (IEEE; multi-cycle)", True)
_vec("mod", torch.remainder, 2, "a mod b (sign of b, Python semantics)")
_vec("pow", lambda a, b: torch.pow(a, b), 2, "a ** b", True, result="promote")
_vec("maximum", torch.maximum, 2, "max(a, b), NaN-propagating")
_vec("minimum", torch.minimum, 2, "min(a, b), NaN-propagating")
_vec("fmaximum", torch.fmax, 2, "max(a, b) ignoring NaN (NaN only if both are)")
_vec("fminimum", torch.fmin, 2, "min(a, b) ignoring NaN (NaN only if both are)")
_vec("fma", lambda a, b, c: a * b + c, 3, "a * b + c", flops=2)
_vec("where", lambda c, a, b: torch.where(c, a, b), 3, "c ? a : b")
for _n, _fn in [("eq", torch.eq), ("ne", torch.ne), ("lt", torch.lt), ("le", torch.le), ("gt", torch.gt),
                ("ge", torch.ge)]:
    _vec(_n, _fn, 2, f"a {_n} b -> bool", result="bool")
_vec("logical_and", torch.logical_and, 2, "a and b -> bool", result="bool")
_vec("logical_or", torch.logical_or, 2, "a or b -> bool", result="bool")
_vec("logical_not", torch.logical_not, 1, "not a -> bool", result="bool")


class DeviceAssertError(RuntimeError):
    """A device-side assertion (``device_assert``) found a false element."""


def _device_assert(c: torch.Tensor) -> torch.Tensor:
    if not bool(torch.all(c)):
        raise DeviceAssertError("device-side assertion failed")
    return c


# Inductor's device_assert_async (F.one_hot's range check): the condition passes through, a false
# element stops the kernel with the assertion's message (the program's meta["asserts"]).
_vec("device_assert", _device_assert, 1, "c, raising when any element is false (an async assert)",
     result="bool")
_vec("isnan", torch.isnan, 1, "a is NaN -> bool", result="bool")
_vec("isinf", torch.isinf, 1, "a is +-inf -> bool", result="bool")
_vec("neg", torch.neg, 1, "-a")
_vec("abs", lambda a: a if a.dtype == torch.bool else torch.abs(a), 1, "|a| (a bool is its own, as on accelerators)")
_vec("relu", torch.relu, 1, "max(a, 0)")
_vec("sign", torch.sign, 1, "sign(a)")
_vec("square", torch.square, 1, "a * a", result="nobool")
_vec("floor", torch.floor, 1, "floor(a)")
_vec("ceil", torch.ceil, 1, "ceil(a)")
_vec("identity", lambda a: a, 1, "a (a register move)")
for _n, _fn, _d in [("exp", torch.exp, "e ** a"), ("exp2", torch.exp2, "2 ** a"), ("expm1", torch.expm1, "e ** a - 1"),
                    ("log", torch.log, "ln a"), ("log2", torch.log2, "log2 a"), ("log1p", torch.log1p, "ln(1 + a)"),
                    ("sqrt", torch.sqrt, "sqrt a"), ("rsqrt", torch.rsqrt, "1 / sqrt a"),
                    ("reciprocal", torch.reciprocal, "1 / a"), ("sin", torch.sin, "sin a"), ("cos", torch.cos, "cos a"),
                    ("tanh", torch.tanh, "tanh a"), ("sigmoid", torch.sigmoid, "1 / (1 + e ** -a)"),
                    ("erf", torch.erf, "erf a")]:
    _vec(_n, (lambda g: (lambda a: g(_f(a))))(_fn), 1, _d, True)

# More elementwise ops (what Inductor's kernels emit beyond the basics).
_vec("trunc", torch.trunc, 1, "round toward zero")
_vec("round", torch.round, 1, "round half to even")
_vec("fmod", torch.fmod, 2, "a mod b (sign of a, C semantics)")
_vec("truncdiv", lambda a, b: torch.div(a, b, rounding_mode="trunc"), 2, "a / b rounded toward zero")
_vec("copysign", lambda a, b: torch.copysign(_f(a), _f(b)), 2, "|a| with the sign of b", result="float")
_vec("signbit", torch.signbit, 1, "sign bit of a -> bool", result="bool")
_vec("nextafter", torch.nextafter, 2, "next float after a toward b, in the operands' own float format",
     exact_width=True)
for _n, _fn in [("bitwise_and", torch.bitwise_and), ("bitwise_or", torch.bitwise_or),
                ("bitwise_xor", torch.bitwise_xor), ("bitwise_left_shift", torch.bitwise_left_shift),
                ("bitwise_right_shift", torch.bitwise_right_shift)]:
    _vec(_n, _fn, 2, f"{_n} of integers or bools")
_vec("bitwise_not", torch.bitwise_not, 1, "bitwise not of integers or bools")
_vec("logical_xor", torch.logical_xor, 2, "a xor b -> bool", result="bool")
for _n, _fn, _d in [("log10", torch.log10, "log10 a"), ("tan", torch.tan, "tan a"), ("sinh", torch.sinh, "sinh a"),
                    ("cosh", torch.cosh, "cosh a"), ("atan", torch.atan, "atan a"), ("asin", torch.asin, "asin a"),
                    ("acos", torch.acos, "acos a"), ("asinh", torch.asinh, "asinh a"), ("acosh", torch.acosh, "acosh a"),
                    ("atanh", torch.atanh, "atanh a"), ("erfc", torch.erfc, "1 - erf a"),
                    ("erfinv", torch.erfinv, "inverse of erf"), ("lgamma", torch.lgamma, "ln |gamma(a)|"),
                    ("digamma", torch.digamma, "d/da ln gamma(a)")]:
    _vec(_n, (lambda g: (lambda a: g(_f(a))))(_fn), 1, _d, True)
# Special functions (Inductor's ops.<name>; ATen's <name> or special_<name>): one line each.
for _n, _fn, _d in [("i0", torch.i0, "modified Bessel function of the first kind, order 0"),
                    ("i1", torch.special.i1, "modified Bessel function of the first kind, order 1"),
                    ("i0e", torch.special.i0e, "exponentially scaled i0: exp(-|a|) i0(a)"),
                    ("i1e", torch.special.i1e, "exponentially scaled i1: exp(-|a|) i1(a)"),
                    ("ndtr", torch.special.ndtr, "standard normal CDF"),
                    ("ndtri", torch.special.ndtri, "inverse of the standard normal CDF"),
                    ("log_ndtr", torch.special.log_ndtr, "log of the standard normal CDF"),
                    ("erfcx", torch.special.erfcx, "scaled complementary error function: exp(a*a) erfc(a)")]:
    _vec(_n, (lambda g: (lambda a: g(_f(a))))(_fn), 1, _d, True)
_vec("atan2", lambda a, b: torch.atan2(_f(a), _f(b)), 2, "atan(a / b) with quadrant", True)
_vec("hypot", lambda a, b: torch.hypot(_f(a), _f(b)), 2, "sqrt(a*a + b*b)", True)


def _cast_fn(dtype: torch.dtype):
    """Semantics of a cast on host values: float values stay fp32 (the card rounds where it writes
    memory), except casts to an 8-bit float, which round there, as PyTorch's cast does (nearest
    even; e4m3fn saturates to +-448, inf included, e5m2 overflows to inf; NaN stays NaN): a
    quantisation's value is its fp8 value. Integer targets truncate toward zero, bool tests != 0."""
    if dtype == torch.bool:
        return lambda a: a != 0
    if dtype in fp8_dtypes():
        return lambda a: a.to(torch.float32).to(dtype).to(torch.float32)
    if dtype.is_floating_point:
        return lambda a: a.to(torch.float32)
    return lambda a: a.to(torch.int64) if not a.is_floating_point() else torch.trunc(a).to(torch.int64)


_register(OpDef("to", "elementwise", "cast a to the op's dtype (float->float keeps fp32 on the host; to fp8 rounds "
                "and saturates as PyTorch's cast)",
                None, 1, 0, "explicit"))


def result_dtype(op: str, args: list[Any]) -> torch.dtype:
    """Card dtype of ``op``'s result from its argument dtypes (python scalars allowed)."""
    d = OPS[op]
    if d.result == "bool":
        return torch.bool
    if d.result == "explicit":
        raise ValueError(f"op {op} needs an explicit dtype")
    tens = [a for a in args if isinstance(a, torch.dtype)]
    if op == "where":
        tens = tens[1:]
    floats = [t for t in tens if t.is_floating_point]
    if floats:
        # the widest float among tensor args (fp16 op fp16 stays fp16 on the card)
        return max(floats, key=lambda t: torch.finfo(t).bits)
    if d.result == "float" or any(isinstance(a, float) for a in args):
        return torch.float32
    ints = [t for t in tens if t != torch.bool]
    if ints or (tens and d.result == "nobool"):
        return torch.int64
    return torch.bool if tens else torch.float32


# ----------------------------------------------------------------------- index / constant
_register(OpDef("index", "elementwise", "the value of an index expression at each point (iota)", flops=0))


@_category("immediate", "none", "free: a constant the instructions carry")
def _immediate_cost(cfg: HardwareConfig, d: OpDef, op: Any, t: TileCtx) -> Cost:
    return Cost("none", 0.0)


_register(OpDef("constant", "immediate", "a scalar constant (an immediate: free)"))


# ----------------------------------------------------------------------- DMA
def _dma_cost(unit: str):
    @_category(unit, unit, "dma_setup_cycles + sticks moved x stick bytes / the core's share of memory bandwidth "
                           "(sticks: the access layout's count for the tile box)")
    def cost(cfg: HardwareConfig, d: OpDef, op: Any, t: TileCtx) -> Cost:
        sticks, elems = t.access[t.index].sticks(t.ext, cfg.stick_bytes)
        nbytes = sticks * cfg.stick_bytes
        rate = t.dma_bytes_per_cycle or cfg.core_memory_bandwidth / cfg.clock_hz
        if not nbytes:
            return Cost(unit, 0.0)
        return Cost(unit, cfg.dma_setup_cycles + nbytes / rate, bytes=nbytes, elems=elems)
    return cost


_dma_cost("dma_in")
_dma_cost("dma_out")
_register(OpDef("load", "dma_in",
                "out = buffer[index] (other where mask is false): a DMA from device memory into the "
                "scratchpad of the tile's box, then a read of the scratchpad copy"))
_register(OpDef("store", "dma_out",
                "buffer[index] = store_cast(value) where mask: a DMA from scratchpad to device memory"))


# Values on the host: what a load puts in a register and how loads and stores move elements. Both
# executors (fast: the whole iteration space at once; checked: tile by tile) use these, so the two
# cannot disagree on what a load or a store does.
def host_value(v: torch.Tensor, clone: bool = False) -> torch.Tensor:
    """A loaded value as the card holds it in registers: fp32 for floats, int64 for integers."""
    if v.dtype == torch.float32 or v.dtype == torch.int64 or v.dtype == torch.bool:
        return v.clone() if clone else v
    out = v.to(torch.float32) if v.is_floating_point() else v.to(torch.int64)
    if clone and out.data_ptr() == v.data_ptr():
        out = out.clone()
    return out


def const_value(v: Any, ndim: int) -> torch.Tensor:
    """An immediate as a value broadcast over ``ndim`` iteration dims."""
    if isinstance(v, bool):
        t = torch.tensor(v)
    elif isinstance(v, int):
        t = torch.tensor(v, dtype=torch.int64)
    else:
        t = torch.tensor(float(v), dtype=torch.float32)
    return t.view([1] * ndim)


def eval_index(fn: Callable, ar: Mapping[str, torch.Tensor], env: Mapping[str, torch.Tensor],
               names: Sequence[str], ndim: int) -> torch.Tensor:
    """A compiled index expression over the dims' aranges ``ar`` and the SSA values ``names`` it
    reads from ``env``, as a value (a constant one broadcast over ``ndim`` dims)."""
    E = dict(ar)
    for n in names:
        E[n] = env[n]
    v = fn(E)
    return v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=torch.int64).view([1] * ndim)


def flat(t: torch.Tensor, span: int) -> torch.Tensor:
    """A buffer as the flat run of ``span`` elements its addresses index."""
    return t.as_strided((span,), (1,), t.storage_offset())


def gather(mem: torch.Tensor, idx: torch.Tensor, mask: torch.Tensor | None, other: Any,
           check: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
    """``mem[idx]`` where ``mask`` (``other`` elsewhere; masked-off addresses are not read).
    ``check`` sees the addresses actually read."""
    if mask is not None:
        idx, mask = torch.broadcast_tensors(idx, mask)
        if check is not None:
            check(idx[mask])
        vals = host_value(mem[torch.where(mask, idx, 0)])
        return torch.where(mask, vals, torch.tensor(other, dtype=vals.dtype))
    if check is not None:
        check(idx)
    return host_value(mem[idx])


def scatter(mem: torch.Tensor, idx: torch.Tensor, val: torch.Tensor, mask: torch.Tensor | None,
            check: Callable[[torch.Tensor], None] | None = None) -> None:
    """``mem[idx] = val`` where ``mask``; ``val`` already in the buffer's dtype. ``check`` sees
    the addresses actually written."""
    if mask is not None:
        idx, val, mask = torch.broadcast_tensors(idx, val, mask)
        idx, val = idx[mask], val[mask]
    else:
        idx, val = torch.broadcast_tensors(idx, val)
        idx, val = idx.reshape(-1), val.reshape(-1)
    if check is not None:
        check(idx)
    mem[idx] = val


def compute_fn(op: Compute, result: torch.dtype) -> Callable[..., torch.Tensor]:
    """The host function of a vector op whose result has dtype ``result``: the registry's ``fn``
    on fp32/int64 registers, a cast for ``to``; an ``exact_width`` op runs in its result's float
    format (nextafter of fp16 values steps fp16's spacing, not fp32's)."""
    d = OPS[op.op]
    f = d.fn if d.fn is not None else _cast_fn(op.dtype)
    if d.exact_width and result.is_floating_point and result != torch.float32:
        def narrow(*args, g=f):
            return g(*[a.to(result) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                       for a in args]).to(torch.float32)
        return narrow
    return f


# ----------------------------------------------------------------------- systolic array
def matmul_shape(p: Program, op: Matmul, ext: Mapping[str, int]) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of one Matmul tile."""
    da, db = p.analysis.dims[op.a], p.analysis.dims[op.b]
    prod = lambda ds: math.prod(ext[d] for d in ds)  # noqa: E731
    return prod((da & db) - {op.dim}), prod(da - db), prod(db - da), ext[op.dim]


def matmul_speedup(cfg: HardwareConfig, p: Program, op: Matmul) -> float:
    """The systolic rate of one Matmul relative to fp16: its operands' dtype's
    (``HardwareConfig.matmul_speedup``: 8-bit fp8/int8 operands 2x), the slower operand's."""
    dts = p.analysis.dtypes
    return min(cfg.matmul_speedup(dts[op.a]), cfg.matmul_speedup(dts[op.b]))


def program_matmul_speedup(cfg: HardwareConfig, p: Program) -> float:
    """The systolic rate of a program's matmuls relative to fp16 (the slowest; 1 without one): the
    roofline counts its flops at this rate's peak."""
    rates = [matmul_speedup(cfg, p, op) for op in p.body if isinstance(op, Matmul)]
    return min(rates) if rates else 1.0


@_category("systolic", "systolic", "batch x ceil(M-N blocks / corelets) x K cycles / the operands' dtype rate "
                                   "(matmul_speedup: fp8, int8 2x fp16) + the array's fill; "
                                   "a block is systolic_rows x (systolic_cols x pe_simd_lanes) outputs")
def _matmul_cost(cfg: HardwareConfig, d: OpDef, op: Matmul, t: TileCtx) -> Cost:
    batch, m, n, k = matmul_shape(t.program, op, t.ext)
    rows = cfg.systolic_rows
    cols = cfg.systolic_cols * cfg.pe_simd_lanes
    blocks = math.ceil(m / rows) * math.ceil(n / cols)
    rate = matmul_speedup(cfg, t.program, op)
    cycles = batch * math.ceil(blocks / cfg.corelets_per_core) * k / rate + cfg.systolic_fill_cycles
    return Cost("systolic", float(cycles), flops=2 * batch * m * n * k)


def _matmul_eval(a: torch.Tensor, b: torch.Tensor, axes_a: list[int], axes_b: list[int], k: int,
                 ndim: int) -> torch.Tensor:
    """a, b: values (one axis per dim); axes_*: the dims each varies along; k: contraction axis.
    Runs as one einsum (a batched GEMM in torch), fp32 accumulation, keeps the iteration axes."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    out_axes = sorted((set(axes_a) | set(axes_b)) - {k})
    sa = "".join(letters[i] for i in axes_a)
    sb = "".join(letters[i] for i in axes_b)
    so = "".join(letters[i] for i in out_axes)
    av = a.reshape([a.shape[i] for i in axes_a])
    bv = b.reshape([b.shape[i] for i in axes_b])
    if av.is_floating_point() or bv.is_floating_point():
        av, bv = av.to(torch.float32), bv.to(torch.float32)
    out = torch.einsum(f"{sa},{sb}->{so}", av, bv)
    shape = [1] * ndim
    for ax in out_axes:     # the size of the operand varying along ax (the other has 1; M may be 0)
        shape[ax] = a.shape[ax] if ax in axes_a else b.shape[ax]
    return out.reshape(shape)


_register(OpDef("matmul", "systolic",
                "out = acc + sum over dim of a * b on the systolic array, fp32 accumulation", _matmul_eval))


# ----------------------------------------------------------------------- attention: online softmax @ v
def _sm_partial(s: torch.Tensor, v: torch.Tensor | None, axes_s: list[int], axes_v: list[int], k: int,
                ndim: int) -> tuple:
    """State of one key tile: (row max m, sum of exp(s - m), exp(s - m) @ v or None). Rows whose
    scores are all -inf have m = -inf, sum 0 and a zero product."""
    s = s.to(torch.float32)
    m = s.amax(dim=k, keepdim=True)
    p = torch.exp(s - torch.where(torch.isneginf(m), torch.zeros_like(m), m))
    return m, p.sum(dim=k, keepdim=True), (_matmul_eval(p, v, axes_s, axes_v, k, ndim) if v is not None else None)


def _sm_combine(x: tuple, y: tuple) -> tuple:
    (m1, l1, a1), (m2, l2, a2) = x, y
    m = torch.maximum(m1, m2)
    c1 = torch.where(torch.isneginf(m1), torch.zeros_like(m1), torch.exp(m1 - m))
    c2 = torch.where(torch.isneginf(m2), torch.zeros_like(m2), torch.exp(m2 - m))
    return m, l1 * c1 + l2 * c2, (a1 * c1 + a2 * c2 if a1 is not None else None)


def _sm_finish(state: tuple, zero_empty: bool) -> torch.Tensor:
    m, l, a = state
    if a is None:                                   # log-sum-exp (-inf for a row of -inf)
        return m + torch.log(l)
    out = a / l
    return torch.where(l == 0, torch.zeros_like(out), out) if zero_empty else out


@dataclass(frozen=True)
class ReductionState:
    """How the partial states of a reduction over tiles or cores are made, combined and finished."""

    partial: Callable[..., Any]
    combine: Callable[[Any, Any], Any]
    finish: Callable[[Any, Any], torch.Tensor]      # (state, op) -> value


SOFTMAX_MATMUL = ReductionState(_sm_partial, _sm_combine, lambda st, op: _sm_finish(st, op.zero_empty))


def softmax_matmul_shape(p: Program, op: Any, ext: Mapping[str, int]) -> tuple[int, int, int, int]:
    """(batch, queries, keys, value width) of one SoftmaxMatmul tile (width 0: log-sum-exp only)."""
    ds = p.analysis.dims[op.s]
    if op.v is None:
        return math.prod(ext[d] for d in ds - {op.dim}), 1, ext[op.dim], 0
    dv = p.analysis.dims[op.v]
    prod = lambda ds_: math.prod(ext[d] for d in ds_)  # noqa: E731
    return prod((ds & dv) - {op.dim}), prod(ds - dv), ext[op.dim], prod(dv - ds)


@_category("online_softmax", "systolic",
           "the vector unit's max, exp, sum and rescales per key tile (transcendental_factor for the exps) "
           "+ exp(s - m) @ v on the systolic array (the systolic formula)")
def _softmax_matmul_cost(cfg: HardwareConfig, d: OpDef, op: Any, t: TileCtx) -> Cost:
    batch, m, n, e = softmax_matmul_shape(t.program, op, t.ext)
    T = cfg.transcendental_factor
    mn, rows = batch * m * n, batch * m
    # vector unit: row max, subtract, exp, row sum over the tile; rescale factors and the running
    # sum per row; rescale of the accumulator. Systolic: exp(s - m) @ v.
    vec = (_lanes_cycles(cfg, mn, 3.0 + T) + _lanes_cycles(cfg, rows, 2.0 * T + 2.0)
           + _lanes_cycles(cfg, batch * m * e, 2.0))
    if not e:
        return Cost("vector", float(vec), flops=4 * mn)
    blocks = math.ceil(m / cfg.systolic_rows) * math.ceil(e / (cfg.systolic_cols * cfg.pe_simd_lanes))
    sys_ = batch * math.ceil(blocks / cfg.corelets_per_core) * n + cfg.systolic_fill_cycles
    return Cost("systolic", float(vec + sys_), flops=2 * mn * e + 4 * mn)


_register(OpDef("softmax_matmul", "online_softmax",
                "out = sum over dim of softmax_dim(s) * v (attention: online softmax over key tiles, "
                "fp32 running max / sum / product, the product on the systolic array)"))


# ----------------------------------------------------------------------- reductions
@dataclass(frozen=True)
class ReduceImpl:
    """A reduction as (partial over some axes of a tile) + (combine two partials) + (finish)."""

    partial: Callable[[torch.Tensor, tuple[int, ...], int], Any]   # (x, axes, start of the axis) -> state
    combine: Callable[[Any, Any], Any]
    finish: Callable[[Any], torch.Tensor]
    factor: float = 1.0


def _acc(x: torch.Tensor) -> torch.Tensor:
    if x.is_floating_point():
        return x.to(torch.float32)
    return x.to(torch.int64) if x.dtype != torch.bool else x.to(torch.int64)


def _arg(kind: str) -> ReduceImpl:
    def partial(x, axes, start):
        (ax,) = axes
        x = x.to(torch.float32) if x.dtype == torch.bool else x
        v, i = (torch.max if kind == "max" else torch.min)(x, dim=ax, keepdim=True)
        return v, i + start

    def combine(s, t):
        (va, ia), (vb, ib) = s, t
        better = (vb > va) if kind == "max" else (vb < va)
        better = better | (torch.isnan(vb) & ~torch.isnan(va)) if vb.is_floating_point() else better
        return torch.where(better, vb, va), torch.where(better, ib, ia)

    return ReduceImpl(partial, combine, lambda s: s[1], 2.0)


def _fmax_partial(x: torch.Tensor, axes: list[int]) -> torch.Tensor:
    """max over ``axes`` ignoring NaN; NaN where every value is NaN (torch.fmax, folded)."""
    if not x.is_floating_point():
        return x.amax(dim=axes, keepdim=True)
    nan = torch.isnan(x)
    r = x.masked_fill(nan, float("-inf")).amax(dim=axes, keepdim=True)
    return r.masked_fill((~nan).sum(dim=axes, keepdim=True) == 0, float("nan"))


REDUCE_IMPL: dict[str, ReduceImpl] = {
    "sum": ReduceImpl(lambda x, axes, s: _acc(x).sum(dim=axes, keepdim=True), torch.add, lambda s: s),
    "prod": ReduceImpl(lambda x, axes, s: _acc(x).prod(dim=axes[0], keepdim=True) if len(axes) == 1 else
                       _acc(x).flatten(min(axes), max(axes)).prod(dim=min(axes), keepdim=True).reshape(
                           [1 if i in axes else x.shape[i] for i in range(x.dim())]), torch.mul, lambda s: s),
    "max": ReduceImpl(lambda x, axes, s: x.amax(dim=axes, keepdim=True), torch.maximum, lambda s: s),
    "min": ReduceImpl(lambda x, axes, s: x.amin(dim=axes, keepdim=True), torch.minimum, lambda s: s),
    "fmax": ReduceImpl(lambda x, axes, s: _fmax_partial(x, axes), torch.fmax, lambda s: s),
    "any": ReduceImpl(lambda x, axes, s: (x != 0).any(dim=axes[0], keepdim=True) if len(axes) == 1 else
                      (x != 0).sum(dim=axes, keepdim=True) > 0, torch.logical_or, lambda s: s),
    "argmax": _arg("max"),
    "argmin": _arg("min"),
}


@_category("reduction", "vector", "ceil(input elements / vector lanes) x the reduction's factor cycles "
                                 "(1; argmax/argmin 2: value and index)")
def _reduce_cost(cfg: HardwareConfig, d: OpDef, op: Reduce, t: TileCtx) -> Cost:
    n = t.elems(op.value)
    for dim in op.dims:              # a value broadcast along a reduced dim is still reduced over it
        if dim not in t.analysis.dims[op.value]:
            n *= t.ext[dim]
    return Cost("vector", _lanes_cycles(cfg, n, REDUCE_IMPL[op.op].factor), flops=n)


assert set(REDUCE_IMPL) == set(REDUCTIONS), "ir.program.REDUCTIONS and REDUCE_IMPL must name the same reductions"
for _r in REDUCE_IMPL:
    _register(OpDef(f"reduce.{_r}", "reduction", f"{_r} over dims inside one core (fp32/int64 accumulator)"))


# ----------------------------------------------------------------------- ring
def ring_transfer_cycles(cfg: HardwareConfig, nbytes: int, hops: int) -> float:
    """One partial sent ``hops`` cores along the ring."""
    return hops * cfg.ring_hop_cycles + nbytes / (cfg.ring_bandwidth / cfg.clock_hz)


@_category("ring", "ring", "per transfer: hops x ring_hop_cycles + bytes / ring bandwidth, + the combine "
                         "on the vector unit (the elementwise formula)")
def _ring_cost(cfg: HardwareConfig, d: OpDef, op: Any, t: TileCtx) -> Cost:
    n = t.elems(op.value)
    nbytes = n * max(4, torch.empty((), dtype=t.analysis.dtypes[op.value]).element_size())
    combine = _lanes_cycles(cfg, n, 1.0)
    return Cost("ring", ring_transfer_cycles(cfg, nbytes, 1) + combine, flops=n, bytes=nbytes, elems=n)


@_category("ring_softmax", "ring", "the ring formula for the row max, the row sum and the product, + their "
                                 "rescale (transcendental_factor for the exps)")
def _ring_softmax_cost(cfg: HardwareConfig, d: OpDef, op: Any, t: TileCtx) -> Cost:
    prod = t.analysis.producer[op.value]
    batch, m, n, e = softmax_matmul_shape(t.program, prod, t.ext)
    rows, n_out = batch * m, batch * m * e
    nbytes = 4 * (n_out + 2 * rows)                  # the product (if any), the row max and the row sum
    combine = _lanes_cycles(cfg, n_out, 2.0) + _lanes_cycles(cfg, rows, 2.0 * cfg.transcendental_factor + 3.0)
    return Cost("ring", ring_transfer_cycles(cfg, nbytes, 1) + combine, flops=2 * n_out, bytes=nbytes, elems=n_out)


_register(OpDef("ring.softmax", "ring_softmax",
                "combine per-core partial attention states (row max, sum of exponentials, product) over "
                "the ring: flash-decoding when the keys are split over cores"))

for _r in sorted(set(RING_COMBINE.values())):
    _register(OpDef(f"ring.{_r}", "ring",
                    f"combine per-core partials with {_r}: each partial travels to the next core toward "
                    "the owner, which ends with the total"))


# ----------------------------------------------------------------------- access layout
def _feeds(p: Program, value: str) -> list[tuple[Any, str]]:
    """(consumer op, role) for a value, looking through single-input casts/moves."""
    out = []
    for op in p.body:
        if isinstance(op, Matmul):
            if op.a == value:
                out.append((op, "a"))
            if op.b == value:
                out.append((op, "b"))
        elif isinstance(op, Compute) and op.op in ("to", "identity") and op.args and op.args[0] == value:
            out.extend(_feeds(p, op.out))
    return out


def access_layout(p: Program, sizes: Mapping[str, int], relayout: frozenset[int] = frozenset(),
                  stick_bytes: int | None = None) -> dict[int, Access]:
    """Decide, per Load/Store, how its DMA moves data.

    Rules (docs/latency-model.md, "DMA"): an affine access is *contiguous* if its address has
    stride 1 along some iteration dim u (the box moves as rows of sticks along u) and u is the dim
    the consumer wants in the stick: for a matmul's ``a`` operand the contraction dim, for ``b``
    the output's stick dim, for other loads either a reduction dim (a reduction along the stick)
    or the kernel's output stick dim (the stride-1 dim of the first store); a transposed operand
    moves one stick per element. An address that is not affine but computable from the indices
    alone (a view's FloorDiv/ModularIndexing, a broadcast, a convolution window), and a load
    masked by an index-only predicate (Inductor's ``cat``, padding), is charged the sticks it
    really touches, counted by evaluating address and mask over the tile (``Access.probe``). A
    gather through loaded values moves stride-1 runs if it has them (embedding rows), else a
    stick per element.

    ``relayout``: indices of transposed matmul operands the planner chose to re-lay once (see
    :func:`relayout_candidates`): they are read in sticks along the dim the matmul wants.
    """
    from ..hardware import get_config

    stick_bytes = stick_bytes or get_config().stick_bytes
    an = p.analysis
    dims = p.dim_names
    kinds = {d.name: d.kind for d in p.dims}
    subs = {sym(k): sympy.Integer(v) for k, v in sizes.items()}
    ext = {d.name: int(sympy.sympify(d.size).xreplace(subs)) for d in p.dims}
    forms: dict[int, Any] = {}
    exprs: dict[int, Any] = {}
    out_stick: str | None = None
    for i, op in enumerate(p.body):
        if isinstance(op, (Load, Store)):
            exprs[i] = op.index.xreplace(subs)
            forms[i] = affine_form(exprs[i], dims)
            if isinstance(op, Store) and out_stick is None and forms[i]:
                unit = [d for d, c in forms[i][1].items() if c == 1]
                if unit and kinds[unit[0]] == "parallel":
                    out_stick = unit[0]
    res: dict[int, Access] = {}
    for i, op in enumerate(p.body):
        if not isinstance(op, (Load, Store)):
            continue
        b = p.buffer(op.buffer)
        form = forms[i]
        # the dims the index moves with once sizes and strides are bound (a broadcast operand of an
        # eager kernel has symbolic strides that bind to 0: it does not move with those dims)
        adims = frozenset(n for n in free_names(exprs[i]) if n in kinds)
        ind = [n for n in free_names(op.index) if n.startswith("%")]
        for n in ind:
            adims |= an.dims[n]
        mask = _index_only(p, op.mask, subs) if isinstance(op, Load) and op.mask else None
        if isinstance(op, Load) and op.mask and mask is not None:
            adims |= an.dims[op.mask]
        if form is None:
            run = _stride1_run(exprs[i], [d for d in dims if d in adims], ext, b.itemsize, stick_bytes)
            if not ind:
                try:
                    probe = _touch_probe(exprs[i], [d for d in dims if d in adims], b.itemsize, stick_bytes, mask)
                except NotImplementedError:
                    probe = None
                if probe is not None:
                    u = run[0] if run else None
                    res[i] = Access(adims, b.itemsize, u, u is not None,
                                    "sticks touched, counted over the tile (view, broadcast or window)", probe=probe)
                    continue
            if run is not None:
                u, n = run
                res[i] = Access(adims, b.itemsize, u, True, f"runs of {n} along {u} (row gather)", run=n)
            else:
                res[i] = Access(adims, b.itemsize, None, False, "gather (indirect index without runs)")
            continue
        coefs = form[1]
        unit = [d for d, c in coefs.items() if c == 1]
        u = unit[-1] if unit else None
        if u is None:
            if not adims:
                res[i] = Access(adims, b.itemsize, None, True, "scalar: one stick")
            elif not coefs:                  # masked load of one element: the mask has dims, the address none
                res[i] = Access(frozenset(), b.itemsize, None, True, "scalar under a mask: one stick")
            else:
                v = min(coefs, key=lambda d: abs(coefs[d]))
                st = abs(coefs[v])
                why = (f"stride {st} along {v}: rows of sticks" if st * b.itemsize < stick_bytes
                       else "no stride-1 dim: a stick per element")
                res[i] = Access(adims, b.itemsize, v, False, why, stride=st)
            continue
        if isinstance(op, Store):
            res[i] = Access(adims, b.itemsize, u, True, f"sticks along {u}")
            continue
        wanted: str | None = None
        why = ""
        for consumer, role in _feeds(p, op.out):
            if role == "a":
                wanted, why = consumer.dim, "matmul a wants the contraction dim in the stick"
            else:
                par = [d for d in dims if d in an.dims[consumer.b] and d != consumer.dim]
                wanted = out_stick if out_stick in par else (par[-1] if par else None)
                why = "matmul b wants the output's stick dim in the stick"
            break
        probe = _touch_probe(exprs[i], [d for d in dims if d in adims], b.itemsize, stick_bytes, mask) \
            if mask is not None else None
        if wanted is None:
            if kinds[u] == "reduction" or out_stick is None or u == out_stick:
                res[i] = Access(adims, b.itemsize, u, True,
                                f"sticks along {u}" + (" where the mask is true" if probe else ""), probe=probe)
            else:
                res[i] = Access(adims, b.itemsize, u, False,
                                f"stride-1 dim {u} is not the output stick dim {out_stick}: transposed")
        else:
            ok = (u == wanted)
            if not ok and i in relayout and wanted is not None:
                res[i] = Access(adims, b.itemsize, wanted, True, f"re-laid once so that {wanted} is in the stick",
                                relayout=True)
            else:
                res[i] = Access(adims, b.itemsize, u, ok, f"sticks along {u}" if ok else f"transposed: {why}",
                                probe=probe if ok else None)
    return res


PROBE_ELEMS = 1 << 12   # largest tile box an access probe evaluates; bigger boxes are sampled and scaled


def _index_only(p: Program, name: str, subs: Mapping[Any, Any]) -> Callable[[dict], torch.Tensor] | None:
    """An evaluator of value ``name`` over a box of aranges when it depends on indices and
    constants only (a mask made of index comparisons); None if it reads memory or reductions."""
    from .program import Constant, IndexValue

    an = p.analysis
    need: list[int] = []
    todo = [name]
    seen: set[str] = set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        op = an.producer[n]
        if isinstance(op, IndexValue) and not op.inputs:
            pass
        elif isinstance(op, Constant):
            pass
        elif isinstance(op, Compute) and (op.op == "to" or OPS[op.op].fn is not None):
            todo.extend(op.inputs)
        else:
            return None
        need.append(p.body.index(op))
    steps = sorted(set(need))

    def run(env: dict) -> torch.Tensor:
        vals: dict[str, Any] = {}
        for i in steps:
            op = p.body[i]
            if isinstance(op, IndexValue):
                v = compile_expr(op.expr.xreplace(subs))(env)
                vals[op.out] = torch.as_tensor(v)
            elif isinstance(op, Constant):
                vals[op.out] = torch.as_tensor(op.value)
            else:
                fn = OPS[op.op].fn if op.op != "to" else _cast_fn(op.dtype)
                vals[op.out] = fn(*[vals[a] if isinstance(a, str) else torch.as_tensor(a) for a in op.args])
        return vals[name].to(torch.bool)
    return run


def _touch_probe(expr: Any, dims: list[str], itemsize: int, stick_bytes: int,
                 mask: Callable[[dict], torch.Tensor] | None) -> Callable[[Mapping[str, int]], tuple[int, int]]:
    """``probe(ext) -> (sticks, elements)``: the distinct sticks a tile at the origin touches (and
    the elements it needs, where the mask is true), evaluated over the box. Boxes above
    ``PROBE_ELEMS`` are sampled: the largest dims are halved until the box fits, and the counts are
    scaled back per halved dim by how many more distinct sticks the full extent reaches along it
    (with the others at 0): a dim the address ignores (a broadcast, the query heads sharing a key
    head) scales nothing, a dim it walks scales by the sticks it walks."""
    fn = compile_expr(expr)
    per_stick = max(1, stick_bytes // itemsize)
    memo: dict[tuple, tuple[int, int]] = {}

    def distinct_along(j: int, n: int) -> int:
        env = {d: torch.zeros(1, dtype=torch.int64) for d in dims}
        env[dims[j]] = torch.arange(n, dtype=torch.int64)
        v = torch.as_tensor(fn(env), dtype=torch.int64).reshape(-1)
        return max(1, int(torch.unique(torch.div(v, per_stick, rounding_mode="floor")).numel()))

    def probe(ext: Mapping[str, int]) -> tuple[int, int]:
        key = tuple(int(ext[d]) for d in dims)
        hit = memo.get(key)
        if hit is not None:
            return hit
        sub = list(key)
        while math.prod(sub) > PROBE_ELEMS:
            k = max(range(len(sub)), key=lambda j: sub[j])
            sub[k] = -(-sub[k] // 2)
        env = {}
        for j, d in enumerate(dims):
            shape = [1] * len(dims)
            shape[j] = sub[j]
            env[d] = torch.arange(sub[j], dtype=torch.int64).view(shape)
        full = torch.Size(sub)
        addr = torch.as_tensor(fn(env), dtype=torch.int64).expand(full) if dims else torch.as_tensor(fn(env))
        if mask is not None:
            m = mask(env).expand(full)
            addr = addr[m]
            need = int(m.sum())
        else:
            addr = addr.reshape(-1)
            need = addr.numel()
        sticks = int(torch.unique(torch.div(addr, per_stick, rounding_mode="floor")).numel()) if addr.numel() else 0
        grow = 1.0
        for j in range(len(dims)):
            if sub[j] < key[j]:
                grow *= distinct_along(j, key[j]) / distinct_along(j, sub[j])
        res = (math.ceil(sticks * grow), math.ceil(need * math.prod(key) / max(1, math.prod(sub))))
        memo[key] = res
        return res
    return probe


def _stride1_run(expr: Any, dims: list[str], ext: Mapping[str, int], itemsize: int, stick_bytes: int,
                 probe: int = 4096) -> tuple[str, int] | None:
    """An index that walks memory in stride-1 runs along one dim (a view's FloorDiv/ModularIndexing,
    a row gather ``W*%i + x``): ``(dim, typical run)``. A run moves whole sticks: one shorter than
    a stick (a 64-byte row of a paged KV cache with head dim 32) still costs one stick per run, not
    one per element.

    Probed numerically along each dim (innermost first) with the other dims and any indirect
    values at 0: the run is the mean length of the stretches where the address steps by 1.
    """
    try:
        fn = compile_expr(expr)
    except NotImplementedError:
        return None
    names = free_names(expr)
    for u in reversed(dims):
        n = max(1, min(probe, int(ext.get(u, probe))))
        env = {k: 0 for k in names}
        env[u] = torch.arange(n + 1)
        try:
            addr = torch.as_tensor(fn(env)).reshape(-1)
        except Exception:  # noqa: BLE001 - an index we cannot probe is a gather
            return None
        if addr.numel() != n + 1:
            continue
        steps = (addr[1:] - addr[:-1]) == 1
        breaks = int((~steps).sum()) + 1
        run = (n + 1) // breaks
        if run * itemsize >= stick_bytes or (run >= 2 and run == n + 1):
            return u, run
    return None


def relayout_candidates(p: Program, sizes: Mapping[str, int]) -> list[int]:
    """Loads that feed a matmul with their stride-1 dim in the wrong place (a transposed operand).

    Each can be read at its real cost (a stick per element) or re-laid once ("restickify": read in
    sticks along its stride-1 dim, written back with the wanted dim in the stick) and then read in
    sticks; the planner asks the latency model which is cheaper.
    """
    out = []
    for i, a in access_layout(p, sizes).items():
        op = p.body[i]
        if isinstance(op, Load) and not a.contiguous and a.unit_var is not None and a.reason.startswith("transposed: matmul"):
            out.append(i)
    return out
