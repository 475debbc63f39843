"""Profiling the card as people expect it::

    with vspyre.runtime.profiler.profile() as prof:     # or torch.spyre.profile()
        model(x)
    print(prof.table())                                   # rich table, one row per kernel
    prof.export_chrome_trace("trace.json")                # open in Perfetto / chrome://tracing

Records every ``trace.KernelEvent`` (a launched tile program, with the latency model's estimate
and per-core segments) and every ``trace.FallbackEvent`` (an op run on the host for the card).

The Chrome trace is the JSON "trace event" format torch.profiler also writes: one process per
card, kernels laid out on the card's *estimated* clock (a kernel starts at the later of its host
launch time and the end of the previous kernel), one track per core for DMA and one for compute
(two tracks per core, because double-buffered DMA overlaps compute and a track must nest), a
"kernels" track, and a "host fallbacks" track in host time.

torch.profiler: launches run inside ``record_function("spyre::<kernel>")`` while a torch
profiler is active, so they appear in its CPU timeline and ``key_averages()``; the device-side
estimates are only in this profiler's trace (torch's device tracks need a C++ profiler backend).
"""

from __future__ import annotations

import io
import json
import os
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from .. import trace

__all__ = ["profile", "Profile", "KernelStats"]


@dataclass
class KernelStats:
    name: str
    calls: int
    est_us: float              # total estimated device time
    host_us: float             # total host wall time of the launches
    bytes: int
    flops: int
    roofline_us: float
    bottleneck: str            # the most common one
    share: float = 0.0         # of all estimated device time

    @property
    def avg_us(self) -> float:
        return self.est_us / self.calls if self.calls else 0.0

    @property
    def efficiency(self) -> float:
        """Roofline bound over estimate (1.0 = at the roofline)."""
        return self.roofline_us / self.est_us if self.est_us > 0 else 0.0


