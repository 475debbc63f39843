"""Schedules: where, in which order and in which pieces each core runs a tile program.

A :class:`Schedule` fixes, for one program and bound sizes: the work division (each core's range
of every dim), the tile extents, the loop order of the outer tiles, double buffering, which
transposed operands are re-laid once before the kernel, and the access layout of every Load and
Store. With it come the rules every consumer of a schedule shares, defined here once:

* **Steps.** A core walks *outer tiles* (dims no op reduces over, nested in ``order``, outermost
  first) and, inside each, *inner tiles* (the reduced dims, in program order, innermost last).
* **Which op runs at a step** (:attr:`OpRule`): an op that needs a reduction over ``d`` to be
  finished runs at the last tile along ``d``; an op that neither varies along an inner dim nor
  waits for it runs once, at the first tile along it (loop-invariant code stays out of the
  loop: a bias load of a K-tiled matmul is loaded once per output tile); the others run at
  every step.
* **Resident loads.** A load whose box (its tile ranges along the dims its address depends on)
  is the same as the last time it ran on this core is not moved again: it stayed in the
  scratchpad. With the loop order the planner picks, the operand that does not depend on the
  innermost loop stays resident (the weight tile of a decode matmul, rope's cos/sin across
  heads, a norm's weight across rows).
* **Scratchpad bytes** (:func:`live_bytes`): values live from definition to last use; values that
  survive across steps (accumulators, resident loads, hoisted values) for the whole step; loads
  that stream (reload every step) twice when double-buffered; no-op casts alias their input.

The latency model (``latency.py``) is a pure function of a Schedule; the planner
(``planning.py``) searches over schedules; checked mode (``vspyre.runtime``) executes one tile by
tile and proves it. None of them re-derives these rules.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import torch

from ..hardware import HardwareConfig
from .ops import Access
from .program import Compute, Load, Matmul, Program, ProgramError, Reduce, Store, _bind

__all__ = ["ScheduleError", "Schedule", "CoreWork", "Step", "OpRule", "bind_sizes", "op_rules",
           "persistent_dims", "stick_dims", "live_bytes", "value_tile_bytes", "tile_ranges", "iter_tiles",
           "check_division", "build_schedule", "is_alias"]


class ScheduleError(RuntimeError):
    """A schedule is illegal or was proven wrong by checked mode (names program, core, tile, buffer)."""


def bind_sizes(p: Program, sizes: Mapping[str, int]) -> dict[str, int]:
    return {d.name: _bind(d.size, sizes) for d in p.dims}


# ------------------------------------------------------------------------------ per-op rules
@dataclass(frozen=True)
class OpRule:
    """When op ``index`` runs inside a core's loop nest, independent of sizes."""

    index: int
    dims: frozenset[str]         # dims the op varies along (a Reduce/Matmul: its input's, reduced dims included)
    wait: frozenset[str]         # reduced dims whose reduction must be finished (runs at their last tile)
    ring: frozenset[str]         # dims of RingReduces it depends on (on the split one: runs on the ring owner only)


def is_alias(p: Program, i: int) -> bool:
    """A cast that changes nothing on the card (f16 -> f16, i64 -> i64, ...): it aliases its input,
    costs no cycles and no scratchpad."""
    flags = p.__dict__.get("_alias_flags")
    if flags is None:
        an = p.analysis
        flags = p.__dict__["_alias_flags"] = tuple(
            (isinstance(op, Compute) and op.op in ("to", "identity") and bool(op.args) and isinstance(op.args[0], str)
             and an.dtypes[op.args[0]] == an.dtypes[op.out]) or _refills_masked_load(p, op) for op in p.body)
    return flags[i]


