"""A small builder for tile programs (compilers and tests use it)::

    b = ProgramBuilder("add_relu")
    x = b.input("x", torch.float16, ("s0", 1024))
    y = b.output("y", torch.float16, ("s0", 1024))
    i, j = b.dim("x0", "s0"), b.dim("x1", 1024)
    v = b.load(x, x.index(i, j))          # element offset 1024*x0 + x1
    b.store(y, y.index(i, j), b.relu(v))
    prog = b.build()

Every vector op of the registry is reachable as ``b.<name>(*args)`` (``b.exp(v)``, ``b.add(v, 1.0)``).
"""

from __future__ import annotations

from typing import Any, Sequence

import sympy
import torch

from .indexing import sym, to_expr
from .ops import OPS
from .program import (Buffer, Compute, Constant, Dim, IndexValue, Load, Matmul, Program, Reduce,
                      RingReduce, SoftmaxMatmul, Split, Store, TilePlan, WorkDivision)

__all__ = ["ProgramBuilder", "BufferRef"]


class BufferRef:
    def __init__(self, buf: Buffer) -> None:
        self.buf = buf
        self.name = buf.name

    def index(self, *idx: Any) -> sympy.Expr:
        """Element offset of ``buf[idx...]`` from its strides (each idx an expression)."""
        if len(idx) != len(self.buf.shape):
            raise ValueError(f"buffer {self.name}: {len(self.buf.shape)} indices needed, got {len(idx)}")
        e = sympy.Integer(0)
        for i, st in zip(idx, self.buf.strides):
            e = e + to_expr(i) * (st if isinstance(st, sympy.Basic) else sympy.Integer(st))
        return e


class ProgramBuilder:
    def __init__(self, name: str, source: str = "builder") -> None:
        self.name = name
        self.source = source
        self.buffers: list[Buffer] = []
        self.dims: list[Dim] = []
        self.body: list = []
        self.scalars: list[str] = []
        self._n = 0
        self.division: WorkDivision | None = None
        self.tiles: TilePlan | None = None
        self.asserts: dict[str, str] = {}     # device_assert value -> its message

    # -- declarations -------------------------------------------------------------------
    def buffer(self, name: str, dtype: torch.dtype, shape: Sequence[Any], strides: Sequence[Any] | None = None,
               role: str = "in", offset: int | None = None) -> BufferRef:
        b = Buffer(name, dtype, tuple(shape), tuple(strides) if strides is not None else None, offset, role)
        self.buffers.append(b)
        return BufferRef(b)

    def input(self, name, dtype, shape, strides=None, offset=None) -> BufferRef:
        return self.buffer(name, dtype, shape, strides, "in", offset)

    def output(self, name, dtype, shape, strides=None, offset=None) -> BufferRef:
        return self.buffer(name, dtype, shape, strides, "out", offset)

    def inout(self, name, dtype, shape, strides=None, offset=None) -> BufferRef:
        return self.buffer(name, dtype, shape, strides, "inout", offset)

    def dim(self, name: str, size: Any, kind: str = "parallel") -> sympy.Symbol:
        self.dims.append(Dim(name, size, kind))
        return sym(name)

    def rdim(self, name: str, size: Any) -> sympy.Symbol:
        return self.dim(name, size, "reduction")

    def scalar(self, name: str) -> sympy.Symbol:
        self.scalars.append(name)
        return sym(name)

    def divide(self, *splits: tuple) -> "ProgramBuilder":
        """``b.divide(("x0", 32))`` or ``b.divide(("x0", 4), ("r0", 8, 64))`` (dim, parts[, chunk])."""
        self.division = WorkDivision(tuple(Split(*s) for s in splits))
        return self

    def tile(self, double_buffer: bool | None = None, **sizes: Any) -> "ProgramBuilder":
        self.tiles = TilePlan(tuple(sizes.items()), double_buffer)
        return self

    # -- ops ------------------------------------------------------------------------------
    def _new(self, hint: str = "t") -> str:
        self._n += 1
        return f"%{hint}{self._n}"

    def load(self, buf: BufferRef | str, index: Any, mask: str | None = None, other: Any = 0) -> str:
        out = self._new("ld")
        self.body.append(Load(out, buf if isinstance(buf, str) else buf.name, to_expr(index), mask, other))
        return out

    def store(self, buf: BufferRef | str, index: Any, value: str, mask: str | None = None) -> None:
        self.body.append(Store(buf if isinstance(buf, str) else buf.name, to_expr(index), value, mask))

    def compute(self, op: str, *args: Any, dtype: torch.dtype | None = None) -> str:
        if op not in OPS or OPS[op].unit not in ("vector",) or op.startswith(("reduce.", "ring.")) or op == "index":
            raise ValueError(f"{op!r} is not a vector op of vspyre.ir.ops.OPS")
        out = self._new("v")
        self.body.append(Compute(out, op, tuple(args), dtype))
        return out

    def to(self, value: str, dtype: torch.dtype) -> str:
        return self.compute("to", value, dtype=dtype)

    def device_assert(self, cond: str, msg: str) -> str:
        """``cond`` passed through; the kernel fails with ``msg`` where an element is false."""
        out = self.compute("device_assert", cond)
        self.asserts[out] = msg
        return out

    def index_value(self, expr: Any, dtype: torch.dtype = torch.int64) -> str:
        out = self._new("ix")
        self.body.append(IndexValue(out, to_expr(expr), dtype))
        return out

    def const(self, value: Any, dtype: torch.dtype = torch.float32) -> str:
        out = self._new("c")
        self.body.append(Constant(out, value, dtype))
        return out

    def matmul(self, a: str, b: str, dim: Any, acc: str | None = None, dtype: torch.dtype = torch.float32) -> str:
        """``sum over dim of a * b`` on the systolic array; ``dtype`` is the accumulator's (fp32, or
        int64 for integer operands: exact)."""
        out = self._new("mm")
        self.body.append(Matmul(out, a, b, str(dim), acc, dtype))
        return out

    def softmax_matmul(self, s: str, v: str | None, dim: Any, zero_empty: bool = False) -> str:
        """``sum over dim of softmax_dim(s) * v`` (attention's softmax and second product, online);
        with ``v=None`` the log-sum-exp of ``s`` over ``dim``."""
        out = self._new("att")
        self.body.append(SoftmaxMatmul(out, s, v, str(dim), zero_empty))
        return out

    def reduce(self, op: str, value: str, dims: Any, dtype: torch.dtype | None = None) -> str:
        if not isinstance(dims, (tuple, list)):
            dims = (dims,)
        out = self._new("red")
        self.body.append(Reduce(out, op, value, tuple(str(d) for d in dims), dtype))
        return out

    def ring_reduce(self, op: str, value: str, dim: Any) -> str:
        out = self._new("ring")
        self.body.append(RingReduce(out, op, value, str(dim)))
        return out

    def __getattr__(self, name: str):
        if name in OPS and OPS[name].unit == "vector" and OPS[name].fn is not None:
            return lambda *args, dtype=None: self.compute(name, *args, dtype=dtype)
        raise AttributeError(name)

    def build(self, ring: bool = True, **meta: Any) -> Program:
        """The program, validated (errors name the program and the op). ``ring``: after every
        reduction that could be split over cores (a single-dim sum/prod/max/min/any, a matmul
        without accumulator, an attention product, whose input depends on no ring reduction over
        the same dim), insert the
        ``RingReduce`` that would combine the per-core partials; it is the identity unless the
        planner splits that dim (a long contraction on few output tiles: decode, P@V)."""
        body = tuple(self.body)
        if self.asserts:
            meta = {**meta, "asserts": dict(self.asserts)}
        p = Program(self.name, tuple(self.buffers), tuple(self.dims), body, self.division, self.tiles,
                    tuple(self.scalars), self.source, meta)
        p.analysis
        if ring:
            body = with_ring_reductions(p)
            if body is not p.body:
                p = Program(self.name, p.buffers, p.dims, body, self.division, self.tiles, p.scalars, self.source, meta)
                p.analysis
        return p


