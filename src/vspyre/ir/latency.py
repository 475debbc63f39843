"""The card's latency model: per-op costs from the registry, composed over the schedule.

Formulas and parameters are documented in docs/latency-model.md. In short, per core and per
tile step: DMA-in (loads), compute (vector + systolic, serial), DMA-out (stores), ring (cross-core
partials); steps are pipelined when the tile plan double-buffers, otherwise they add up. Kernel
time = launch + slowest core. Lives in ``vspyre.ir`` because the planner picks divisions with it;
``vspyre.runtime.latency`` is the runtime's (cached) front door.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import trace
from .ops import OPS, Cost, TileCtx
from .planning import CoreWork, Schedule, iter_tiles
from .program import RingReduce

__all__ = ["Estimate", "estimate_schedule", "StepCost", "MAX_TRACE_STEPS"]

MAX_TRACE_STEPS = 96     # per core; later steps are merged into one segment per kind


@dataclass
class StepCost:
    dma_in: float = 0.0
    compute: float = 0.0
    dma_out: float = 0.0
    ring: float = 0.0
    systolic: float = 0.0   # part of compute spent on the systolic array (for labels)

    def add(self, c: Cost) -> None:
        if c.unit == "dma_in":
            self.dma_in += c.cycles
        elif c.unit == "dma_out":
            self.dma_out += c.cycles
        elif c.unit == "ring":
            self.ring += c.cycles
        elif c.unit == "systolic":
            self.compute += c.cycles
            self.systolic += c.cycles
        else:
            self.compute += c.cycles


@dataclass
class Estimate:
    name: str
    cycles: float                 # launch + slowest core, in core cycles
    us: float
    launch_us: float
    core_us: tuple[float, ...]
    bottleneck: str               # memory | compute | ring | launch
    dma_bytes: int
    ring_bytes: int
    flops: int
    compulsory_bytes: int
    roofline_us: float
    dma_us: float                 # on the slowest core
    compute_us: float
    ring_us: float
    double_buffer: bool
    schedule: str
    segments: tuple[trace.Segment, ...] = field(default=(), repr=False)

    @property
    def roofline_efficiency(self) -> float:
        return self.roofline_us / self.us if self.us > 0 else 0.0


class _Acc:
    def __init__(self) -> None:
        self.flops = 0
        self.dma_bytes = 0
        self.ring_bytes = 0
        self.read: dict[str, int] = {}
        self.write: dict[str, int] = {}


def _step_costs(s: Schedule, core: CoreWork, owner: bool, group_active: int, acc: _Acc,
                memo: dict) -> list[StepCost]:
    p = s.program
    an = p.analysis
    cfg = s.cfg
    names = p.dim_names
    red = an.reduced_dims
    post = [bool(an.op_after[i] & red) for i in range(len(p.body))]
    out: list[StepCost] = []

    def cost(i: int, ranges) -> Cost:
        key = (i, tuple(b - a for a, b in ranges))
        c = memo.get(key)
        if c is None:
            ext = {d: b - a for d, (a, b) in zip(names, ranges)}
            op = p.body[i]
            c = OPS[op.kind].cost(cfg, op, TileCtx(p, ext, s.access, i))
            memo[key] = c
        return c

    def charge(i: int, ranges, sc: StepCost) -> None:
        op = p.body[i]
        if an.op_ring[i] and not owner:
            return
        c = cost(i, ranges)
        if isinstance(op, RingReduce):
            if s.ring_dim != op.dim or group_active <= 1:
                return                               # identity: nothing travels
            transfers = (group_active - 1) if owner else 1
            sc.ring += c.cycles * transfers
            acc.ring_bytes += c.bytes * transfers if owner else 0
            acc.flops += c.flops if owner else 0
            return
        sc.add(c)
        acc.flops += c.flops
        if c.unit in ("dma_in", "dma_out"):
            acc.dma_bytes += c.bytes
            book = acc.read if c.unit == "dma_in" else acc.write
            book[op.buffer] = book.get(op.buffer, 0) + c.elems

    for outer, steps in iter_tiles(s, core):
        for j, rng in enumerate(steps):
            sc = StepCost()
            for i in range(len(p.body)):
                if not post[i]:
                    charge(i, rng, sc)
            if j == len(steps) - 1:
                for i in range(len(p.body)):
                    if post[i]:
                        charge(i, rng, sc)
            out.append(sc)
    return out


def _pipeline(steps: list[StepCost], double_buffer: bool, core: int, segs: list | None,
              cyc_us: float, t0: float) -> tuple[float, float, float, float]:
    """Simulate one core's steps. Returns (end cycle, dma, compute, ring) totals."""
    n = len(steps)
    dma_tot = sum(x.dma_in + x.dma_out for x in steps)
    comp_tot = sum(x.compute for x in steps)
    ring_tot = sum(x.ring for x in steps)
    if n == 0:
        return 0.0, 0.0, 0.0, 0.0

    def emit(kind: str, start: float, dur: float, label: str, i: int) -> None:
        if segs is None or dur <= 0:
            return
        if i < MAX_TRACE_STEPS:
            segs.append(trace.Segment(core, kind, t0 + start * cyc_us, dur * cyc_us, label))
        else:
            tail = tails.setdefault(kind, [start, start + dur, 0])
            tail[0] = min(tail[0], start)
            tail[1] = max(tail[1], start + dur)
            tail[2] += 1

    tails: dict[str, list] = {}

    def clabel(x: StepCost, i: int) -> tuple[str, str]:
        kind = "matmul" if x.systolic > x.compute / 2 else "compute"
        return kind, f"tile {i}"

    if not double_buffer:
        t = 0.0
        for i, x in enumerate(steps):
            emit("dma_in", t, x.dma_in, f"tile {i} load", i)
            t += x.dma_in
            k, lab = clabel(x, i)
            emit(k, t, x.compute, lab, i)
            t += x.compute
            emit("ring", t, x.ring, f"tile {i} ring", i)
            t += x.ring
            emit("dma_out", t, x.dma_out, f"tile {i} store", i)
            t += x.dma_out
        end = t
    else:
        dma = 0.0
        comp_end: list[float] = []
        for i, x in enumerate(steps):
            s_in = max(dma, comp_end[i - 2] if i >= 2 else 0.0)
            in_end = s_in + x.dma_in
            emit("dma_in", s_in, x.dma_in, f"tile {i} load", i)
            dma = in_end
            if i >= 1:
                prev = steps[i - 1]
                s_out = max(dma, comp_end[i - 1])
                emit("dma_out", s_out, prev.dma_out, f"tile {i - 1} store", i - 1)
                dma = s_out + prev.dma_out
            s_c = max(in_end, comp_end[i - 1] if i else 0.0)
            k, lab = clabel(x, i)
            emit(k, s_c, x.compute, lab, i)
            emit("ring", s_c + x.compute, x.ring, f"tile {i} ring", i)
            comp_end.append(s_c + x.compute + x.ring)
        s_out = max(dma, comp_end[-1])
        emit("dma_out", s_out, steps[-1].dma_out, f"tile {n - 1} store", n - 1)
        dma = s_out + steps[-1].dma_out
        end = max(dma, comp_end[-1])
    if segs is not None:
        for kind, (a, b, cnt) in tails.items():
            segs.append(trace.Segment(core, kind, t0 + a * cyc_us, (b - a) * cyc_us,
                                      f"{cnt} more tiles (merged)"))
    return end, dma_tot, comp_tot, ring_tot


