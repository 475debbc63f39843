"""The planner: a search over schedules, scored by the latency model. Both compilers use it.

``resolve(program, sizes)`` returns the :class:`~vspyre.ir.schedule.Schedule` with the lowest
estimated time among the candidates, honouring whatever the program (or the caller) fixed
(division, tiles, re-layout, loop order). The search, in the order it runs:

1. **Re-layout** (``variants``, ``relayouts``): every subset of the transposed matmul operands (a
   linear's weight) is tried read as-is (a stick per element) or re-laid once before the kernel;
   and a matmul with a transposed operand is also tried with its operands in the other roles
   (then the other operand is the one to lay out: attention's query rather than its keys).
2. **Work division** (``divisions``): one or two parallel dims split over the cores in whole
   sticks, or one parallel dim and the reduction dim (finished over the ring). Divisions are
   visited from the lowest *lower bound* up: the time a core needs at least to move its box of
   every operand once and to compute it, at the bandwidth share its number of active cores
   gets. Once a schedule beats the next division's bound, the rest are skipped.
3. **Loop order** (``orders``): the outer tiles in program order, or with one outer dim moved
   innermost: the operand that does not depend on the innermost loop stays resident in the
   scratchpad (e.g. a weight tile while the rows stream past it).
4. **Tiles** (``tilings``): per dim a ladder of extents (the core's whole extent, then halves
   down to one stick or row), with and without double buffering; the candidates are the
   largest combinations that fit the scratchpad (no dim can grow without overflowing). When
   nothing fits, stick dims may go below one stick (a partial stick costs a whole one) before
   the planner gives up with an error that names the program, its shapes and the bytes needed.

Every division is first tried with its first-choice candidates (double-buffered, program order);
the two best are then refined with every loop order and buffering choice.

Each candidate is estimated (``latency.estimate_schedule``); the best wins (ties: fewer cores,
fewer steps). Adding a kind of candidate is one generator here. Plans are cached per program and
bound sizes by the runtime.
"""

from __future__ import annotations

import functools
import itertools
import math
import sqlite3
from typing import Iterator, Mapping

from .. import hardware
from ..hardware import HardwareConfig
from . import plan_cache
from .latency import estimate_schedule
from .ops import Access, access_layout, relayout_candidates
from .program import Program, ProgramError, Split, TilePlan, WorkDivision, _bind
from .schedule import (Schedule, ScheduleError, bind_sizes, build_schedule, check_division, chunk_of, live_bytes,
                       persistent_dims, scratchpad_overflow, stick_dims)

__all__ = ["resolve", "legal_divisions", "pick_division", "size_tiles", "Schedule", "ScheduleError",
           "plan_stats"]

MAX_LADDER = 6          # extents per dim in the tile ladder (the largest ones, plus the smallest)
MAX_DIVISIONS = 10      # divisions searched in full (lowest bounds first)
GAP = 0.98              # a division whose bound is within 2% of the best estimate cannot win enough to search
MIN_GAIN_US = 0.25      # ... nor one that could win less than this (tiny, launch-bound kernels)
REFINE = 2              # divisions whose every loop order and buffering choice is tried

plan_stats = {"plans": 0, "candidates": 0, "cache_hits": 0, "cache_stores": 0, "cache_errors": 0}


# ------------------------------------------------------------------------------ candidates
def variants(p: Program, sizes: Mapping[str, int]) -> list[Program]:
    """The program, and when it has a transposed matmul operand, the program with that matmul's
    operands in the other roles (the same product: the systolic array streams the other operand, so
    the *other* one must be laid out for it; e.g. attention's small query at decode re-laid instead
    of its long keys)."""
    out = [p]
    if relayout_candidates(p, sizes):
        import dataclasses
        from .program import Matmul
        for i, op in enumerate(p.body):
            if isinstance(op, Matmul) and op.acc is None:
                body = list(p.body)
                body[i] = dataclasses.replace(op, a=op.b, b=op.a)
                meta = dict(p.meta, swapped=tuple(p.meta.get("swapped", ())) + (op.out,))
                out.append(dataclasses.replace(p, body=tuple(body), meta=meta))
    return out


