"""Device memory as the runtime sees it: a CPU tensor aliasing the tensor's memory."""

from __future__ import annotations

import torch

__all__ = ["host"]


def host(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself for CPU tensors (tests treat them as device memory); for ``spyre`` tensors, a
    CPU tensor aliasing the same memory with the same sizes/strides/offset (device layer)."""
    if t.device.type == "cpu":
        return t
    if t.device.type in ("spyre", "privateuseone"):
        from vspyre.device import host_view  # lazy: the device layer is optional for the runtime
        return host_view(t)
    raise TypeError(f"vspyre runtime: tensor on device {t.device} is neither cpu nor spyre")