def estimate_schedule(s: Schedule, segments: bool = True) -> Estimate:
    p = s.program
    cfg = s.cfg
    cyc_us = 1e6 / cfg.clock_hz
    launch_us = cfg.kernel_launch_us
    acc = _Acc()
    memo: dict = {}
    per_sig: dict = {}
    core_cycles: list[float] = []
    parts: list[tuple[float, float, float]] = []
    segs: list[trace.Segment] | None = [] if segments else None
    if segs is not None:
        segs.extend(trace.Segment(c.core, "launch", 0.0, launch_us, "kernel launch") for c in s.cores[:1])
    for group in s.ring_groups():
        active = [c for c in group if not c.empty]
        for c in group:
            owner = c is group[0] or (c is active[0] if active else False)
            sig = (tuple(b - a for a, b in c.ranges), owner, len(active))
            if sig not in per_sig or segs is not None:
                sub = _Acc()
                steps = _step_costs(s, c, owner, len(active), sub, memo)
                res = _pipeline(steps, s.double_buffer, c.core, segs, cyc_us, launch_us)
                per_sig[sig] = (res, sub)
            res, sub = per_sig[sig]
            acc.flops += sub.flops
            acc.dma_bytes += sub.dma_bytes
            acc.ring_bytes += sub.ring_bytes
            for b, n in sub.read.items():
                acc.read[b] = acc.read.get(b, 0) + n
            for b, n in sub.write.items():
                acc.write[b] = acc.write.get(b, 0) + n
            core_cycles.append(res[0])
            parts.append(res[1:])
    slow = max(range(len(core_cycles)), key=lambda i: core_cycles[i]) if core_cycles else None
    core_time = core_cycles[slow] * cyc_us if slow is not None else 0.0
    dma_c, comp_c, ring_c = parts[slow] if slow is not None else (0.0, 0.0, 0.0)
    relay_us = 0.0
    for i in sorted(s.relayout):
        # Re-lay once before the main phase: every core streams its share of the operand in,
        # transposes it in the scratchpad and writes it back; read + write in whole sticks at the
        # card's aggregate bandwidth. Charged to the slowest core's DMA time.
        a = s.access[i]
        elems = 1
        for d in a.dims:
            elems *= s.extents[p.dim_names.index(d)]
        nbytes = 2 * math.ceil(elems * a.itemsize / cfg.stick_bytes) * cfg.stick_bytes
        acc.dma_bytes += nbytes
        t = nbytes / cfg.device_memory_bandwidth * 1e6
        relay_us += t
        dma_c += t / cyc_us
        if segs is not None:
            segs.extend(trace.Segment(c.core, "dma_in", launch_us, t, f"re-lay {p.body[i].buffer}") for c in s.cores)
    if relay_us and segs is not None:
        segs[:] = [g if g.kind == "launch" or g.label.startswith("re-lay") else
                   trace.Segment(g.core, g.kind, g.start_us + relay_us, g.dur_us, g.label) for g in segs]
    core_time += relay_us
    us = launch_us + core_time
    if launch_us >= core_time:
        bottleneck = "launch"
    else:
        bottleneck = max((dma_c, "memory"), (comp_c, "compute"), (ring_c, "ring"))[1]
    compulsory = 0
    for b in p.buffers:
        span = b.span(s.sizes)
        compulsory += (min(span, acc.read.get(b.name, 0)) + min(span, acc.write.get(b.name, 0))) * b.itemsize
    roof = max(acc.flops / cfg.peak_fp16_flops, compulsory / cfg.device_memory_bandwidth) * 1e6
    return Estimate(p.name, us / cyc_us, us, launch_us, tuple(c * cyc_us for c in core_cycles), bottleneck,
                    acc.dma_bytes, acc.ring_bytes, acc.flops, compulsory, roof, dma_c * cyc_us, comp_c * cyc_us,
                    ring_c * cyc_us, s.double_buffer, s.describe(), tuple(segs or ()))
