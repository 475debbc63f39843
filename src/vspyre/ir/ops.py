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
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import sympy
import torch

from ..hardware import HardwareConfig
from .indexing import affine_form, compile_expr, free_names, sym
from .program import Load, Matmul, Program, Reduce, Store, Compute

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
    stick per element (a transposed operand, a gather, a non-affine index)."""

    dims: frozenset[str]      # iteration dims the address depends on (the DMA box)
    itemsize: int
    unit_var: str | None      # dim with address stride 1, if any
    contiguous: bool
    reason: str               # human-readable: why (for the text form and the docs)
    relayout: bool = False    # re-laid once before the kernel (restickify), then read in sticks
    run: int | None = None    # for a non-affine index: length of its stride-1 runs along unit_var


@dataclass
class TileCtx:
    program: Program
    ext: Mapping[str, int]                 # tile extent per iteration dim
    access: Mapping[int, Access]           # op index -> access layout (Load/Store)
    index: int = 0                         # op index being costed

    @property
    def analysis(self):
        return self.program.analysis

    def elems(self, value: str) -> int:
        n = 1
        for d in self.analysis.dims[value]:
            n *= self.ext[d]
        return n


@dataclass(frozen=True)
class OpDef:
    name: str
    unit: str
    doc: str
    cost: Callable[[HardwareConfig, Any, TileCtx], Cost]
    fn: Callable[..., torch.Tensor] | None = None   # vector semantics on host tensors
    arity: int | None = None
    transcendental: bool = False
    result: str = "promote"                          # "promote", "bool", "float", "int"


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


def _vector_cost(factor_attr: bool, flops_per_elem: int = 1):
    def cost(cfg: HardwareConfig, op: Any, t: TileCtx) -> Cost:
        n = t.elems(op.out)
        f = cfg.transcendental_factor if factor_attr else 1.0
        return Cost("vector", _lanes_cycles(cfg, n, f), flops=n * flops_per_elem)
    return cost


def _vec(name: str, fn: Callable, arity: int, doc: str, transcendental: bool = False,
         result: str = "promote", flops: int = 1) -> None:
    _register(OpDef(name, "vector", doc, _vector_cost(transcendental, flops), fn, arity, transcendental, result))


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
_vec("pow", lambda a, b: torch.pow(a, b), 2, "a ** b", True)
_vec("maximum", torch.maximum, 2, "max(a, b), NaN-propagating")
_vec("minimum", torch.minimum, 2, "min(a, b), NaN-propagating")
_vec("fma", lambda a, b, c: a * b + c, 3, "a * b + c", flops=2)
_vec("where", lambda c, a, b: torch.where(c, a, b), 3, "c ? a : b")
for _n, _fn in [("eq", torch.eq), ("ne", torch.ne), ("lt", torch.lt), ("le", torch.le), ("gt", torch.gt),
                ("ge", torch.ge)]:
    _vec(_n, _fn, 2, f"a {_n} b -> bool", result="bool")
_vec("logical_and", torch.logical_and, 2, "a and b -> bool", result="bool")
_vec("logical_or", torch.logical_or, 2, "a or b -> bool", result="bool")
_vec("logical_not", torch.logical_not, 1, "not a -> bool", result="bool")
_vec("isnan", torch.isnan, 1, "a is NaN -> bool", result="bool")
_vec("isinf", torch.isinf, 1, "a is +-inf -> bool", result="bool")
_vec("neg", torch.neg, 1, "-a")
_vec("abs", torch.abs, 1, "|a|")
_vec("relu", torch.relu, 1, "max(a, 0)")
_vec("sign", torch.sign, 1, "sign(a)")
_vec("square", torch.square, 1, "a * a")
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
_vec("copysign", lambda a, b: torch.copysign(_f(a), _f(b)), 2, "|a| with the sign of b")
_vec("signbit", torch.signbit, 1, "sign bit of a -> bool", result="bool")
_vec("nextafter", lambda a, b: torch.nextafter(_f(a), _f(b)), 2, "next float after a toward b")
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
_vec("atan2", lambda a, b: torch.atan2(_f(a), _f(b)), 2, "atan(a / b) with quadrant", True)
_vec("hypot", lambda a, b: torch.hypot(_f(a), _f(b)), 2, "sqrt(a*a + b*b)", True)


def _cast_fn(dtype: torch.dtype):
    """Semantics of a cast on host values: float values stay fp32 (the card rounds where it writes
    memory), integer targets truncate toward zero, bool tests != 0."""
    if dtype == torch.bool:
        return lambda a: a != 0
    if dtype.is_floating_point:
        return lambda a: a.to(torch.float32)
    return lambda a: a.to(torch.int64) if not a.is_floating_point() else torch.trunc(a).to(torch.int64)


_register(OpDef("to", "vector", "cast a to the op's dtype (float->float keeps fp32 on the host)",
                _vector_cost(False, 0), None, 1, False, "explicit"))


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
    if d.transcendental or any(isinstance(a, float) for a in args):
        return torch.float32
    ints = [t for t in tens if t != torch.bool]
    if ints:
        return torch.int64
    return torch.bool if tens else torch.float32


# ----------------------------------------------------------------------- index / constant
_register(OpDef("index", "vector", "the value of an index expression at each point (iota)",
                lambda cfg, op, t: Cost("vector", _lanes_cycles(cfg, t.elems(op.out), 1.0))))
_register(OpDef("constant", "none", "a scalar constant (an immediate: free)",
                lambda cfg, op, t: Cost("none", 0.0)))


# ----------------------------------------------------------------------- DMA
def _dma_cost(unit: str):
    def cost(cfg: HardwareConfig, op: Any, t: TileCtx) -> Cost:
        acc = t.access[t.index]
        elems = 1
        for d in acc.dims:
            elems *= t.ext[d]
        sb = cfg.stick_bytes
        if not acc.dims:
            sticks = 1
        elif acc.contiguous:
            inner = t.ext[acc.unit_var] if acc.run is None else max(1, min(t.ext[acc.unit_var], acc.run))
            sticks = (elems // inner) * math.ceil(inner * acc.itemsize / sb)
        else:
            sticks = elems
        nbytes = sticks * sb
        bytes_per_cycle = cfg.core_memory_bandwidth / cfg.clock_hz
        return Cost(unit, cfg.dma_setup_cycles + nbytes / bytes_per_cycle, bytes=nbytes, elems=elems)
    return cost


_register(OpDef("load", "dma_in",
                "out = buffer[index] (other where mask is false): a DMA from device memory into the "
                "scratchpad of the tile's box, then a read of the scratchpad copy",
                _dma_cost("dma_in")))
_register(OpDef("store", "dma_out",
                "buffer[index] = store_cast(value) where mask: a DMA from scratchpad to device memory",
                _dma_cost("dma_out")))


# ----------------------------------------------------------------------- systolic array
def matmul_shape(p: Program, op: Matmul, ext: Mapping[str, int]) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of one Matmul tile."""
    da, db = p.analysis.dims[op.a], p.analysis.dims[op.b]
    prod = lambda ds: math.prod(ext[d] for d in ds)  # noqa: E731
    return prod((da & db) - {op.dim}), prod(da - db), prod(db - da), ext[op.dim]


