"""``torch.spyre``: the device module, shaped like ``torch.cuda``.

Every number it reports comes from the active hardware config (``vspyre.hardware``); memory
statistics come from the C++ allocator, per card. Streams and events are synchronous: every
kernel has finished when its launch returns, so ``synchronize`` has nothing to wait for and
events carry host timestamps (``elapsed_time`` measures host time between two records).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from .. import hardware, numerics as _numerics
from . import fallback as _fallback
from ._ext import _C

__all__ = [
    "is_available", "is_initialized", "device_count", "current_device", "set_device", "device",
    "device_of", "synchronize", "manual_seed", "manual_seed_all", "seed", "seed_all",
    "initial_seed", "get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all",
    "default_generators", "get_device_properties", "get_device_name", "get_device_capability",
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "reset_peak_memory_stats", "reset_accumulated_memory_stats", "memory_stats", "memory_summary",
    "mem_get_info", "empty_cache", "Stream", "Event", "current_stream", "default_stream", "stream",
    "fallback_stats", "fallback_time_stats", "reset_fallback_stats", "set_fallback_mode",
    "get_fallback_mode", "fallback_mode", "set_numerics", "get_numerics", "hardware_config",
    "OutOfMemoryError", "estimate_only", "is_estimate_only", "has_values", "EstimateOnlyError",
]

OutOfMemoryError = torch.OutOfMemoryError
EstimateOnlyError = _fallback.EstimateOnlyError


# -- availability and cards -----------------------------------------------------------------

def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _lazy_init() -> None:
    """Nothing to initialise lazily: the card is ready once vspyre is imported."""


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return _C._num_cards()


def current_device() -> int:
    return _C._current_device()


def _index(dev: Any = None) -> int:
    if dev is None:
        return current_device()
    if isinstance(dev, int):
        idx = dev
    else:
        d = torch.device(dev)
        if d.type != "spyre":
            raise ValueError(f"expected a spyre device, got {d}")
        idx = current_device() if d.index is None else d.index
    if not 0 <= idx < device_count():
        raise ValueError(f"spyre: invalid device index {idx} (this process has {device_count()} "
                         f"card(s); set VSPYRE_NUM_CARDS for more)")
    return idx


def set_device(dev: Any) -> None:
    _C._set_device(_index(dev))


class device:
    """Context manager that makes a card current: ``with torch.spyre.device(1): ...``."""

    def __init__(self, dev: Any):
        self.idx = -1 if dev is None else _index(dev)
        self.prev = -1

    def __enter__(self) -> "device":
        self.prev = current_device()
        if self.idx >= 0:
            _C._set_device(self.idx)
        return self

    def __exit__(self, *exc: Any) -> None:
        _C._set_device(self.prev)


class device_of(device):
    """Context manager that makes the card of a tensor current (no-op for other devices)."""

    def __init__(self, obj: torch.Tensor):
        super().__init__(obj.device.index if obj.device.type == "spyre" else None)


def synchronize(dev: Any = None) -> None:
    """Wait for all kernels on a card: they finished when launched, so this only checks the card."""
    _index(dev)


# -- random numbers -------------------------------------------------------------------------
# Dynamo never traces this package (vspyre.inductor.skip_device_code puts it in its skip list, as
# torch.cuda is): calls to these from compiled code run eagerly, between graphs.

class _DefaultGenerators:
    def __getitem__(self, idx: int) -> torch.Generator:
        return _C._default_generator(_index(idx))

    def __len__(self) -> int:
        return device_count()

    def __iter__(self) -> Iterator[torch.Generator]:
        return (self[i] for i in range(len(self)))


default_generators = _DefaultGenerators()


def manual_seed(seed: int) -> None:
    default_generators[current_device()].manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for g in default_generators:
        g.manual_seed(int(seed))


def seed() -> None:
    default_generators[current_device()].seed()


def seed_all() -> None:
    s = default_generators[0].seed()
    for g in list(default_generators)[1:]:
        g.manual_seed(s)


def initial_seed() -> int:
    return default_generators[current_device()].initial_seed()


def get_rng_state(dev: Any = None) -> torch.Tensor:
    return default_generators[_index(dev)].get_state()


def set_rng_state(state: torch.Tensor, dev: Any = None) -> None:
    default_generators[_index(dev)].set_state(state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [g.get_state() for g in default_generators]


def set_rng_state_all(states: list[torch.Tensor]) -> None:
    for g, s in zip(default_generators, states):
        g.set_state(s)


# -- properties -----------------------------------------------------------------------------

@dataclass(frozen=True)
class SpyreDeviceProperties:
    """What ``get_device_properties`` returns: the card's numbers from the hardware config."""

    name: str
    preset: str
    total_memory: int                  # allocatable bytes (device memory minus ECC)
    device_memory: int                 # bytes of LPDDR5, ECC included
    num_cores: int
    multi_processor_count: int         # = num_cores (the name Inductor and torch.cuda use)
    corelets_per_core: int
    scratchpad_per_core: int
    scratchpad_usable_per_core: int
    stick_bytes: int
    clock_rate_mhz: float
    memory_bandwidth_gbps: float
    ring_bandwidth_gbps: float
    host_link_bandwidth_gbps: float
    peak_fp16_tflops: float
    numerics: str
    type: str = "spyre"
    major: int = 1
    minor: int = 0

    def __str__(self) -> str:
        return (f"_SpyreDeviceProperties(name='{self.name}', preset='{self.preset}', "
                f"total_memory={self.total_memory // 2**20}MB, num_cores={self.num_cores}, "
                f"scratchpad_per_core={self.scratchpad_per_core // 1024}KB, "
                f"clock_rate={self.clock_rate_mhz:.0f}MHz, "
                f"memory_bandwidth={self.memory_bandwidth_gbps:.1f}GB/s, "
                f"ring_bandwidth={self.ring_bandwidth_gbps:.1f}GB/s, "
                f"peak_fp16={self.peak_fp16_tflops:.3f}TFLOP/s, numerics='{self.numerics}')")

    __repr__ = __str__


