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

from .. import hardware
from ..ir.indexing import affine_form, compile_expr, free_names, sym
from ..ir.ops import DeviceAssertError, const_value, eval_index
from ..ir.planning import resolve
from ..ir.schedule import (Schedule, ScheduleError, bind_sizes, iter_tiles, live_bytes, op_rules, runs_at)
from ..ir.program import STATE, Compute, Load, Matmul, Program, ProgramError, RingReduce, SoftmaxMatmul, Store, _bind

__all__ = ["Bound", "bind", "run_fast", "run_checked", "ScheduleError", "LaunchError"]


class LaunchError(ValueError):
    """The tensors given to a launch do not match the program's buffers."""


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


class _FastCtx:
    """What the op kinds' fast forms see (``ir.program``): one box of the iteration space."""

    def __init__(self, bd: Bound, region: list[tuple[int, int]] | None) -> None:
        p = self.p = bd.program
        self.bd, self.an, self.names, self.ndim = bd, p.analysis, p.dim_names, len(p.dim_names)
        full = region or [(0, bd.ext[d]) for d in self.names]
        self.ar = _aranges(p, full)
        self.box = [b - a for a, b in full]
        self.start = {d: a for d, (a, _) in zip(self.names, full)}
        self.bidx = {b.name: i for i, b in enumerate(p.buffers)}
        self.spans = bd.spans

    def subst(self, expr: sympy.Expr) -> sympy.Expr:
        return _subst(expr, self.bd.sizes)

    def axes(self, value: str) -> list[int]:
        return sorted(self.names.index(d) for d in self.an.dims[value])

    def view(self, op, store: bool = False) -> tuple | None:
        """An affine access as a strided view of its buffer (shape, strides, offset), or None."""
        expr = self.subst(op.index)
        if any(n.startswith("%") for n in free_names(expr)):
            return None
        form = affine_form(expr, self.names)
        if form is None or any(c < 0 for c in form[1].values()):
            return None
        const, coefs = form
        const += sum(c * self.start[d] for d, c in coefs.items())
        vshape = [n if coefs.get(d) else 1 for d, n in zip(self.names, self.box)]
        vstr = [coefs.get(d, 0) for d in self.names]
        if store and not _non_overlapping(vshape, vstr):
            return None
        return vshape, vstr, const

    def index_of(self, expr: sympy.Expr) -> Callable:
        """An address expression evaluated over the box (reading the SSA values it names)."""
        expr = self.subst(expr)
        indirect = sorted(n for n in free_names(expr) if n.startswith("%"))
        fn, ar, ndim = compile_expr(expr), self.ar, self.ndim

        return lambda env: eval_index(fn, ar, env, indirect, ndim)


def _compile_fast(bd: Bound, region: list[tuple[int, int]] | None = None) -> list[Callable]:
    fx = _FastCtx(bd, region)
    attn = _attention_paths(bd.program)
    skip = set().union(*[a["skip"] for a in attn.values()]) if attn else set()
    steps: list[Callable] = []
    for i, op in enumerate(bd.program.body):
        if i in skip:
            continue
        if i in attn:
            def step(env, H, a=attn[i], out=op.out, ndim=fx.ndim):
                env[out] = _attention_fast(a, env, ndim)
            steps.append(step)
        else:
            steps.append(op.fast(i, fx))
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
            benv[op.out] = op.fn(p.analysis)(*[benv[x] if isinstance(x, str) else const_value(x, ndim)
                                               for x in op.args])
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
    host = bd.program.meta.get("host")
    if host is not None:                  # a library program with a whole-program host form
        from ..ir.library import HOST_FORMS
        try:
            HOST_FORMS[host[0]](bd.program, hosts)
        except DeviceAssertError:         # the program's own device-side checks, made on the host
            raise
        except (RuntimeError, IndexError, TypeError, ValueError) as e:
            raise RuntimeError(f"program {bd.program.name}: {type(e).__name__}: {e}") from e
        return
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
        self.core = None
        self.spans = bd.spans

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

    # -- what the op kinds' tile forms see (``ir.program``) --------------------------------
    def where(self, core, tile) -> str:
        rng = ", ".join(f"{d}[{a}:{b}]" for d, (a, b) in zip(self.names, tile))
        return f"program {self.p.name}: core {core.core}: tile {rng}"

    def subst(self, expr: sympy.Expr) -> sympy.Expr:
        return _subst(expr, self.bd.sizes)

    def axes(self, value: str) -> list[int]:
        return sorted(self.names.index(d) for d in self.an.dims[value])

    def index(self, i: int, env, ar) -> torch.Tensor:
        fn, ind = self.exprs[i]
        return eval_index(fn, ar, env, ind, self.ndim)

    def _bounds(self, i: int, what: str, idx: torch.Tensor, span: int, tile) -> None:
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= span):
            bad = int(idx.min()) if int(idx.min()) < 0 else int(idx.max())
            raise ScheduleError(f"{self.where(self.core, tile)}: op {i} {what}: element {bad} out of bounds [0, {span})")

    def read_check(self, i: int, op, span: int, tile) -> Callable:
        return lambda idx: self._bounds(i, f"load {op.out} from buffer {op.buffer}", idx, span, tile)

    def write_check(self, i: int, op, span: int, tile) -> Callable:
        def check(idx):
            self._bounds(i, f"store to buffer {op.buffer}", idx, span, tile)
            cnt = self.counts[op.buffer]
            cnt.index_put_((idx,), torch.ones_like(idx, dtype=torch.int32), accumulate=True)
            if idx.numel() and int(cnt[idx].max()) > 1:
                dup = int(idx[cnt[idx] > 1][0])
                raise ScheduleError(f"{self.where(self.core, tile)}: op {i} store to buffer {op.buffer}: element "
                                    f"{dup} written {int(cnt[dup])} times (overlapping work division or tiles)")
        return check

    def run_op(self, i: int, op, env, ar, core, tile, states: dict) -> None:
        self.core = core
        try:
            op.tile(i, self, env, ar, tile, states)
        except DeviceAssertError as e:
            raise _fail(self.p, i, op, e, f" (core {core.core})") from None

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
                    partials.append({i: env[STATE + op.value] for i, op in enumerate(p.body) if split_ring[i]})
                    envs.append((c, env, steps[-1]))
                # ring: the partial of chunk j travels to chunk j-1; the owner ends with the total
                owner, oenv, olast = envs[0]
                for i, op in enumerate(p.body):
                    if not split_ring[i]:
                        continue
                    prod = an.producer[op.value]
                    comb, finish = prod.state_fns()
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


def _shape(x) -> tuple:
    return tuple(tuple(t.shape) if t is not None else () for t in x) if isinstance(x, tuple) else tuple(x.shape)


def run_checked(bd: Bound, hosts: Sequence[torch.Tensor], schedule: Schedule | None = None) -> dict:
    """Run core by core, tile by tile, proving the schedule. Returns facts it measured."""
    s = schedule or bd.schedule()
    return _Checked(bd, hosts, s).run()