def _matmul_cost(cfg: HardwareConfig, op: Matmul, t: TileCtx) -> Cost:
    batch, m, n, k = matmul_shape(t.program, op, t.ext)
    rows = cfg.systolic_rows
    cols = cfg.systolic_cols * cfg.pe_simd_lanes
    blocks = math.ceil(m / rows) * math.ceil(n / cols)
    cycles = batch * math.ceil(blocks / cfg.corelets_per_core) * k + cfg.systolic_fill_cycles
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
                "out = acc + sum over dim of a * b on the systolic array, fp32 accumulation",
                _matmul_cost, _matmul_eval))


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


REDUCE_IMPL: dict[str, ReduceImpl] = {
    "sum": ReduceImpl(lambda x, axes, s: _acc(x).sum(dim=axes, keepdim=True), torch.add, lambda s: s),
    "prod": ReduceImpl(lambda x, axes, s: _acc(x).prod(dim=axes[0], keepdim=True) if len(axes) == 1 else
                       _acc(x).flatten(min(axes), max(axes)).prod(dim=min(axes), keepdim=True).reshape(
                           [1 if i in axes else x.shape[i] for i in range(x.dim())]), torch.mul, lambda s: s),
    "max": ReduceImpl(lambda x, axes, s: x.amax(dim=axes, keepdim=True), torch.maximum, lambda s: s),
    "min": ReduceImpl(lambda x, axes, s: x.amin(dim=axes, keepdim=True), torch.minimum, lambda s: s),
    "any": ReduceImpl(lambda x, axes, s: (x != 0).any(dim=axes[0], keepdim=True) if len(axes) == 1 else
                      (x != 0).sum(dim=axes, keepdim=True) > 0, torch.logical_or, lambda s: s),
    "argmax": _arg("max"),
    "argmin": _arg("min"),
}


def _reduce_cost(name: str):
    def cost(cfg: HardwareConfig, op: Reduce, t: TileCtx) -> Cost:
        n = t.elems(op.value)
        for d in op.dims:              # a value broadcast along a reduced dim is still reduced over it
            if d not in t.analysis.dims[op.value]:
                n *= t.ext[d]
        return Cost("vector", _lanes_cycles(cfg, n, REDUCE_IMPL[name].factor), flops=n)
    return cost


for _r in REDUCE_IMPL:
    _register(OpDef(f"reduce.{_r}", "vector", f"{_r} over dims inside one core (fp32/int64 accumulator)",
                    _reduce_cost(_r)))


