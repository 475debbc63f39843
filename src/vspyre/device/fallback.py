"""The host fallback: every ATen op without a device kernel runs on the host, counted.

Device memory on the virtual card is host memory, so the fallback runs the CPU kernel directly
on *aliases* of the device tensors (``host_view``): an in-place op writes the device bytes, and
an op that returns a view of an input returns a device view of the same storage. Only fresh
results are copied to the card. Every call is counted per op (:func:`stats`); the mode decides
what else happens:

* ``"allow"`` (default): run, count;
* ``"warn"``: run, count, and warn once per op;
* ``"strict"``: raise ``NotImplementedError`` naming the op (the device stays usable).

The mode comes from ``VSPYRE_FALLBACK`` or :func:`set_mode` / the :func:`mode` context manager.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import time
import warnings
from typing import Any, Callable, Iterator

import torch

from .. import hardware, trace
from ._ext import _C
from ._extname import torch_release

MODES = ("allow", "warn", "strict")

_lock = threading.Lock()
_counts: collections.Counter[str] = collections.Counter()
_time_ns: collections.Counter[str] = collections.Counter()
_warned: set[str] = set()
_mode = os.environ.get("VSPYRE_FALLBACK", "allow")
_local = threading.local()   # .context: "eager" or "compiled" (set by compiled-graph wrappers)
if _mode not in MODES:
    raise ValueError(f"VSPYRE_FALLBACK={_mode!r}: expected one of {MODES}")


class HostFallbackError(NotImplementedError):
    """Raised in strict mode when an op would run on the host."""


def set_mode(mode: str) -> str:
    """Set the fallback mode (``allow``, ``warn``, ``strict``); returns the previous one."""
    global _mode
    if mode not in MODES:
        raise ValueError(f"spyre fallback mode must be one of {MODES}, got {mode!r}")
    prev, _mode = _mode, mode
    return prev


def get_mode() -> str:
    return _mode


@contextlib.contextmanager
def mode(m: str) -> Iterator[None]:
    prev = set_mode(m)
    try:
        yield
    finally:
        set_mode(prev)


@contextlib.contextmanager
def context(name: str) -> Iterator[None]:
    """Label fallbacks that happen inside (``"compiled"`` for compiled graphs)."""
    prev = getattr(_local, "context", "eager")
    _local.context = name
    try:
        yield
    finally:
        _local.context = prev


def current_context() -> str:
    """``"eager"``, or ``"compiled"`` inside a compiled graph."""
    return getattr(_local, "context", "eager")


def stats() -> dict[str, int]:
    """How often each op ran as a host fallback since the last reset, most frequent first."""
    with _lock:
        return dict(_counts.most_common())


def time_stats() -> dict[str, float]:
    """Host wall time (seconds) spent in each fallback op since the last reset."""
    with _lock:
        return {k: v / 1e9 for k, v in _time_ns.most_common()}


def reset_stats() -> None:
    with _lock:
        _counts.clear()
        _time_ns.clear()
        _warned.clear()


# -- the fallback -------------------------------------------------------------------------

def _map(fn: Any, x: Any) -> Any:
    """Apply fn to every tensor in an op's arguments or results (tuples, lists, dicts)."""
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_map(fn, v) for v in x) if not hasattr(x, "_fields") else type(x)(*(_map(fn, v) for v in x))
    if isinstance(x, dict):
        return {k: _map(fn, v) for k, v in x.items()}
    return fn(x) if isinstance(x, torch.Generator) else x