def get_device_properties(dev: Any = None) -> SpyreDeviceProperties:
    _index(dev)
    c = hardware.get_config()
    return SpyreDeviceProperties(
        name="vspyre virtual Spyre-class card",
        preset=c.name,
        total_memory=c.usable_memory_bytes,
        device_memory=c.device_memory_bytes,
        num_cores=c.num_cores,
        multi_processor_count=c.num_cores,
        corelets_per_core=c.corelets_per_core,
        scratchpad_per_core=c.scratchpad_bytes,
        scratchpad_usable_per_core=c.scratchpad_usable_bytes,
        stick_bytes=c.stick_bytes,
        clock_rate_mhz=c.clock_hz / 1e6,
        memory_bandwidth_gbps=c.device_memory_bandwidth / 1e9,
        ring_bandwidth_gbps=c.ring_bandwidth / 1e9,
        host_link_bandwidth_gbps=c.host_link_bandwidth / 1e9,
        peak_fp16_tflops=c.peak_fp16_flops / 1e12,
        numerics=c.numerics,
    )


def get_device_name(dev: Any = None) -> str:
    return get_device_properties(dev).name


def get_device_capability(dev: Any = None) -> tuple[int, int]:
    p = get_device_properties(dev)
    return (p.major, p.minor)


def hardware_config() -> hardware.HardwareConfig:
    return hardware.get_config()


# -- memory ---------------------------------------------------------------------------------

def memory_stats(dev: Any = None) -> dict[str, int]:
    """Allocator statistics of a card, with torch.cuda's key names where they apply."""
    return dict(sorted(_C._memory_stats(_index(dev)).items()))


def memory_allocated(dev: Any = None) -> int:
    return memory_stats(dev)["allocated_bytes.all.current"]


def max_memory_allocated(dev: Any = None) -> int:
    return memory_stats(dev)["allocated_bytes.all.peak"]


def memory_reserved(dev: Any = None) -> int:
    return memory_stats(dev)["reserved_bytes.all.current"]


def max_memory_reserved(dev: Any = None) -> int:
    return memory_stats(dev)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(dev: Any = None) -> None:
    _C._reset_peak(_index(dev))


def reset_accumulated_memory_stats(dev: Any = None) -> None:
    _C._reset_accumulated(_index(dev))


def empty_cache() -> None:
    """The allocator keeps no cache: freed bytes return at once. Nothing to do."""


def mem_get_info(dev: Any = None) -> tuple[int, int]:
    """(free bytes, total bytes) of a card."""
    s = memory_stats(dev)
    return s["capacity"] - s["allocated_bytes.all.current"], s["capacity"]


