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
from typing import Any, Callable, Mapping, Union

import sympy
import torch

from .indexing import compile_expr, free_names, sym, to_expr

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
#
# Each op kind is one class holding everything about it: its operands (``inputs``/``outputs``),
# its analysis (``analyze``: the dims and dtype of what it defines, and its checks), its text
# (``text``), its *fast* form (``fast``: a step over the whole iteration space, built once per
# launch shape) and its *tile* form (``tile``: one tile on one core, as the checked executor runs
# the schedule). Their value semantics (what a load holds, gathers and scatters, the vector ops,
# the reductions) are ``vspyre.ir.ops``'s, shared by both forms. The executors only walk programs
# (whole space, or cores, tiles and rings) and call these.
#
# The forms get the executor's context: ``fx`` (fast) has ``p, an, names, ndim, ar, box, spans,
# bidx`` and ``index_of(expr)``, ``view(op)``, ``subst(expr)``, ``axes(value)``; ``tx`` (tile) has
# ``p, an, names, ndim, hosts, spans, bidx`` and ``index(i, env, ar)``, ``subst(expr)``,
# ``axes(value)``, ``read_check(i, op, span, tile)``, ``write_check(i, op, span, tile)``.

STATE = "#state:"     # env key prefix of a reduction's raw partial state (tile form)


def _sem():
    """The value semantics (``vspyre.ir.ops``, which imports this module)."""
    from . import ops
    return ops


def _arg_text(a) -> str:
    return a if isinstance(a, str) else repr(a)


class _Kind:
    """What every op kind shares: no reduction, no ring combine."""

    reduces: frozenset = frozenset()      # iteration dims this op reduces over
    combines: frozenset = frozenset()     # dims whose per-core partials this op combines (ring)
    ring_combine: str | None = None       # the RingReduce that combines its per-core partials


@dataclass(frozen=True)
class Load(_Kind):
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

    def analyze(self, sc: "_Scope") -> dict:
        sc.need_buffer(self.buffer)
        d = sc.idx_dims(self.index) | (sc.dims[self.mask] if self.mask else frozenset())
        return {self.out: (d, sc.p.buffer(self.buffer).dtype)}

    def text(self) -> str:
        m = f" mask={self.mask} other={self.other!r}" if self.mask else ""
        return f"{self.out} = load {self.buffer}[{self.index}]{m}"

    def fast(self, i: int, fx) -> Callable:
        S = _sem()
        bi = fx.bidx[self.buffer]
        out, mask, other, view = self.out, self.mask, self.other, fx.view(self)
        if view is not None and mask is None:            # a strided view of the buffer: no copy
            vshape, vstr, const = view
            clone = fx.p.buffers[bi].role != "in"

            def step(env, H):
                t = H[bi]
                env[out] = S.host_value(t.as_strided(vshape, vstr, t.storage_offset() + const), clone)
            return step
        span, index_of = fx.spans[bi], fx.index_of(self.index)

        def step(env, H):
            env[out] = S.gather(S.flat(H[bi], span), index_of(env), env[mask] if mask else None, other)
        return step

    def tile(self, i: int, tx, env: dict, ar: dict, tile, states: dict) -> None:
        S = _sem()
        bi = tx.bidx[self.buffer]
        span = tx.spans[bi]
        env[self.out] = S.gather(S.flat(tx.hosts[bi], span), tx.index(i, env, ar),
                                 env[self.mask] if self.mask else None, self.other,
                                 tx.read_check(i, self, span, tile))