def iter_tensors(x: Any) -> Iterator[torch.Tensor]:
    """Every tensor in an op's arguments or results (tuples, lists, dicts)."""
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from iter_tensors(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from iter_tensors(v)


_tensors = iter_tensors


def meta_like(x: torch.Tensor) -> torch.Tensor:
    """A meta tensor with ``x``'s dtype, sizes, strides and storage offset (shapes without values)."""
    span = x.untyped_storage().nbytes() // max(1, x.element_size())
    return torch.empty(max(span, x.storage_offset() + 1), dtype=x.dtype, device="meta").as_strided(
        x.size(), x.stride(), x.storage_offset())


class _OpInfo:
    """What the fallback needs to know of an op's schema, computed once per op."""

    __slots__ = ("name", "arg_names", "index_lists", "mutable", "out_args", "generator_pos", "tensor_args",
                 "seeded")

    def __init__(self, op: torch._ops.OpOverload):
        args = op._schema.arguments
        self.name = op.name() if hasattr(op, "name") else str(op)
        self.arg_names = [a.name for a in args]
        self.index_lists = {i for i, a in enumerate(args) if str(a.type) == "List[Optional[Tensor]]"}
        self.mutable = [i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write]
        self.out_args = {i for i in self.mutable if args[i].kwarg_only}     # out=: written, not read
        self.generator_pos = self.arg_names.index("generator") if "generator" in self.arg_names else -1
        # a random op without a generator argument (native_dropout) draws from the default generator
        self.seeded = self.generator_pos < 0 and torch.Tag.nondeterministic_seeded in getattr(op, "tags", ())
        self.tensor_args = [i for i, a in enumerate(args) if str(a.type) == "Tensor"]


_op_infos: dict[Any, _OpInfo] = {}


def _info(op: torch._ops.OpOverload) -> _OpInfo:
    info = _op_infos.get(op)
    if info is None:
        info = _op_infos[op] = _OpInfo(op)
    return info


def _arg(info: _OpInfo, i: int, args: Any, kwargs: dict) -> Any:
    return args[i] if i < len(args) else kwargs.get(info.arg_names[i])


def _is_spyre(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "spyre"


def _device_error(a: torch.device, b: torch.device, op: str) -> RuntimeError:
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, "
        f"{a} and {b}! (when checking arguments for {op})")


def _check_devices(info: _OpInfo, args: tuple, kwargs: dict) -> torch.device | None:
    """The one spyre device the op runs on; CUDA's error when tensors are on different devices.

    As on CUDA, 0-dim CPU tensors pass as scalars, and CPU index tensors are accepted where an
    op takes a list of optional index tensors (``x[idx]``).
    """
    found: torch.device | None = None
    other: torch.device | None = None
    for i in range(len(info.arg_names)):
        value = _arg(info, i, args, kwargs)
        if value is None or isinstance(value, (int, float, bool)):
            continue
        for t in _tensors(value):
            if t.device.type == "spyre":
                if found is None:
                    found = t.device
                elif t.device != found:
                    raise _device_error(found, t.device, info.name)
            elif not (t.dim() == 0 or i in info.index_lists):
                other = t.device
    if found is not None and other is not None:
        raise _device_error(found, other, info.name)
    return found


def _link_us(nbytes: int) -> float:
    """The host link's time to move ``nbytes`` (one direction)."""
    return nbytes / hardware.get_config().host_link_bandwidth * 1e6


def _note(name: str, dev_index: int, t0: int, t1: int, moved: Callable[[], int] = lambda: 0) -> None:
    with _lock:
        _counts[name] += 1
        _time_ns[name] += t1 - t0
        first = name not in _warned
        if first:
            _warned.add(name)
    if _mode == "warn" and first:
        warnings.warn(f"spyre: {name} has no device kernel and ran on the host (host fallback)",
                      stacklevel=3)
    if trace.listening():
        n = moved()
        trace.publish(trace.FallbackEvent(op=name, device=dev_index, host_start_ns=t0, host_end_ns=t1,
                                          context=getattr(_local, "context", "eager"),
                                          bytes_moved=n, est_us=_link_us(n)))


_WIDER = {torch.int8: torch.float64, torch.int16: torch.float64, torch.int32: torch.float64,
          torch.uint8: torch.float64, torch.int64: torch.float64, torch.bool: torch.int64,
          torch.float16: torch.float32, torch.bfloat16: torch.float32,
          torch.float8_e4m3fn: torch.float32, torch.float8_e5m2: torch.float32}


_DTYPE_NAMES = {"Half": torch.float16, "BFloat16": torch.bfloat16, "Bool": torch.bool, "Byte": torch.uint8,
                "Char": torch.int8, "Short": torch.int16, "Int": torch.int32, "Long": torch.int64,
                "Float8_e4m3fn": torch.float8_e4m3fn, "Float8_e5m2": torch.float8_e5m2}


def _bridge_dtype(op: Any, info: "_OpInfo", name: str, args: list, kwargs: dict, err: Exception) -> Any:
    """The CPU has no kernel for this dtype but accelerators do (integer ``histc``, half-precision
    ``avg_pool3d``, ``trace`` of bools): compute in a dtype the CPU has and cast the results back
    to the dtypes the op gives (its meta kernel says which). Integer and bool results must come
    back exactly, or this raises naming the op and dtype; half floats are computed in fp32 and
    rounded once, as accelerators' half kernels compute (fp32 "opmath"). Written arguments
    (``out=``, in-place) are computed in wide temporaries, then written back."""
    import re
    m = re.search(r"not implemented for '(\w+)'", str(err))
    dt = _DTYPE_NAMES.get(m.group(1)) if m else None
    if dt is None or dt not in _WIDER:
        raise err
    wide = _WIDER[dt]
    written = {i: _arg(info, i, args, kwargs) for i in info.mutable}

    def up(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dtype == dt:
            if dt == torch.int64 and x.numel() and x.abs().max() > 2 ** 53:
                raise TypeError(f"spyre: {name} has no CPU kernel for {dt} and its values exceed 2**53, "
                                f"so it cannot run exactly in {wide} on the host")
            return x.to(wide)
        return x

    def cast(x: torch.Tensor, to: torch.dtype) -> torch.Tensor:
        back = x.to(to)
        if not (to.is_floating_point or torch.equal(back.to(x.dtype), x)):
            raise TypeError(f"spyre: {name} has no CPU kernel for {dt}; computed in {wide} its result is "
                            f"not exactly representable in {to}")
        return back

    def meta(x: Any) -> Any:
        return meta_like(x) if isinstance(x, torch.Tensor) else x
    try:             # the dtypes of the op's results for the real arguments
        want = op(*[_map(meta, a) for a in args], **{k: _map(meta, v) for k, v in kwargs.items()})
    except Exception:  # noqa: BLE001 (no meta kernel: results in the bridged dtype)
        want = None
    temps = {i: (torch.empty(0, dtype=wide if t.dtype == dt else t.dtype) if i in info.out_args else up(t))
             for i, t in written.items() if isinstance(t, torch.Tensor)}
    a2 = [temps[i] if i in temps else _map(up, a) for i, a in enumerate(args)]
    k2 = {k: temps[j] if (j := info.arg_names.index(k) if k in info.arg_names else -1) in temps else _map(up, v)
          for k, v in kwargs.items()}
    out = op(*a2, **k2)
    back = {}
    for i, t in temps.items():
        dst = written[i]
        if dst.shape != t.shape:
            dst.resize_(t.shape)
        dst.copy_(cast(t, dst.dtype))
        back[id(t)] = dst
    wants: list[torch.dtype] = []
    if want is not None:
        _map(lambda w: wants.append(w.dtype), want)
    order = iter(wants)

    def fix(x: torch.Tensor) -> torch.Tensor:      # called for each result tensor, in order
        d = next(order, None) if want is not None else (dt if x.dtype == wide else None)
        if id(x) in back:                          # a written argument: already cast back
            return back[id(x)]
        return cast(x, d) if d is not None and x.dtype != d else x
    return _map(fix, out)


def _host_fallback(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    info = _info(op)
    name = info.name
    if _mode == "strict":
        raise HostFallbackError(
            f"spyre: {name} has no device kernel and would run on the host; strict fallback mode "
            f"forbids that (torch.spyre.set_fallback_mode('allow') permits it)")
    t0 = time.perf_counter_ns()
    device = _check_devices(info, args, kwargs)
    target = device
    if target is None:  # a factory op: device=spyre in kwargs
        dev_kw = kwargs.get("device")
        if dev_kw is not None and torch.device(dev_kw).type == "spyre":
            target = torch.device(dev_kw)
            if target.index is None:
                target = torch.device("spyre", _C._current_device())
            kwargs = dict(kwargs, device=torch.device("cpu"))
    if target is None:
        target = torch.device("spyre", _C._current_device())
    dev_index = target.index if target.index is not None else _C._current_device()
    if _C._estimate_only():
        result = _shape_only(op, info, args, kwargs, target)
        _note(name, dev_index, t0, time.perf_counter_ns(), lambda: _link_bytes(info, args, kwargs, result))
        return result

    # device tensor -> host alias (and remember which host alias stands for which device tensor)
    host_of: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}   # id(host alias) -> (alias, device)

    def to_host(x: Any) -> Any:
        if _is_spyre(x):
            h = _C._host_view(x)
            host_of[id(h)] = (h, x)
            return h
        return x

    h_args = [_map(to_host, a) for a in args]
    h_kwargs = {k: _map(to_host, v) for k, v in kwargs.items()} if kwargs else {}
    gen_sync = _swap_generator(info, h_args, h_kwargs, dev_index) if info.generator_pos >= 0 else None
    if info.seeded:
        gen_sync = _seed_default_generator(dev_index)
    # A Python number where the schema wants a Tensor is a "wrapped number" that came through the
    # boxed call unwrapped (e.g. remainder(t, 4) -> remainder.Tensor_out): wrap it again.
    for i in info.tensor_args:
        if i < len(h_args) and isinstance(h_args[i], (bool, int, float)):
            h_args[i] = torch.tensor(h_args[i])

    prev_dev = _C._current_device()
    _C._set_device(dev_index)
    try:
        try:
            out = op(*h_args, **h_kwargs)
        except NotImplementedError as e:
            out = _bridge_dtype(op, info, name, h_args, h_kwargs, e)
        except RuntimeError as e:
            if "not resizable" not in str(e):
                raise
            out = _run_with_resizable_outputs(op, info, h_args, h_kwargs, host_of)
        if gen_sync is not None:
            gen_sync()
        if info.mutable:
            _sync_mutated_metadata(info, h_args, h_kwargs, host_of)
        result = _to_device(out, host_of, target, name)
    finally:
        _C._set_device(prev_dev)
        if info.seeded:
            gen_sync.restore()     # type: ignore[union-attr]
    _note(name, dev_index, t0, time.perf_counter_ns(), lambda: _link_bytes(info, args, kwargs, result))
    return result


def _link_bytes(info: "_OpInfo | None", args: Any, kwargs: dict, result: Any) -> int:
    """Bytes a host fallback moves over the host link: the device tensors it reads go up, the ones
    it writes come down (an ``out=`` argument only down, an in-place one both ways), and fresh
    device results come down; results that are inputs or views of them move nothing more."""
    outs: dict[int, int] = {}          # id(tensor) -> times its bytes cross (in-place 2, out= 1)
    if info is not None:
        for i in info.mutable:
            outs.update((id(t), 1 if i in info.out_args else 2) for t in _tensors(_arg(info, i, args, kwargs)))
    ins = [t for t in _tensors([args, kwargs]) if t.device.type == "spyre"]
    storages = {t.untyped_storage()._cdata for t in ins}
    n = 0
    for t in ins:
        size = t.numel() * t.element_size()
        n += size * outs.get(id(t), 1)
    n += sum(t.numel() * t.element_size() for t in _tensors(result)
             if t.device.type == "spyre" and t.untyped_storage()._cdata not in storages)
    return n


class EstimateOnlyError(RuntimeError):
    """An op needs values, and the tensors were produced in estimate-only mode."""


def _shape_only(op: Any, info: _OpInfo, args: tuple, kwargs: dict, target: torch.device) -> Any:
    """The host fallback in estimate-only mode: run the op's meta kernel for the result shapes and
    give the results device memory without values (the op is still counted and costed on the
    host link by the caller)."""
    dev_of: dict[int, torch.Tensor] = {}       # id(meta stand-in) -> device tensor

    def to_meta(x: Any) -> Any:
        if not isinstance(x, torch.Tensor) or x.device.type not in ("spyre", "cpu"):
            return x
        m = meta_like(x)
        if x.device.type == "spyre":
            dev_of[id(m)] = x
        return m

    for i in info.mutable:
        for t in _tensors(_arg(info, i, args, kwargs)):
            if t.device.type == "spyre" and _C._has_values(t):
                raise EstimateOnlyError(
                    f"spyre: {info.name} in estimate-only mode would write a {t.dtype} tensor of shape "
                    f"{tuple(t.shape)} that was allocated outside the mode and has values this mode does not "
                    f"compute; allocate it inside torch.spyre.estimate_only()")
    m_args = [_map(to_meta, a) for a in args]
    m_kwargs = {k: _map(to_meta, v) for k, v in kwargs.items()}
    if "device" in m_kwargs:
        m_kwargs["device"] = torch.device("meta")
    try:
        out = op(*m_args, **m_kwargs)
    except Exception as e:  # noqa: BLE001 - re-raised with the op named
        raise EstimateOnlyError(
            f"spyre: {info.name} has no device kernel, and in estimate-only mode its host fallback runs "
            f"on shapes alone, which this op cannot ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            f"its result depends on values (data-dependent), which this mode does not compute") from None
    # m_args/m_kwargs keep every stand-in alive, so an id in dev_of is still that stand-in's
    inputs = [m for m in _tensors([m_args, m_kwargs]) if id(m) in dev_of]

    def back(x: Any) -> Any:
        if not isinstance(x, torch.Tensor) or x.device.type != "meta":
            return x
        d = dev_of.get(id(x))
        if d is not None:                          # in-place / out=: the argument itself
            if d.size() != x.size() or d.stride() != x.stride():
                with torch.no_grad():
                    _take_layout(d, x)
            return d
        for m in inputs:                           # a view of an input: the same device storage
            if x.untyped_storage()._cdata == m.untyped_storage()._cdata:
                return dev_of[id(m)].as_strided(x.size(), x.stride(), x.storage_offset())
        if x.dtype not in hardware.card_dtypes():
            raise TypeError(f"spyre: {info.name} produced a {x.dtype} result, a dtype the card does not "
                            f"support (supported: {hardware.dtype_names()}); compute in float32 instead")
        return torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=target)

    return _map(back, out)


def _swap_generator(info: _OpInfo, h_args: list, h_kwargs: dict, dev_index: int):
    """Random ops draw from the card's generator (seeded by torch.spyre.manual_seed)."""
    pos = info.generator_pos
    gen = _arg(info, pos, h_args, h_kwargs)
    if gen is None:
        gen = _C._default_generator(dev_index)
    if gen.device.type != "spyre":
        return None
    cpu_gen = torch.Generator()
    cpu_gen.set_state(gen.get_state())
    if pos < len(h_args):
        h_args[pos] = cpu_gen
    else:
        h_kwargs["generator"] = cpu_gen
    return lambda: gen.set_state(cpu_gen.get_state())


def _seed_default_generator(dev_index: int):
    """A random op with no generator argument runs on the host's default generator: lend it the
    card's state for the call (and take the advanced state back), so it draws from the card."""
    gen = _C._default_generator(dev_index)
    host = torch.default_generator
    saved = host.get_state()
    host.set_state(gen.get_state())

    def sync() -> None:            # after the op ran: the card's generator advanced
        gen.set_state(host.get_state())

    def restore() -> None:         # always (the op may raise): the host's own state back
        host.set_state(saved)
    sync.restore = restore         # type: ignore[attr-defined]
    return sync


def _mutable_args(info: _OpInfo, h_args: list, h_kwargs: dict) -> list[tuple[int | str, torch.Tensor]]:
    out = []
    for i in info.mutable:
        key = i if i < len(h_args) else info.arg_names[i]
        for t in _tensors(_arg(info, i, h_args, h_kwargs)):
            out.append((key, t))
    return out


def _sync_mutated_metadata(info, h_args, h_kwargs, host_of) -> None:
    """An op that resized or restrided an output inside its storage: mirror it on the device."""
    for _, h in _mutable_args(info, h_args, h_kwargs):
        if id(h) not in host_of:
            continue
        d = host_of[id(h)][1]
        if h.size() != d.size() or h.stride() != d.stride() or h.storage_offset() != d.storage_offset():
            with torch.no_grad():
                d.set_(d.untyped_storage(), h.storage_offset(), h.size(), h.stride())


def _run_with_resizable_outputs(op, info, h_args, h_kwargs, host_of):
    """Retry with host copies for outputs that must grow, then write them back to the card."""
    swapped = []
    for key, h in _mutable_args(info, h_args, h_kwargs):
        if id(h) not in host_of:
            continue
        d = host_of[id(h)][1]
        # The failed attempt may have left h with sizes its storage cannot hold: never read it.
        # Ops that resize an output overwrite it, so an empty host tensor stands in.
        fresh = torch.empty(0, dtype=h.dtype)
        if isinstance(key, int) and h_args[key] is h:
            h_args[key] = fresh
        elif isinstance(key, str) and h_kwargs.get(key) is h:
            h_kwargs[key] = fresh
        else:
            continue
        swapped.append((d, fresh))
        host_of[id(fresh)] = (fresh, d)
    out = op(*h_args, **h_kwargs)
    with torch.no_grad():
        for d, fresh in swapped:
            _take_layout(d, fresh)
            _C._host_view(d).copy_(fresh)
    return out


def _take_layout(d: torch.Tensor, h: torch.Tensor) -> None:
    """Give the device tensor ``d`` the sizes and strides of the host result ``h``.

    ``h`` may be a strided view of a larger buffer (linalg.lstsq's solution is the top rows of a
    column-major [m, k] buffer: sizes [n, k], strides [1, m]), so sizes alone do not give the
    storage its strides need: grow ``d``'s storage to the span of ``h``'s layout first.
    """
    if d.size() == h.size() and d.stride() == h.stride():
        return
    span = 0 if h.numel() == 0 else 1 + sum((s - 1) * st for s, st in zip(h.size(), h.stride()))
    d.resize_(span)                      # 1-D over the span (grows the storage if needed)
    d.as_strided_(h.size(), h.stride())


def _storage_span(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def _to_device(out: Any, host_of: dict[int, tuple[torch.Tensor, torch.Tensor]], target: torch.device,
               name: str) -> Any:
    spans = None

    def back(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        nonlocal spans
        hit = host_of.get(id(x))
        if hit is not None and hit[0] is x:
            return hit[1]                   # in-place / out= op returned its argument
        if x.device.type == "cpu" and x.untyped_storage().nbytes() > 0:
            p = x.untyped_storage().data_ptr()
            if spans is None:
                spans = [(_storage_span(h), d) for h, d in host_of.values()]
            for (lo, hi), dev in spans:
                if lo <= p < hi:            # a view of an input: same bytes on the card
                    view = torch.empty(0, dtype=x.dtype, device=dev.device)
                    byte_off = p - lo
                    view.set_(dev.untyped_storage(), byte_off // x.element_size() + x.storage_offset(),
                              x.size(), x.stride())
                    return view
        if x.dtype not in hardware.card_dtypes():
            raise TypeError(f"spyre: {name} produced a {x.dtype} result, a dtype the card does not "
                            f"support (supported: {hardware.dtype_names()}); compute in float32 instead")
        return x.to(target)

    return _map(back, out)



# -- ops whose composite kernel would throw before the fallback is reached ----------------------
# For a backend without its own convolution, aten::_convolution calls convolution_overrideable,
# whose default (CompositeExplicitAutograd) kernel raises. Registering a PrivateUse1 kernel routes
# it to the host fallback like any other op, under the name of the op that actually runs.
_overrideable_lib = None

# Device kernels from a layer above (vspyre.eager) for the ops this module registers Python kernels
# for itself (a second registration of the same op would be refused): tried first; a kernel
# returns NotImplemented when it has no tile form for a call, which then runs on the host here.
_device_kernels: dict[str, Callable[..., Any]] = {}
PYTHON_KERNEL_OPS: set[str] = set()


def set_device_kernel(name: str, fn: Callable[..., Any] | None) -> None:
    """Install (or with ``None`` remove) the device kernel tried first for ``name``, one of
    :data:`PYTHON_KERNEL_OPS` (e.g. ``"aten::convolution_overrideable"``)."""
    if name not in PYTHON_KERNEL_OPS:
        raise KeyError(f"spyre: {name} has no Python kernel in the device layer; register its kernel with "
                       "torch.library instead")
    if fn is None:
        _device_kernels.pop(name, None)
    else:
        _device_kernels[name] = fn


def host_fallback(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    """Run ``op`` as a counted host fallback (what every op without a device kernel does); for
    device kernels that have no tile form for a particular call."""
    return _host_fallback(op, *args, **kwargs)


def register_overrideable_kernels() -> None:
    global _overrideable_lib
    if _overrideable_lib is not None:
        return
    lib = _KernelLib(torch.library.Library("aten", "IMPL"))
    aten = torch.ops.aten

    def conv(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
        out = _host_fallback(aten.convolution.default, input, weight, bias, stride, padding, dilation,
                             transposed, output_padding, groups)
        # The host kernel may pick its own layout (oneDNN likes channels-last); the meta kernel
        # of an "overrideable" convolution backend, which compiled graphs plan with, gives a
        # contiguous result.
        if not out.is_contiguous():
            fixed = torch.empty(out.shape, dtype=out.dtype, device=out.device)
            fixed.copy_(out)
            out = fixed
        return out

    def conv_backward(grad_output, input, weight, stride, padding, dilation, transposed, output_padding,
                      groups, output_mask):
        bias_sizes = [weight.size(1) * groups if transposed else weight.size(0)]
        return _host_fallback(aten.convolution_backward.default, grad_output, input, weight, bias_sizes, stride,
                              padding, dilation, transposed, output_padding, groups, output_mask)

    lib.impl("convolution_overrideable", conv, "PrivateUse1")
    lib.impl("convolution_backward_overrideable", conv_backward, "PrivateUse1")

    # Layer and group norm have a CompositeExplicitAutograd kernel (math_native_layer_norm /
    # math_group_norm) that other backends get; on the card it would split into several host
    # fallbacks with float16 intermediates, 1.5e-3..2e-3 off the CPU kernel, which keeps float32
    # inside and rounds once. Each runs as one host fallback instead.
    def whole(op):
        return lambda *args: _host_fallback(op, *args)

    lib.impl("native_layer_norm", whole(aten.native_layer_norm.default), "PrivateUse1")
    lib.impl("native_group_norm", whole(aten.native_group_norm.default), "PrivateUse1")

    # quantile/nanquantile: ATen's composite sorts in float64 on the input's device since torch
    # 2.14, a dtype the card cannot hold. Each runs whole on the host (one counted fallback) and
    # returns the CPU's result in the input's dtype.
    def whole_kw(op):
        def run(*args, **kwargs):
            t = [a for a in args if isinstance(a, torch.Tensor)]
            if any(type(a) not in (torch.Tensor, torch.nn.Parameter) for a in t):
                # traced (fake tensors): one opaque node shaped like ATen's result, which the
                # compilers keep as a host-fallback node (run eagerly, it lands here again)
                out = op(*[a.to("meta") if isinstance(a, torch.Tensor) else a for a in args], **kwargs)
                return torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=t[0].device)
            return _host_fallback(op, *args, **kwargs)
        return run

    for name in ("quantile", "nanquantile") if torch_release(torch.__version__) >= (2, 14, 0) else ():
        for ov in ("default", "scalar"):
            lib.impl(f"{name}.{ov}" if ov != "default" else name, whole_kw(getattr(getattr(aten, name), ov)),
                     "PrivateUse1")

    # Attention: scaled_dot_product_attention on the card picks the "overrideable" backend (the C++
    # part registers the choice), so that compiled graphs keep it as one node the compilers lower
    # to the card's flash program. Eagerly it runs as ONE host fallback (the CPU's flash kernel on
    # host aliases), named after the op, not as a dozen.
    lib.impl("_scaled_dot_product_fused_attention_overrideable", _sdpa_eager, "PrivateUse1")
    lib.impl("_scaled_dot_product_fused_attention_overrideable_backward", _sdpa_backward_eager, "PrivateUse1")
    _overrideable_lib = lib.lib


class _KernelLib:
    """Registers this module's Python kernels so that a device kernel set with
    :func:`set_device_kernel` is tried before each."""

    def __init__(self, lib: torch.library.Library) -> None:
        self.lib = lib

    def impl(self, name: str, fn: Callable[..., Any], key: str) -> None:
        full = f"aten::{name}"                  # as trace.op_name spells the overload
        PYTHON_KERNEL_OPS.add(full)

        def kernel(*args: Any, **kwargs: Any) -> Any:
            dk = _device_kernels.get(full)
            if dk is not None:
                out = dk(*args, **kwargs)
                if out is not NotImplemented:
                    return out
            return fn(*args, **kwargs)
        self.lib.impl(name, kernel, key)


_SDPA = "aten::_scaled_dot_product_fused_attention_overrideable"


def _host_call(name: str, device: torch.device, fn, *args: Any) -> Any:
    """Run the Python ``fn`` on host aliases of the device tensors in ``args`` as one counted host
    fallback named ``name``; its tensor results come back to ``device``."""
    if _mode == "strict":
        raise HostFallbackError(f"spyre: {name} has no device kernel and would run on the host; strict fallback "
                                "mode forbids that (torch.spyre.set_fallback_mode('allow') permits it)")
    t0 = time.perf_counter_ns()
    if _C._estimate_only():     # shapes only: fn on meta stand-ins, results without values
        try:
            out = fn(*[meta_like(a) if _is_spyre(a) else a for a in args])
        except Exception as e:  # noqa: BLE001 - re-raised with the op named
            raise EstimateOnlyError(f"spyre: {name} cannot run on shapes alone in estimate-only mode "
                                    f"({type(e).__name__}: {e})") from None
        res = _map(lambda x: torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=device)
                   if isinstance(x, torch.Tensor) else x, out)
    else:
        out = fn(*[_C._host_view(a) if _is_spyre(a) else a for a in args])
        res = _map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, out)
    _note(name, device.index if device.index is not None else _C._current_device(), t0, time.perf_counter_ns(),
          lambda: _link_bytes(None, args, {}, res))
    return res


def _sdpa_host_inputs(q, k, v, bias):
    if k.size(1) != q.size(1):                    # grouped-query attention: repeat the kv heads
        g = q.size(1) // k.size(1)
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    if bias is not None and bias.dtype == torch.bool:
        bias = torch.zeros(bias.shape, dtype=q.dtype).masked_fill(~bias, float("-inf"))
    return k, v, bias


def _sdpa_eager(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False,
                *, scale=None):
    def host(q, k, v, bias):
        k, v, bias = _sdpa_host_inputs(q, k, v, bias)
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, dropout_p, is_causal, attn_mask=bias, scale=scale)

    out, lse = _host_call(_SDPA, query.device, host, query, key, value, attn_bias)
    empty = torch.empty(0, dtype=query.dtype, device=query.device)
    seed = torch.zeros((), dtype=torch.int64, device=query.device)
    return out, lse, empty, empty, query.size(2), key.size(2), seed, seed.clone(), empty


def _sdpa_backward_eager(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q,
                         cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    def host(go, q, k, v, bias):
        # the math backward (autograd does not record below this kernel): S = scale q k^T + bias,
        # P = softmax(S), O = P v; dV = P^T dO, dS = P (dO v^T - rowsum(dO * O)), dQ = scale dS k,
        # dK = scale dS^T q; grouped kv heads sum the grads of their query heads.
        dt = q.dtype
        hq, hk = q.size(1), k.size(1)
        kk, vv, b = _sdpa_host_inputs(q, k, v, bias)
        qf, kf, vf, gof = (x.float() for x in (q, kk, vv, go))
        sc = scale if scale is not None else q.size(-1) ** -0.5
        sm = (qf @ kf.transpose(-2, -1)) * sc
        if b is not None:
            sm = sm + b.float()
        if is_causal:
            L, S = sm.shape[-2:]
            sm = sm.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
        p = torch.softmax(sm, -1)
        o = p @ vf
        gv = p.transpose(-2, -1) @ gof
        ds = p * (gof @ vf.transpose(-2, -1) - (gof * o).sum(-1, keepdim=True))
        gq = (ds @ kf) * sc
        gk = (ds.transpose(-2, -1) @ qf) * sc
        if hk != hq:
            gk = gk.unflatten(1, (hk, hq // hk)).sum(2)
            gv = gv.unflatten(1, (hk, hq // hk)).sum(2)
        return gq.to(dt), gk.to(dt), gv.to(dt)

    gq, gk, gv = _host_call(_SDPA + "_backward", query.device, host, grad_out, query, key, value, attn_bias)
    gb = torch.empty(0, dtype=query.dtype, device=query.device) if attn_bias is None else torch.zeros_like(attn_bias)
    return gq, gk, gv, gb
