"""Dynamo's view of the card: ``torch._dynamo.device_interface.DeviceInterface`` for ``spyre``."""

from __future__ import annotations

from typing import Any

import torch

from .. import hardware
from ..compat import DeviceInterface


class SpyreInterface(DeviceInterface):
    device = torch.spyre.device          # type: ignore[assignment]
    Event = torch.spyre.Event            # type: ignore[assignment]
    Stream = torch.spyre.Stream          # type: ignore[assignment]

    class Worker:
        """What Inductor asks of the device from its compile workers (properties, current card)."""

        @staticmethod
        def set_device(device: int) -> None:
            torch.spyre.set_device(device)

        @staticmethod
        def current_device() -> int:
            return torch.spyre.current_device()

        @staticmethod
        def get_device_properties(device: torch.types.Device = None) -> Any:
            return torch.spyre.get_device_properties(device)

    current_device = staticmethod(torch.spyre.current_device)
    set_device = staticmethod(torch.spyre.set_device)
    device_count = staticmethod(torch.spyre.device_count)
    is_available = staticmethod(torch.spyre.is_available)
    stream = staticmethod(torch.spyre.stream)
    current_stream = staticmethod(torch.spyre.current_stream)
    synchronize = staticmethod(torch.spyre.synchronize)
    memory_allocated = staticmethod(torch.spyre.memory_allocated)

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        return SpyreInterface.exchange_device(device)

    @staticmethod
    def exchange_device(device: int) -> int:
        prev = torch.spyre.current_device()
        if device >= 0:
            torch.spyre.set_device(device)
        return prev

    @staticmethod
    def set_stream(stream: torch.Stream) -> None:
        """Streams are synchronous on the virtual card: only the card matters."""
        torch.spyre.set_device(stream.device_index)

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        torch.spyre.set_device(device_index)

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        return 0

    @classmethod
    def get_device_properties(cls, device: torch.types.Device = None) -> Any:
        return torch.spyre.get_device_properties(device)

    @staticmethod
    def get_compute_capability(device: torch.types.Device = None) -> Any:
        return "spyre"

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return True

    @classmethod
    def is_dtype_supported(cls, dtype: torch.dtype, including_emulation: bool = False) -> bool:
        return dtype in hardware.card_dtypes()

    @staticmethod
    def is_triton_capable(device: torch.types.Device = None) -> bool:
        return False