# ----------------------------------------------------------------------- ring
def ring_transfer_cycles(cfg: HardwareConfig, nbytes: int, hops: int) -> float:
    """One partial sent ``hops`` cores along the ring."""
    return hops * cfg.ring_hop_cycles + nbytes / (cfg.ring_bandwidth / cfg.clock_hz)


def _ring_cost(cfg: HardwareConfig, op: Any, t: TileCtx) -> Cost:
    n = t.elems(op.value)
    nbytes = n * max(4, torch.empty((), dtype=t.analysis.dtypes[op.value]).element_size())
    combine = _lanes_cycles(cfg, n, 1.0)
    return Cost("ring", ring_transfer_cycles(cfg, nbytes, 1) + combine, flops=n, bytes=nbytes, elems=n)


for _r in ("sum", "prod", "max", "min", "any"):
    _register(OpDef(f"ring.{_r}", "ring",
                    f"combine per-core partials with {_r}: each partial travels to the next core toward "
                    "the owner, which ends with the total; cost per transfer (hops x hop latency + bytes / "
                    "ring bandwidth) + the combine on the vector unit", _ring_cost))


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


def access_layout(p: Program, sizes: Mapping[str, int], relayout: frozenset[int] = frozenset()) -> dict[int, Access]:
    """Decide, per Load/Store, whether its DMA moves whole sticks along a stride-1 dim.

    Rules (docs/latency-model.md, "DMA"): an access is *contiguous* if its address has stride 1
    along some iteration dim u (the box moves as rows of sticks along u) and u is the dim the
    consumer wants in the stick: for a matmul's ``a`` operand the contraction dim, for ``b`` the
    output's stick dim, for other loads either a reduction dim (a reduction along the stick) or
    the kernel's output stick dim (the stride-1 dim of the first store). Anything else (a
    transposed operand, a gather, a non-affine index) moves one stick per element.

    ``relayout``: indices of transposed matmul operands the planner chose to re-lay once (see
    :func:`relayout_candidates`): they are read in sticks along the dim the matmul wants.
    """
    an = p.analysis
    dims = p.dim_names
    kinds = {d.name: d.kind for d in p.dims}
    subs = {sym(k): sympy.Integer(v) for k, v in sizes.items()}
    forms: dict[int, Any] = {}
    out_stick: str | None = None
    for i, op in enumerate(p.body):
        if isinstance(op, (Load, Store)):
            e = op.index.xreplace(subs)
            forms[i] = affine_form(e, dims)
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
        adims = frozenset(n for n in free_names(op.index) if n in kinds)
        ind = [n for n in free_names(op.index) if n.startswith("%")]
        for n in ind:
            adims |= an.dims[n]
        if form is None:
            run = _stride1_run(op.index, [d for d in dims if d in adims], sizes, b.itemsize)
            if run is not None:
                u, n = run
                res[i] = Access(adims, b.itemsize, u, True, f"runs of {n} along {u} (view or row gather)", run=n)
            else:
                res[i] = Access(adims, b.itemsize, None, False, "gather (non-affine or indirect index)")
            continue
        coefs = form[1]
        unit = [d for d, c in coefs.items() if c == 1]
        u = unit[-1] if unit else None
        if u is None:
            res[i] = Access(adims, b.itemsize, None, False if adims else True,
                            "no stride-1 dim: a stick per element" if adims else "scalar: one stick")
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
        if wanted is None:
            if kinds[u] == "reduction" or out_stick is None or u == out_stick:
                res[i] = Access(adims, b.itemsize, u, True, f"sticks along {u}")
            else:
                res[i] = Access(adims, b.itemsize, u, False,
                                f"stride-1 dim {u} is not the output stick dim {out_stick}: transposed")
        else:
            ok = (u == wanted)
            if not ok and i in relayout and wanted is not None:
                res[i] = Access(adims, b.itemsize, wanted, True, f"re-laid once so that {wanted} is in the stick",
                                relayout=True)
            else:
                res[i] = Access(adims, b.itemsize, u, ok, f"sticks along {u}" if ok else f"transposed: {why}")
    return res


def _stride1_run(index: Any, dims: list[str], sizes: Mapping[str, int], itemsize: int,
                 probe: int = 4096) -> tuple[str, int] | None:
    """A non-affine index (a view's FloorDiv/ModularIndexing, a row gather ``W*%i + x``) that still
    walks memory in stride-1 runs of at least a stick along one dim: ``(dim, typical run)``.

    Probed numerically along each dim (innermost first) with the other dims and any indirect
    values at 0: the run is the mean length of the stretches where the address steps by 1.
    """
    from ..hardware import get_config

    stick = get_config().stick_bytes
    e = index.xreplace({sym(k): sympy.Integer(v) for k, v in sizes.items()})
    try:
        fn = compile_expr(e)
    except NotImplementedError:
        return None
    names = free_names(e)
    for u in reversed(dims):
        n = min(probe, int(sizes.get(u, probe)) if u in sizes else probe)
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
        if run * itemsize >= stick:
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
