"""Tile programs: the one kernel form both vspyre compilers emit and the runtime executes.

A :class:`Program` is data, not code:

* ``buffers``: device-memory tensors it reads/writes (dtype, shape, strides, offset, role);
* ``dims``: the iteration space (parallel dims ``x*`` then reduction dims ``r*`` by convention),
  sizes are ints or sympy expressions over size symbols bound at launch;
* ``body``: SSA ops over the iteration space (see ``vspyre.ir.ops`` for each op's semantics and
  cost): ``Load``, ``Compute`` (vector unit), ``IndexValue``, ``Constant``, ``Matmul`` (systolic
  array), ``Reduce`` (inside a core), ``RingReduce`` (across cores), ``Store``;
* ``division``: which dims are split over how many cores (chunks in whole sticks on a stick dim);
* ``tiles``: per-core tile sizes per dim and whether DMA is double-buffered.

``division``/``tiles`` may be left ``None``: the runtime then plans them at launch with
``vspyre.ir.planning`` (cached per bound sizes). The text form is ``vspyre.ir.printer.format``.

Every SSA value has *dims*: the iteration dims it varies along (a value is a box over the
iteration space, broadcast along the others). ``analyze`` computes them and validates the body.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from typing import Any, Mapping, Union

import sympy
import torch

from .indexing import free_names, sym, to_expr

__all__ = [
    "Buffer", "Dim", "Load", "Store", "Compute", "IndexValue", "Constant", "Matmul", "Reduce",
    "RingReduce", "SoftmaxMatmul", "Split", "WorkDivision", "TilePlan", "Program", "ProgramError", "Analysis",
    "analyze", "Op", "REDUCTIONS", "RING_COMBINE", "ReductionKind",
]


class ProgramError(ValueError):
    """A program is malformed (names the program and the op)."""


Size = Union[int, sympy.Expr]
Scalar = Union[int, float, bool]


def _size(v: Any) -> Size:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    e = to_expr(v)
    return int(e) if e.is_Integer else e


@dataclass(frozen=True)
class Buffer:
    """A tensor in device memory that the program reads and/or writes.

    ``role``: ``"in"`` (read only), ``"out"`` (every element written exactly once), ``"inout"``
    (read and/or written; each element written at most once). ``offset``: the storage offset the
    tensor must have at launch (``None``: any). Indices are element offsets from the tensor's
    first element, so ``offset`` never enters an index.
    """

    name: str
    dtype: torch.dtype
    shape: tuple[Size, ...]
    strides: tuple[Size, ...] | None = None   # None: contiguous
    offset: int | None = None
    role: str = "in"

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(_size(s) for s in self.shape))
        if self.strides is None:
            st: list[Size] = []
            acc: Size = 1
            for s in reversed(self.shape):
                st.append(acc)
                acc = acc * s
            object.__setattr__(self, "strides", tuple(reversed(st)))
        else:
            object.__setattr__(self, "strides", tuple(_size(s) for s in self.strides))
        if len(self.strides) != len(self.shape):
            raise ProgramError(f"buffer {self.name}: {len(self.shape)} sizes but {len(self.strides)} strides")
        if self.role not in ("in", "out", "inout"):
            raise ProgramError(f"buffer {self.name}: role must be in/out/inout, got {self.role!r}")

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def span(self, sizes: Mapping[str, int]) -> int:
        """Elements from the first to one past the last element (the addressable extent)."""
        shape = [_bind(s, sizes) for s in self.shape]
        strides = [_bind(s, sizes) for s in self.strides]
        if any(s == 0 for s in shape):
            return 0
        return 1 + sum((n - 1) * st for n, st in zip(shape, strides))


def _bind(v: Size, sizes: Mapping[str, int]) -> int:
    if isinstance(v, int):
        return v
    missing = free_names(v) - set(sizes)
    if missing:
        raise ProgramError(f"size {v} uses unbound symbol(s) {sorted(missing)}")
    return int(v.xreplace({sym(k): sympy.Integer(val) for k, val in sizes.items()}))


@dataclass(frozen=True)
class Dim:
    """One dimension of the iteration space. ``kind``: ``"parallel"`` or ``"reduction"``."""

    name: str
    size: Size
    kind: str = "parallel"

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _size(self.size))
        if self.kind not in ("parallel", "reduction"):
            raise ProgramError(f"dim {self.name}: kind must be parallel/reduction, got {self.kind!r}")


# ---------------------------------------------------------------------------------- ops
# Arguments of ops are SSA names (str) or Python scalars (constants).

@dataclass(frozen=True)
class Load:
    """``out = buffer[index]`` (``other`` where ``mask`` is false; masked-off elements are not read)."""

    out: str
    buffer: str
    index: sympy.Expr
    mask: str | None = None
    other: Scalar = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "index", to_expr(self.index))

    kind = property(lambda self: "load")
    inputs = property(lambda self: tuple(n for n in (self.mask,) if n) + tuple(
        sorted(n for n in free_names(self.index) if n.startswith("%"))))
    outputs = property(lambda self: (self.out,))


@dataclass(frozen=True)
class Store:
    """``buffer[index] = value`` where ``mask`` (through ``numerics.store_cast``)."""

    buffer: str
    index: sympy.Expr
    value: str
    mask: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "index", to_expr(self.index))

    kind = property(lambda self: "store")
    inputs = property(lambda self: (self.value,) + ((self.mask,) if self.mask else ()) + tuple(
        sorted(n for n in free_names(self.index) if n.startswith("%"))))
    outputs = property(lambda self: ())


@dataclass(frozen=True)
class Compute:
    """``out = op(*args)`` on the vector unit; ``op`` names a registry entry (``vspyre.ir.ops``)."""

    out: str
    op: str
    args: tuple[Any, ...]
    dtype: torch.dtype | None = None   # result dtype; None: the registry's rule

    kind = property(lambda self: self.op)
    inputs = property(lambda self: tuple(a for a in self.args if isinstance(a, str)))
    outputs = property(lambda self: (self.out,))


@dataclass(frozen=True)
class IndexValue:
    """``out = expr`` evaluated at every point (Inductor's ``index_expr``: iotas, masks)."""

    out: str
    expr: sympy.Expr
    dtype: torch.dtype = torch.int64

    def __post_init__(self) -> None:
        object.__setattr__(self, "expr", to_expr(self.expr))

    kind = property(lambda self: "index")
    # SSA values in the expression (an index computed from loaded values, e.g. max-pool offsets)
    inputs = property(lambda self: tuple(sorted(n for n in free_names(self.expr) if n.startswith("%"))))
    outputs = property(lambda self: (self.out,))


@dataclass(frozen=True)
class Constant:
    out: str
    value: Scalar
    dtype: torch.dtype = torch.float32

    kind = property(lambda self: "constant")
    inputs = property(lambda self: ())
    outputs = property(lambda self: (self.out,))


@dataclass(frozen=True)
class Matmul:
    """``out = acc + sum over dim of a * b`` on the systolic array (fp32 accumulation).

    ``a`` must vary along ``dim`` and one output dim (M), ``b`` along ``dim`` and another (N);
    shared other dims are batch dims. Never lowered to a broadcast multiply + sum.
    """

    out: str
    a: str
    b: str
    dim: str
    acc: str | None = None
    dtype: torch.dtype = torch.float32

    kind = property(lambda self: "matmul")
    inputs = property(lambda self: (self.a, self.b) + ((self.acc,) if self.acc else ()))
    outputs = property(lambda self: (self.out,))


@dataclass(frozen=True)
class SoftmaxMatmul:
    """``out = sum over dim of softmax_dim(s) * v``: attention's second product with its softmax,
    as one reduction over the keys (an *online* softmax: the running max, the running sum of
    exponentials and the weighted sum of ``v``, rescaled as key tiles arrive, so the scores never
    need the whole key length at once). ``s`` varies along ``dim`` and the query dims, ``v`` along
    ``dim`` and the output's value dims. Rows whose scores are all ``-inf`` give NaN, as softmax
    does, or 0 with ``zero_empty``. fp32 state; the product runs on the systolic array. With
    ``v=None`` the result is the log-sum-exp of the scores over ``dim`` (attention's saved
    statistic), by the same online reduction.
    """

    out: str
    s: str
    v: str | None
    dim: str
    zero_empty: bool = False
    dtype: torch.dtype = torch.float32

    kind = property(lambda self: "softmax_matmul")
    inputs = property(lambda self: (self.s, self.v) if self.v is not None else (self.s,))
    outputs = property(lambda self: (self.out,))


@dataclass(frozen=True)
class ReductionKind:
    """What a reduction returns and how partial results combine over the ring; the one table of
    reductions (their semantics and cost are ``ir.ops.REDUCE_IMPL``, keyed alike)."""

    result: str              # "accumulate": fp32 for floats, int64 for integers; "extreme": fp32 for
    #                          floats, the input's dtype otherwise; "index": int64; "bool"
    ring: str | None         # the RingReduce that finishes it across cores (None: not split)

    def dtype(self, src: torch.dtype, requested: torch.dtype | None = None) -> torch.dtype:
        if self.result == "index":
            return torch.int64
        if self.result == "bool":
            return torch.bool
        if requested is not None:
            return requested
        if src.is_floating_point:
            return torch.float32
        return torch.int64 if self.result == "accumulate" else src


REDUCTIONS: dict[str, ReductionKind] = {
    "sum": ReductionKind("accumulate", "sum"), "prod": ReductionKind("accumulate", "prod"),
    "max": ReductionKind("extreme", "max"), "min": ReductionKind("extreme", "min"),
    "fmax": ReductionKind("extreme", "fmax"),          # max ignoring NaN (Inductor's two-pass softmax, 2.14+)
    "any": ReductionKind("bool", "any"),
    "argmax": ReductionKind("index", None), "argmin": ReductionKind("index", None),
}
RING_COMBINE = {k: r.ring for k, r in REDUCTIONS.items() if r.ring}


@dataclass(frozen=True)
class Reduce:
    """``out = op over dims of value`` inside one core (keeps the dims, size 1)."""

    out: str
    op: str
    value: str
    dims: tuple[str, ...]
    dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        if isinstance(self.dims, str):
            object.__setattr__(self, "dims", (self.dims,))
        object.__setattr__(self, "dims", tuple(self.dims))

    kind = property(lambda self: f"reduce.{self.op}")
    inputs = property(lambda self: (self.value,))
    outputs = property(lambda self: (self.out,))


@dataclass(frozen=True)
class RingReduce:
    """Combine the per-core partials of ``value`` (a Reduce/Matmul over ``dim``) over the ring.

    If ``dim`` is split across cores, the partial of the core with chunk index j travels to the
    core with index j-1, which combines it with its own and passes it on; the core with index 0
    (the *owner*) ends with the total, and only the owner runs the ops that depend on it. If
    ``dim`` is not split it is the identity.
    """

    out: str
    op: str
    value: str
    dim: str

    kind = property(lambda self: f"ring.{self.op}")
    inputs = property(lambda self: (self.value,))
    outputs = property(lambda self: (self.out,))


Op = Union[Load, Store, Compute, IndexValue, Constant, Matmul, Reduce, RingReduce, SoftmaxMatmul]


# ---------------------------------------------------------------------------------- schedule
@dataclass(frozen=True)
class Split:
    """Split dim ``dim`` over ``parts`` cores. ``chunk``: iterations per core (None: computed at
    launch, rounded up to whole sticks if ``dim`` is a stick dim). ``starts``: explicit first
    iteration of each part (None: ``i * chunk``); only for hand-made (e.g. deliberately broken)
    schedules."""

    dim: str
    parts: int
    chunk: Size | None = None
    starts: tuple[int, ...] | None = None


@dataclass(frozen=True)
class WorkDivision:
    """The splits, outermost first; core id = row-major index over the splits' parts."""

    splits: tuple[Split, ...] = ()

    @property
    def num_cores(self) -> int:
        n = 1
        for s in self.splits:
            n *= s.parts
        return n


@dataclass(frozen=True)
class TilePlan:
    """Tile extent per dim (dims not listed: the core's whole extent). ``double_buffer``: DMA of
    the next tile overlaps compute of this one (None: decided at launch from the scratchpad
    budget)."""

    sizes: tuple[tuple[str, Size], ...] = ()
    double_buffer: bool | None = None

    def get(self, dim: str) -> Size | None:
        for d, s in self.sizes:
            if d == dim:
                return s
        return None


@dataclass(frozen=True, eq=False)
class Program:
    """One kernel for the card. Immutable; identity-hashed (the runtime caches per program)."""

    name: str
    buffers: tuple[Buffer, ...]
    dims: tuple[Dim, ...]
    body: tuple[Op, ...]
    division: WorkDivision | None = None
    tiles: TilePlan | None = None
    scalars: tuple[str, ...] = ()   # size symbols passed explicitly at launch
    source: str = ""                # which compiler made it
    meta: Mapping[str, Any] = field(default_factory=dict)

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise ProgramError(f"program {self.name}: no buffer {name!r}")

    def dim(self, name: str) -> Dim:
        for d in self.dims:
            if d.name == name:
                return d
        raise ProgramError(f"program {self.name}: no dim {name!r}")

    @property
    def dim_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dims)

    @property
    def size_symbols(self) -> tuple[str, ...]:
        names: set[str] = set(self.scalars)
        for b in self.buffers:
            for s in itertools.chain(b.shape, b.strides):
                if not isinstance(s, int):
                    names |= free_names(s)
        for d in self.dims:
            if not isinstance(d.size, int):
                names |= free_names(d.size)
        return tuple(sorted(names))


    def __str__(self) -> str:
        from .printer import format_program
        return format_program(self)

    @functools.cached_property   # writes the instance __dict__ directly: fine on a frozen dataclass
    def analysis(self) -> "Analysis":
        return analyze(self)