def relayouts(p: Program, sizes: Mapping[str, int]) -> list[frozenset[int]]:
    cands = relayout_candidates(p, sizes)
    return [frozenset(c) for n in range(len(cands) + 1) for c in itertools.combinations(cands, n)]


def legal_divisions(p: Program, sizes: Mapping[str, int], cfg: HardwareConfig | None = None,
                    access: dict[int, Access] | None = None) -> list[WorkDivision]:
    """Candidate divisions: one parallel dim or two, or one with the ring-combined reduction
    dim, part counts that give every core at least one stick (or row), at most ``num_cores``."""
    cfg = cfg or hardware.get_config()
    an = p.analysis
    ext = bind_sizes(p, sizes)
    sticks = stick_dims(p, access if access is not None else access_layout(p, sizes), cfg)
    pers = persistent_dims(p)
    par = [d.name for d in p.dims if d.kind == "parallel" and d.name not in an.reduced_dims and ext[d.name] > 1]
    red = [d for d in an.ring_dims if ext[d] > 1 and d not in pers]
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
            check_division(p, w, cfg)
        except ScheduleError:
            continue
        good.append(w)
    return good


def orders(p: Program, multi: frozenset[str]) -> list[tuple[str, ...]]:
    """Program order, and each outer dim that has several tiles moved innermost."""
    red = p.analysis.reduced_dims
    base = tuple(d for d in p.dim_names if d not in red)
    out = [base]
    walked = [d for d in base if d in multi]
    if len(walked) > 1:
        for d in walked[:-1]:
            out.append(tuple(x for x in base if x != d) + (d,))
    return out