@dataclass(frozen=True)
class Store(_Kind):
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

    def analyze(self, sc: "_Scope") -> dict:
        sc.need_buffer(self.buffer)
        b = sc.p.buffer(self.buffer)
        if b.role == "in":
            raise sc.err(f"stores to input-only buffer {b.name}")
        d = sc.idx_dims(self.index)
        vd = sc.dims[self.value] | (sc.dims[self.mask] if self.mask else frozenset())
        if not vd <= d:
            raise sc.err(f"value {self.value} varies along {sorted(vd - d)} but the index "
                         f"{self.index} does not: several iterations would write one element")
        sc.written[self.buffer] = self.value
        return {}

    def text(self) -> str:
        m = f" mask={self.mask}" if self.mask else ""
        return f"store {self.buffer}[{self.index}] <- {self.value}{m}"

    def fast(self, i: int, fx) -> Callable:
        from .. import numerics
        S = _sem()
        bi = fx.bidx[self.buffer]
        dtype = fx.p.buffers[bi].dtype
        value, mask, view = self.value, self.mask, fx.view(self, store=True)
        if view is not None:                              # a strided view, written in place
            vshape, vstr, const = view

            def step(env, H):
                t = H[bi]
                dst = t.as_strided(vshape, vstr, t.storage_offset() + const)
                val = env[value]
                if val.dtype != dtype or dtype == torch.float16:
                    val = numerics.store_cast(val, dtype)
                if mask is not None:
                    val = torch.where(env[mask], val, dst)
                dst.copy_(val)
            return step
        span, index_of = fx.spans[bi], fx.index_of(self.index)

        def step(env, H):
            S.scatter(S.flat(H[bi], span), index_of(env), numerics.store_cast(env[value], dtype),
                      env[mask] if mask else None)
        return step

    def tile(self, i: int, tx, env: dict, ar: dict, tile, states: dict) -> None:
        from .. import numerics
        S = _sem()
        bi = tx.bidx[self.buffer]
        span = tx.spans[bi]
        S.scatter(S.flat(tx.hosts[bi], span), tx.index(i, env, ar),
                  numerics.store_cast(env[self.value], tx.p.buffers[bi].dtype),
                  env[self.mask] if self.mask else None, tx.write_check(i, self, span, tile))


@dataclass(frozen=True)
class Compute(_Kind):
    """``out = op(*args)`` on the vector unit; ``op`` names a registry entry (``vspyre.ir.ops``)."""

    out: str
    op: str
    args: tuple[Any, ...]
    dtype: torch.dtype | None = None   # result dtype; None: the registry's rule

    kind = property(lambda self: self.op)
    inputs = property(lambda self: tuple(a for a in self.args if isinstance(a, str)))
    outputs = property(lambda self: (self.out,))

    def analyze(self, sc: "_Scope") -> dict:
        S = _sem()
        arity = S.OPS[self.op].arity
        if arity is not None and len(self.args) != arity:
            raise sc.err(f"{self.op} takes {arity} argument(s), got {len(self.args)}")
        d = frozenset().union(*[sc.dims[n] for n in self.inputs]) if self.inputs else frozenset()
        dt = self.dtype or S.result_dtype(self.op, [sc.dtypes[a] if isinstance(a, str) else a for a in self.args])
        return {self.out: (d, dt)}

    def text(self) -> str:
        from .printer import dtype_name
        extra = f" -> {dtype_name(self.dtype)}" if self.op == "to" and self.dtype is not None else ""
        return f"{self.out} = {self.op}({', '.join(_arg_text(a) for a in self.args)}){extra}"

    def fn(self, an: "Analysis") -> Callable:
        """Its host function (``ir.ops.compute_fn`` for its result dtype)."""
        return _sem().compute_fn(self, an.dtypes[self.out])

    def fast(self, i: int, fx) -> Callable:
        S = _sem()
        an, out = fx.an, self.out
        f = self.fn(an)
        getters = [a if isinstance(a, str) else S.const_value(a, fx.ndim) for a in self.args]
        a0 = self.args[0] if self.args else None
        prod = an.producer.get(a0) if isinstance(a0, str) else None
        # the first argument is a temporary that dies here: compute into its storage
        reuse = (self.op in S.INPLACE and isinstance(prod, Compute)
                 and prod.op not in ("identity", "to")               # those may alias a buffer
                 and an.last_use.get(a0) == i and self.args.count(a0) == 1
                 and an.dtypes[a0].is_floating_point and an.dtypes[out].is_floating_point)
        if reuse and len(self.args) <= 2:
            meth = S.INPLACE[self.op]
            other = self.args[1] if len(self.args) == 2 else None
            o = other if isinstance(other, str) or other is None else float(other)

            def step(env, H):
                x = env[a0]
                if o is None:
                    env[out] = getattr(x, meth)()
                    return
                y = env[o] if isinstance(o, str) else o
                if x.dtype == torch.float32 and (not isinstance(y, torch.Tensor) or (
                        y.dtype == torch.float32 and torch.broadcast_shapes(x.shape, y.shape) == x.shape)):
                    env[out] = getattr(x, meth)(y)
                else:
                    env[out] = f(x, env[getters[1]] if isinstance(getters[1], str) else getters[1])
            return step
        if len(getters) == 1 and isinstance(getters[0], str):
            g0 = getters[0]

            def step(env, H):
                env[out] = f(env[g0])
            return step
        if len(getters) == 2:
            g0, g1 = getters
            s0, s1 = isinstance(g0, str), isinstance(g1, str)

            def step(env, H):
                env[out] = f(env[g0] if s0 else g0, env[g1] if s1 else g1)
            return step

        def step(env, H):
            env[out] = f(*[env[a] if isinstance(a, str) else a for a in getters])
        return step

    def tile(self, i: int, tx, env: dict, ar: dict, tile, states: dict) -> None:
        S = _sem()
        env[self.out] = self.fn(tx.an)(*[env[a] if isinstance(a, str) else S.const_value(a, tx.ndim)
                                         for a in self.args])