def _refills_masked_load(p: Program, op: Any) -> bool:
    """``where(m, load(.., mask=m, other=c), c)``: the masked load already filled ``c`` where ``m``
    is false (Inductor writes this for a padded or concatenated read), so the ``where`` is the load."""
    if not (isinstance(op, Compute) and op.op == "where" and len(op.args) == 3
            and isinstance(op.args[0], str) and isinstance(op.args[1], str)):
        return False
    from .program import Constant
    an = p.analysis
    ld = an.producer.get(op.args[1])
    if not isinstance(ld, Load) or ld.mask != op.args[0] or an.dtypes[ld.out] != an.dtypes[op.out]:
        return False
    c = op.args[2]
    if isinstance(c, str):
        cop = an.producer.get(c)
        if not isinstance(cop, Constant):
            return False
        c = cop.value
    try:
        return float(c) == float(ld.other)
    except (TypeError, ValueError):
        return False


def address_only(p: Program) -> frozenset[int]:
    """Index computations (IndexValue, constants and vector ops over them) used only to mask or
    index loads: the DMA engine's address generation does them (zero fill of a convolution's
    padding, the bounds of a ``cat``), not the vector unit; they cost no cycles and no scratchpad.
    Where a mask is also used as a value (``where(mask, a, b)``), it is computed on the vector unit."""
    cached = p.__dict__.get("_address_only")
    if cached is not None:
        return cached
    from .program import Constant, IndexValue
    an = p.analysis
    users: dict[str, list] = {}
    for op in p.body:
        for n in op.inputs:
            users.setdefault(n, []).append(op)
    out: set[int] = set()
    for i in range(len(p.body) - 1, -1, -1):
        op = p.body[i]
        if not isinstance(op, (IndexValue, Constant, Compute)) or not op.outputs:
            continue
        if isinstance(op, Compute) and any(isinstance(an.producer.get(n), (Load, Reduce, Matmul))
                                           for n in op.inputs):
            continue
        name = op.outputs[0]
        us = users.get(name, [])
        ok = bool(us)
        for u in us:
            if isinstance(u, Load) and u.mask == name:
                continue
            if _refills_masked_load(p, u) and u.args[0] == name and name not in u.args[1:]:
                continue
            j = p.body.index(u)
            if j in out:
                continue
            ok = False
            break
        if ok:
            out.add(i)
    res = frozenset(out)
    p.__dict__["_address_only"] = res
    return res


def op_rules(p: Program) -> tuple[OpRule, ...]:
    cached = p.__dict__.get("_op_rules")
    if cached is not None:
        return cached
    an = p.analysis
    names = set(p.dim_names)
    out = []
    for i, op in enumerate(p.body):
        d: set[str] = set()
        if isinstance(op, (Load, Store)):
            d |= {n for n in (s.name for s in op.index.free_symbols) if n in names}
        for n in op.inputs + op.outputs:
            d |= an.dims[n]
        d |= op.reduces
        out.append(OpRule(i, frozenset(d), an.op_after[i], an.op_ring[i]))
    res = tuple(out)
    p.__dict__["_op_rules"] = res
    return res


def persistent_dims(p: Program) -> frozenset[str]:
    """Reduction dims that must be one tile per core: some op needs the reduction over the dim to
    be finished *and* varies along a reduced dim (softmax's ``exp(x - max)`` varies along the dim
    it waits for; attention's scores wait for the head-dim contraction and vary along the keys)."""
    an = p.analysis
    out: set[str] = set()
    for r in op_rules(p):
        if r.wait and r.dims & an.reduced_dims:
            out |= r.wait
    return frozenset(out)


def stick_dims(p: Program, access: Mapping[int, Access], cfg: HardwareConfig) -> dict[str, int]:
    """dim -> elements per stick, for every dim some contiguous access walks with stride 1.
    Work division chunks and tile extents along these dims are whole sticks."""
    out: dict[str, int] = {}
    for acc in access.values():
        if acc.contiguous and acc.unit_var is not None:
            out[acc.unit_var] = max(out.get(acc.unit_var, 1), cfg.stick_elems(acc.itemsize))
    return out


# ------------------------------------------------------------------------------ scratchpad
def value_tile_bytes(shape_per_dim: list[int], value_dims: frozenset[str], dims: tuple[str, ...],
                     itemsize: int, cfg: HardwareConfig) -> int:
    """Scratchpad bytes of one value's tile: its box, innermost dim padded to whole sticks."""
    ext = [n for d, n in zip(dims, shape_per_dim) if d in value_dims]
    if not ext:
        return cfg.stick_bytes
    inner = ext[-1]
    outer = math.prod(ext[:-1])
    return outer * math.ceil(inner * itemsize / cfg.stick_bytes) * cfg.stick_bytes


