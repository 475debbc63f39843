"""Events the card reports while it works, and who listens.

The device layer publishes a :class:`FallbackEvent` for every host fallback; the runtime
publishes a :class:`KernelEvent` for every tile program it launches; the distributed backend a
:class:`CollectiveEvent` for every collective between cards. The profiler
(``vspyre.runtime.profiler``) subscribes to both. Publishing costs one list check when nobody
listens, so it stays on the hot path.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Union


@dataclass(frozen=True)
class Segment:
    """One interval of estimated device time on one core (for the trace's per-core tracks)."""

    core: int
    kind: str          # "dma_in", "dma_out", "compute", "matmul", "ring", "launch"
    start_us: float    # from the kernel's start
    dur_us: float
    label: str = ""


@dataclass(frozen=True)
class KernelEvent:
    """A tile program ran on a card."""

    name: str
    device: int
    host_start_ns: int
    host_end_ns: int
    est_us: float                 # estimated device time (slowest core + launch)
    bottleneck: str               # "memory", "compute", "ring", "launch"
    bytes_moved: int
    flops: int
    roofline_us: float
    segments: tuple[Segment, ...] = ()
    source: str = ""              # which compiler made it ("inductor", "standalone", "test", ...)
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class FallbackEvent:
    """An ATen op ran on the host on behalf of the card."""

    op: str
    device: int
    host_start_ns: int
    host_end_ns: int
    context: str = "eager"        # "eager", or "compiled" when a compiled graph called it
    bytes_moved: int = 0          # over the host link: device inputs up, fresh results down
    est_us: float = 0.0           # that traffic at the host link's bandwidth (the card waits for it)


@dataclass(frozen=True)
class CollectiveEvent:
    """A collective (all_reduce, all_gather, ...) between cards, as one rank sees it: the bytes it
    moves and its time on the card-to-card link model (``vspyre.distributed``)."""

    name: str                     # "all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", ...
    device: int
    host_start_ns: int
    host_end_ns: int
    est_us: float                 # the link model's time; the card waits for it (synchronous collectives)
    nbytes: int                   # the payload: this rank's tensor (all_gather: its input; reduce_scatter: its input)
    link_bytes: int               # bytes this card sends over its link
    world_size: int
    algorithm: str                # "ring", "host", "p2p"
    steps: int                    # messages per card (each pays the link latency)
    executed: bool = True         # False in estimate-only mode: costed, not run


Event = Union[KernelEvent, FallbackEvent, CollectiveEvent]

_lock = threading.Lock()
_subscribers: list[Callable[[Event], None]] = []


def subscribe(fn: Callable[[Event], None]) -> None:
    with _lock:
        _subscribers.append(fn)


def unsubscribe(fn: Callable[[Event], None]) -> None:
    with _lock:
        if fn in _subscribers:
            _subscribers.remove(fn)


def listening() -> bool:
    return bool(_subscribers)


def publish(event: Event) -> None:
    for fn in tuple(_subscribers):
        fn(event)


def op_packet(name: str) -> str:
    """An op name without its overload (``aten::median.dim_values`` -> ``aten::median``): the key
    that joins reports across paths, since the device counts the overload the dispatcher ran (a
    structured op's ``.out``) and a compiler the one in its graph (``median.dim``)."""
    ns, sep, rest = name.partition("::")
    return f"{ns}{sep}{rest.split('.', 1)[0]}" if sep else name


def op_name(op: object) -> str:
    """The name every report uses for an op: the dispatcher's spelling, namespace included
    (``aten::add.Tensor``, ``aten::i0``, ``transformers::grouped_mm_fallback``); Python callables
    as ``module.name`` (``operator.getitem``, ``torch.sym_sum``)."""
    name = getattr(op, "name", None)
    if callable(name) and hasattr(op, "_schema"):            # an OpOverload
        return name()
    qual = getattr(op, "_qualified_op_name", None)           # an OpOverloadPacket
    if isinstance(qual, str):
        return qual
    base = getattr(op, "__name__", str(op))
    mod = getattr(op, "__module__", None)
    if mod in ("_operator", "operator"):
        return f"operator.{base}"
    return f"torch.{base}" if mod == "torch" else base

