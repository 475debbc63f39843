"""The standalone compiler's kernel generators: one tile program per (pattern, shapes, dtypes).

Every generator takes hashable *specs* and is memoised (``functools.lru_cache``), so a program is
built once per op pattern and shape and then only launched. A tensor spec is
``TSpec = (dtype, shape, strides)`` with concrete ints (a kernel is specialised to its shapes,
the way vendor graph compilers specialise).

Pointwise work is written as a small *expression* (nested tuples) over leaves:

* ``("in", i)``  - extra input ``i`` broadcast to the kernel's output shape;
* ``("acc",)``   - a matmul's accumulator (matmul epilogues);
* ``("x",)``     - the row value (softmax / norm prologues);
* ``("c", v)``   - an immediate;
* ``(op, *args)`` - any vector op of ``vspyre.ir.ops.OPS`` (``add``, ``exp``, ``where``...);
* ``("to", dtype, arg)`` - a cast.

All generated programs leave work division and tiling to the shared planner
(``vspyre.ir.planning``) at launch, which picks the legal division with the lowest estimate.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from ..hardware import fp8_dtypes
from ..ir import ProgramBuilder
from ..ir import library
from ..ir.program import REDUCTIONS, Program
from ..ir.ops import OPS, result_dtype

SOURCE = "standalone"
TSpec = tuple  # (dtype, shape tuple, strides tuple)


def spec(t: torch.Tensor) -> TSpec:
    return (t.dtype, tuple(t.shape), tuple(t.stride()))


def _bstrides(s: TSpec, out_shape: tuple[int, ...]) -> list[int]:
    """Strides of ``s`` broadcast (right-aligned) to ``out_shape`` (0 along broadcast dims)."""
    _, shape, strides = s
    off = len(out_shape) - len(shape)
    if off < 0:
        raise ValueError(f"cannot broadcast shape {shape} to {out_shape}")
    res = []
    for d in range(len(out_shape)):
        j = d - off
        if j < 0 or shape[j] == 1:
            res.append(0)
        else:
            if shape[j] != out_shape[d]:
                raise ValueError(f"cannot broadcast shape {shape} to {out_shape}")
            res.append(strides[j])
    return res


def _index(strides: list[int], dims: list[Any]):
    e = 0
    for st, d in zip(strides, dims):
        if st:
            e = e + st * d
    return e


def _kind(dt: torch.dtype) -> str:
    return "b" if dt == torch.bool else ("f" if dt.is_floating_point else "i")


class _Emitter:
    """Turns an expression into builder calls (each distinct sub-expression once)."""

    def __init__(self, b: ProgramBuilder, leaves: dict[Any, str], leaf_dtypes: dict[Any, torch.dtype]):
        self.b, self.leaves, self.leaf_dtypes = b, leaves, leaf_dtypes
        self.memo: dict[Any, Any] = {}
        self.kinds: dict[Any, str] = {}

    def __call__(self, e: Any) -> Any:
        if not isinstance(e, tuple):
            return e
        if e in self.memo:
            return self.memo[e]
        head = e[0]
        b = self.b
        if head in ("in", "acc", "x", "idx"):
            v = self.leaves[e]
            k = _kind(self.leaf_dtypes[e])
        elif head == "c":
            v, k = e[1], _kind_of(e[1])
        elif head == "to":
            dt = e[1]
            arg = self(e[2])
            if self.kind(e[2]) == _kind(dt) and _kind(dt) != "i" and dt not in fp8_dtypes():
                v = arg                      # float->float: the card keeps fp32, rounds at store
                # (a cast to fp8 is a quantisation: it rounds and saturates where it is written)
            elif isinstance(arg, (int, float)):
                v = float(arg) if dt.is_floating_point else arg
            else:
                v = b.to(arg, dt)
            k = _kind(dt)
        else:
            args = [self(a) for a in e[1:]]
            if all(not isinstance(a, str) for a in args):   # fold immediates
                v = _fold(head, args)
                k = _kind_of(v)
            else:
                v = b.compute(head, *args)
                k = _result_kind(head, [self.kind(a) for a in e[1:]])
        self.memo[e] = v
        self.kinds[e] = k
        return v

    def kind(self, e: Any) -> str:
        if not isinstance(e, tuple):
            return _kind_of(e)
        if e not in self.kinds:
            self(e)
        return self.kinds[e]


_KIND_DTYPE = {"f": torch.float32, "i": torch.int64, "b": torch.bool}


def _result_kind(op: str, kinds: list[str]) -> str:
    """Kind of ``op``'s result: the registry's result rule (``ir.ops.result_dtype``)."""
    return _kind(result_dtype(op, [_KIND_DTYPE[k] for k in kinds]))


def _fold(op: str, args: list) -> Any:
    """Fold an op over immediates with the registry's own semantics, in the card's compute dtypes
    (fp32, int64, bool): ``sqrt(-1)`` is nan, ``log(0)`` -inf, ``1/0`` inf, as on the card."""
    if op not in OPS:
        raise NotImplementedError(f"standalone: no registry op {op!r} to fold")
    vals = [torch.tensor(a, dtype=_KIND_DTYPE[_kind_of(a)]) for a in args]
    return OPS[op].fn(*vals).item()


def _kind_of(v: Any) -> str:
    return "b" if isinstance(v, bool) else ("f" if isinstance(v, float) else "i")


def _store(b: ProgramBuilder, em: _Emitter, out, index, expr, dtype: torch.dtype) -> None:
    v = em(expr)
    if not isinstance(v, str):   # a constant result: materialise it
        v = b.const(v, dtype if not dtype.is_floating_point else torch.float32)
    elif em.kind(expr) != _kind(dtype):
        v = b.to(v, dtype)
    b.store(out, index, v)


def _leaves(expr: Any, head: str) -> set[int]:
    found: set[int] = set()

    def walk(e):
        if isinstance(e, tuple) and e:
            if e[0] == head:
                found.add(e[1])
            elif e[0] not in ("c",):
                for a in e[1:]:
                    walk(a)
    walk(expr)
    return found


def _recip(b: ProgramBuilder, n: Any) -> Any:
    """``1 / n`` for a size ``n``: an immediate when ``n`` is a number, a program value when it is a
    size symbol (eager kernels keep sizes symbolic, bound at launch)."""
    if isinstance(n, int) or getattr(n, "is_number", False):
        return 1.0 / int(n)
    return b.reciprocal(b.to(b.index_value(n), torch.float32))


def _pdims(b: ProgramBuilder, shape: tuple[int, ...], prefix: str = "x") -> list:
    return [b.dim(f"{prefix}{i}", n) for i, n in enumerate(shape)]


# ------------------------------------------------------------------------------ pointwise
@functools.lru_cache(maxsize=4096)
def pointwise(name: str, out: TSpec, ins: tuple[TSpec, ...], expr: Any) -> Program:
    """out[idx] = expr(ins broadcast to out's shape)."""
    b = ProgramBuilder(name, source=SOURCE)
    odt, oshape, ostr = out
    bufs = [b.input(f"in{i}", s[0], s[1], s[2]) for i, s in enumerate(ins)]
    ob = b.output("out", odt, oshape, ostr)
    dims = _pdims(b, oshape)
    leaves, ldt = {}, {}
    for i in sorted(_leaves(expr, "in")):
        leaves[("in", i)] = b.load(bufs[i], _index(_bstrides(ins[i], oshape), dims))
        ldt[("in", i)] = ins[i][0]
    for d in sorted(_leaves(expr, "idx")):
        leaves[("idx", d)] = b.index_value(dims[d])
        ldt[("idx", d)] = torch.int64
    em = _Emitter(b, leaves, ldt)
    _store(b, em, ob, _index(list(ostr), dims), expr, odt)
    return b.build()


@functools.lru_cache(maxsize=1024)
def arange(out: TSpec, start: Any, step: Any) -> Program:
    b = ProgramBuilder("arange", source=SOURCE)
    odt, oshape, ostr = out
    ob = b.output("out", odt, oshape, ostr)
    (i,) = _pdims(b, oshape)
    v = b.index_value(i)
    if step != 1:
        v = b.mul(v, step)
    if start != 0:
        v = b.add(v, start)
    b.store(ob, ostr[0] * i, v if _kind(odt) != "f" else b.to(v, odt))
    return b.build()


# ------------------------------------------------------------------------------ reductions
@functools.lru_cache(maxsize=2048)
def reduction(op: str, x: TSpec, rdims: tuple[int, ...], out: TSpec, keepdim: bool, scale: Any = None,
              prologue: Any = None, epilogue: Any = None) -> Program:
    """out = epilogue(op over ``rdims`` of prologue(x)) (``mean`` = sum * scale; without a scale,
    sum / the number of reduced elements)."""
    b = ProgramBuilder(f"reduce_{op}", source=SOURCE)
    xdt, xshape, xstr = x
    odt, oshape, ostr = out
    xb = b.input("x", xdt, xshape, xstr)
    ob = b.output("out", odt, oshape, ostr)
    dims, odims = [], []
    for d, n in enumerate(xshape):
        if d in rdims:
            dims.append(b.rdim(f"r{d}", n))
        else:
            dims.append(b.dim(f"x{d}", n))
            odims.append(dims[-1])
    v = b.load(xb, _index(list(xstr), dims))
    if prologue is not None:
        em = _Emitter(b, {("x",): v}, {("x",): xdt})
        v = em(prologue)
    rop = "sum" if op == "mean" else op
    r = b.reduce(rop, v, [dims[d] for d in rdims])
    if scale is not None:
        r = b.mul(r, scale)
    elif op == "mean":
        r = b.mul(r, _recip(b, math.prod(xshape[d] for d in rdims)))
    if epilogue is not None:
        r = _Emitter(b, {("x",): r}, {("x",): REDUCTIONS[rop].dtype(xdt)})(epilogue)
    oidx = []
    for d in range(len(xshape)):
        if d in rdims:
            if keepdim:
                oidx.append(0)
        else:
            oidx.append(dims[d])
    index = op in REDUCTIONS and REDUCTIONS[op].result == "index"
    if _kind(odt) != ("i" if index else _kind(xdt)) or op == "mean" and _kind(odt) != "f":
        r = b.to(r, odt)
    b.store(ob, _index(list(ostr), oidx), r)
    return b.build()


# ------------------------------------------------------------------------------ matmul + epilogue
@functools.lru_cache(maxsize=2048)
def matmul(a: TSpec, bm: TSpec, out: TSpec, extras: tuple[TSpec, ...] = (), epilogue: Any = ("acc",),
           name: str = "matmul") -> Program:
    """out[..., m, n] = epilogue(sum_k a[..., m, k] * b[..., k, n], extras) on the systolic array.

    Batch dims of ``a``/``b`` broadcast against out's leading dims; extras broadcast to ``out``.
    """
    pb = ProgramBuilder(name, source=SOURCE)
    odt, oshape, ostr = out
    ab = pb.input("a", *a[:1], a[1], a[2])
    bb = pb.input("b", *bm[:1], bm[1], bm[2])
    xbs = [pb.input(f"e{i}", s[0], s[1], s[2]) for i, s in enumerate(extras)]
    ob = pb.output("out", odt, oshape, ostr)
    nb = len(oshape) - 2
    K = a[1][-1]
    dims = _pdims(pb, oshape)
    k = pb.rdim("r0", K)
    batch, m, n = dims[:nb], dims[nb], dims[nb + 1]
    ast = _bstrides((a[0], a[1][:-2], a[2][:-2]), oshape[:nb]) + [a[2][-2], a[2][-1]]
    bst = _bstrides((bm[0], bm[1][:-2], bm[2][:-2]), oshape[:nb]) + [bm[2][-2], bm[2][-1]]
    va = pb.load(ab, _index(ast, batch + [m, k]))
    vb = pb.load(bb, _index(bst, batch + [k, n]))
    # int8 operands (``_int_mm`` with its epilogue): an exact integer accumulator whose value is
    # the int32 product's (int64 registers; no int8 x int8 sum over K < 2**17 leaves int32's range)
    integer = not a[0].is_floating_point
    acc = pb.matmul(va, vb, k, dtype=torch.int64) if integer else pb.matmul(va, vb, k)
    leaves = {("acc",): acc}
    ldt = {("acc",): torch.int32 if integer else torch.float32}
    for i in sorted(_leaves(epilogue, "in")):
        leaves[("in", i)] = pb.load(xbs[i], _index(_bstrides(extras[i], oshape), dims))
        ldt[("in", i)] = extras[i][0]
    em = _Emitter(pb, leaves, ldt)
    _store(pb, em, ob, _index(list(ostr), dims), epilogue, odt)
    return pb.build()


# ------------------------------------------------------------------------------ softmax
def _prologue_value(b: ProgramBuilder, xb: Any, x: TSpec, ebs: list, extras: tuple[TSpec, ...], dims: list,
                    prologue: Any) -> str:
    """Load ``x`` and the extras a prologue reads (broadcast to ``x``'s shape) and emit the prologue."""
    xdt, xshape, xstr = x
    leaves = {("x",): b.load(xb, _index(list(xstr), dims))}
    ldt = {("x",): xdt}
    for i in sorted(_leaves(prologue, "in")):
        leaves[("in", i)] = b.load(ebs[i], _index(_bstrides(extras[i], xshape), dims))
        ldt[("in", i)] = extras[i][0]
    return _Emitter(b, leaves, ldt)(prologue)


@functools.lru_cache(maxsize=1024)
def softmax(x: TSpec, dim: int, out: TSpec, extras: tuple[TSpec, ...] = (), prologue: Any = ("x",),
            safe: bool = False, log: bool = False, name: str = "softmax") -> Program:
    """out = softmax(prologue(x, extras)) along ``dim`` in one program (max, exp, sum, div)."""
    b = ProgramBuilder(name, source=SOURCE)
    xdt, xshape, xstr = x
    odt, oshape, ostr = out
    xb = b.input("x", xdt, xshape, xstr)
    ebs = [b.input(f"e{i}", s[0], s[1], s[2]) for i, s in enumerate(extras)]
    ob = b.output("out", odt, oshape, ostr)
    dims = [b.rdim(f"r{d}", n) if d == dim else b.dim(f"x{d}", n) for d, n in enumerate(xshape)]
    r = dims[dim]
    v = _prologue_value(b, xb, x, ebs, extras, dims, prologue)
    mx = b.reduce("max", v, r)
    sh = b.sub(v, mx)
    e = b.exp(sh)
    s = b.reduce("sum", e, r)
    y = b.sub(sh, b.log(s)) if log else b.truediv(e, s)
    if safe:
        y = b.where(b.eq(mx, float("-inf")), 0.0, y)
    b.store(ob, _index(list(ostr), dims), y)
    return b.build()


# ------------------------------------------------------------------------------ layer / RMS norm
@functools.lru_cache(maxsize=1024)
def norm(kind: str, x: TSpec, out: TSpec, eps: float, weight: TSpec | None = None, bias: TSpec | None = None,
         extras: tuple[TSpec, ...] = (), prologue: Any = ("x",), stats: bool = False, sum_out: TSpec | None = None,
         name: str | None = None, stats_dtype: torch.dtype = torch.float32) -> Program:
    """LayerNorm (``kind="layer"``) or RMSNorm (``"rms"``) over the last dim, one program.

    ``prologue`` (over ``("x",)`` and extras) lets the residual add feed the norm; ``sum_out`` then
    also stores the prologue's value (the new residual stream). ``stats``: also store mean and
    rstd (LayerNorm's second and third results), shape ``x.shape[:-1] + (1,)``.
    """
    b = ProgramBuilder(name or f"{kind}norm", source=SOURCE)
    xdt, xshape, xstr = x
    D = xshape[-1]
    xb = b.input("x", xdt, xshape, xstr)
    ebs = [b.input(f"e{i}", s[0], s[1], s[2]) for i, s in enumerate(extras)]
    wb = b.input("w", weight[0], weight[1], weight[2]) if weight else None
    bb = b.input("bias", bias[0], bias[1], bias[2]) if bias else None
    ob = b.output("out", out[0], out[1], out[2])
    sb = b.output("sum", sum_out[0], sum_out[1], sum_out[2]) if sum_out else None
    if stats:
        st_shape = tuple(xshape[:-1]) + (1,)
        mb = b.output("mean", stats_dtype, st_shape)
        rb = b.output("rstd", stats_dtype, st_shape)
    dims = [b.dim(f"x{d}", n) for d, n in enumerate(xshape[:-1])]
    r = b.rdim("r0", D)
    alld = dims + [r]
    v = _prologue_value(b, xb, x, ebs, extras, alld, prologue)
    if sb is not None:
        b.store(sb, _index(list(sum_out[2]), alld), v)
    if kind == "layer":
        inv_d = _recip(b, D)
        mean = b.mul(b.reduce("sum", v, r), inv_d)
        d = b.sub(v, mean)
        var = b.mul(b.reduce("sum", b.mul(d, d), r), inv_d)
        rstd = b.rsqrt(b.add(var, eps))
        y = b.mul(d, rstd)
    else:
        ms = b.mul(b.reduce("sum", b.mul(v, v), r), _recip(b, D))
        rstd = b.rsqrt(b.add(ms, eps))
        y = b.mul(v, rstd)
    if wb is not None:
        y = b.mul(y, b.load(wb, weight[2][0] * r))
    if bb is not None:
        y = b.add(y, b.load(bb, bias[2][0] * r))
    b.store(ob, _index(list(out[2]), alld), y)
    if stats:
        stst = [math.prod(st_shape[i + 1:]) for i in range(len(st_shape))]
        b.store(mb, _index(stst[:-1], dims), mean)
        b.store(rb, _index(stst[:-1], dims), rstd)
    return b.build()


# ------------------------------------------------------------------------------ gather
@functools.lru_cache(maxsize=512)
def embedding(weight: TSpec, idx: TSpec, out: TSpec) -> Program:
    """out[..., j] = weight[idx[...], j] (an indirect load per row)."""
    b = ProgramBuilder("embedding", source=SOURCE)
    wb = b.input("weight", *weight[:1], weight[1], weight[2])
    ib = b.input("idx", *idx[:1], idx[1], idx[2])
    ob = b.output("out", out[0], out[1], out[2])
    dims = _pdims(b, out[1])
    row = b.load(ib, _index(list(idx[2]), dims[:-1]))
    v = b.load(wb, f"{row}*{weight[2][0]} + ({_index([weight[2][1]], [dims[-1]])})")
    b.store(ob, _index(list(out[2]), dims), v)
    return b.build()


# ------------------------------------------------------------------------------ attention
def attention(q: TSpec, k: TSpec, v: TSpec, out: TSpec, mask: TSpec | None, scale: float | None, causal: bool,
              name: str = "attention", kt: bool = False, safe: bool = False) -> Program:
    """The card's flash-attention program (``vspyre.ir.library.attention``, shared with the
    Inductor path): scores, online softmax and the product with ``v`` in one program."""
    return library.attention(q, k, v, out, mask, scale, causal, kt, safe, name, SOURCE)