# ---------------------------------------------------------------------------------- analysis
@dataclass
class Analysis:
    """Static facts about a program's body (computed once per program)."""

    dims: dict[str, frozenset[str]]        # SSA value -> iteration dims it varies along
    dtypes: dict[str, torch.dtype]         # SSA value -> dtype on the card
    after: dict[str, frozenset[str]]       # SSA value -> reduction dims whose completion it needs
    ring_after: dict[str, frozenset[str]]  # SSA value -> dims of RingReduces it depends on
    producer: dict[str, Op]
    last_use: dict[str, int]               # SSA value -> index of last op using it
    op_after: list[frozenset[str]]         # per op: reduction dims it must wait for
    op_ring: list[frozenset[str]]          # per op: ring dims it depends on
    reduced_dims: frozenset[str]           # dims some Reduce/Matmul reduces over
    ring_dims: frozenset[str]              # dims some RingReduce combines over
    pending: dict[str, frozenset[str]]     # SSA value -> reduced dims not yet combined over the ring
    store_pending: list[frozenset[str]]    # per op: for a Store, the pending dims of what it writes


def _err(p: Program, i: int, op: Any, msg: str) -> ProgramError:
    return ProgramError(f"program {p.name}: op {i} ({getattr(op, 'kind', type(op).__name__)}): {msg}")