def _fmt(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def memory_summary(dev: Any = None, abbreviated: bool = False) -> str:
    idx = _index(dev)
    s = memory_stats(idx)
    rows = [
        ("Allocated memory", _fmt(s["allocated_bytes.all.current"]), _fmt(s["allocated_bytes.all.peak"]),
         _fmt(s["allocated_bytes.all.allocated"]), _fmt(s["allocated_bytes.all.freed"])),
        ("Requested memory", _fmt(s["requested_bytes.all.current"]), _fmt(s["requested_bytes.all.peak"]), "", ""),
        ("Allocations", str(s["allocation.all.current"]), str(s["allocation.all.peak"]),
         str(s["allocation.all.allocated"]), str(s["allocation.all.freed"])),
    ]
    free, total = mem_get_info(idx)
    lines = [
        "=" * 83,
        f" spyre:{idx} memory summary (virtual card, preset '{hardware.get_config().name}')",
        f" capacity {_fmt(total)}, free {_fmt(free)}, OOMs {s['num_ooms']}, "
        f"host allocation failures {s['num_host_alloc_failures']}",
        "-" * 83,
        f" {'Metric':<20}|{'Cur Usage':>15} |{'Peak Usage':>15} |{'Tot Alloc':>12} |{'Tot Freed':>12}",
        "-" * 83,
    ]
    for r in rows:
        lines.append(f" {r[0]:<20}|{r[1]:>15} |{r[2]:>15} |{r[3]:>12} |{r[4]:>12}")
    lines.append("=" * 83)
    return "\n".join(lines)


# -- streams and events (synchronous) ---------------------------------------------------------

class _OnSpyre(type):
    """``isinstance(x, torch.spyre.Stream)``: a torch.Stream / torch.Event on a spyre card."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls._base) and obj.device.type == "spyre"


class Stream(metaclass=_OnSpyre):
    """A stream on a card (a ``torch.Stream``). Kernels run synchronously: it is always complete."""

    _base = torch.Stream

    def __new__(cls, device: Any = None, priority: int = 0) -> torch.Stream:
        return torch.Stream(device=torch.device("spyre", _index(device)), priority=priority)


class Event(metaclass=_OnSpyre):
    """An event (a ``torch.Event``); ``elapsed_time`` gives host ms between two recorded events."""

    _base = torch.Event

    def __new__(cls, enable_timing: bool = False, blocking: bool = False,
                interprocess: bool = False) -> torch.Event:
        return torch.Event(device=torch.device("spyre", current_device()), enable_timing=enable_timing,
                           blocking=blocking, interprocess=interprocess)


def current_stream(dev: Any = None) -> torch.Stream:
    return Stream(device=dev)


def default_stream(dev: Any = None) -> torch.Stream:
    return current_stream(dev)


@contextlib.contextmanager
def stream(s: "torch.Stream | None") -> Iterator["torch.Stream | None"]:
    """Make a stream current; streams are synchronous, so only its card matters."""
    if s is None:
        yield s
        return
    with device(s.device_index):
        yield s


# -- host fallbacks and numerics ----------------------------------------------------------------

def fallback_stats() -> dict[str, int]:
    """Ops that ran as host fallbacks and how often, since the last reset."""
    return _fallback.stats()


def fallback_time_stats() -> dict[str, float]:
    return _fallback.time_stats()


def reset_fallback_stats() -> None:
    _fallback.reset_stats()


# -- estimate-only mode -------------------------------------------------------------------------

@contextlib.contextmanager
def estimate_only(on: bool = True) -> Iterator[None]:
    """Plan and cost every kernel without executing it, and account device memory against the
    card's capacity without host pages (an 8B model then costs no host memory)::

        with torch.spyre.estimate_only():
            model = model.to_empty(device="spyre")      # weights: accounted, no values
            out = compiled(ids)                          # kernels planned and costed, not run

    Tensors allocated inside have no values: reading one (``.cpu()``, ``print``, ``.item()``) raises
    and says so. Host fallbacks run on shapes alone (their meta kernels) and are still counted and
    costed on the host link; an op whose result depends on values raises, naming it. Also on with
    ``VSPYRE_ESTIMATE_ONLY=1``."""
    prev = _C._set_estimate_only(on)
    try:
        yield
    finally:
        _C._set_estimate_only(prev)


def is_estimate_only() -> bool:
    return bool(_C._estimate_only())


# Compile time has values. A compiler evaluates a graph's constants while it compiles: Inductor's
# constant folding runs the constant subgraphs (a mask's ``full([], True)``, a host constant moved
# to the card) as real ops on the graph's device and reads the result (``.item()``) to decide what
# to fold. Those values come from the program text, not from run-time data, so the mode does not
# apply to them: while Dynamo compiles, allocations are ordinary (with values), and the mode is back
# when the compiled graph runs. (The standalone compiler folds the same constants on the host.)
# A tensor made at compile time is a constant of the graph: a kernel writing into it later still
# raises, as for any tensor with values inside the mode.
_compile_saved: list[bool] = []


def _compile_started(_args: object) -> None:
    _compile_saved.append(bool(_C._set_estimate_only(False)))


def _compile_ended(_args: object) -> None:
    if _compile_saved:
        _C._set_estimate_only(_compile_saved.pop())


class _KeptOnReset(list):
    """Dynamo's compile callbacks, except that ``torch._dynamo.reset()`` (which clears them) keeps
    the device's: they belong to the card, not to one compile."""

    def clear(self) -> None:
        keep = [c for c in self if c in (_compile_started, _compile_ended)]
        super().clear()
        self.extend(keep)


def install_compile_callbacks() -> None:
    """Suspend estimate-only mode while Dynamo compiles (called once Dynamo is imported)."""
    from ..compat import dynamo_callback_handler as handler

    for name, fn in (("start_callbacks", _compile_started), ("end_callbacks", _compile_ended)):
        cbs = getattr(handler, name)
        if not isinstance(cbs, _KeptOnReset):
            cbs = _KeptOnReset(cbs)
            setattr(handler, name, cbs)
        if fn not in cbs:
            cbs.append(fn)


def has_values(t: torch.Tensor) -> bool:
    """False for a spyre tensor allocated in estimate-only mode (it has no defined values)."""
    return bool(_C._has_values(t))


set_fallback_mode = _fallback.set_mode
get_fallback_mode = _fallback.get_mode
fallback_mode = _fallback.mode


def set_numerics(mode: str) -> str:
    """``"dl16"`` (DLFloat16 rounding of fp16 written by device kernels) or ``"ieee"``."""
    prev = hardware.get_config().numerics
    hardware.configure(numerics=mode)
    return prev


def get_numerics() -> str:
    return _numerics.current()
