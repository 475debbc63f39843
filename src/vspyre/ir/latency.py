"""The card's latency model: a pure function of a :class:`~vspyre.ir.schedule.Schedule`.

Formulas and parameters are documented in docs/latency-model.md. Per op and per tile the cost
comes from the op registry (``vspyre.ir.ops``: semantics and cost side by side). Per core this
module sums them over the steps the schedule's rules say the op runs (``schedule.OpRule``), in
closed form: an op's cost depends only on its tile's extents, and along each dim a core's tiles
have at most two extents (full tiles and one remainder), so the sum over a core's steps is a
sum over at most 2^k extent combinations with their counts. Resident loads are charged once per
box change, no-op casts nothing. Per core:

* DMA ``D`` (loads + stores + the bus's read/write turnaround), compute ``C`` (vector + systolic),
  ring ``R`` (partials sent to the ring owner);
* not double-buffered: ``T = D + C + R``;
* double-buffered (one DMA engine, one compute engine): ``T = max(D + c_last, C + R + d_first +
  d_last)``, at most ``D + C + R``: the engines overlap except for filling the pipeline (the first
  load) and draining it (the last step's compute, the last store);
* kernel time = launch + re-layouts done before the cores start + the slowest core.

Nothing here plans: the planner (``planning.py``) calls :func:`estimate_schedule` on candidates.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from .. import trace
from .ops import OPS, Cost, TileCtx, program_matmul_speedup
from .program import Load, RingReduce, Store
from .schedule import CoreWork, Schedule, Step, address_only, is_alias, op_rules, runs_at

__all__ = ["Estimate", "estimate_schedule", "StepCost", "MAX_TRACE_STEPS", "CoreCost", "relayout_cost", "multicast",
           "shared_cost"]

MAX_TRACE_STEPS = 96     # per core; later steps are merged into one segment per kind


@dataclass
class StepCost:
    dma_in: float = 0.0
    compute: float = 0.0
    dma_out: float = 0.0
    ring: float = 0.0
    systolic: float = 0.0   # part of compute spent on the systolic array (for labels)

    def add(self, c: Cost, times: float = 1.0) -> None:
        cyc = c.cycles * times
        if c.unit == "dma_in":
            self.dma_in += cyc
        elif c.unit == "dma_out":
            self.dma_out += cyc
        elif c.unit == "ring":
            self.ring += cyc
        elif c.unit == "systolic":
            self.compute += cyc
            self.systolic += cyc
        else:
            self.compute += cyc


@dataclass
class Estimate:
    name: str
    cycles: float                 # launch + re-layout + slowest core, in core cycles
    us: float
    launch_us: float
    core_us: tuple[float, ...]
    bottleneck: str               # memory | compute | ring | launch
    dma_bytes: int
    ring_bytes: int
    flops: int
    compulsory_bytes: int
    roofline_us: float
    dma_us: float                 # on the slowest core (re-layout included)
    compute_us: float
    ring_us: float
    double_buffer: bool
    schedule: str
    segments: tuple[trace.Segment, ...] = field(default=(), repr=False)
    relayout_us: float = 0.0      # part of ``us`` spent re-laying transposed operands before the cores start
    relayout_bytes: int = 0
    relayout_buffers: tuple[str, ...] = ()

    @property
    def roofline_efficiency(self) -> float:
        return self.roofline_us / self.us if self.us > 0 else 0.0

    def without_relayout(self) -> "Estimate":
        """The same launch when its re-laid operands are already laid out on the device (cached)."""
        if not self.relayout_us:
            return self
        import dataclasses
        us = self.us - self.relayout_us
        cyc = self.cycles * us / self.us if self.us else 0.0
        dma_us = max(0.0, self.dma_us - self.relayout_us)
        segs = tuple(trace.Segment(g.core, g.kind, g.start_us - self.relayout_us if g.start_us >= self.launch_us
                                   + self.relayout_us else g.start_us, g.dur_us, g.label)
                     for g in self.segments if not g.label.startswith("re-lay"))
        bott = self.bottleneck
        if self.launch_us >= us - self.launch_us:
            bott = "launch"
        elif bott == "memory" and dma_us < max(self.compute_us, self.ring_us):
            bott = "compute" if self.compute_us >= self.ring_us else "ring"
        return dataclasses.replace(self, us=us, cycles=cyc, dma_us=dma_us, relayout_us=0.0, relayout_bytes=0,
                                   relayout_buffers=(), dma_bytes=self.dma_bytes - self.relayout_bytes,
                                   segments=segs, bottleneck=bott)


@dataclass
class CoreCost:
    """One core's totals (cycles) and what it moved."""

    dma: float = 0.0
    compute: float = 0.0
    ring: float = 0.0
    systolic: float = 0.0
    first_in: float = 0.0          # the first step's loads (pipeline fill)
    last_out: float = 0.0          # the last step's stores (drain)
    last_compute: float = 0.0      # the last step's compute and ring (drain)
    flops: int = 0
    dma_bytes: int = 0
    ring_bytes: int = 0
    read_bytes: int = 0
    write_bytes: int = 0
    read: dict = field(default_factory=dict)     # buffer -> elements needed
    write: dict = field(default_factory=dict)

    def time(self, double_buffer: bool) -> float:
        seq = self.dma + self.compute + self.ring
        if not double_buffer:
            return seq
        return min(seq, max(self.dma + self.last_compute, self.compute + self.ring + self.first_in + self.last_out))