def with_ring_reductions(p: Program) -> tuple:
    """``p.body`` with a RingReduce after every reduction that may be split over cores (see
    ``ProgramBuilder.build``); later uses read the combined value."""
    ringed = {op.value for op in p.body if isinstance(op, RingReduce)}
    rename: dict[str, str] = {}
    out: list = []
    changed = False
    tainted: dict[str, frozenset[str]] = {}     # value -> dims of the ring reductions it depends on
    for op in p.body:
        if rename:
            op = _renamed(op, rename)
        out.append(op)
        dep = frozenset().union(*[tainted.get(n, frozenset()) for n in op.inputs]) if op.inputs else frozenset()
        if isinstance(op, RingReduce):
            dep = dep | {op.dim}
        for n in op.outputs:
            tainted[n] = dep
        # a reduction over one dim with a ring combine (a matmul without an accumulator to add)
        if len(op.reduces) != 1 or op.ring_combine is None or getattr(op, "acc", None) is not None:
            continue
        (dim,), kind, name = op.reduces, op.ring_combine, op.outputs[0]
        if name in ringed or dim in tainted[name]:
            continue
        new = f"{name}_ring"
        out.append(RingReduce(new, kind, name, dim))
        tainted[new] = tainted[name] | {dim}
        rename[name] = new
        changed = True
    return tuple(out) if changed else p.body


def _renamed(op: Any, rename: dict[str, str]) -> Any:
    import dataclasses

    subs = {sym(k): sym(v) for k, v in rename.items()}
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(op):
        v = getattr(op, f.name)
        if f.name in ("out",):
            continue
        if isinstance(v, str) and v in rename:
            changes[f.name] = rename[v]
        elif isinstance(v, tuple) and f.name == "args":
            changes[f.name] = tuple(rename.get(a, a) if isinstance(a, str) else a for a in v)
        elif isinstance(v, sympy.Basic) and v.free_symbols & set(subs):
            changes[f.name] = v.xreplace(subs)
    return dataclasses.replace(op, **changes) if changes else op