@dataclass(frozen=True)
class IndexValue(_Kind):
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

    def analyze(self, sc: "_Scope") -> dict:
        return {self.out: (sc.idx_dims(self.expr), self.dtype)}

    def text(self) -> str:
        return f"{self.out} = index({self.expr})"

    def _eval(self, fn: Callable, ar: dict, env: dict, ndim: int) -> torch.Tensor:
        S = _sem()
        return S._cast_fn(self.dtype)(S.eval_index(fn, ar, env, self.inputs, ndim))

    def fast(self, i: int, fx) -> Callable:
        fn, out, ndim, ar = compile_expr(fx.subst(self.expr)), self.out, fx.ndim, fx.ar
        if self.inputs:       # the expression reads SSA values: evaluated per launch
            def step(env, H):
                env[out] = self._eval(fn, ar, env, ndim)
            return step
        v = self._eval(fn, ar, {}, ndim)

        def step(env, H):
            env[out] = v
        return step

    def tile(self, i: int, tx, env: dict, ar: dict, tile, states: dict) -> None:
        env[self.out] = self._eval(compile_expr(tx.subst(self.expr)), ar, env, tx.ndim)


@dataclass(frozen=True)
class Constant(_Kind):
    out: str
    value: Scalar
    dtype: torch.dtype = torch.float32

    kind = property(lambda self: "constant")
    inputs = property(lambda self: ())
    outputs = property(lambda self: (self.out,))

    def analyze(self, sc: "_Scope") -> dict:
        return {self.out: (frozenset(), self.dtype)}

    def text(self) -> str:
        return f"{self.out} = constant({self.value!r})"

    def _value(self, ndim: int) -> torch.Tensor:
        S = _sem()
        return S._cast_fn(self.dtype)(S.const_value(self.value, ndim))

    def fast(self, i: int, fx) -> Callable:
        v, out = self._value(fx.ndim), self.out

        def step(env, H):
            env[out] = v
        return step

    def tile(self, i: int, tx, env: dict, ar: dict, tile, states: dict) -> None:
        env[self.out] = self._value(tx.ndim)


