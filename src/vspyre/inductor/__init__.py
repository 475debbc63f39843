"""The new path: ``torch.compile`` on the ``spyre`` device through an Inductor extension.

Inductor keeps graph capture, decompositions, lowering, scheduling and fusion. What is
specific to the card lives here:

* ``device_interface.py`` - Dynamo's view of the device;
* ``kernel.py`` - fused kernels as tile programs (on Inductor's SIMD kernel base);
* ``scheduling.py`` - the SIMD scheduling with the card's kernel and matmul tiling;
* ``wrapper.py`` - the wrapper that launches tile programs;
* ``lowering.py`` - matmul family on the systolic array (Inductor's native-matmul lowering);
* ``launcher.py`` - what compiled code calls at run time.

Registration is lazy: importing Inductor costs seconds, so ``import torch`` only installs import
hooks; the extension registers when Dynamo or Inductor are first imported.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.util
import pathlib
import sys
import threading
from typing import Any, Callable

_lock = threading.RLock()
_done: set[str] = set()


def register_device_interface() -> None:
    with _lock:
        if "interface" in _done:
            return
        _done.add("interface")
        from ..compat import register_interface_for_device

        from .device_interface import SpyreInterface

        register_interface_for_device("spyre", SpyreInterface)
        import torch

        for i in range(torch.spyre.device_count()):
            register_interface_for_device(f"spyre:{i}", SpyreInterface)


def skip_device_code() -> None:
    """The device's own Python (torch.spyre, the host fallback kernel the dispatcher calls) is
    runtime code, as torch.cuda is: Dynamo runs it and never traces it. Traced, a graph break
    inside it (generator state, an op's schema) made Dynamo compile the device's internals, e.g.
    wrap the RNG state as a fake tensor under torch.testing's no_dispatch()."""
    with _lock:
        if "skip" in _done:
            return
        _done.add("skip")
        from ..compat import trace_rules

        trace_rules.add("vspyre.device")
        from ..device.module import install_compile_callbacks

        install_compile_callbacks()


def backend_version() -> str:
    """A hash of this backend's code (extension, IR, runtime): part of the FX graph cache key."""
    root = pathlib.Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for sub in ("inductor", "ir", "runtime"):
        for f in sorted((root / sub).glob("*.py")):
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def register() -> None:
    """Register the card with Inductor (idempotent)."""
    with _lock:
        if "inductor" in _done:
            return
        _done.add("inductor")
        register_device_interface()
        from ..compat import register_backend_for_device, register_device_op_overrides

        from . import lowering
        from .device_op_overrides import SpyreDeviceOpOverrides
        from .passes import SpyreGraphPass
        from .scheduling import SpyreScheduling
        from .wrapper import SpyreWrapperCodegen

        register_device_op_overrides("spyre", SpyreDeviceOpOverrides())
        register_backend_for_device("spyre", SpyreScheduling, SpyreWrapperCodegen,
                                    device_custom_pass=SpyreGraphPass())
        lowering.register()
        from ..compat import inductor_decompositions
        from ..device import out_dtype
        inductor_decompositions.update(out_dtype.decompositions())    # torchao's int8 mm: the card's _int_mm


class _AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Run a callback right after a module finishes importing (lazy registration)."""

    def __init__(self, hooks: dict[str, Callable[[], None]]):
        self.hooks = hooks

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.hooks:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        real = spec.loader
        hook = self.hooks.pop(name)

        class Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return real.create_module(spec)

            def exec_module(self, module):
                real.exec_module(module)
                hook()

        spec.loader = Loader()
        return spec


def install_hooks() -> None:
    """Register with Dynamo/Inductor now if they are loaded, else when they first load."""
    if "torch._inductor.compile_fx" in sys.modules:
        skip_device_code()
        register()
        return
    hooks: dict[str, Callable[[], None]] = {"torch._inductor.compile_fx": register}
    if "torch._dynamo.trace_rules" in sys.modules:
        skip_device_code()
    else:
        hooks["torch._dynamo.trace_rules"] = skip_device_code
    if "torch._dynamo.device_interface" in sys.modules:
        register_device_interface()
    else:
        hooks["torch._dynamo.device_interface"] = register_device_interface
    sys.meta_path.insert(0, _AfterImport(hooks))
