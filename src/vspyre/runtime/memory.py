"""Device memory as the runtime sees it: a CPU tensor aliasing the tensor's memory."""

from __future__ import annotations

import functools

import torch

__all__ = ["host", "estimate_only", "has_values"]


def host(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself for CPU tensors (tests treat them as device memory); for ``spyre`` tensors, a
    CPU tensor aliasing the same memory with the same sizes/strides/offset (device layer)."""
    if t.device.type == "cpu":
        return t
    if t.device.type in ("spyre", "privateuseone"):
        from vspyre.device import host_view  # lazy: the device layer is optional for the runtime
        return host_view(t)
    raise TypeError(f"vspyre runtime: tensor on device {t.device} is neither cpu nor spyre")


@functools.cache
def _device_ext():
    try:
        from vspyre.device._ext import _C   # lazy: the runtime runs without the device too (tests)
    except ImportError:
        return None
    return _C


def estimate_only() -> bool:
    """Whether the card runs estimate-only (kernels planned and costed, not executed; device
    memory accounted but without values). The device layer holds the switch."""
    c = _device_ext()
    return bool(c is not None and c._estimate_only())


def has_values(t: torch.Tensor) -> bool:
    """False for device memory allocated in estimate-only mode (it was never written)."""
    c = _device_ext()
    return t.device.type == "cpu" or c is None or bool(c._has_values(t))