class _Reduction(_Kind):
    """A reduction over iteration dims: its tile form keeps one partial state per tile of the dims
    it does not reduce, combines the partials of successive tiles and finishes them; the ring
    combines the partials of the cores (``state_fns``)."""

    def state_fns(self) -> tuple[Callable, Callable]:
        """(combine two partial states, finish a state into the value)."""
        return torch.add, (lambda st: st)

    def partial(self, tx, env: dict, tile) -> Any:
        raise NotImplementedError

    def finished(self, val: torch.Tensor, env: dict) -> torch.Tensor:
        return val

    def tile(self, i: int, tx, env: dict, ar: dict, tile, states: dict) -> None:
        combine, finish = self.state_fns()
        part = self.partial(tx, env, tile)
        key = (i, tuple(r for d, r in zip(tx.names, tile) if d not in self.reduces))
        states[key] = combine(states[key], part) if key in states else part
        env[STATE + self.out] = states[key]
        env[self.out] = self.finished(finish(states[key]), env)


@dataclass(frozen=True)
class Matmul(_Reduction):
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
    reduces = property(lambda self: frozenset({self.dim}))
    ring_combine = "sum"

    def analyze(self, sc: "_Scope") -> dict:
        sc.need_dim(self.dim)
        if self.dim not in sc.dims[self.a] or self.dim not in sc.dims[self.b]:
            raise sc.err(f"both operands must vary along the contraction dim {self.dim}")
        d = (sc.dims[self.a] | sc.dims[self.b]) - {self.dim}
        if self.acc:
            d |= sc.dims[self.acc]
        return {self.out: (d, self.dtype)}

    def text(self) -> str:
        acc = f" + {self.acc}" if self.acc else ""
        return f"{self.out} = matmul({self.a}, {self.b}) over {self.dim}{acc}"

    def _product(self, ctx, env: dict) -> torch.Tensor:
        return _sem()._matmul_eval(env[self.a], env[self.b], ctx.axes(self.a), ctx.axes(self.b),
                                   ctx.names.index(self.dim), ctx.ndim)

    def finished(self, val: torch.Tensor, env: dict) -> torch.Tensor:
        return val + env[self.acc] if self.acc else val

    def fast(self, i: int, fx) -> Callable:
        mm, axes_a, axes_b = _sem()._matmul_eval, fx.axes(self.a), fx.axes(self.b)
        k, ndim = fx.names.index(self.dim), fx.ndim
        out, a, b, acc = self.out, self.a, self.b, self.acc

        def step(env, H):
            r = mm(env[a], env[b], axes_a, axes_b, k, ndim)
            env[out] = r + env[acc] if acc else r
        return step

    def partial(self, tx, env: dict, tile) -> Any:
        return self._product(tx, env)