def _ladder(n: int, unit: int, floor: int) -> list[int]:
    """Tile extents for a dim of core extent ``n``: n, then halves in whole units down to ``floor``."""
    out = [n]
    t = n
    while True:
        t = max(floor, -(-(-(-t // 2)) // unit) * unit if unit > 1 else -(-t // 2))
        if t >= out[-1]:
            break
        out.append(t)
        if t <= floor:
            break
    if len(out) > MAX_LADDER:
        out = out[:MAX_LADDER - 1] + [out[-1]]
    return out


def tilings(p: Program, core_ext: Mapping[str, int], sticks: Mapping[str, int], cfg: HardwareConfig,
            double_buffer: bool, order: tuple[str, ...], fixed: Mapping[str, int] | None = None,
            below_stick: bool = False) -> list[dict[str, int]]:
    """The largest tiles that fit the scratchpad: every combination of ladder extents such that no
    dim can take its next larger extent without overflowing (persistent dims stay whole)."""
    budget = cfg.scratchpad_usable_bytes
    pers = persistent_dims(p)
    fixed = dict(fixed or {})
    names = p.dim_names
    ladders: dict[str, list[int]] = {}
    for d in names:
        n = max(1, core_ext[d])
        if d in fixed:
            ladders[d] = [max(1, min(n, fixed[d]))]
        elif d in pers:
            ladders[d] = [n]
        else:
            unit = 1 if below_stick else sticks.get(d, 1)
            ladders[d] = _ladder(n, unit, min(n, unit))
    free = [d for d in names if len(ladders[d]) > 1]
    base = {d: ladders[d][0] for d in names}

    def fits(t: dict[str, int]) -> bool:
        multi = frozenset(d for d in names if core_ext[d] > t[d])
        return live_bytes(p, t, double_buffer, cfg, multi, order) <= budget

    out: list[dict[str, int]] = []
    if not free:
        return [base] if fits(base) else []
    last = free[-1]
    lad = ladders[last]
    for combo in itertools.product(*[range(len(ladders[d])) for d in free[:-1]]):
        t = dict(base)
        for d, k in zip(free[:-1], combo):
            t[d] = ladders[d][k]
        # largest extent of the last free dim that fits (the ladder is decreasing; fit is monotone)
        lo, hi = 0, len(lad) - 1
        t[last] = lad[hi]
        if not fits(t):
            continue
        while lo < hi:
            mid = (lo + hi) // 2
            t[last] = lad[mid]
            if fits(t):
                hi = mid
            else:
                lo = mid + 1
        t[last] = lad[lo]
        out.append(dict(t))
    # keep the maximal ones: drop a tile another candidate contains in every dim
    out.sort(key=lambda t: -math.prod(t.values()))
    maximal: list[dict[str, int]] = []
    for t in out:
        if not any(all(u[d] >= t[d] for d in names) for u in maximal):
            maximal.append(t)
    return maximal


# ------------------------------------------------------------------------------ bounds
def _core_extents(p: Program, sizes: Mapping[str, int], ext: Mapping[str, int], division: WorkDivision,
                  sticks: Mapping[str, int]) -> dict[str, int]:
    out = dict(ext)
    for s in division.splits:
        chunk = _bind(s.chunk, sizes) if s.chunk is not None else chunk_of(ext[s.dim], s.parts, sticks.get(s.dim, 1))
        out[s.dim] = min(ext[s.dim], chunk)
    return out


def _active(ext: Mapping[str, int], core_ext: Mapping[str, int], division: WorkDivision) -> int:
    n = 1
    for s in division.splits:
        n *= min(s.parts, -(-ext[s.dim] // max(1, core_ext[s.dim])))
    return max(1, n)


def division_bound(p: Program, sizes: Mapping[str, int], cfg: HardwareConfig, division: WorkDivision,
                   access: dict[int, Access], relayout_us: float = 0.0) -> float:
    """Microseconds a kernel with this division needs at least: its busiest core moves its box of
    every operand once (whole sticks, multicast loads at its share) at the bandwidth share of the
    active cores, and computes its whole box in one tile (no per-tile overheads); the larger of the
    two, plus the launch and the re-layouts."""
    from .latency import multicast, shared_cost
    from .ops import OPS, TileCtx
    from .program import Load, RingReduce, Store
    from .schedule import is_alias

    ext = bind_sizes(p, sizes)
    sticks = stick_dims(p, access, cfg)
    core_ext = _core_extents(p, sizes, ext, division, sticks)
    active = _active(ext, core_ext, division)
    rate = cfg.core_bandwidth(active) / cfg.clock_hz
    splits = [(s.dim, s.parts, core_ext[s.dim]) for s in division.splits]
    dma = comp = 0.0
    for i, op in enumerate(p.body):
        if isinstance(op, RingReduce) or is_alias(p, i) or (i in access and access[i].probe is not None):
            continue        # (a probed access is left out: counting its sticks costs more than the bound saves)
        c = OPS[op.kind].cost(cfg, op, TileCtx(p, core_ext, access, i, rate))
        if isinstance(op, Load):
            c = shared_cost(cfg, c, multicast(access[i], splits, ext))
        if isinstance(op, (Load, Store)):
            dma += c.cycles
        else:
            comp += c.cycles
    return cfg.kernel_launch_us + relayout_us + max(dma, comp) * 1e6 / cfg.clock_hz


# ------------------------------------------------------------------------------ the search
def resolve(p: Program, sizes: Mapping[str, int], cfg: HardwareConfig | None = None,
            division: WorkDivision | None = None, tiles: TilePlan | None = None,
            relayout: frozenset[int] | None = None, order: tuple[str, ...] | None = None,
            persistent: frozenset[str] = frozenset()) -> Schedule:
    """The best schedule of ``p`` for bound ``sizes``; what the caller (or the program) fixes is kept.

    ``persistent``: buffers that keep their values across launches (a model's weights): their
    re-layout is paid once (the runtime keeps the weight re-laid), so the search does not count it
    per launch; the schedule's estimate still reports it."""
    cfg = cfg or hardware.get_config()
    searched = division is None and tiles is None and relayout is None and order is None
    division = division or p.division
    tiles = tiles or p.tiles
    plan_stats["plans"] += 1
    best: tuple | None = None
    err: Exception | None = None
    persistent = frozenset(persistent)
    cache = p.__dict__.setdefault("_variants", {})
    key = tuple(sorted(sizes.items()))
    if key not in cache:
        cache[key] = variants(p, sizes) if relayout is None else [p]
    stored = _stored(p, cache[key], sizes, cfg, persistent) if searched and plan_cache.enabled() else None
    if isinstance(stored, Schedule):
        return stored
    for v in cache[key]:
        for rl in ([frozenset(relayout)] if relayout is not None else relayouts(v, sizes)):
            try:
                cand = _best_for_relayout(v, sizes, cfg, division, tiles, rl, order, best, persistent)
            except (ScheduleError, ProgramError) as e:
                err = e
                continue
            if cand is not None and (best is None or cand[0] < best[0]):
                best = cand
    if best is None:
        raise err if err else ScheduleError(f"program {p.name}: no schedule")
    if stored is not None:                                  # a key to store the search's answer under
        try:
            plan_cache.store(stored, plan_cache.plan_of(cache[key].index(best[1].program), best[1]))
            plan_stats["cache_stores"] += 1
        except (sqlite3.Error, OSError, ValueError):
            plan_stats["cache_errors"] += 1
    return best[1]


def _stored(p: Program, progs: list[Program], sizes: Mapping[str, int], cfg: HardwareConfig,
            persistent: frozenset[str]) -> Schedule | str | None:
    """The schedule a previous process's search chose (``plan_cache``), or the key to store this
    search's answer under, or None if the cache cannot be used."""
    try:
        k = plan_cache.key(p, sizes, cfg, persistent)
        plan = plan_cache.lookup(k)
    except (sqlite3.Error, OSError, ValueError):
        plan_stats["cache_errors"] += 1
        return None
    if plan is None:
        return k
    try:
        v = progs[plan["variant"]]
        rl = frozenset(plan["relayout"])
        division = WorkDivision(tuple(Split(d, n, c, tuple(st)) for d, n, c, st in plan["splits"]))
        s = build_schedule(v, sizes, cfg, division, dict(zip(v.dim_names, plan["tiles"])), plan["double_buffer"],
                           access_layout(v, sizes, rl, cfg.stick_bytes), rl, tuple(plan["order"]))
    except (KeyError, IndexError, TypeError, ValueError, ScheduleError, ProgramError):
        plan_stats["cache_errors"] += 1             # an entry this planner cannot use: search again
        return k
    plan_stats["cache_hits"] += 1
    return s


def _best_for_relayout(p: Program, sizes: Mapping[str, int], cfg: HardwareConfig, division: WorkDivision | None,
                       tiles: TilePlan | None, relayout: frozenset[int], order: tuple[str, ...] | None,
                       incumbent: tuple | None, persistent: frozenset[str] = frozenset()) -> tuple | None:
    """The best schedule with these re-laid operands, or None if ``incumbent`` stays better.

    Two passes: every promising division (lowest bound first) with its first-choice candidates
    (double-buffered when it fits, program loop order), then the two best divisions with every loop
    order and buffering choice."""
    ctx = _Search(p, sizes, cfg, tiles, relayout, order, persistent)
    if division is not None:
        divs = [(0.0, division)]
    else:
        divs = sorted(((division_bound(p, sizes, cfg, w, ctx.access, ctx.relayout_us()), w)
                       for w in legal_divisions(p, sizes, cfg, ctx.access)), key=lambda x: (x[0], -x[1].num_cores))
    best = incumbent
    per_div: list[tuple] = []
    for n, (bound, w) in enumerate(divs):
        if best is not None:
            best_us = best[0][0] * 1e6 / cfg.clock_hz
            if bound >= min(best_us * GAP, best_us - MIN_GAIN_US) or n >= MAX_DIVISIONS:
                break
        try:
            check_division(p, w, cfg)
        except ScheduleError:
            if division is not None:
                raise
            continue
        mine = None
        for cand in ctx.candidates(w, coarse=True):
            if best is None or cand[0] < best[0]:
                best = cand
            if mine is None or cand[0] < mine:
                mine = cand[0]
        if mine is not None:
            per_div.append((mine, w))
        elif ctx.need is None:
            ctx.need = ctx.one_element_bytes(w)
    for _, w in sorted(per_div, key=lambda x: x[0])[:REFINE]:
        for cand in ctx.candidates(w, coarse=False):
            if best is None or cand[0] < best[0]:
                best = cand
    if best is None and ctx.need is not None:
        raise scratchpad_overflow(p, sizes, ctx.need, cfg, "even one-element tiles (the persistent dims "
                                  f"{sorted(persistent_dims(p))} whole) do not fit")
    if best is None or best is incumbent:
        return None
    return best


class _Search:
    """What the search needs for one program, sizes and set of re-laid operands."""

    def __init__(self, p: Program, sizes: Mapping[str, int], cfg: HardwareConfig, tiles: TilePlan | None,
                 relayout: frozenset[int], order: tuple[str, ...] | None, persistent: frozenset[str] = frozenset()):
        self.p, self.sizes, self.cfg, self.relayout, self.order = p, sizes, cfg, relayout, order
        self.once = frozenset(i for i in relayout if p.body[i].buffer in persistent)   # paid once, not per launch
        self.access = access_layout(p, sizes, relayout, cfg.stick_bytes)
        self.sticks = stick_dims(p, self.access, cfg)
        self.ext = bind_sizes(p, sizes)
        self.tiles = tiles
        self.fixed = {d: max(1, _bind(v, sizes)) for d, v in (tiles.sizes if tiles else ())}
        self.db_opts = [tiles.double_buffer] if tiles is not None and tiles.double_buffer is not None else [True, False]
        self.pers = persistent_dims(p)
        self.need: int | None = None

    def one_element_bytes(self, w: WorkDivision) -> int:
        """Scratchpad bytes of a step with one-element tiles (persistent dims whole)."""
        core_ext = _core_extents(self.p, self.sizes, self.ext, w, self.sticks)
        t1 = {d: 1 if d not in self.pers else core_ext[d] for d in self.p.dim_names}
        return live_bytes(self.p, t1, False, self.cfg)

    def relayout_us(self, which: frozenset[int] | None = None) -> float:
        """Per-launch re-layout time (of ``which``; default: those not paid once)."""
        which = (self.relayout - self.once) if which is None else which
        if not which:
            return 0.0
        from .latency import relayout_cost
        s = build_schedule(self.p, self.sizes, self.cfg, WorkDivision(()), {}, False, self.access, self.relayout)
        return sum(relayout_cost(s, i)[1] for i in which)

    def fits(self, t: dict[str, int], core_ext: Mapping[str, int], db: bool, od) -> bool:
        multi = frozenset(d for d in self.p.dim_names if core_ext[d] > t[d])
        return live_bytes(self.p, t, db, self.cfg, multi, od) <= self.cfg.scratchpad_usable_bytes

    def _tile_choices(self, core_ext: Mapping[str, int], coarse: bool) -> Iterator[tuple[dict, bool, tuple | None]]:
        p, names = self.p, self.p.dim_names
        whole = {d: max(1, core_ext[d]) for d in names}
        if not self.fixed and self.fits(whole, core_ext, False, self.order):
            # everything fits in one step: that, or a few steps along one dim, double-buffered, so
            # that loading the next piece overlaps computing this one
            yield whole, self.db_opts[-1], self.order
            if True in self.db_opts:
                for d in names:
                    for k in (2, 4):
                        if d not in self.pers and whole[d] >= 2 * k:
                            t = dict(whole, **{d: -(-whole[d] // k)})
                            if self.fits(t, core_ext, True, self.order):
                                yield t, True, self.order
            return
        multi_all = frozenset(d for d in names if core_ext[d] > 1)
        ods = [tuple(self.order)] if self.order else orders(p, multi_all)
        dbs = self.db_opts
        if coarse:
            ods, dbs = ods[:1], dbs[:1]
        for below in (False, True):
            any_ = False
            for db in dbs:
                for od in ods:
                    if self.fixed:
                        # the caller's tiles are kept even if they overflow (checked mode will say so);
                        # double buffering is only chosen for them if it fits
                        cands = tilings(p, core_ext, self.sticks, self.cfg, db, od, self.fixed, below) \
                            if len(self.fixed) < len(names) else []
                        if not cands:
                            t = {d: min(whole[d], self.fixed.get(d, whole[d])) for d in names}
                            if db and self.tiles.double_buffer is None and not self.fits(t, core_ext, True, od):
                                continue
                            cands = [t]
                    else:
                        cands = tilings(p, core_ext, self.sticks, self.cfg, db, od, None, below)
                    for t in cands:
                        any_ = True
                        yield t, db, od
            if any_:
                return
            if coarse and len(self.db_opts) > 1:       # nothing double-buffered fits: try single
                yield from self._tile_choices_single(core_ext, below)
                return

    def _tile_choices_single(self, core_ext: Mapping[str, int], below: bool) -> Iterator[tuple[dict, bool, tuple]]:
        od = tuple(self.order) if self.order else orders(self.p, frozenset())[0]
        for bl in (below, True):
            cands = tilings(self.p, core_ext, self.sticks, self.cfg, False, od, None, bl)
            for t in cands:
                yield t, False, od
            if cands:
                return

    def candidates(self, w: WorkDivision, coarse: bool) -> Iterator[tuple]:
        """(key, schedule) for the division's candidates, each estimated."""
        core_ext = _core_extents(self.p, self.sizes, self.ext, w, self.sticks)
        for t, db, od in self._tile_choices(core_ext, coarse):
            try:
                s = build_schedule(self.p, self.sizes, self.cfg, w, t, db, self.access, self.relayout, od)
            except ScheduleError:
                continue
            plan_stats["candidates"] += 1
            e = estimate_schedule(s, segments=False)
            steps = math.prod(-(-n // max(1, t[d])) for d, n in core_ext.items())
            yield (e.cycles - self.once_cycles, w.num_cores, steps), s

    @functools.cached_property
    def once_cycles(self) -> float:
        return self.relayout_us(self.once) * self.cfg.clock_hz / 1e6


# ------------------------------------------------------------------------------ compatibility helpers
def pick_division(p: Program, sizes: Mapping[str, int], cfg: HardwareConfig | None = None,
                  tiles: TilePlan | None = None, relayout: frozenset[int] = frozenset()) -> WorkDivision:
    """The division of the best schedule."""
    s = resolve(p, sizes, cfg, tiles=tiles, relayout=relayout)
    return WorkDivision(tuple(Split(d, n, c) for d, n, c, _ in s.splits))


def size_tiles(p: Program, core_ext: Mapping[str, int], sticks: Mapping[str, int], cfg: HardwareConfig,
               budget: int | None = None, double_buffer: bool | None = None) -> tuple[dict[str, int], bool]:
    """The largest (by volume) tile that fits, preferring double buffering when its tile is at least
    a quarter of the single-buffered one."""
    if budget is not None and budget != cfg.scratchpad_usable_bytes:
        cfg = hardware.HardwareConfig(**{**hardware.as_dict(cfg),
                                         "scratchpad_bytes": int(budget / (1 - cfg.scratchpad_reserve_fraction))})
    order = tuple(d for d in p.dim_names if d not in p.analysis.reduced_dims)
    res = {}
    for db in (True, False):
        c = tilings(p, core_ext, sticks, cfg, db, order) or tilings(p, core_ext, sticks, cfg, db, order,
                                                                    below_stick=True)
        res[db] = max(c, key=lambda t: math.prod(t.values())) if c else None
    if double_buffer is False or res[True] is None:
        if res[False] is None:
            raise ProgramError(f"program {p.name}: even the smallest tiles overflow the scratchpad")
        return res[False], False
    if double_buffer or res[False] is None or math.prod(res[True].values()) * 4 >= math.prod(res[False].values()):
        return res[True], True
    return res[False], False


def iter_candidates(p: Program, sizes: Mapping[str, int], cfg: HardwareConfig | None = None) -> Iterator[Schedule]:
    """Every candidate schedule the search would consider without pruning (for tools and tests)."""
    cfg = cfg or hardware.get_config()
    ext = bind_sizes(p, sizes)
    for rl in relayouts(p, sizes):
        access = access_layout(p, sizes, rl, cfg.stick_bytes)
        sticks = stick_dims(p, access, cfg)
        for w in legal_divisions(p, sizes, cfg, access):
            core_ext = _core_extents(p, sizes, ext, w, sticks)
            for db in (True, False):
                for od in orders(p, frozenset(d for d in p.dim_names if core_ext[d] > 1)):
                    for t in tilings(p, core_ext, sticks, cfg, db, od):
                        yield build_schedule(p, sizes, cfg, w, t, db, access, rl, od)