class Profile:
    def __init__(self, record_segments: bool = True) -> None:
        self.kernels: list[trace.KernelEvent] = []
        self.fallbacks: list[trace.FallbackEvent] = []
        self.collectives: list[trace.CollectiveEvent] = []
        self.record_segments = record_segments
        self._lock = threading.Lock()
        self._t0 = 0
        self._active = False

    # -- recording ----------------------------------------------------------------------------
    def _on(self, ev: trace.Event) -> None:
        with self._lock:
            if isinstance(ev, trace.KernelEvent):
                self.kernels.append(ev)
            elif isinstance(ev, trace.FallbackEvent):
                self.fallbacks.append(ev)
            elif isinstance(ev, trace.CollectiveEvent):
                self.collectives.append(ev)

    def start(self) -> "Profile":
        import time
        self._t0 = time.perf_counter_ns()
        trace.subscribe(self._on)
        self._active = True
        return self

    def stop(self) -> None:
        if self._active:
            trace.unsubscribe(self._on)
            self._active = False

    def __enter__(self) -> "Profile":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- summaries ------------------------------------------------------------------------------
    def key_averages(self) -> list[KernelStats]:
        """One row per kernel name, sorted by total estimated device time (descending)."""
        rows: dict[str, KernelStats] = {}
        bnecks: dict[str, Counter] = defaultdict(Counter)
        for k in self.kernels:
            r = rows.get(k.name)
            if r is None:
                r = rows[k.name] = KernelStats(k.name, 0, 0.0, 0.0, 0, 0, 0.0, "")
            r.calls += 1
            r.est_us += k.est_us
            r.host_us += (k.host_end_ns - k.host_start_ns) / 1e3
            r.bytes += k.bytes_moved
            r.flops += k.flops
            r.roofline_us += k.roofline_us
            bnecks[k.name][k.bottleneck] += 1
        total = sum(r.est_us for r in rows.values()) or 1.0
        for r in rows.values():
            r.bottleneck = bnecks[r.name].most_common(1)[0][0]
            r.share = r.est_us / total
        return sorted(rows.values(), key=lambda r: -r.est_us)

    def fallback_summary(self) -> list[tuple[str, int, float]]:
        """(op, calls, total host microseconds), most time first."""
        agg: dict[str, list] = {}
        for f in self.fallbacks:
            a = agg.setdefault(f.op, [0, 0.0])
            a[0] += 1
            a[1] += (f.host_end_ns - f.host_start_ns) / 1e3
        return sorted(((k, v[0], v[1]) for k, v in agg.items()), key=lambda r: -r[2])

    def collective_summary(self) -> list[tuple[str, int, float, int]]:
        """(collective, calls, total est. microseconds, total payload bytes), most time first."""
        agg: dict[str, list] = {}
        for c in self.collectives:
            a = agg.setdefault(c.name, [0, 0.0, 0])
            a[0] += 1
            a[1] += c.est_us
            a[2] += c.nbytes
        return sorted(((k, v[0], v[1], v[2]) for k, v in agg.items()), key=lambda r: -r[2])

    @property
    def kernel_est_us(self) -> float:
        """Estimated device time of the kernels alone."""
        return sum(k.est_us for k in self.kernels)

    @property
    def collective_est_us(self) -> float:
        """Estimated time of the collectives between cards (the card waits for each: synchronous)."""
        return sum(c.est_us for c in self.collectives)

    @property
    def total_est_us(self) -> float:
        """Kernels plus collectives: one card's estimated time."""
        return self.kernel_est_us + self.collective_est_us

    def rich_table(self, row_limit: int = 50):
        from rich.markup import escape
        from rich.table import Table

        coll = (f"; {len(self.collectives)} collectives, {self.collective_est_us:.1f} us"
                if self.collectives else "")
        t = Table(title=f"spyre kernels: {len(self.kernels)} launches, est. device time {self.total_est_us:.1f} us"
                        f"{coll}; {len(self.fallbacks)} host fallbacks")
        for col, just in [("kernel", "left"), ("calls", "right"), ("est. device time (us)", "right"),
                          ("avg (us)", "right"), ("share", "right"), ("bottleneck", "left"), ("bytes", "right"),
                          ("flops", "right"), ("roofline eff.", "right")]:
            t.add_column(col, justify=just)
        for r in self.key_averages()[:row_limit]:
            t.add_row(escape(r.name), str(r.calls), f"{r.est_us:.2f}", f"{r.avg_us:.2f}", f"{r.share:.1%}", r.bottleneck,
                      _human(r.bytes), _human(r.flops), f"{r.efficiency:.0%}")
        total = self.total_est_us or 1.0
        for name, calls, us, nbytes in self.collective_summary()[:row_limit]:
            algo = ", ".join(sorted({c.algorithm for c in self.collectives if c.name == name}))
            t.add_row(escape(f"[collective] {name}"), str(calls), f"{us:.2f}", f"{us / calls:.2f}", f"{us / total:.1%}",
                      f"link ({algo})", _human(nbytes), "-", "-")
        for op, calls, us in self.fallback_summary()[:row_limit]:
            t.add_row(escape(f"[host fallback] {op}"), str(calls), "-", "-", "-", "host", "-", "-", f"host {us:.1f} us")
        return t

    def table(self, row_limit: int = 50, width: int = 140) -> str:
        """The table as text (like torch.profiler's ``key_averages().table()``)."""
        from rich.console import Console

        buf = io.StringIO()
        Console(file=buf, width=width, force_terminal=False, color_system=None).print(self.rich_table(row_limit))
        return buf.getvalue()

    def print(self, row_limit: int = 50) -> None:
        from rich.console import Console
        Console().print(self.rich_table(row_limit))

    # -- Chrome trace --------------------------------------------------------------------------
    def chrome_trace(self) -> dict:
        events: list[dict] = []
        cards = sorted({k.device for k in self.kernels} | {f.device for f in self.fallbacks}
                       | {c.device for c in self.collectives}) or [0]
        cores_seen: dict[int, set[int]] = defaultdict(set)
        FALLBACK_TID, KERNEL_TID, COLLECTIVE_TID = 1, 2, 3
        cursor: dict[int, float] = defaultdict(float)
        t0 = self._t0 or min([k.host_start_ns for k in self.kernels] + [f.host_start_ns for f in self.fallbacks] + [0])
        timeline = sorted(list(self.kernels) + list(self.collectives), key=lambda k: k.host_start_ns)
        for k in timeline:
            pid = k.device
            start = max(cursor[pid], (k.host_start_ns - t0) / 1e3)
            cursor[pid] = start + k.est_us
            if isinstance(k, trace.CollectiveEvent):
                events.append({"ph": "X", "cat": "collective", "name": k.name, "pid": pid, "tid": COLLECTIVE_TID,
                               "ts": start, "dur": k.est_us,
                               "args": {"bytes": k.nbytes, "link_bytes": k.link_bytes, "world_size": k.world_size,
                                        "algorithm": k.algorithm, "steps": k.steps, "executed": k.executed}})
                continue
            events.append({"ph": "X", "cat": "kernel", "name": k.name, "pid": pid, "tid": KERNEL_TID,
                           "ts": start, "dur": k.est_us,
                           "args": {"bottleneck": k.bottleneck, "bytes": k.bytes_moved, "flops": k.flops,
                                    "roofline_us": k.roofline_us, "source": k.source,
                                    **{kk: str(v) for kk, v in k.extra.items()}}})
            if not self.record_segments:
                continue
            for s in k.segments:
                if s.kind == "launch":
                    continue
                cores_seen[pid].add(s.core)
                tid = 10 + 2 * s.core + (0 if s.kind in ("dma_in", "dma_out") else 1)
                events.append({"ph": "X", "cat": s.kind, "name": f"{s.kind} {k.name}", "pid": pid, "tid": tid,
                               "ts": start + s.start_us, "dur": s.dur_us, "args": {"label": s.label}})
        for f in self.fallbacks:
            events.append({"ph": "X", "cat": "fallback", "name": f.op, "pid": f.device, "tid": FALLBACK_TID,
                           "ts": (f.host_start_ns - t0) / 1e3, "dur": (f.host_end_ns - f.host_start_ns) / 1e3,
                           "args": {"context": f.context}})
        meta: list[dict] = []
        for pid in cards:
            meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                         "args": {"name": f"spyre:{pid} (estimated device time)"}})
            meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
            meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": FALLBACK_TID,
                         "args": {"name": "host fallbacks (host time)"}})
            meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": KERNEL_TID, "args": {"name": "kernels"}})
            if self.collectives:
                meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": COLLECTIVE_TID,
                             "args": {"name": "collectives (card-to-card link model)"}})
            for c in sorted(cores_seen[pid]):
                for off, what in ((0, "dma"), (1, "compute")):
                    tid = 10 + 2 * c + off
                    meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                                 "args": {"name": f"core {c:02d} {what}"}})
                    meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                                 "args": {"sort_index": tid}})
        return {"traceEvents": meta + events, "displayTimeUnit": "ns",
                "otherData": {"generator": "vspyre.runtime.profiler", "time_base": "microseconds; device "
                              "tracks show the latency model's estimate, not a measurement"}}

    def export_chrome_trace(self, path: str | os.PathLike) -> str:
        with open(path, "w") as fh:
            json.dump(self.chrome_trace(), fh)
        return str(path)


def profile(record_segments: bool = True) -> Profile:
    """``with profile() as prof: ...`` records kernels and host fallbacks (see module doc)."""
    return Profile(record_segments)


def _human(n: float) -> str:
    for unit in ("", "K", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.0f}{unit}" if unit == "" else f"{n:.1f}{unit}"
        n /= 1000
    return f"{n:.1f}P"
