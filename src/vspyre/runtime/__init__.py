"""The runtime: launch tile programs on the (virtual) card.

    from vspyre import runtime
    runtime.launch(prog, x, y)                  # fast mode (default)
    runtime.launch(prog, x, y, mode="checked")  # core by core, proving the schedule
    runtime.launch(prog, x, out, sizes={"n": 7})  # explicit scalar size symbols

Every launch publishes a ``trace.KernelEvent`` (when someone listens, e.g. the profiler) with the
latency model's estimate and per-core segments. The default mode comes from ``VSPYRE_RUNTIME_MODE``
(``fast`` or ``checked``).

Logging: the ``vspyre.runtime`` logger prints each program's text form (with its schedule) at
DEBUG the first time it is bound (``TORCH_LOGS=+vspyre`` enables it when torch's logging knows the
name; ``logging.getLogger("vspyre.runtime").setLevel(logging.DEBUG)`` always works). With
``VSPYRE_DUMP_DIR`` set, the same text is written to ``<dir>/<program>.<shape-hash>.tprog``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from typing import Mapping, Sequence

import torch

from .. import hardware, trace
from ..ir.planning import ScheduleError
from ..ir.printer import format_program
from ..ir.program import Load, Program
from .executor import Bound, LaunchError, bind, run_checked, run_fast
from . import relayout
from .memory import estimate_only, has_values, host

__all__ = ["launch", "host", "ScheduleError", "LaunchError", "MODES", "default_mode", "dump"]

log = logging.getLogger("vspyre.runtime")
MODES = ("fast", "checked")

try:  # make TORCH_LOGS="+vspyre" work; torch._logging is torch's, not inductor's
    from ..compat import register_log as _register_log
    _register_log("vspyre", ["vspyre"])
except Exception:  # noqa: BLE001 - optional nicety
    pass


def default_mode() -> str:
    m = os.environ.get("VSPYRE_RUNTIME_MODE", "fast")
    if m not in MODES:
        raise ValueError(f"VSPYRE_RUNTIME_MODE={m!r}: one of {MODES}")
    return m


def _key(tensors: Sequence[torch.Tensor], scalars: Mapping[str, int]):
    k = tuple((t.dtype, t.shape, t.stride()) for t in tensors)
    return (k, tuple(sorted(scalars.items()))) if scalars else k


def _is_weight(t: torch.Tensor) -> bool:
    """A parameter of a module (or a view of one: compiled code passes flat views of its inputs)."""
    return isinstance(t, torch.nn.Parameter) or isinstance(getattr(t, "_base", None), torch.nn.Parameter)


def _bound_for(program: Program, tensors: Sequence[torch.Tensor], scalars: Mapping[str, int]) -> Bound:
    cache = program.__dict__.get("_rt_cache")
    if cache is None:
        cache = program.__dict__["_rt_cache"] = {}
    key = _key(tensors, scalars)
    bd = cache.get(key)
    if bd is None:
        bd = bind(program, tensors, dict(scalars))
        # a model's weights keep their values across launches: the planner counts their re-layout once
        bd.meta["persistent"] = frozenset(b.name for b, t in zip(program.buffers, tensors) if _is_weight(t))
        cache[key] = bd
        if log.isEnabledFor(logging.DEBUG) or os.environ.get("VSPYRE_DUMP_DIR"):
            dump(bd)
    return bd


def dump(bd: Bound) -> str:
    """The program's text form with its resolved schedule and estimate; logged and dumped."""
    try:
        s = bd.schedule()
        e = bd.estimate()
        text = format_program(bd.program, s) + (
            f"  sizes: {bd.sizes}\n  estimate: {e.us:.2f} us ({e.bottleneck}), {e.dma_bytes} DMA bytes, "
            f"{e.flops} flops, roofline {e.roofline_us:.2f} us\n")
    except Exception as err:  # noqa: BLE001 - still show the program
        text = format_program(bd.program) + f"  (no schedule: {err})\n"
    log.debug("tile program:\n%s", text)
    d = os.environ.get("VSPYRE_DUMP_DIR")
    if d:
        os.makedirs(d, exist_ok=True)
        h = hashlib.sha1(repr(sorted(bd.sizes.items())).encode()).hexdigest()[:8]
        with open(os.path.join(d, f"{bd.program.name}.{h}.tprog"), "w") as fh:
            fh.write(text)
    return text


def _direct_reads(bd: Bound) -> tuple[int, ...]:
    """The read-only buffers the program reads in their stored layout (a load not re-laid)."""
    got = bd.meta.get("direct_reads")
    if got is None or got[0] is not hardware.get_config():
        rl = bd.schedule().relayout if bd.relayouts() else frozenset()
        ins = {b.name: i for i, b in enumerate(bd.program.buffers) if b.role == "in"}
        got = (hardware.get_config(), tuple(sorted({ins[op.buffer] for i, op in enumerate(bd.program.body)
                                                     if isinstance(op, Load) and op.buffer in ins and i not in rl})))
        bd.meta["direct_reads"] = got
    return got[1]


