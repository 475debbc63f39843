"""Executing tile programs on host-addressable device memory.

* **fast** (default): the whole iteration space at once with vectorised torch CPU ops. Affine
  loads/stores become strided views of the buffer (no copy, no index tensor); other indices are
  evaluated once per launch over broadcast ``arange``s and gathered/scattered. Per (program, shapes)
  everything is compiled into a list of closures, so a launch is a dict lookup plus the ops.
* **checked** (opt-in): core by core and tile by tile as the schedule says, proving it: every
  output element written exactly once, every access inside its buffer, the scratchpad never over
  capacity, every ring send received. Raises :class:`ScheduleError` naming program, core, tile and
  buffer. Results are the same as fast mode (same op semantics from ``vspyre.ir.ops``).

Numerics: float values are computed in fp32 (matmul and reductions accumulate in fp32); every
write to device memory goes through ``numerics.store_cast`` (DL16 rounding of fp16 when the
setting is ``dl16``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import math

import sympy
import torch

from .. import hardware, numerics
from ..ir.indexing import affine_form, compile_expr, free_names, sym
from ..ir.ops import INPLACE, OPS, REDUCE_IMPL, SOFTMAX_MATMUL, DeviceAssertError, _cast_fn, _matmul_eval
from ..ir.planning import resolve
from ..ir.schedule import (Schedule, ScheduleError, bind_sizes, iter_tiles, live_bytes, op_rules, runs_at)
from ..ir.program import (Compute, Constant, IndexValue, Load, Matmul, Program, ProgramError, Reduce, RingReduce,
                          SoftmaxMatmul,
                          Store, _bind)

__all__ = ["Bound", "bind", "run_fast", "run_checked", "ScheduleError", "LaunchError"]


class LaunchError(ValueError):
    """The tensors given to a launch do not match the program's buffers."""


def _to_host_value(v: torch.Tensor, clone: bool) -> torch.Tensor:
    if v.dtype == torch.float32 or v.dtype == torch.int64 or v.dtype == torch.bool:
        return v.clone() if clone else v
    if v.is_floating_point():
        out = v.to(torch.float32)
    elif v.dtype == torch.bool:
        out = v
    else:
        out = v.to(torch.int64)
    if clone and out.data_ptr() == v.data_ptr():
        out = out.clone()
    return out