def multicast(access, splits, extents) -> int:
    """How many cores load the same box as this one: those that differ only along split dims the
    address ignores. The bus carries such a load once for all of them (multicast)."""
    g = 1
    for d, parts, chunk in splits:
        if d not in access.dims:
            g *= min(parts, -(-extents[d] // max(1, chunk)))
    return g


def chain_cost(cfg, c: Cost, g: int, owner: bool) -> Cost:
    """A ring reduction over ``g`` cores (``c``: one transfer of a partial and its combine). The
    partials flow down the chain toward the owner stick by stick, each core adding its own as they
    pass, so the owner has the total one transfer plus a hop per further core after it starts; each
    other core sends once. Every link of the chain carries the partial once."""
    if not owner:
        return c
    return Cost(c.unit, c.cycles + (g - 2) * cfg.ring_hop_cycles, c.flops * (g - 1), c.bytes * (g - 1), c.elems)


def shared_cost(cfg, c: Cost, g: int) -> Cost:
    """A load's cost for one of ``g`` cores that receive it in one multicast transfer (its bytes
    and the elements it needs from memory: each receiver's share, memory is read once)."""
    if g <= 1 or not c.bytes:
        return c
    setup = cfg.dma_setup_cycles
    return Cost(c.unit, setup + (c.cycles - setup) / g, c.flops, c.bytes / g, c.elems / g)


class _Model:
    """The per-schedule context: op rules, tile lists, cost memo."""

    def __init__(self, s: Schedule):
        self.s = s
        p = self.p = s.program
        self.cfg = s.cfg
        self.names = p.dim_names
        self.rules = op_rules(p)
        self.inner = frozenset(d for d in self.names if d in p.analysis.reduced_dims)
        addr = address_only(p)
        self.alias = [is_alias(p, i) or i in addr for i in range(len(p.body))]     # cost nothing
        self.active = max(1, s.active_cores)
        cfg = self.cfg
        self.rate = cfg.core_bandwidth(self.active) / cfg.clock_hz
        self.turnaround = (cfg.rw_turnaround_ns_per_byte * 1e-9 * cfg.clock_hz * self.active
                           / cfg.bus_fraction(self.active))
        self.memo: dict = {}
        self.op_dims = []
        # Cores that load the same box (they differ only along split dims the address ignores) get
        # it in one multicast transfer: the bus carries it once (torch-spyre measured a broadcast
        # operand costing one load however the work is split), each receiver is charged its share.
        ext = dict(zip(p.dim_names, s.extents))
        self.shared = [multicast(s.access[i], [(d, parts, chunk) for d, parts, chunk, _ in s.splits], ext)
                       if isinstance(op, Load) else 1 for i, op in enumerate(p.body)]
        for i, op in enumerate(p.body):
            r = self.rules[i]
            if isinstance(op, (Load, Store)):
                d = s.access[i].dims
            else:
                d = r.dims
            self.op_dims.append(tuple(x for x in self.names if x in d))

    def cost(self, i: int, ext: dict) -> Cost:
        key = (i,) + tuple(ext[d] for d in self.op_dims[i])
        c = self.memo.get(key)
        if c is None:
            op = self.p.body[i]
            c = OPS[op.kind].cost(self.cfg, op, TileCtx(self.p, ext, self.s.access, i, self.rate))
            c = shared_cost(self.cfg, c, self.shared[i])
            self.memo[key] = c
        return c

    # -- closed form over one core's steps --------------------------------------------------
    def core(self, core: CoreWork, owner: bool, group_active: int) -> CoreCost:
        s, p = self.s, self.p
        levels = list(s.order) + [d for d in self.names if d in self.inner]
        pos = {d: k for k, d in enumerate(self.names)}
        tiles = {}
        for d in self.names:
            a, b = core.ranges[pos[d]]
            t = s.tiles[pos[d]]
            n = b - a
            full, rem = divmod(n, t) if n > 0 else (0, 0)
            opts = []
            if full:
                opts.append((t, full))
            if rem:
                opts.append((rem, 1))
            tiles[d] = opts
        ntiles = {d: sum(c for _, c in tiles[d]) for d in self.names}
        cc = CoreCost()
        if any(n == 0 for n in ntiles.values()):
            return cc
        base_ext = {d: tiles[d][0][0] for d in self.names}
        for i, op in enumerate(p.body):
            if self.alias[i]:
                continue
            r = self.rules[i]
            if s.ring_dim in r.ring and not owner:
                continue
            if isinstance(op, RingReduce) and (s.ring_dim != op.dim or group_active <= 1):
                continue                         # identity: nothing travels
            od = set(self.op_dims[i])
            if isinstance(op, Load):
                varying = {d for d in levels if d in od and ntiles[d] > 1}
                star = max((levels.index(d) for d in varying), default=-1)
                factor = 1
                enum = []
                for k, d in enumerate(levels):
                    if d in od:
                        enum.append(d)
                    elif k <= star:
                        factor *= ntiles[d]
            else:
                factor = 1
                enum = []
                for d in levels:
                    if d in od:
                        enum.append(d)
                    elif d not in self.inner:
                        factor *= ntiles[d]
            # dims the op does not depend on but that are in op_dims (none for loads) enumerate too
            for d in od:
                if d not in enum:
                    enum.append(d)
            ext = dict(base_ext)
            for combo in itertools.product(*[tiles[d] for d in enum]):
                cnt = factor
                for d, (e, c) in zip(enum, combo):
                    ext[d] = e
                    cnt *= c
                c = self.cost(i, ext)
                if isinstance(op, RingReduce):
                    c = chain_cost(self.cfg, c, group_active, owner)
                self._add(cc, op, c, cnt, owner)
        # pipeline fill and drain: the first and the last step
        first = _end_step(s, core, last=False)
        last = _end_step(s, core, last=True)
        if first is not None:
            f = self.step_cost(first, {}, owner, group_active)
            cc.first_in = f.dma_in
        if last is not None:
            l_ = self.step_cost(last, None, owner, group_active)
            cc.last_out = l_.dma_out
            cc.last_compute = l_.compute + l_.ring
        cc.dma += self.turnaround * min(cc.read_bytes, cc.write_bytes)
        return cc

    def _add(self, cc: CoreCost, op, c: Cost, times: float, owner: bool) -> None:
        cyc = c.cycles * times
        if c.unit in ("dma_in", "dma_out"):
            cc.dma += cyc
            nbytes = c.bytes * times            # a multicast load's share may be fractional
            cc.dma_bytes += nbytes
            elems = int(c.elems * times)
            if c.unit == "dma_in":
                cc.read_bytes += nbytes
                cc.read[op.buffer] = cc.read.get(op.buffer, 0) + elems
            else:
                cc.write_bytes += nbytes
                cc.write[op.buffer] = cc.write.get(op.buffer, 0) + elems
            cc.flops += int(c.flops * times)
        elif c.unit == "ring":
            cc.ring += cyc
            if owner:
                cc.ring_bytes += int(c.bytes * times)
                cc.flops += int(c.flops * times)
        else:
            cc.compute += cyc
            if c.unit == "systolic":
                cc.systolic += cyc
            cc.flops += int(c.flops * times)

    # -- one step (pipeline ends and the trace) ----------------------------------------------
    def step_cost(self, st: Step, boxes: dict | None, owner: bool, group_active: int) -> StepCost:
        """The cost of one step. ``boxes``: load -> box it last loaded on this core (updated);
        None: every load that runs is charged (an upper bound for the last step)."""
        s, p = self.s, self.p
        ext = {d: b - a for d, (a, b) in zip(self.names, st.ranges)}
        sc = StepCost()
        for i, op in enumerate(p.body):
            if self.alias[i]:
                continue
            r = self.rules[i]
            if s.ring_dim in r.ring and not owner:
                continue
            if not runs_at(r, st, self.inner):
                continue
            if isinstance(op, RingReduce) and (s.ring_dim != op.dim or group_active <= 1):
                continue
            if isinstance(op, Load) and boxes is not None:
                box = tuple(st.ranges[self.names.index(d)] for d in self.op_dims[i])
                if boxes.get(i) == box:
                    continue                     # resident: still in the scratchpad
                boxes[i] = box
            c = self.cost(i, ext)
            sc.add(chain_cost(self.cfg, c, group_active, owner) if isinstance(op, RingReduce) else c)
        return sc


def _end_step(s: Schedule, core: CoreWork, last: bool) -> Step | None:
    """The core's first or last step, without walking the others."""
    p = s.program
    names = p.dim_names
    if any(b <= a for a, b in core.ranges):
        return None
    ranges = []
    counts = []
    for (a, b), t in zip(core.ranges, s.tiles):
        k = -(-(b - a) // max(1, t))
        counts.append(k)
        ranges.append((a + (k - 1) * t, b) if last else (a, min(a + t, b)))
    inner = [k for k, d in enumerate(names) if d in p.analysis.reduced_dims]
    single = frozenset(names[k] for k in inner if counts[k] == 1)
    every = frozenset(names[k] for k in inner)
    return Step(tuple(ranges), single if last else every, every if last else single, -1)


def _pipeline_segments(model: _Model, core: CoreWork, owner: bool, group_active: int, end: float,
                       double_buffer: bool, cyc_us: float, t0: float) -> list[trace.Segment]:
    """A picture of one core's pipeline for the trace: the first steps laid out on a DMA and a
    compute engine as double buffering (or strict sequence) orders them, the rest merged; times
    are scaled so that the core's timeline ends at its estimated time."""
    steps: list[StepCost] = []
    boxes: dict = {}
    more = 0
    for j, st in enumerate(model.s.steps(core)):
        if j < MAX_TRACE_STEPS:
            steps.append(model.step_cost(st, boxes, owner, group_active))
        else:
            more += 1
    if not steps:
        return []
    raw: list[tuple[str, float, float, str]] = []
    if not double_buffer:
        t = 0.0
        for i, x in enumerate(steps):
            for kind, dur, lab in (("dma_in", x.dma_in, "load"), (_ckind(x), x.compute, ""), ("ring", x.ring, "ring"),
                                   ("dma_out", x.dma_out, "store")):
                raw.append((kind, t, dur, f"tile {i}" + (f" {lab}" if lab else "")))
                t += dur
        sim_end = t
    else:
        dma = 0.0
        comp_end: list[float] = []
        for i, x in enumerate(steps):
            s_in = max(dma, comp_end[i - 2] if i >= 2 else 0.0)
            raw.append(("dma_in", s_in, x.dma_in, f"tile {i} load"))
            dma = s_in + x.dma_in
            if i >= 1:
                s_out = max(dma, comp_end[i - 1])
                raw.append(("dma_out", s_out, steps[i - 1].dma_out, f"tile {i - 1} store"))
                dma = s_out + steps[i - 1].dma_out
            s_c = max(s_in + x.dma_in, comp_end[i - 1] if i else 0.0)
            raw.append((_ckind(x), s_c, x.compute, f"tile {i}"))
            raw.append(("ring", s_c + x.compute, x.ring, f"tile {i} ring"))
            comp_end.append(s_c + x.compute + x.ring)
        s_out = max(dma, comp_end[-1])
        raw.append(("dma_out", s_out, steps[-1].dma_out, f"tile {len(steps) - 1} store"))
        sim_end = max(s_out + steps[-1].dma_out, comp_end[-1])
    shown = sim_end if not more else sim_end * (1 + more / len(steps))
    scale = end / shown if shown > 0 else 0.0
    segs = [trace.Segment(core.core, kind, t0 + a * scale * cyc_us, d * scale * cyc_us, lab)
            for kind, a, d, lab in raw if d > 0]
    if more:
        a = sim_end * scale
        for kind in ("dma_in", "compute", "dma_out"):
            segs.append(trace.Segment(core.core, kind, t0 + a * cyc_us, (end - a) * cyc_us,
                                      f"{more} more tiles (merged)"))
    return segs


def _ckind(x: StepCost) -> str:
    return "matmul" if x.systolic > x.compute / 2 else "compute"


def relayout_cost(s: Schedule, i: int) -> tuple[int, float]:
    """(bytes, us) of re-laying the operand of Load ``i`` once (restickify): its box read and
    written back in whole sticks at the card's re-layout rate, before the cores start."""
    cfg = s.cfg
    a = s.access[i]
    elems = 1
    for d in a.dims:
        elems *= s.extents[s.program.dim_names.index(d)]
    nbytes = 2 * math.ceil(elems * a.itemsize / cfg.stick_bytes) * cfg.stick_bytes
    return nbytes, nbytes / cfg.relayout_bandwidth * 1e6


def estimate_schedule(s: Schedule, segments: bool = True) -> Estimate:
    p = s.program
    cfg = s.cfg
    cyc_us = 1e6 / cfg.clock_hz
    launch_us = cfg.kernel_launch_us
    model = _Model(s)
    per_sig: dict = {}
    core_cycles: list[float] = []
    parts: list[tuple[float, float, float]] = []
    costs: list[tuple[CoreWork, bool, int, CoreCost]] = []
    flops = dma_bytes = ring_bytes = 0
    read: dict[str, int] = {}
    write: dict[str, int] = {}
    for group in s.ring_groups():
        active = [c for c in group if not c.empty]
        for c in group:
            owner = c is group[0] or (c is active[0] if active else False)
            sig = (tuple(b - a for a, b in c.ranges), owner, len(active))
            cc = per_sig.get(sig)
            if cc is None:
                cc = per_sig[sig] = model.core(c, owner, len(active))
            costs.append((c, owner, len(active), cc))
            flops += cc.flops
            dma_bytes += cc.dma_bytes
            ring_bytes += cc.ring_bytes
            for b, n in cc.read.items():
                read[b] = read.get(b, 0) + n
            for b, n in cc.write.items():
                write[b] = write.get(b, 0) + n
            core_cycles.append(cc.time(s.double_buffer))
            parts.append((cc.dma, cc.compute, cc.ring))
    slow = max(range(len(core_cycles)), key=lambda i: core_cycles[i]) if core_cycles else None
    core_time = core_cycles[slow] * cyc_us if slow is not None else 0.0
    dma_c, comp_c, ring_c = parts[slow] if slow is not None else (0.0, 0.0, 0.0)
    relay_us = 0.0
    relay_bytes = 0
    relay_names = []
    for i in sorted(s.relayout):
        nbytes, t = relayout_cost(s, i)
        relay_bytes += nbytes
        relay_us += t
        relay_names.append(p.body[i].buffer)
    dma_bytes = math.ceil(dma_bytes - 1e-6) + relay_bytes
    segs: list[trace.Segment] | None = None
    if segments:
        segs = [trace.Segment(costs[0][0].core if costs else 0, "launch", 0.0, launch_us, "kernel launch")]
        if relay_us:
            for c, *_ in costs:
                segs.append(trace.Segment(c.core, "dma_in", launch_us, relay_us, f"re-lay {', '.join(relay_names)}"))
        for (c, owner, ga, cc), cyc in zip(costs, core_cycles):
            segs.extend(_pipeline_segments(model, c, owner, ga, cyc, s.double_buffer, cyc_us, launch_us + relay_us))
    us = launch_us + relay_us + core_time
    dma_us = dma_c * cyc_us + relay_us
    if launch_us >= us - launch_us:
        bottleneck = "launch"
    else:
        bottleneck = max((dma_us, "memory"), (comp_c * cyc_us, "compute"), (ring_c * cyc_us, "ring"))[1]
    compulsory = 0
    for b in p.buffers:
        span = b.span(s.sizes)
        compulsory += (min(span, read.get(b.name, 0)) + min(span, write.get(b.name, 0))) * b.itemsize
    # the flops at the peak of the program's matmul dtype (fp8 and int8 operands: 2x fp16's)
    peak = cfg.peak_fp16_flops * program_matmul_speedup(cfg, p)
    roof = max(flops / peak, compulsory / cfg.device_memory_bandwidth) * 1e6
    return Estimate(p.name, us / cyc_us, us, launch_us, tuple(c * cyc_us for c in core_cycles), bottleneck,
                    dma_bytes, ring_bytes, flops, compulsory, roof, dma_us, comp_c * cyc_us, ring_c * cyc_us,
                    s.double_buffer, s.describe(), tuple(segs or ()), relay_us, relay_bytes, tuple(relay_names))