def analyze(p: Program) -> Analysis:
    from .ops import OPS, result_dtype  # registry lives next to the semantics

    dimset = set(p.dim_names)
    if len(dimset) != len(p.dims):
        raise ProgramError(f"program {p.name}: duplicate dim names {p.dim_names}")
    bufs = {b.name for b in p.buffers}
    if len(bufs) != len(p.buffers):
        raise ProgramError(f"program {p.name}: duplicate buffer names")
    if dimset & bufs:
        raise ProgramError(f"program {p.name}: names used both as dim and buffer: {sorted(dimset & bufs)}")
    dims: dict[str, frozenset[str]] = {}
    dtypes: dict[str, torch.dtype] = {}
    after: dict[str, frozenset[str]] = {}
    ring_after: dict[str, frozenset[str]] = {}
    producer: dict[str, Op] = {}
    last_use: dict[str, int] = {}
    op_after: list[frozenset[str]] = []
    op_ring: list[frozenset[str]] = []
    reduced: set[str] = set()
    ringed: set[str] = set()
    pending_ring: dict[str, frozenset[str]] = {}   # value -> reduced dims still needing a RingReduce
    written: dict[str, str] = {}
    store_pending: list[frozenset[str]] = []
    sizes_syms = set(p.size_symbols)

    def use(i: int, op: Any, name: str) -> None:
        if name not in dims:
            raise _err(p, i, op, f"uses undefined value {name!r}")
        last_use[name] = i

    def idx_dims(i: int, op: Any, expr: sympy.Expr) -> frozenset[str]:
        out: set[str] = set()
        for n in free_names(expr):
            if n in dimset:
                out.add(n)
            elif n.startswith("%"):
                use(i, op, n)
                if dtypes[n].is_floating_point:
                    raise _err(p, i, op, f"indirect index {n} has float dtype {dtypes[n]}")
                out |= dims[n]
            elif n not in sizes_syms:
                raise _err(p, i, op, f"index {expr} uses unknown symbol {n!r}")
        return frozenset(out)

    for i, op in enumerate(p.body):
        if op.kind not in OPS:
            raise _err(p, i, op, f"unknown op {op.kind!r} (not in vspyre.ir.ops.OPS)")
        for n in op.inputs:
            use(i, op, n)
        ins = [n for n in op.inputs]
        a_after = frozenset().union(*[after[n] for n in ins]) if ins else frozenset()
        a_ring = frozenset().union(*[ring_after[n] for n in ins]) if ins else frozenset()
        a_pend = frozenset().union(*[pending_ring.get(n, frozenset()) for n in ins]) if ins else frozenset()
        in_after = a_after
        if isinstance(op, Load):
            if op.buffer not in bufs:
                raise _err(p, i, op, f"no buffer {op.buffer!r}")
            d = idx_dims(i, op, op.index) | (dims[op.mask] if op.mask else frozenset())
            dt = p.buffer(op.buffer).dtype
            res = {op.out: (d, dt)}
        elif isinstance(op, Store):
            if op.buffer not in bufs:
                raise _err(p, i, op, f"no buffer {op.buffer!r}")
            b = p.buffer(op.buffer)
            if b.role == "in":
                raise _err(p, i, op, f"stores to input-only buffer {b.name}")
            d = idx_dims(i, op, op.index)
            vd = dims[op.value] | (dims[op.mask] if op.mask else frozenset())
            if not vd <= d:
                raise _err(p, i, op, f"value {op.value} varies along {sorted(vd - d)} but the index "
                                     f"{op.index} does not: several iterations would write one element")
            written[op.buffer] = op.value
            res = {}
        elif isinstance(op, IndexValue):
            res = {op.out: (idx_dims(i, op, op.expr), op.dtype)}
        elif isinstance(op, Constant):
            res = {op.out: (frozenset(), op.dtype)}
        elif isinstance(op, Compute):
            arity = OPS[op.op].arity
            if arity is not None and len(op.args) != arity:
                raise _err(p, i, op, f"{op.op} takes {arity} argument(s), got {len(op.args)}")
            d = frozenset().union(*[dims[n] for n in op.inputs]) if op.inputs else frozenset()
            dt = op.dtype or result_dtype(op.op, [dtypes[a] if isinstance(a, str) else a for a in op.args])
            res = {op.out: (d, dt)}
        elif isinstance(op, Matmul):
            if op.dim not in dimset:
                raise _err(p, i, op, f"no dim {op.dim!r}")
            if op.dim not in dims[op.a] or op.dim not in dims[op.b]:
                raise _err(p, i, op, f"both operands must vary along the contraction dim {op.dim}")
            d = (dims[op.a] | dims[op.b]) - {op.dim}
            if op.acc:
                d |= dims[op.acc]
            reduced.add(op.dim)
            res = {op.out: (d, op.dtype)}
            a_after = a_after | {op.dim}
            a_pend = a_pend | {op.dim}
        elif isinstance(op, SoftmaxMatmul):
            if op.dim not in dimset:
                raise _err(p, i, op, f"no dim {op.dim!r}")
            if op.dim not in dims[op.s] or (op.v is not None and op.dim not in dims[op.v]):
                raise _err(p, i, op, f"scores and values must both vary along the key dim {op.dim}")
            d = (dims[op.s] | (dims[op.v] if op.v is not None else frozenset())) - {op.dim}
            reduced.add(op.dim)
            res = {op.out: (d, op.dtype)}
            a_after = a_after | {op.dim}
            a_pend = a_pend | {op.dim}
        elif isinstance(op, Reduce):
            if op.op not in REDUCTIONS:
                raise _err(p, i, op, f"unknown reduction {op.op!r}; one of {tuple(REDUCTIONS)}")
            for dn in op.dims:
                if dn not in dimset:
                    raise _err(p, i, op, f"no dim {dn!r}")
            kind = REDUCTIONS[op.op]
            if kind.result == "index" and len(op.dims) != 1:
                raise _err(p, i, op, f"{op.op} reduces exactly one dim")
            dt = kind.dtype(dtypes[op.value], op.dtype)
            reduced.update(op.dims)
            res = {op.out: (dims[op.value] - set(op.dims), dt)}
            a_after = a_after | set(op.dims)
            a_pend = a_pend | set(op.dims)
        elif isinstance(op, RingReduce):
            prod = producer.get(op.value)
            if not isinstance(prod, (Reduce, Matmul, SoftmaxMatmul)):
                raise _err(p, i, op, f"input {op.value} must be the direct result of a Reduce, Matmul or SoftmaxMatmul")
            pdims = prod.dims if isinstance(prod, Reduce) else (prod.dim,)
            pop = prod.op if isinstance(prod, Reduce) else ("softmax" if isinstance(prod, SoftmaxMatmul) else "sum")
            if op.dim not in pdims:
                raise _err(p, i, op, f"{op.value} is not a reduction over {op.dim}")
            if RING_COMBINE.get(pop, pop if pop == "softmax" else None) != op.op:
                raise _err(p, i, op, f"cannot combine partials of {pop} with ring.{op.op}")
            if op.dim in ring_after[op.value]:
                raise _err(p, i, op, f"a RingReduce over {op.dim} may not depend on another RingReduce over {op.dim}")
            ringed.add(op.dim)
            res = {op.out: (dims[op.value], dtypes[op.value])}
            a_ring = a_ring | {op.dim}
            a_pend = a_pend - {op.dim}
        else:  # pragma: no cover
            raise _err(p, i, op, "unknown op class")
        op_after.append(in_after)
        op_ring.append(a_ring)
        store_pending.append(a_pend if isinstance(op, Store) else frozenset())
        for name, (d, dt) in res.items():
            if name in dims or name in dimset or name in bufs:
                raise _err(p, i, op, f"value {name!r} defined twice (SSA)")
            if not name.startswith("%"):
                raise _err(p, i, op, f"SSA value names start with '%', got {name!r}")
            dims[name], dtypes[name], after[name], ring_after[name] = d, dt, a_after, a_ring
            pending_ring[name] = a_pend
            producer[name] = op
    for b in p.buffers:
        if b.role == "out" and b.name not in written:
            raise ProgramError(f"program {p.name}: output buffer {b.name} is never stored")
    return Analysis(dims, dtypes, after, ring_after, producer, last_use, op_after, op_ring,
                    frozenset(reduced), frozenset(ringed), pending_ring, store_pending)