@dataclass(frozen=True)
class SoftmaxMatmul(_Reduction):
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
    reduces = property(lambda self: frozenset({self.dim}))
    ring_combine = "softmax"

    def analyze(self, sc: "_Scope") -> dict:
        sc.need_dim(self.dim)
        if self.dim not in sc.dims[self.s] or (self.v is not None and self.dim not in sc.dims[self.v]):
            raise sc.err(f"scores and values must both vary along the key dim {self.dim}")
        d = (sc.dims[self.s] | (sc.dims[self.v] if self.v is not None else frozenset())) - {self.dim}
        return {self.out: (d, self.dtype)}

    def text(self) -> str:
        if self.v is None:
            return f"{self.out} = logsumexp({self.s}) over {self.dim} (online)"
        z = " (all -inf rows: 0)" if self.zero_empty else ""
        return f"{self.out} = softmax_matmul({self.s}, {self.v}) over {self.dim}{z}"

    def state_fns(self) -> tuple[Callable, Callable]:
        sm = _sem().SOFTMAX_MATMUL
        return sm.combine, (lambda st: sm.finish(st, self))

    def partial(self, ctx, env: dict, tile=None) -> Any:
        return _sem().SOFTMAX_MATMUL.partial(env[self.s], env[self.v] if self.v else None, ctx.axes(self.s),
                                             ctx.axes(self.v) if self.v else [], ctx.names.index(self.dim),
                                             ctx.ndim)

    def fast(self, i: int, fx) -> Callable:
        finish = self.state_fns()[1]

        def step(env, H):
            env[self.out] = finish(self.partial(fx, env))
        return step


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
class Reduce(_Reduction):
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
    reduces = property(lambda self: frozenset(self.dims))
    ring_combine = property(lambda self: RING_COMBINE.get(self.op))

    def analyze(self, sc: "_Scope") -> dict:
        if self.op not in REDUCTIONS:
            raise sc.err(f"unknown reduction {self.op!r}; one of {tuple(REDUCTIONS)}")
        for dn in self.dims:
            sc.need_dim(dn)
        kind = REDUCTIONS[self.op]
        if kind.result == "index" and len(self.dims) != 1:
            raise sc.err(f"{self.op} reduces exactly one dim")
        return {self.out: (sc.dims[self.value] - set(self.dims), kind.dtype(sc.dtypes[self.value], self.dtype))}

    def text(self) -> str:
        return f"{self.out} = reduce.{self.op}({self.value}) over {', '.join(self.dims)}"

    def state_fns(self) -> tuple[Callable, Callable]:
        impl = _sem().REDUCE_IMPL[self.op]
        return impl.combine, impl.finish

    @staticmethod
    def _expanded(x: torch.Tensor, axes: tuple[int, ...], extents: list[int]) -> torch.Tensor:
        """``x`` at its full extent along the reduced axes (a value constant along one is broadcast)."""
        if any(x.shape[a] != extents[a] for a in axes):
            shape = list(x.shape)
            for a in axes:
                shape[a] = extents[a]
            x = x.expand(shape)
        return x

    def fast(self, i: int, fx) -> Callable:
        impl = _sem().REDUCE_IMPL[self.op]
        axes, box, out, value = tuple(fx.names.index(d) for d in self.dims), fx.box, self.out, self.value

        def step(env, H):
            env[out] = impl.finish(impl.partial(self._expanded(env[value], axes, box), axes, 0))
        return step

    def partial(self, tx, env: dict, tile) -> Any:
        axes = tuple(tx.names.index(d) for d in self.dims)
        x = self._expanded(env[self.value], axes, [b - a for a, b in tile])
        return _sem().REDUCE_IMPL[self.op].partial(x, axes, tile[axes[0]][0])


@dataclass(frozen=True)
class RingReduce(_Kind):
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
    combines = property(lambda self: frozenset({self.dim}))

    def analyze(self, sc: "_Scope") -> dict:
        prod = sc.producer.get(self.value)
        if not isinstance(prod, _Reduction):
            raise sc.err(f"input {self.value} must be the direct result of a Reduce, Matmul or SoftmaxMatmul")
        if self.dim not in prod.reduces:
            raise sc.err(f"{self.value} is not a reduction over {self.dim}")
        if prod.ring_combine != self.op:
            raise sc.err(f"cannot combine partials of {prod.kind} with ring.{self.op}")
        if self.dim in sc.ring_after[self.value]:
            raise sc.err(f"a RingReduce over {self.dim} may not depend on another RingReduce over {self.dim}")
        return {self.out: (sc.dims[self.value], sc.dtypes[self.value])}

    def text(self) -> str:
        return f"{self.out} = ring.{self.op}({self.value}) over {self.dim}"

    def fast(self, i: int, fx) -> Callable:
        out, value = self.out, self.value

        def step(env, H):       # the whole reduction was done in one piece
            env[out] = env[value]
        return step

    def tile(self, i: int, tx, env: dict, ar: dict, tile, states: dict) -> None:
        env[self.out] = env[self.value]   # combined by the executor when the dim is split
        if STATE + self.value in env:
            env[STATE + self.out] = env[STATE + self.value]


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


