"""Device op overrides Inductor requires for every device (used by its wrapper code)."""

from __future__ import annotations

from ..compat import DeviceOpOverrides


class SpyreDeviceOpOverrides(DeviceOpOverrides):
    def import_get_raw_stream_as(self, name: str) -> str:
        return f"def {name}(idx): return 0"

    def set_device(self, device_idx: int) -> str:
        return f"torch.spyre.set_device({device_idx})"

    def synchronize(self) -> str:
        return "torch.spyre.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.spyre.device({device_idx})"