@dataclass
class Bound:
    """A program with its size symbols bound: the cached unit of execution."""

    program: Program
    sizes: dict[str, int]
    ext: dict[str, int]
    spans: tuple[int, ...]
    steps: list[Callable] | None = None
    _schedule: Schedule | None = None
    _estimate: Any = None
    _cfg: Any = None
    meta: dict = field(default_factory=dict)

    def schedule(self) -> Schedule:
        cfg = hardware.get_config()
        if self._schedule is None or self._cfg is not cfg:
            self._schedule = resolve(self.program, self.sizes, cfg, persistent=self.meta.get("persistent", frozenset()))
            self._estimate = None
            self._cfg = cfg
        return self._schedule

    def estimate(self):
        s = self.schedule()
        if self._estimate is None:
            from ..ir.latency import estimate_schedule
            self._estimate = estimate_schedule(s, segments=True)
        return self._estimate

    def relayouts(self) -> tuple[tuple[int, str, int, int, int, float], ...]:
        """The operands this launch reads through a re-layout: (buffer index, buffer name, span,
        stride that moves into the stick, bytes, us), planned once per bound sizes."""
        info = self.meta.get("relayouts")
        if info is None or self.meta.get("relayouts_cfg") is not hardware.get_config():
            info = ()
            if any(isinstance(op, Matmul) for op in self.program.body):
                from ..ir.latency import relayout_cost
                s = self.schedule()
                names = [b.name for b in self.program.buffers]
                out = []
                for i in sorted(s.relayout):
                    op = self.program.body[i]
                    form = affine_form(_subst(op.index, self.sizes), self.program.dim_names)
                    stride = form[1].get(s.access[i].unit_var, 0) if form else 0
                    bi = names.index(op.buffer)
                    nbytes, us = relayout_cost(s, i)
                    out.append((bi, op.buffer, self.spans[bi], stride, nbytes // 2, us))
                info = tuple(out)
            self.meta["relayouts"] = info
            self.meta["relayouts_cfg"] = hardware.get_config()
        return info


# ------------------------------------------------------------------------------------- binding
def bind(p: Program, tensors: Sequence[torch.Tensor], scalars: dict[str, int] | None = None) -> Bound:
    """Bind size symbols from the tensors' shapes/strides and explicit scalars; check every
    buffer's dtype, shape, strides (and offset, if declared)."""
    if len(tensors) != len(p.buffers):
        raise LaunchError(f"program {p.name}: {len(p.buffers)} buffers "
                          f"({', '.join(b.name for b in p.buffers)}) but {len(tensors)} tensors given")
    sizes: dict[str, int] = {k: int(v) for k, v in (scalars or {}).items()}
    missing = [s for s in p.scalars if s not in sizes]
    if missing:
        raise LaunchError(f"program {p.name}: scalar(s) {missing} not given")
    for b, t in zip(p.buffers, tensors):
        if t.dtype != b.dtype:
            raise LaunchError(f"program {p.name}: buffer {b.name} wants {b.dtype}, got {t.dtype}")
        if t.dim() != len(b.shape):
            raise LaunchError(f"program {p.name}: buffer {b.name} wants {len(b.shape)} dims, got shape {tuple(t.shape)}")
        for decl, actual in zip(b.shape + b.strides, tuple(t.shape) + tuple(t.stride())):
            if isinstance(decl, sympy.Symbol):
                prev = sizes.setdefault(decl.name, int(actual))
                if prev != actual:
                    raise LaunchError(f"program {p.name}: symbol {decl.name} is {prev} and {actual} "
                                      f"(buffer {b.name}, shape {tuple(t.shape)})")
    for b, t in zip(p.buffers, tensors):
        try:
            want_shape = tuple(_bind(s, sizes) for s in b.shape)
            want_strides = tuple(_bind(s, sizes) for s in b.strides)
        except ProgramError as e:
            raise LaunchError(f"program {p.name}: buffer {b.name}: {e}") from None
        if want_shape != tuple(t.shape):
            raise LaunchError(f"program {p.name}: buffer {b.name} wants shape {want_shape}, got {tuple(t.shape)}")
        nontriv = [(w, a) for w, a, n in zip(want_strides, t.stride(), want_shape) if n > 1]
        if any(w != a for w, a in nontriv):
            raise LaunchError(f"program {p.name}: buffer {b.name} wants strides {want_strides}, got {t.stride()}")
    try:
        ext = bind_sizes(p, sizes)
    except ProgramError as e:
        raise LaunchError(f"program {p.name}: {e}") from None
    spans = tuple(b.span(sizes) for b in p.buffers)
    return Bound(p, sizes, ext, spans)


# ------------------------------------------------------------------------------------- fast mode
def _aranges(p: Program, ranges: Sequence[tuple[int, int]]) -> dict[str, torch.Tensor]:
    n = len(ranges)
    out = {}
    for i, (d, (a, b)) in enumerate(zip(p.dim_names, ranges)):
        shape = [1] * n
        shape[i] = b - a
        out[d] = torch.arange(a, b, dtype=torch.int64).view(shape)
    return out


def _subst(expr: sympy.Expr, sizes: dict[str, int]) -> sympy.Expr:
    names = free_names(expr) & set(sizes)
    return expr.xreplace({sym(k): sympy.Integer(sizes[k]) for k in names}) if names else expr


def _non_overlapping(shape: list[int], strides: list[int]) -> bool:
    dims = sorted((st, n) for n, st in zip(shape, strides) if n > 1)
    reach = 0
    for st, n in dims:
        if st <= reach:
            return False
        reach += (n - 1) * st
    return True


def _const_tensor(v: Any, ndim: int) -> torch.Tensor:
    if isinstance(v, bool):
        return torch.tensor(v).view([1] * ndim)
    if isinstance(v, int):
        return torch.tensor(v, dtype=torch.int64).view([1] * ndim)
    return torch.tensor(float(v), dtype=torch.float32).view([1] * ndim)


def _fail(p: Program, i: int, op: Any, e: Exception, where: str = "") -> RuntimeError:
    if isinstance(e, DeviceAssertError):
        msg = p.meta.get("asserts", {}).get(getattr(op, "out", None), "")
        return DeviceAssertError(f"program {p.name}: device-side assertion failed{where}: {msg}")
    return RuntimeError(f"program {p.name}: op {i} ({op.kind}{' ' + op.buffer if hasattr(op, 'buffer') else ''})"
                        f"{where}: {type(e).__name__}: {e}")


FAST_BYTES = 1 << 30   # host bytes fast mode lets a launch's values take before it runs it in chunks


def _chunks(bd: Bound) -> list[list[tuple[int, int]]]:
    """The boxes fast mode runs: the whole iteration space, or pieces along the parallel dim that
    most values vary along, when its values would take more than ``FAST_BYTES`` of host memory
    (attention's scores at a long sequence). Parallel dims are independent, so pieces give the same
    result; each piece is still whole-tensor torch ops."""
    p = bd.program
    an = p.analysis
    names = p.dim_names
    full = [(0, bd.ext[d]) for d in names]
    total = 0
    skipped = {p.body[j].outputs[0] for a in _attention_paths(p).values() for j in a["skip"]}
    for name, dims in an.dims.items():
        if name in skipped:
            continue
        n = 4
        for d in dims:
            n *= bd.ext[d]
        total += n
    if total <= FAST_BYTES:
        return [full]
    par = [d for d in names if d not in an.reduced_dims and bd.ext[d] > 1]
    if not par:
        return [full]
    weight = {d: sum(1 for dims in an.dims.values() if d in dims) for d in par}
    d = max(par, key=lambda x: (weight[x], bd.ext[x]))
    k = names.index(d)
    pieces = min(bd.ext[d], -(-total // FAST_BYTES))
    step = -(-bd.ext[d] // pieces)
    out = []
    for a in range(0, bd.ext[d], step):
        box = list(full)
        box[k] = (a, min(a + step, bd.ext[d]))
        out.append(box)
    return out


def _compile_fast(bd: Bound, region: list[tuple[int, int]] | None = None) -> list[Callable]:
    p = bd.program
    an = p.analysis
    names = p.dim_names
    ndim = len(names)
    full = region or [(0, bd.ext[d]) for d in names]
    ar = _aranges(p, full)
    box = [b - a for a, b in full]
    start = {d: a for d, (a, _) in zip(names, full)}
    bidx = {b.name: i for i, b in enumerate(p.buffers)}
    steps: list[Callable] = []
    attn = _attention_paths(p)
    skip = set().union(*[a["skip"] for a in attn.values()]) if attn else set()

    for i, op in enumerate(p.body):
        if i in skip:
            continue
        if i in attn:
            a = attn[i]

            def step(env, H, a=a, op=op):
                env[op.out] = _attention_fast(a, env, ndim)
            steps.append(step)
            continue
        if isinstance(op, (Load, Store)):
            bi = bidx[op.buffer]
            buf = p.buffers[bi]
            span = bd.spans[bi]
            expr = _subst(op.index, bd.sizes)
            indirect = sorted(n for n in free_names(expr) if n.startswith("%"))
            form = None if indirect else affine_form(expr, names)
            if form is not None:
                const, coefs = form
                if any(c < 0 for c in coefs.values()):
                    form = None
            if form is not None:
                const, coefs = form
                const += sum(c * start[d] for d, c in coefs.items())
                vshape = [n if coefs.get(d) else 1 for d, n in zip(names, box)]
                vstr = [coefs.get(d, 0) for d in names]
            fn = compile_expr(expr)

            def index_of(env, fn=fn, indirect=indirect):
                E = dict(ar)
                for n in indirect:
                    E[n] = env[n]
                v = fn(E)
                return v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=torch.int64).view([1] * ndim)

            if isinstance(op, Load):
                clone = buf.role != "in"
                if form is not None and op.mask is None:
                    def step(env, H, bi=bi, vshape=vshape, vstr=vstr, const=const, out=op.out, clone=clone):
                        t = H[bi]
                        env[out] = _to_host_value(t.as_strided(vshape, vstr, t.storage_offset() + const), clone)
                else:
                    def step(env, H, bi=bi, span=span, op=op, index_of=index_of):
                        t = H[bi]
                        flat = t.as_strided((span,), (1,), t.storage_offset())
                        idx = index_of(env)
                        if op.mask is not None:
                            m = env[op.mask]
                            idx, m = torch.broadcast_tensors(idx, m)
                            vals = _to_host_value(flat[torch.where(m, idx, 0)], False)
                            other = torch.tensor(op.other, dtype=vals.dtype)
                            env[op.out] = torch.where(m, vals, other)
                        else:
                            env[op.out] = _to_host_value(flat[idx], False)
            else:
                dtype = buf.dtype
                if form is not None and _non_overlapping(vshape, vstr):
                    def step(env, H, bi=bi, vshape=vshape, vstr=vstr, const=const, op=op, dtype=dtype):
                        t = H[bi]
                        view = t.as_strided(vshape, vstr, t.storage_offset() + const)
                        val = env[op.value]
                        if val.dtype != dtype or dtype == torch.float16:
                            val = numerics.store_cast(val, dtype)
                        if op.mask is not None:
                            val = torch.where(env[op.mask], val, view)
                        view.copy_(val)
                else:
                    def step(env, H, bi=bi, span=span, op=op, dtype=dtype, index_of=index_of):
                        t = H[bi]
                        flat = t.as_strided((span,), (1,), t.storage_offset())
                        idx = index_of(env)
                        val = numerics.store_cast(env[op.value], dtype)
                        if op.mask is not None:
                            idx, val, m = torch.broadcast_tensors(idx, val, env[op.mask])
                            flat[idx[m]] = val[m]
                        else:
                            idx, val = torch.broadcast_tensors(idx, val)
                            flat[idx.reshape(-1)] = val.reshape(-1)
        elif isinstance(op, Compute):
            d = OPS[op.op]
            f = d.fn if d.fn is not None else _cast_fn(op.dtype)
            getters = [a if isinstance(a, str) else _const_tensor(a, ndim) for a in op.args]
            a0 = op.args[0] if op.args else None
            reuse = (op.op in INPLACE and isinstance(a0, str) and isinstance(an.producer.get(a0), Compute)
                     and an.producer[a0].op not in ("identity", "to")   # those may alias a buffer
                     and an.last_use.get(a0) == i and op.args.count(a0) == 1
                     and an.dtypes[a0].is_floating_point and an.dtypes[op.out].is_floating_point)
            if reuse and len(op.args) <= 2:
                meth = INPLACE[op.op]
                other = op.args[1] if len(op.args) == 2 else None
                other_c = other if isinstance(other, str) or other is None else float(other)

                def step(env, H, f=f, a=a0, o=other_c, meth=meth, out=op.out, g=getters):
                    x = env[a]
                    if o is None:
                        env[out] = getattr(x, meth)()
                        return
                    y = env[o] if isinstance(o, str) else o
                    if x.dtype == torch.float32 and (not isinstance(y, torch.Tensor) or (
                            y.dtype == torch.float32 and torch.broadcast_shapes(x.shape, y.shape) == x.shape)):
                        env[out] = getattr(x, meth)(y)
                    else:
                        env[out] = f(x, env[g[1]] if isinstance(g[1], str) else g[1])
            elif len(getters) == 1 and isinstance(getters[0], str):
                def step(env, H, f=f, a=getters[0], out=op.out):
                    env[out] = f(env[a])
            elif len(getters) == 2:
                a0, a1 = getters
                s0, s1 = isinstance(a0, str), isinstance(a1, str)

                def step(env, H, f=f, a0=a0, a1=a1, s0=s0, s1=s1, out=op.out):
                    env[out] = f(env[a0] if s0 else a0, env[a1] if s1 else a1)
            else:
                def step(env, H, f=f, g=getters, out=op.out):
                    env[out] = f(*[env[a] if isinstance(a, str) else a for a in g])
        elif isinstance(op, IndexValue):
            fn = compile_expr(_subst(op.expr, bd.sizes))
            if op.inputs:      # the expression reads SSA values: evaluated per launch
                def step(env, H, fn=fn, ins=op.inputs, cast=_cast_fn(op.dtype), out=op.out):
                    E = dict(ar)
                    for n in ins:
                        E[n] = env[n]
                    v = fn(E)
                    env[out] = cast(v if isinstance(v, torch.Tensor) else
                                    torch.tensor(v, dtype=torch.int64).view([1] * ndim))
            else:
                v = fn(ar)
                v = v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=torch.int64).view([1] * ndim)
                v = _cast_fn(op.dtype)(v)

                def step(env, H, v=v, out=op.out):
                    env[out] = v
        elif isinstance(op, Constant):
            v = _cast_fn(op.dtype)(_const_tensor(op.value, ndim))

            def step(env, H, v=v, out=op.out):
                env[out] = v
        elif isinstance(op, Reduce):
            impl = REDUCE_IMPL[op.op]
            axes = tuple(names.index(d) for d in op.dims)

            def step(env, H, impl=impl, axes=axes, op=op):
                x = env[op.value]
                if any(x.shape[a] != box[a] for a in axes):
                    shape = list(x.shape)
                    for a in axes:
                        shape[a] = box[a]
                    x = x.expand(shape)
                env[op.out] = impl.finish(impl.partial(x, axes, 0))
        elif isinstance(op, Matmul):
            axes_a = sorted(names.index(d) for d in an.dims[op.a])
            axes_b = sorted(names.index(d) for d in an.dims[op.b])
            k = names.index(op.dim)

            def step(env, H, op=op, axes_a=axes_a, axes_b=axes_b, k=k):
                r = _matmul_eval(env[op.a], env[op.b], axes_a, axes_b, k, ndim)
                env[op.out] = r + env[op.acc] if op.acc else r
        elif isinstance(op, SoftmaxMatmul):
            axes_s = sorted(names.index(d) for d in an.dims[op.s])
            axes_v = sorted(names.index(d) for d in an.dims[op.v]) if op.v else []
            k = names.index(op.dim)

            def step(env, H, op=op, axes_s=axes_s, axes_v=axes_v, k=k):
                st = SOFTMAX_MATMUL.partial(env[op.s], env[op.v] if op.v else None, axes_s, axes_v, k, ndim)
                env[op.out] = SOFTMAX_MATMUL.finish(st, op)
        elif isinstance(op, RingReduce):
            def step(env, H, op=op):       # the whole reduction was done in one piece
                env[op.out] = env[op.value]
        else:  # pragma: no cover
            raise ProgramError(f"program {p.name}: op {i}: cannot execute {op!r}")
        steps.append(step)
    return steps


# -- attention's fast path ------------------------------------------------------------------------
_AFFINE = {"mul", "truediv", "add", "sub", "where", "to", "identity"}


def _attention_paths(p: Program) -> dict[int, dict]:
    """SoftmaxMatmuls whose scores are ``c * (q . k) + B`` (a Matmul, then scalings, additions and
    masks that do not depend on the scores): fast mode runs them through torch's own
    scaled_dot_product_attention instead of materialising the scores (same value; the card's cost
    is the program's, whatever the host does). op index -> what the fast path needs."""
    an = p.analysis
    users: dict[str, list[int]] = {}
    for i, op in enumerate(p.body):
        for n in op.inputs:
            users.setdefault(n, []).append(i)
    out = {}
    for i, op in enumerate(p.body):
        if not (isinstance(op, SoftmaxMatmul) and op.v is not None):
            continue
        chain, cur, scale = [], op.s, 1.0
        ok = True
        while True:
            prod = an.producer[cur]
            j = p.body.index(prod)
            if users.get(cur, []) != [chain[-1] if chain else i]:
                ok = False                        # the scores (or a step of their chain) are used elsewhere
                break
            if isinstance(prod, Matmul):
                break
            if isinstance(prod, RingReduce):
                chain.append(j)
                cur = prod.value
                continue
            if not (isinstance(prod, Compute) and prod.op in _AFFINE):
                ok = False
                break
            on_path = [k for k, a in enumerate(prod.args) if isinstance(a, str) and _from_matmul(an, a)]
            args = prod.args
            if prod.op in ("mul", "truediv"):
                other = args[1 - on_path[0]] if len(on_path) == 1 else None
                if len(on_path) != 1 or not isinstance(other, (int, float)) or (prod.op == "truediv" and on_path[0]):
                    ok = False
                    break
                scale = scale * other if prod.op == "mul" else scale / other
            elif prod.op == "sub" and on_path != [0]:
                ok = False
                break
            elif prod.op == "where" and on_path != [1]:
                ok = False
                break
            elif prod.op in ("add",) and len(on_path) != 1:
                ok = False
                break
            chain.append(j)
            cur = args[on_path[0]] if on_path else None
            if cur is None:
                ok = False
                break
        if not ok or prod.acc is not None:
            continue
        mm_i = p.body.index(prod)
        q, k, d = prod.a, prod.b, prod.dim
        if op.dim in an.dims[q]:
            q, k = k, q
        batch = (an.dims[q] & an.dims[k]) - {d}
        if not (an.dims[k] - batch - {d} == {op.dim} and an.dims[op.v] - batch >= {op.dim}
                and (an.dims[op.v] - {op.dim}) - batch and not (an.dims[op.v] & (an.dims[q] - batch))):
            continue
        out[i] = {"op": op, "q": q, "k": k, "v": op.v, "d": d, "n": op.dim, "batch": batch,
                  "m": an.dims[q] - batch - {d}, "e": an.dims[op.v] - batch - {op.dim},
                  "chain": sorted(chain), "matmul": mm_i, "scale": scale, "names": p.dim_names,
                  "program": p, "skip": set(chain) | {mm_i}, "score": p.body[mm_i].out}
    return out


def _from_matmul(an, name: str) -> bool:
    """Whether value ``name`` is computed from a Matmul's result (the scores' path)."""
    prod = an.producer.get(name)
    if isinstance(prod, Matmul):
        return True
    if isinstance(prod, (Compute, RingReduce)):
        return any(_from_matmul(an, x) for x in prod.inputs)
    return False


def _attention_fast(a: dict, env: dict, ndim: int) -> torch.Tensor:
    p = a["program"]
    names = a["names"]
    pos = {d: k for k, d in enumerate(names)}
    # query rows: the last query-only dim; the others (a grouped head's query heads) join the batch,
    # the keys and values broadcast along them
    qonly = [d for d in names if d in a["m"]]
    batch = [d for d in names if d in a["batch"] or d in qonly[:-1]]
    m, e = qonly[-1:], [d for d in names if d in a["e"]]
    n, d = a["n"], a["d"]
    q, k, v = env[a["q"]], env[a["k"]], env[a["v"]]
    size = {x: max(q.shape[pos[x]], k.shape[pos[x]], v.shape[pos[x]]) for x in names}

    def arrange(t: torch.Tensor, groups: list[list[str]], loose: int = -1) -> torch.Tensor:
        """``t`` (one axis per dim) as [prod(group) for group], broadcasting where it is constant;
        group ``loose`` stays 1 if ``t`` is constant along all its dims (a mask shared by the heads)."""
        flat = [x for g in groups for x in g]
        rest = [pos[x] for x in names if x not in flat]
        t = t.permute([pos[x] for x in flat] + rest)
        t = t.reshape(t.shape[:len(flat)])
        keep = set(groups[loose]) if loose >= 0 and all(t.shape[flat.index(x)] == 1 for x in groups[loose]) else set()
        t = t.expand([1 if x in keep else size[x] for x in flat])
        return t.reshape([math.prod(1 if x in keep else size[x] for x in g) for g in groups])

    # the scores' bias: the chain evaluated with the scores at zero
    zero = torch.zeros([1] * ndim)
    benv = dict(env)
    benv[a["score"]] = zero
    bias = zero
    for j in a["chain"]:
        op = p.body[j]
        if isinstance(op, RingReduce):
            benv[op.out] = benv[op.value]
        else:
            f = OPS[op.op].fn if OPS[op.op].fn is not None else _cast_fn(op.dtype)
            benv[op.out] = f(*[benv[x] if isinstance(x, str) else _const_tensor(x, ndim) for x in op.args])
        bias = benv[op.out]
    bias = bias.to(torch.float32) if bias.is_floating_point() else bias.float()
    qf = arrange(q.float(), [batch, m, [d]])
    kf = arrange(k.float(), [batch, [n], [d]])
    vf = arrange(v.float(), [batch, [n], e])
    mask = None
    causal = False
    if a["chain"] and bool((bias != 0).any()):
        mask = arrange(bias, [batch, m, [n]], loose=0)
        rows, cols = mask.shape[-2:]
        tril = torch.ones(rows, cols, dtype=torch.bool).tril()
        if bool(((mask == 0) == tril).all()) and bool((torch.isneginf(mask) | (mask == 0)).all()):
            mask, causal = None, True             # torch's own causal path: no bias to add
    # 4-D: the CPU's flash kernel takes (batch, heads, rows, width); 3-D inputs take the math path
    o = torch.nn.functional.scaled_dot_product_attention(
        qf[None], kf[None], vf[None], attn_mask=None if mask is None else mask[None], is_causal=causal,
        scale=a["scale"])[0]
    if mask is not None:
        empty = torch.isneginf(mask).all(-1, keepdim=True)
        if bool(empty.any()):
            o = torch.where(empty, torch.zeros_like(o) if a["op"].zero_empty else torch.full_like(o, float("nan")), o)
    # back to one axis per dim
    o = o.reshape([size[x] for x in batch] + [size[x] for x in m] + [size[x] for x in e])
    order = batch + m + e
    o = o.reshape(o.shape + (1,) * (ndim - len(order)))
    rest = [x for x in names if x not in order]
    perm = [ (order + rest).index(x) for x in names]
    return o.permute(perm)


def run_fast(bd: Bound, hosts: Sequence[torch.Tensor]) -> None:
    pieces = bd.steps
    if pieces is None:
        pieces = bd.steps = [_compile_fast(bd, box) for box in _chunks(bd)]
    for steps in pieces:
        env: dict[str, torch.Tensor] = {}
        try:
            for s in steps:
                s(env, hosts)
        except (RuntimeError, IndexError, TypeError, ValueError):
            # find which op failed (cheap: re-run with the index to name it)
            env = {}
            p = bd.program
            for i, s in enumerate(steps):
                try:
                    s(env, hosts)
                except Exception as e2:  # noqa: BLE001
                    raise _fail(p, i, p.body[i], e2) from e2
            raise


# ------------------------------------------------------------------------------------- checked mode
class _Checked:
    def __init__(self, bd: Bound, hosts: Sequence[torch.Tensor], schedule: Schedule) -> None:
        self.bd = bd
        self.p = bd.program
        self.an = self.p.analysis
        self.s = schedule
        self.cfg = schedule.cfg
        self.hosts = hosts
        self.names = self.p.dim_names
        self.ndim = len(self.names)
        self.rules = op_rules(self.p)
        self.inner = frozenset(d for d in self.names if d in self.an.reduced_dims)
        self.bidx = {b.name: i for i, b in enumerate(self.p.buffers)}
        self.counts = {b.name: torch.zeros(bd.spans[i], dtype=torch.int32)
                       for i, b in enumerate(self.p.buffers) if b.role != "in"}
        self.capacity = self.cfg.scratchpad_usable_bytes
        self.peak = 0
        self.sends: list[tuple] = []
        self.recvs: list[tuple] = []
        self._live: dict = {}
        self.exprs = {i: (compile_expr(_subst(op.index, bd.sizes)),
                          sorted(n for n in free_names(op.index) if n.startswith("%")))
                      for i, op in enumerate(self.p.body) if isinstance(op, (Load, Store))}

    # -- helpers --------------------------------------------------------------------------
    def where(self, core, tile) -> str:
        rng = ", ".join(f"{d}[{a}:{b}]" for d, (a, b) in zip(self.names, tile))
        return f"program {self.p.name}: core {core.core}: tile {rng}"

    def index(self, i: int, env, ar) -> torch.Tensor:
        fn, ind = self.exprs[i]
        E = dict(ar)
        for n in ind:
            E[n] = env[n]
        v = fn(E)
        return v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=torch.int64).view([1] * self.ndim)

    def account(self, core, tile, multi: frozenset[str]) -> None:
        """The scratchpad bytes of this step (the planner's own accounting, on the actual tile)."""
        ext = tuple(b - a for a, b in tile)
        key = (ext, multi)
        total = self._live.get(key)
        if total is None:
            total = self._live[key] = live_bytes(self.p, dict(zip(self.names, ext)), self.s.double_buffer,
                                                 self.cfg, multi, self.s.order)
        self.peak = max(self.peak, total)
        if total > self.capacity:
            raise ScheduleError(
                f"{self.where(core, tile)}: scratchpad overflow: {total} live bytes > {self.capacity} usable "
                f"({self.cfg.scratchpad_bytes} minus {self.cfg.scratchpad_reserve_fraction:.0%} reserve) for tile "
                f"extents {dict(zip(self.names, ext))}, double_buffer={self.s.double_buffer}")

    # -- one op on one tile ----------------------------------------------------------------
    def run_op(self, i: int, op, env, ar, core, tile, states: dict) -> None:
        p, an = self.p, self.an
        if isinstance(op, Load):
            bi = self.bidx[op.buffer]
            span = self.bd.spans[bi]
            idx = self.index(i, env, ar)
            m = None
            if op.mask is not None:
                idx, m = torch.broadcast_tensors(idx, env[op.mask])
            chk = idx[m] if m is not None else idx
            if chk.numel() and (int(chk.min()) < 0 or int(chk.max()) >= span):
                bad = int(chk.min()) if int(chk.min()) < 0 else int(chk.max())
                raise ScheduleError(f"{self.where(core, tile)}: op {i} load {op.out} from buffer {op.buffer}: "
                                    f"element {bad} out of bounds [0, {span})")
            t = self.hosts[bi]
            flat = t.as_strided((span,), (1,), t.storage_offset())
            vals = _to_host_value(flat[torch.where(m, idx, 0) if m is not None else idx], True)
            if m is not None:
                vals = torch.where(m, vals, torch.tensor(op.other, dtype=vals.dtype))
            env[op.out] = vals
        elif isinstance(op, Store):
            bi = self.bidx[op.buffer]
            buf = p.buffers[bi]
            span = self.bd.spans[bi]
            idx = self.index(i, env, ar)
            val = numerics.store_cast(env[op.value], buf.dtype)
            if op.mask is not None:
                idx, val, m = torch.broadcast_tensors(idx, val, env[op.mask])
                idx, val = idx[m], val[m]
            else:
                idx, val = torch.broadcast_tensors(idx, val)
                idx, val = idx.reshape(-1), val.reshape(-1)
            if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= span):
                bad = int(idx.min()) if int(idx.min()) < 0 else int(idx.max())
                raise ScheduleError(f"{self.where(core, tile)}: op {i} store to buffer {op.buffer}: "
                                    f"element {bad} out of bounds [0, {span})")
            cnt = self.counts[op.buffer]
            cnt.index_put_((idx,), torch.ones_like(idx, dtype=torch.int32), accumulate=True)
            if idx.numel() and int(cnt[idx].max()) > 1:
                dup = int(idx[cnt[idx] > 1][0])
                raise ScheduleError(f"{self.where(core, tile)}: op {i} store to buffer {op.buffer}: element "
                                    f"{dup} written {int(cnt[dup])} times (overlapping work division or tiles)")
            t = self.hosts[bi]
            flat = t.as_strided((span,), (1,), t.storage_offset())
            flat[idx] = val
        elif isinstance(op, Compute):
            d = OPS[op.op]
            f = d.fn if d.fn is not None else _cast_fn(op.dtype)
            env[op.out] = f(*[env[a] if isinstance(a, str) else _const_tensor(a, self.ndim) for a in op.args])
        elif isinstance(op, IndexValue):
            E = dict(ar)
            for n in op.inputs:
                E[n] = env[n]
            v = compile_expr(_subst(op.expr, self.bd.sizes))(E)
            v = v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=torch.int64).view([1] * self.ndim)
            env[op.out] = _cast_fn(op.dtype)(v)
        elif isinstance(op, Constant):
            env[op.out] = _cast_fn(op.dtype)(_const_tensor(op.value, self.ndim))
        elif isinstance(op, (Reduce, Matmul, SoftmaxMatmul)):
            combine, finish = _reduction_state(op)
            if isinstance(op, Reduce):
                axes = tuple(self.names.index(d) for d in op.dims)
                x = env[op.value]
                shape = list(x.shape)
                for a in axes:
                    shape[a] = tile[a][1] - tile[a][0]
                x = x.expand(shape)
                part = REDUCE_IMPL[op.op].partial(x, axes, tile[axes[0]][0])
                reduced = set(op.dims)
            elif isinstance(op, Matmul):
                axes_a = sorted(self.names.index(d) for d in an.dims[op.a])
                axes_b = sorted(self.names.index(d) for d in an.dims[op.b])
                part = _matmul_eval(env[op.a], env[op.b], axes_a, axes_b, self.names.index(op.dim), self.ndim)
                reduced = {op.dim}
            else:
                axes_s = sorted(self.names.index(d) for d in an.dims[op.s])
                axes_v = sorted(self.names.index(d) for d in an.dims[op.v]) if op.v else []
                part = SOFTMAX_MATMUL.partial(env[op.s], env[op.v] if op.v else None, axes_s, axes_v,
                                              self.names.index(op.dim), self.ndim)
                reduced = {op.dim}
            # one accumulator per tile of the dims this reduction does not reduce over
            key = (i, tuple(r for d, r in zip(self.names, tile) if d not in reduced))
            states[key] = combine(states[key], part) if key in states else part
            env[_STATE + op.out] = states[key]
            val = finish(states[key])
            if isinstance(op, Matmul) and op.acc:
                val = val + env[op.acc]
            env[op.out] = val
        elif isinstance(op, RingReduce):
            env[op.out] = env[op.value]   # combined by the caller when the dim is split
            if _STATE + op.value in env:
                env[_STATE + op.out] = env[_STATE + op.value]

    # -- the schedule ------------------------------------------------------------------------
    def run(self) -> dict:
        p, an, s = self.p, self.an, self.s
        # ops after the ring reduction over the split dim run on the ring's owner once it has the total
        split_ring = [isinstance(op, RingReduce) and op.dim == s.ring_dim for op in p.body]
        ring_dep = [s.ring_dim is not None and s.ring_dim in self.rules[i].ring for i in range(len(p.body))]
        for group in s.ring_groups():
            active = [c for c in group if not c.empty]
            if not active:
                continue
            tiles = [list(iter_tiles(s, c)) for c in active]
            n_outer = len(tiles[0])
            if any(len(t) != n_outer for t in tiles):
                raise ScheduleError(f"program {p.name}: cores {[c.core for c in active]} of one ring group have "
                                    "different tile counts; their partials cannot be matched")
            for o in range(n_outer):
                partials: list[dict] = []
                envs = []
                for c, ct in zip(active, tiles):
                    outer, steps = ct[o]
                    env: dict = {}
                    states: dict = {}
                    multi = s.multi_dims(c)
                    looped = {self.names[k] for k in range(self.ndim) if self.names[k] in self.inner
                              and len({st.ranges[k] for st in steps}) > 1}
                    for r in self.rules:
                        if r.wait & looped and (r.dims & looped):
                            raise ScheduleError(
                                f"{self.where(c, steps[-1].ranges)}: op {r.index} ({p.body[r.index].kind}) needs the "
                                f"finished reduction over {sorted(r.wait)} and varies along {sorted(r.dims & looped)}, "
                                "which this schedule tiles into several steps: the reduction dim must be one tile "
                                "(persistent)")
                    for st in steps:
                        ar = _aranges(p, st.ranges)
                        self.account(c, st.ranges, multi)
                        for i, op in enumerate(p.body):
                            if ring_dep[i] or split_ring[i]:
                                continue
                            if runs_at(self.rules[i], st, self.inner):
                                self.run_op(i, op, env, ar, c, st.ranges, states)
                    partials.append({i: env[_STATE + op.value] for i, op in enumerate(p.body) if split_ring[i]})
                    envs.append((c, env, steps[-1]))
                # ring: the partial of chunk j travels to chunk j-1; the owner ends with the total
                owner, oenv, olast = envs[0]
                for i, op in enumerate(p.body):
                    if not split_ring[i]:
                        continue
                    prod = an.producer[op.value]
                    comb, finish = _reduction_state(prod)
                    carry = partials[-1][i]
                    for j in range(len(active) - 1, 0, -1):
                        src, dst = active[j], active[j - 1]
                        self.sends.append((src.core, dst.core, i, o, _shape(carry)))
                        mine = partials[j - 1][i]
                        if _shape(mine) != _shape(carry):
                            raise ScheduleError(f"program {p.name}: ring op {i}: core {dst.core} holds a partial "
                                                f"of shape {_shape(mine)} but receives {_shape(carry)} "
                                                f"from core {src.core}")
                        self.recvs.append((src.core, dst.core, i, o, _shape(mine)))
                        carry = comb(mine, carry)
                    oenv[op.out] = finish(carry)
                ar = _aranges(p, olast.ranges)
                for i, op in enumerate(p.body):
                    if ring_dep[i] and not split_ring[i]:
                        self.run_op(i, op, oenv, ar, owner, olast.ranges, {})
        unmatched = set(self.sends) ^ set(self.recvs)
        if unmatched:
            raise ScheduleError(f"program {p.name}: unmatched ring transfers {sorted(unmatched)[:4]}")
        for b in p.buffers:
            if b.role != "out":
                continue
            cnt = self.counts[b.name]
            shape = [_bind(x, self.bd.sizes) for x in b.shape]
            strides = [_bind(x, self.bd.sizes) for x in b.strides]
            pos = torch.zeros((), dtype=torch.int64)
            for n, st in zip(shape, strides):
                pos = pos.unsqueeze(-1) + torch.arange(n, dtype=torch.int64) * st
            pos = pos.reshape(-1)
            miss = cnt[pos] == 0 if pos.numel() else torch.zeros(0, dtype=torch.bool)
            if bool(miss.any()):
                first = int(miss.nonzero()[0])
                coord = []
                for n in reversed(shape):
                    coord.append(first % n)
                    first //= n
                raise ScheduleError(f"program {p.name}: gap: {int(miss.sum())} element(s) of output buffer {b.name} "
                                    f"never written (first at {tuple(reversed(coord))}); the work division or tiles "
                                    "do not cover the iteration space")
        return {"peak_scratchpad_bytes": self.peak, "ring_transfers": len(self.sends),
                "cores": sum(1 for c in s.cores if not c.empty)}


_STATE = "#state:"     # env key prefix of a reduction's raw partial state (checked mode)


def _reduction_state(op) -> tuple:
    """(combine, finish) of a reduction's partial states, from the registry."""
    if isinstance(op, Reduce):
        impl = REDUCE_IMPL[op.op]
        return impl.combine, impl.finish
    if isinstance(op, SoftmaxMatmul):
        return SOFTMAX_MATMUL.combine, (lambda st, op=op: SOFTMAX_MATMUL.finish(st, op))
    return torch.add, (lambda st: st)


def _shape(x) -> tuple:
    return tuple(tuple(t.shape) if t is not None else () for t in x) if isinstance(x, tuple) else tuple(x.shape)


def run_checked(bd: Bound, hosts: Sequence[torch.Tensor], schedule: Schedule | None = None) -> dict:
    """Run core by core, tile by tile, proving the schedule. Returns facts it measured."""
    s = schedule or bd.schedule()
    return _Checked(bd, hosts, s).run()
