"""The virtual card as a PyTorch device: PrivateUse1 renamed ``spyre``.

Importing this package (which ``import torch`` does through the ``torch.backends`` entry point)
loads the C++ part, renames PrivateUse1 to ``spyre``, registers the ``torch.spyre`` module,
generates the ``Tensor.spyre()`` / ``Module.spyre()`` methods, and installs the host fallback.
"""

from __future__ import annotations

import os

import torch

from .. import hardware
from ._ext import _C
from . import fallback

_registered = False


def _apply_config(cfg: hardware.HardwareConfig) -> None:
    _C._set_stick_bytes(cfg.stick_bytes)       # allocations round to whole sticks of the active config
    for i in range(_C._num_cards()):
        _C._set_capacity(i, cfg.usable_memory_bytes)


def register() -> None:
    """Make ``spyre`` a PyTorch device (idempotent)."""
    global _registered
    if _registered:
        return
    cfg = hardware.get_config()
    _C._set_card_dtypes(list(hardware.card_dtypes()))
    _C._set_num_cards(cfg.num_cards)
    _apply_config(cfg)
    if os.environ.get("VSPYRE_ESTIMATE_ONLY", "0") not in ("", "0"):
        _C._set_estimate_only(True)           # kernels costed, not run; memory without values
    hardware.on_change(_apply_config)
    hardware._mark_device_started()

    torch.utils.rename_privateuse1_backend("spyre")
    from . import module as spyre_module
    from ..compat import register_device_module
    register_device_module("spyre", spyre_module)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True)
    global _fallback_lib
    _fallback_lib = torch.library.Library("_", "IMPL")
    _fallback_lib.fallback(fallback._host_fallback, "PrivateUse1")
    fallback.register_overrideable_kernels()
    from . import out_dtype
    out_dtype.register()
    _patch_tensor_printing()
    _registered = True


def _patch_tensor_printing() -> None:
    """Print spyre tensors from a host copy.

    torch's formatter converts values to float64 on the tensor's own device, a dtype the card
    does not have; formatting the host copy gives the same text (the device suffix is added by
    torch as usual) and runs no device ops. A tensor without values (estimate-only mode) prints
    as ``tensor([no values: estimate-only, size (3, 4)], device='spyre:0', dtype=...)``.
    """
    from ..compat import tensor_str as ts

    orig = ts._tensor_str

    def _tensor_str(self: torch.Tensor, indent: int) -> str:
        if self.device.type == "spyre":
            if self.numel() and not _C._has_values(self):
                # estimate-only mode: nothing to show, and printing must not fail (libraries look
                # at a tensor's repr: torchao's int8 matmul tests it for "FakeTensor")
                return f"[no values: estimate-only, size {tuple(self.shape)}]"
            self = self.detach().cpu()
        return orig(self, indent)

    ts._tensor_str = _tensor_str


def host_view(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor aliasing a spyre tensor's device memory (same sizes, strides, offset).

    Device kernels read and write device memory through this: it copies nothing.
    """
    if t.device.type != "spyre":
        raise TypeError(f"host_view expects a spyre tensor, got a tensor on {t.device}")
    return _C._host_view(t)


_fallback_lib = None
