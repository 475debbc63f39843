"""Planning helpers both compilers share: work divisions in whole sticks, tile sizing against the
scratchpad budget, and picking a division with the latency model.

``resolve(program, sizes)`` turns a program (whose ``division``/``tiles`` may be ``None``) and bound
sizes into a concrete :class:`Schedule`: per core, its range of every dim, the tile extents, and
whether DMA is double-buffered. The executor's checked mode, the latency model and the trace all
walk this one schedule.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Iterator, Mapping

import torch

from .. import hardware
from ..hardware import HardwareConfig
from .ops import Access, access_layout, relayout_candidates
from .program import (Load, Matmul, Program, ProgramError, Reduce, Split, Store, TilePlan,
                      WorkDivision, _bind)

__all__ = ["Schedule", "CoreWork", "resolve", "bind_sizes", "stick_dims", "persistent_dims", "live_bytes",
           "value_tile_bytes", "size_tiles", "legal_divisions", "pick_division", "ScheduleError", "tile_ranges"]


class ScheduleError(RuntimeError):
    """A schedule is illegal or was proven wrong by checked mode (names program, core, tile, buffer)."""


def bind_sizes(p: Program, sizes: Mapping[str, int]) -> dict[str, int]:
    return {d.name: _bind(d.size, sizes) for d in p.dims}


@dataclass(frozen=True)
class CoreWork:
    core: int
    coords: tuple[int, ...]                 # index along each split
    ranges: tuple[tuple[int, int], ...]     # [start, stop) per dim (program dim order)

    @property
    def empty(self) -> bool:
        return any(b <= a for a, b in self.ranges)


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

    @property
    def num_cores(self) -> int:
        return len(self.cores)

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

    def describe(self) -> str:
        p = self.program
        sp = ", ".join(f"{d}/{n} chunk={c}" for d, n, c, _ in self.splits) or "none (1 core)"
        tl = ", ".join(f"{d}={t}" for d, t in zip(p.dim_names, self.tiles))
        rl = ""
        if self.relayout:
            names = ", ".join(sorted(p.body[i].buffer for i in self.relayout))
            rl = f"; re-laid once: {names}"
        return f"cores={self.num_cores} split: {sp}; tile: {tl}; double_buffer={self.double_buffer}{rl}"


# ------------------------------------------------------------------------------ analysis helpers
def stick_dims(p: Program, access: Mapping[int, Access], cfg: HardwareConfig) -> dict[str, int]:
    """dim -> elements per stick, for every dim some contiguous access walks with stride 1.
    Work division chunks and tile extents along these dims are whole sticks."""
    out: dict[str, int] = {}
    for acc in access.values():
        if acc.contiguous and acc.unit_var is not None:
            out[acc.unit_var] = max(out.get(acc.unit_var, 1), cfg.stick_elems(acc.itemsize))
    return out


def persistent_dims(p: Program) -> frozenset[str]:
    """Reduction dims that must be one tile per core: some op needs a reduction over the dim
    to be complete *and* varies along it (softmax's exp(x - max))."""
    an = p.analysis
    out: set[str] = set()
    for i, op in enumerate(p.body):
        vd: set[str] = set()
        for n in op.inputs + op.outputs:
            vd |= an.dims[n]
        if isinstance(op, (Load, Store)):
            vd |= {d for d in p.dim_names if d in {s.name for s in op.index.free_symbols}}
        out |= an.op_after[i] & vd
    return frozenset(out)


def value_tile_bytes(shape_per_dim: list[int], value_dims: frozenset[str], dims: tuple[str, ...],
                     itemsize: int, cfg: HardwareConfig) -> int:
    """Scratchpad bytes of one value's tile: its box, innermost dim padded to whole sticks."""
    ext = [n for d, n in zip(dims, shape_per_dim) if d in value_dims]
    if not ext:
        return cfg.stick_bytes
    inner = ext[-1]
    outer = math.prod(ext[:-1])
    return outer * math.ceil(inner * itemsize / cfg.stick_bytes) * cfg.stick_bytes


def _itemsize(dt: torch.dtype) -> int:
    return torch.empty((), dtype=dt).element_size()


def live_bytes(p: Program, tile: Mapping[str, int], double_buffer: bool, cfg: HardwareConfig) -> int:
    """Peak scratchpad bytes of one tile step: values live at once (def to last use), reduction
    accumulators, DMA staging tiles (twice when double-buffered). Checked mode measures the same
    quantity on the actual tiles it runs."""
    an = p.analysis
    dims = p.dim_names
    shape = [tile[d] for d in dims]
    live: dict[str, int] = {}
    peak = 0
    for i, op in enumerate(p.body):
        extra = 0
        for name in op.outputs:
            b = value_tile_bytes(shape, an.dims[name], dims, _itemsize(an.dtypes[name]), cfg)
            if isinstance(op, Load):
                b *= 2 if double_buffer else 1
            if isinstance(op, (Reduce, Matmul)):
                acc_dims = an.dims[name]
                b = value_tile_bytes(shape, acc_dims, dims, 4, cfg)
            live[name] = b
        if isinstance(op, Store):
            b = p.buffer(op.buffer)
            extra = value_tile_bytes(shape, an.dims[op.value], dims, b.itemsize, cfg) * (2 if double_buffer else 1)
        peak = max(peak, sum(live.values()) + extra)
        for name in list(live):
            if an.last_use.get(name, -1) <= i:
                del live[name]
    return peak


# ------------------------------------------------------------------------------ resolve
def tile_ranges(start: int, stop: int, tile: int) -> list[tuple[int, int]]:
    return [(a, min(a + tile, stop)) for a in range(start, stop, max(1, tile))]


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _chunk(size: int, parts: int, stick: int) -> int:
    c = max(1, -(-size // parts))
    return _round_up(c, stick) if stick > 1 else c


def _check_division(p: Program, division: WorkDivision, cfg: HardwareConfig) -> str | None:
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


def resolve(p: Program, sizes: Mapping[str, int], cfg: HardwareConfig | None = None,
            division: WorkDivision | None = None, tiles: TilePlan | None = None,
            relayout: frozenset[int] | None = None) -> Schedule:
    """The concrete schedule of ``p`` for bound ``sizes`` (planning what the program leaves open).

    ``relayout=None``: the stick-aware access pass decides, for every transposed matmul operand,
    whether to read it at its real cost or re-lay it once, by the latency model's estimate.
    """
    cfg = cfg or hardware.get_config()
    if relayout is None:
        return _resolve_relayout(p, sizes, cfg, division, tiles)
    ext = bind_sizes(p, sizes)
    access = access_layout(p, sizes, relayout)
    sticks = stick_dims(p, access, cfg)
    division = division or p.division
    tiles = tiles or p.tiles
    if division is None:
        division = pick_division(p, sizes, cfg, tiles=tiles, relayout=relayout)
    ring_dim = _check_division(p, division, cfg)
    splits = []
    for s in division.splits:
        size = ext[s.dim]
        chunk = _bind(s.chunk, sizes) if s.chunk is not None else _chunk(size, s.parts, sticks.get(s.dim, 1))
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
    budget = cfg.scratchpad_usable_bytes
    if tiles is not None and tiles.sizes:
        t = {d: core_ext[d] for d in p.dim_names}
        for d, v in tiles.sizes:
            t[d] = max(1, _bind(v, sizes))
        db = tiles.double_buffer
        if db is None:
            db = live_bytes(p, {d: max(1, min(t[d], core_ext[d] or 1)) for d in t}, True, cfg) <= budget
    else:
        t, db = size_tiles(p, core_ext, sticks, cfg, budget,
                           double_buffer=None if tiles is None else tiles.double_buffer)
    return Schedule(p, dict(sizes), tuple(ext[d] for d in p.dim_names), tuple(splits),
                    tuple(t[d] for d in p.dim_names), bool(db), tuple(cores), access, ring_dim, cfg,
                    frozenset(relayout))


def _resolve_relayout(p: Program, sizes: Mapping[str, int], cfg: HardwareConfig, division: WorkDivision | None,
                      tiles: TilePlan | None) -> Schedule:
    """Stick-aware access: try reading each transposed matmul operand as is or re-laid once."""
    from .latency import estimate_schedule

    cands = relayout_candidates(p, sizes)
    if not cands:
        return resolve(p, sizes, cfg, division, tiles, relayout=frozenset())
    best = None
    err: Exception | None = None
    for n in range(len(cands) + 1):
        for subset in itertools.combinations(cands, n):
            try:
                s = resolve(p, sizes, cfg, division, tiles, relayout=frozenset(subset))
            except (ScheduleError, ProgramError) as e:
                err = e
                continue
            us = estimate_schedule(s, segments=False).us
            if best is None or us < best[0]:
                best = (us, s)
    if best is None:
        raise err if err else ScheduleError(f"program {p.name}: no schedule")
    return best[1]


def size_tiles(p: Program, core_ext: Mapping[str, int], sticks: Mapping[str, int], cfg: HardwareConfig,
               budget: int, double_buffer: bool | None = None) -> tuple[dict[str, int], bool]:
    """Largest tiles that fit ``budget``: start from the core's whole extent and halve the
    largest shrinkable dim (parallel dims first, then non-persistent reduction dims), keeping
    stick dims in whole sticks. Prefers double buffering when it fits with tiles at least a
    quarter of the single-buffered ones. Raises ProgramError if even minimal tiles overflow."""
    pers = persistent_dims(p)
    kinds = {d.name: d.kind for d in p.dims}

    def fit(db: bool) -> dict[str, int] | None:
        t = {d: max(1, n) for d, n in core_ext.items()}
        while live_bytes(p, t, db, cfg) > budget:
            cands = []
            for d, n in t.items():
                unit = sticks.get(d, 1)
                if d in pers or n <= unit:
                    continue
                cands.append((kinds[d] == "parallel", n // unit, d))
            if not cands:
                return None
            cands.sort(reverse=True)
            d = cands[0][2]
            unit = sticks.get(d, 1)
            t[d] = max(unit, _round_up(-(-t[d] // 2), unit))
        return t

    single = fit(False)
    if single is None:
        raise ProgramError(f"program {p.name}: even the smallest tiles overflow the scratchpad "
                           f"({budget} usable bytes); persistent dims {sorted(pers)}")
    if double_buffer is False:
        return single, False
    dbl = fit(True)
    if dbl is not None and (double_buffer or math.prod(dbl.values()) * 4 >= math.prod(single.values())):
        return dbl, True
    if double_buffer:
        raise ProgramError(f"program {p.name}: double buffering was asked for but does not fit the scratchpad")
    return single, False


def legal_divisions(p: Program, sizes: Mapping[str, int], cfg: HardwareConfig | None = None) -> list[WorkDivision]:
    """Candidate divisions: one parallel dim or two, optionally with one ring-combined reduction
    dim, part counts that give every core at least one stick (or row), at most ``num_cores``."""
    cfg = cfg or hardware.get_config()
    an = p.analysis
    ext = bind_sizes(p, sizes)
    sticks = stick_dims(p, access_layout(p, sizes), cfg)
    par = [d.name for d in p.dims if d.kind == "parallel" and d.name not in an.reduced_dims and ext[d.name] > 1]
    red = [d for d in an.ring_dims if ext[d] > 1 and d not in persistent_dims(p)]
    n = cfg.num_cores

    def parts_for(d: str) -> list[int]:
        units = -(-ext[d] // sticks.get(d, 1))
        opts = {k for k in (2 ** i for i in range(0, 12)) if k <= min(n, units)}
        opts.add(min(n, units))
        return sorted(k for k in opts if k > 1)

    out = [WorkDivision(())]
    singles = [(d, k) for d in par + red for k in parts_for(d)]
    for d, k in singles:
        out.append(WorkDivision((Split(d, k),)))
    for (d1, k1), (d2, k2) in itertools.combinations(singles, 2):
        if d1 != d2 and k1 * k2 <= n and not (d1 in red and d2 in red):
            s = sorted([Split(d1, k1), Split(d2, k2)], key=lambda s: s.dim in red)  # ring dim innermost
            out.append(WorkDivision(tuple(s)))
    good = []
    for w in out:
        try:
            _check_division(p, w, cfg)
        except ScheduleError:
            continue
        good.append(w)
    return good


def pick_division(p: Program, sizes: Mapping[str, int], cfg: HardwareConfig | None = None,
                  tiles: TilePlan | None = None, relayout: frozenset[int] = frozenset()) -> WorkDivision:
    """The legal division with the lowest estimated time (ties: fewer cores)."""
    from .latency import estimate_schedule

    cfg = cfg or hardware.get_config()
    best = None
    for w in legal_divisions(p, sizes, cfg):
        try:
            s = resolve(p, sizes, cfg, division=w, tiles=tiles, relayout=relayout)
        except (ScheduleError, ProgramError):
            continue
        est = estimate_schedule(s, segments=False)
        key = (est.cycles, w.num_cores)
        if best is None or key < best[0]:
            best = (key, w)
    if best is None:
        raise ScheduleError(f"program {p.name}: no legal work division fits the scratchpad")
    return best[1]


def iter_tiles(s: Schedule, core: CoreWork) -> Iterator[tuple[tuple[tuple[int, int], ...], list[tuple[tuple[int, int], ...]]]]:
    """For one core: (outer tile ranges, [inner tile ranges ...]) where inner tiles walk the
    reduced dims (the dims of a reduction loop) and outer tiles the others."""
    p = s.program
    red = p.analysis.reduced_dims
    names = p.dim_names
    outer_axes = [i for i, d in enumerate(names) if d not in red]
    inner_axes = [i for i, d in enumerate(names) if d in red]
    outer_lists = [tile_ranges(*core.ranges[i], s.tiles[i]) for i in outer_axes]
    inner_lists = [tile_ranges(*core.ranges[i], s.tiles[i]) for i in inner_axes]
    inner = list(itertools.product(*inner_lists))
    for o in itertools.product(*outer_lists):
        base = list(core.ranges)
        for ax, r in zip(outer_axes, o):
            base[ax] = r
        steps = []
        for it in inner:
            rr = list(base)
            for ax, r in zip(inner_axes, it):
                rr[ax] = r
            steps.append(tuple(rr))
        yield tuple(base), steps