def _execute(bd: Bound, tensors: Sequence[torch.Tensor], m: str) -> dict | None:
    hosts = [t if t.is_cpu else host(t) for t in tensors]
    if torch.autograd._profiler_enabled():      # visible in torch.profiler's CPU timeline
        with torch.profiler.record_function(f"spyre::{bd.program.name}"):
            return run_fast(bd, hosts) if m == "fast" else run_checked(bd, hosts)
    return run_fast(bd, hosts) if m == "fast" else run_checked(bd, hosts)


def _estimate_only(bd: Bound, tensors: Sequence[torch.Tensor]) -> None:
    """Plan and cost the launch without executing it. A buffer the kernel writes must be memory
    without values too: writing garbage over a tensor that has values would pass silently."""
    bd.estimate()                     # plans the schedule: a launch that cannot run fails here too
    for b, t in zip(bd.program.buffers, tensors):
        if b.role != "in" and t.device.type != "cpu" and has_values(t):
            raise LaunchError(
                f"program {bd.program.name}: estimate-only mode cannot write buffer {b.name} "
                f"({tuple(t.shape)} {t.dtype}): that tensor was allocated outside the mode and has values "
                "this launch would not compute; allocate it inside torch.spyre.estimate_only()")
    return None


def launch(program: Program, *tensors: torch.Tensor, mode: str | None = None,
           sizes: Mapping[str, int] | None = None, source: str | None = None) -> dict | None:
    """Run ``program`` on ``tensors`` (one per buffer, in ``program.buffers`` order; CPU tensors
    stand for device memory, spyre tensors are accessed through ``host_view``).

    Returns ``None`` in fast mode, the facts checked mode measured (peak scratchpad bytes, ring
    transfers, cores) in checked mode.
    """
    t0 = time.perf_counter_ns()
    scalars = sizes or {}
    bd = _bound_for(program, tensors, scalars)
    if bd.meta.get("offsets", True):
        if not any(b.offset is not None for b in program.buffers):
            bd.meta["offsets"] = False
        for b, t in zip(program.buffers, tensors):
            if b.offset is not None and t.storage_offset() != b.offset:
                raise LaunchError(f"program {program.name}: buffer {b.name} wants storage offset {b.offset}, "
                                  f"got {t.storage_offset()}")
    m = mode or default_mode()
    if m not in MODES:
        raise ValueError(f"launch: mode must be one of {MODES}, got {m!r}")
    # operands read through a re-layout: laid out once per tensor version and kept on the card
    missed = [r for r in bd.relayouts() if not relayout.lookup(tensors[r[0]], r[2], r[3], r[4])]
    if relayout.held_in_place():      # a tensor re-laid in place and read as stored too keeps both layouts
        for bi in _direct_reads(bd):
            relayout.read(tensors[bi], bd.spans[bi])
    if estimate_only():
        facts = _estimate_only(bd, tensors)
    else:
        facts = _execute(bd, tensors, m)
    if relayout.active():
        for b, t in zip(program.buffers, tensors):
            if b.role != "in":
                relayout.invalidate(t)
    if trace.listening():
        t1 = time.perf_counter_ns()
        e = bd.estimate()
        dev = next((t.device.index or 0 for t in tensors if t.device.type != "cpu"), 0)
        src = source or program.source
        bw = hardware.get_config().device_memory_bandwidth
        for bi, name, span, stride, nbytes, us in missed:
            trace.publish(trace.KernelEvent(
                name=f"relayout {name} ({program.name})", device=dev, host_start_ns=t0, host_end_ns=t0, est_us=us,
                bottleneck="memory", bytes_moved=2 * nbytes, flops=0, roofline_us=2 * nbytes / bw * 1e6,
                segments=(trace.Segment(0, "dma_in", 0.0, us, f"re-lay {name}"),), source=src,
                extra={"kind": "relayout", "buffer": name, "kernel": program.name}))
        e = e.without_relayout()
        trace.publish(trace.KernelEvent(
            name=program.name, device=dev, host_start_ns=t0, host_end_ns=t1, est_us=e.us,
            bottleneck=e.bottleneck, bytes_moved=e.dma_bytes, flops=e.flops, roofline_us=e.roofline_us,
            segments=e.segments, source=src,
            extra={"mode": m, "schedule": e.schedule, "compulsory_bytes": e.compulsory_bytes,
                   "ring_bytes": e.ring_bytes, "sizes": dict(bd.sizes)}))
    return facts