@dataclass
class _Scope:
    """What an op kind's ``analyze`` sees: the values defined so far, and the op being analysed."""

    p: Program
    dims: dict[str, frozenset[str]]
    dtypes: dict[str, torch.dtype]
    ring_after: dict[str, frozenset[str]]
    producer: dict[str, Any]
    last_use: dict[str, int]
    written: dict[str, str]
    dimset: frozenset[str]
    bufs: frozenset[str]
    sizes: frozenset[str]
    i: int = 0
    op: Any = None

    def err(self, msg: str) -> ProgramError:
        return _err(self.p, self.i, self.op, msg)

    def use(self, name: str) -> None:
        if name not in self.dims:
            raise self.err(f"uses undefined value {name!r}")
        self.last_use[name] = self.i

    def need_buffer(self, name: str) -> None:
        if name not in self.bufs:
            raise self.err(f"no buffer {name!r}")

    def need_dim(self, name: str) -> None:
        if name not in self.dimset:
            raise self.err(f"no dim {name!r}")

    def idx_dims(self, expr: sympy.Expr) -> frozenset[str]:
        """The iteration dims an index expression varies along (through the SSA values it reads)."""
        out: set[str] = set()
        for n in free_names(expr):
            if n in self.dimset:
                out.add(n)
            elif n.startswith("%"):
                self.use(n)
                if self.dtypes[n].is_floating_point:
                    raise self.err(f"indirect index {n} has float dtype {self.dtypes[n]}")
                out |= self.dims[n]
            elif n not in self.sizes:
                raise self.err(f"index {expr} uses unknown symbol {n!r}")
        return frozenset(out)


def analyze(p: Program) -> Analysis:
    from .ops import OPS  # registry lives next to the semantics

    dimset = set(p.dim_names)
    if len(dimset) != len(p.dims):
        raise ProgramError(f"program {p.name}: duplicate dim names {p.dim_names}")
    bufs = {b.name for b in p.buffers}
    if len(bufs) != len(p.buffers):
        raise ProgramError(f"program {p.name}: duplicate buffer names")
    if dimset & bufs:
        raise ProgramError(f"program {p.name}: names used both as dim and buffer: {sorted(dimset & bufs)}")
    sc = _Scope(p, {}, {}, {}, {}, {}, {}, frozenset(dimset), frozenset(bufs), frozenset(p.size_symbols))
    dims, dtypes, ring_after, producer = sc.dims, sc.dtypes, sc.ring_after, sc.producer
    after: dict[str, frozenset[str]] = {}
    op_after: list[frozenset[str]] = []
    op_ring: list[frozenset[str]] = []
    reduced: set[str] = set()
    ringed: set[str] = set()
    pending_ring: dict[str, frozenset[str]] = {}   # value -> reduced dims still needing a RingReduce
    store_pending: list[frozenset[str]] = []

    for i, op in enumerate(p.body):
        sc.i, sc.op = i, op
        if not isinstance(op, _Kind):
            raise _err(p, i, op, "unknown op class")
        if op.kind not in OPS:
            raise _err(p, i, op, f"unknown op {op.kind!r} (not in vspyre.ir.ops.OPS)")
        ins = op.inputs
        for n in ins:
            sc.use(n)
        in_after = frozenset().union(*[after[n] for n in ins]) if ins else frozenset()
        a_ring = frozenset().union(*[ring_after[n] for n in ins]) if ins else frozenset()
        a_pend = frozenset().union(*[pending_ring.get(n, frozenset()) for n in ins]) if ins else frozenset()
        res = op.analyze(sc)
        # a reduction's result waits for its dims and is pending until a ring combines them
        reduced |= op.reduces
        ringed |= op.combines
        a_after = in_after | op.reduces
        a_pend = (a_pend | op.reduces) - op.combines
        a_ring = a_ring | op.combines
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
        if b.role == "out" and b.name not in sc.written:
            raise ProgramError(f"program {p.name}: output buffer {b.name} is never stored")
    return Analysis(dims, dtypes, after, ring_after, producer, sc.last_use, op_after, op_ring,
                    frozenset(reduced), frozenset(ringed), pending_ring, store_pending)