class _LiveInfo:
    """What :func:`live_bytes` needs of a program, computed once (the planner calls it a lot)."""

    def __init__(self, p: Program):
        an = p.analysis
        rules = op_rules(p)
        self.dims = p.dim_names
        self.pos = {d: k for k, d in enumerate(self.dims)}
        self.reduced = an.reduced_dims
        self.inner_dims = tuple(d for d in self.dims if d in an.reduced_dims)
        self.values: list[tuple] = []      # (op index, name, dim positions, itemsize, kind, dims, extra)
        self.stores: dict[int, tuple] = {}
        alias_of: dict[str, str] = {}
        addr = address_only(p)
        for i, op in enumerate(p.body):
            if is_alias(p, i):
                alias_of[op.outputs[0]] = alias_of.get(op.args[0], op.args[0])
                continue
            if i in addr:
                continue
            r = rules[i]
            for name in op.outputs:
                idx = tuple(k for k, d in enumerate(self.dims) if d in an.dims[name])
                if op.reduces:
                    self.values.append((i, name, idx, 4, "acc", r.dims, op.reduces))
                elif isinstance(op, Load):
                    self.values.append((i, name, idx, _itemsize(an.dtypes[name]), "load", r.dims, None))
                else:
                    self.values.append((i, name, idx, _itemsize(an.dtypes[name]), "val", r.dims, r.wait))
            if isinstance(op, Store):
                idx = tuple(k for k, d in enumerate(self.dims) if d in an.dims[op.value])
                self.stores[i] = (idx, p.buffer(op.buffer).itemsize)
        last = dict(an.last_use)
        for a, src in alias_of.items():          # an alias keeps its source alive
            last[src] = max(last.get(src, -1), last.get(a, -1))
        self.last = last
        self.nops = len(p.body)


_ITEMSIZE: dict = {}


def _itemsize(dt: torch.dtype) -> int:
    n = _ITEMSIZE.get(dt)
    if n is None:
        n = _ITEMSIZE[dt] = torch.empty((), dtype=dt).element_size()
    return n


def _tile_bytes(shape: list[int], idx: tuple[int, ...], itemsize: int, stick: int) -> int:
    if not idx:
        return stick
    outer = 1
    for k in idx[:-1]:
        outer *= shape[k]
    return outer * (-(-shape[idx[-1]] * itemsize // stick)) * stick


def live_bytes(p: Program, tile: Mapping[str, int], double_buffer: bool, cfg: HardwareConfig,
               multi: frozenset[str] | None = None, order: tuple[str, ...] | None = None) -> int:
    """Peak scratchpad bytes of one tile step.

    ``multi``: dims a core walks in more than one tile (None: every dim, the conservative
    assumption); ``order``: the outer loop order (None: program order). Values live from
    definition to last use; values that survive from one step to the next for the whole step:
    accumulators of a Reduce/Matmul whose reduced dim is walked in several tiles, values an op
    computes once for several steps (loop-invariant), and loads that stay resident (their box does
    not depend on the innermost loop). Loads that stream, and store staging, count twice when
    double-buffered. No-op casts alias their input. Checked mode measures the same quantity on
    the tiles it runs.
    """
    info = p.__dict__.get("_live_info")
    if info is None:
        info = p.__dict__["_live_info"] = _LiveInfo(p)
    dims = info.dims
    shape = [tile[d] for d in dims]
    multi = frozenset(dims) if multi is None else multi
    inner = None
    for d in reversed(tuple(order if order is not None else (x for x in dims if x not in info.reduced))
                      + info.inner_dims):
        if d in multi:
            inner = d
            break
    red_inner = info.reduced & multi
    stick = cfg.stick_bytes
    db = 2 if double_buffer else 1
    carried = 0
    live: dict[int, list] = {}            # op index -> [(name, bytes)] defined there
    for i, name, idx, isz, kind, rdims, extra in info.values:
        b = _tile_bytes(shape, idx, isz, stick)
        if kind == "acc":
            if extra & multi:
                carried += b
                continue
        elif kind == "load":
            if inner is not None and inner in rdims:
                b *= db
            else:
                carried += b              # resident across steps
                continue
        elif red_inner - rdims - extra:
            carried += b                  # computed once, kept for the inner steps
            continue
        live.setdefault(i, []).append((name, b))
    peak = carried
    current: dict[str, int] = {}
    total = 0
    last = info.last
    for i in range(info.nops):
        for name, b in live.get(i, ()):
            current[name] = b
            total += b
        st = info.stores.get(i)
        extra = _tile_bytes(shape, st[0], st[1], stick) * db if st is not None else 0
        if carried + total + extra > peak:
            peak = carried + total + extra
        if current:
            for name in [n for n in current if last.get(n, -1) <= i]:
                total -= current.pop(name)
    return peak


# ------------------------------------------------------------------------------ the schedule
@dataclass(frozen=True)
class CoreWork:
    core: int
    coords: tuple[int, ...]                 # index along each split
    ranges: tuple[tuple[int, int], ...]     # [start, stop) per dim (program dim order)

    @property
    def empty(self) -> bool:
        return any(b <= a for a, b in self.ranges)


@dataclass(frozen=True)
class Step:
    """One tile step of a core: its range of every dim, and where it sits in the inner loops."""

    ranges: tuple[tuple[int, int], ...]
    first: frozenset[str]      # inner (reduced) dims at their first tile
    last: frozenset[str]       # inner (reduced) dims at their last tile
    outer: int                 # index of the outer tile


def tile_ranges(start: int, stop: int, tile: int) -> list[tuple[int, int]]:
    return [(a, min(a + tile, stop)) for a in range(start, stop, max(1, tile))]


@dataclass
class Schedule:
    program: Program
    sizes: dict[str, int]                  # bound size symbols
    extents: tuple[int, ...]               # per dim
    splits: tuple[tuple[str, int, int, tuple[int, ...]], ...]   # (dim, parts, chunk, starts)
    tiles: tuple[int, ...]                 # tile extent per dim
    double_buffer: bool
    cores: tuple[CoreWork, ...]
    access: dict[int, Access]
    ring_dim: str | None                   # the split dim combined over the ring (if any)
    cfg: HardwareConfig = field(repr=False, default=None)
    relayout: frozenset = frozenset()      # Load indices re-laid once before the kernel
    order: tuple[str, ...] = ()            # outer loop order (non-reduced dims), outermost first

    def __post_init__(self) -> None:
        red = self.program.analysis.reduced_dims
        if not self.order:
            self.order = tuple(d for d in self.program.dim_names if d not in red)

    @property
    def num_cores(self) -> int:
        return len(self.cores)

    @property
    def active_cores(self) -> int:
        return sum(1 for c in self.cores if not c.empty)

    def ring_groups(self) -> list[list[CoreWork]]:
        """Cores that share everything but the ring dim; owner (chunk index 0) first."""
        if self.ring_dim is None:
            return [[c] for c in self.cores]
        k = [s[0] for s in self.splits].index(self.ring_dim)
        groups: dict[tuple, list[CoreWork]] = {}
        for c in self.cores:
            key = c.coords[:k] + c.coords[k + 1:]
            groups.setdefault(key, []).append(c)
        return [sorted(g, key=lambda c: c.coords[k]) for g in groups.values()]

    def multi_dims(self, core: CoreWork | None = None) -> frozenset[str]:
        """Dims walked in more than one tile (on ``core``, or on the largest core)."""
        names = self.program.dim_names
        if core is None:
            ext = [max((c.ranges[i][1] - c.ranges[i][0]) for c in self.cores) for i in range(len(names))]
        else:
            ext = [b - a for a, b in core.ranges]
        return frozenset(d for d, n, t in zip(names, ext, self.tiles) if n > t)

    def describe(self) -> str:
        p = self.program
        sp = ", ".join(f"{d}/{n} chunk={c}" for d, n, c, _ in self.splits) or "none (1 core)"
        tl = ", ".join(f"{d}={t}" for d, t in zip(p.dim_names, self.tiles))
        default = tuple(d for d in p.dim_names if d not in p.analysis.reduced_dims)
        od = f"; order: {' > '.join(self.order)}" if self.order != default and len(self.order) > 1 else ""
        rl = ""
        if self.relayout:
            names = ", ".join(sorted(p.body[i].buffer for i in self.relayout))
            rl = f"; re-laid once: {names}"
        if p.meta.get("swapped"):
            rl += f"; operands swapped: {', '.join(p.meta['swapped'])}"
        return f"cores={self.num_cores} split: {sp}; tile: {tl}{od}; double_buffer={self.double_buffer}{rl}"

    def steps(self, core: CoreWork) -> Iterator[Step]:
        """The core's steps in execution order."""
        p = self.program
        names = p.dim_names
        red = p.analysis.reduced_dims
        pos = {d: i for i, d in enumerate(names)}
        outer_axes = [pos[d] for d in self.order]
        inner_axes = [i for i, d in enumerate(names) if d in red]
        outer_lists = [tile_ranges(*core.ranges[i], self.tiles[i]) for i in outer_axes]
        inner_lists = [tile_ranges(*core.ranges[i], self.tiles[i]) for i in inner_axes]
        inner = []
        for combo in itertools.product(*[list(enumerate(lst)) for lst in inner_lists]):
            first = frozenset(names[ax] for ax, (k, _) in zip(inner_axes, combo) if k == 0)
            last = frozenset(names[ax] for ax, (k, _), lst in zip(inner_axes, combo, inner_lists) if k == len(lst) - 1)
            inner.append((tuple(r for _, r in combo), first, last))
        for oi, o in enumerate(itertools.product(*outer_lists)):
            base = list(core.ranges)
            for ax, r in zip(outer_axes, o):
                base[ax] = r
            for rr, first, last in inner:
                cur = list(base)
                for ax, r in zip(inner_axes, rr):
                    cur[ax] = r
                yield Step(tuple(cur), first, last, oi)


def iter_tiles(s: Schedule, core: CoreWork) -> Iterator[tuple[tuple[tuple[int, int], ...], list[Step]]]:
    """For one core: (outer tile ranges, [its inner steps ...]) in execution order."""
    cur: list[Step] = []
    idx = -1
    for st in s.steps(core):
        if st.outer != idx and cur:
            yield _outer_ranges(s, cur[0]), cur
            cur = []
        idx = st.outer
        cur.append(st)
    if cur:
        yield _outer_ranges(s, cur[0]), cur


def _outer_ranges(s: Schedule, st: Step) -> tuple[tuple[int, int], ...]:
    p = s.program
    return tuple(r if d not in p.analysis.reduced_dims else (0, 0) for d, r in zip(p.dim_names, st.ranges))


def runs_at(rule: OpRule, st: Step, inner_dims: frozenset[str]) -> bool:
    """Whether an op runs at a step (see the module doc)."""
    if not rule.wait <= st.last | (rule.wait - inner_dims):
        return False
    hoist = inner_dims - rule.dims - rule.wait
    return hoist <= st.first


# ------------------------------------------------------------------------------ building
def check_division(p: Program, division, cfg: HardwareConfig) -> str | None:
    """Validate a work division; returns the split reduction dim (the ring dim), if any."""
    an = p.analysis
    if division.num_cores > cfg.num_cores:
        raise ScheduleError(f"program {p.name}: division uses {division.num_cores} cores, the card has {cfg.num_cores}")
    seen = set()
    ring_dim = None
    for s in division.splits:
        if s.dim not in p.dim_names:
            raise ScheduleError(f"program {p.name}: division splits unknown dim {s.dim!r}")
        if s.dim in seen:
            raise ScheduleError(f"program {p.name}: division splits {s.dim} twice")
        seen.add(s.dim)
        if s.parts < 1:
            raise ScheduleError(f"program {p.name}: split of {s.dim} into {s.parts} parts")
        if s.dim in an.reduced_dims and s.parts > 1:
            if ring_dim is not None:
                raise ScheduleError(f"program {p.name}: at most one reduction dim may be split across cores")
            ring_dim = s.dim
            for i, op in enumerate(p.body):
                if an.store_pending[i] and s.dim in an.store_pending[i]:
                    raise ScheduleError(
                        f"program {p.name}: reduction dim {s.dim} is split over {s.parts} cores but op {i} "
                        f"(store to {op.buffer}) writes a partial result not combined by a RingReduce over {s.dim}")
                if s.dim in an.op_ring[i]:
                    vd = set().union(*[an.dims[n] for n in op.inputs + op.outputs]) if (op.inputs or op.outputs) else set()
                    if s.dim in vd:
                        raise ScheduleError(f"program {p.name}: op {i} ({op.kind}) runs after the ring reduction "
                                            f"over {s.dim} but varies along {s.dim}; {s.dim} cannot be split")
    return ring_dim


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def chunk_of(size: int, parts: int, stick: int) -> int:
    c = max(1, -(-size // parts))
    return _round_up(c, stick) if stick > 1 else c


def build_schedule(p: Program, sizes: Mapping[str, int], cfg: HardwareConfig, division, tiles: Mapping[str, int],
                   double_buffer: bool, access: dict[int, Access], relayout: frozenset[int] = frozenset(),
                   order: tuple[str, ...] | None = None) -> Schedule:
    """A concrete schedule from explicit choices (no search). ``tiles``: extent per dim (missing
    dims: the core's whole extent)."""
    ext = bind_sizes(p, sizes)
    ring_dim = check_division(p, division, cfg)
    sticks = stick_dims(p, access, cfg)
    splits = []
    for s in division.splits:
        size = ext[s.dim]
        chunk = _bind(s.chunk, sizes) if s.chunk is not None else chunk_of(size, s.parts, sticks.get(s.dim, 1))
        starts = s.starts if s.starts is not None else tuple(i * chunk for i in range(s.parts))
        if len(starts) != s.parts:
            raise ScheduleError(f"program {p.name}: split of {s.dim}: {len(starts)} starts for {s.parts} parts")
        splits.append((s.dim, s.parts, chunk, tuple(starts)))
    cores = []
    for cid, coords in enumerate(itertools.product(*[range(s[1]) for s in splits])):
        rng = {d: (0, n) for d, n in ext.items()}
        for (d, parts, chunk, starts), c in zip(splits, coords):
            a = min(starts[c], ext[d])
            rng[d] = (a, min(a + chunk, ext[d]))
        cores.append(CoreWork(cid, tuple(coords), tuple(rng[d] for d in p.dim_names)))
    core_ext = {d: max((c.ranges[i][1] - c.ranges[i][0]) for c in cores) for i, d in enumerate(p.dim_names)}
    t = tuple(max(1, min(int(tiles.get(d, core_ext[d])), max(1, core_ext[d]))) for d in p.dim_names)
    red = p.analysis.reduced_dims
    default = tuple(d for d in p.dim_names if d not in red)
    if order is not None and sorted(order) != sorted(default):
        raise ScheduleError(f"program {p.name}: loop order {order} must name the outer dims {default}")
    return Schedule(p, dict(sizes), tuple(ext[d] for d in p.dim_names), tuple(splits), t, bool(double_buffer),
                    tuple(cores), access, ring_dim, cfg, frozenset(relayout), tuple(order) if order else default)


def scratchpad_overflow(p: Program, sizes: Mapping[str, int], need: int, cfg: HardwareConfig, what: str) -> ProgramError:
    shapes = ", ".join(f"{b.name}={list(_bind(x, sizes) for x in b.shape)}" for b in p.buffers)
    return ProgramError(f"program {p.name}: {what}: needs {need} scratchpad bytes per core, "
                        f"{cfg.scratchpad_usable_bytes} usable; buffers {shapes}")
