"""The wrapper Inductor writes around the kernels: launches tile programs on the runtime.

Besides kernel launches, the wrapper is where a compiled graph's *host fallbacks* become visible:
every extern/fallback kernel Inductor emits for a spyre graph runs on the host through the
device's counted fallback. They are written into the compiled module, which records them when it
loads, also from the FX graph cache (``compiled_fallbacks()``, logged),
forbidden when the fallback mode is ``strict`` (a compile error naming the op), and at run time
the whole graph runs inside ``fallback.context("compiled")`` so the profiler labels them.
"""

from __future__ import annotations

import logging
from typing import Any


from ..compat import IndentedBuffer, PythonWrapperCodegen, SubgraphPythonWrapperCodegen, V
from ..device import fallback as device_fallback
from ..trace import op_name
from .launcher import compiled_fallbacks, reset_compiled_fallbacks  # noqa: F401 (public here)

log = logging.getLogger("vspyre.inductor")


def _op_name(node: Any) -> str:
    op = getattr(node, "op_overload", None)
    if op is not None and hasattr(op, "name"):
        return op_name(op)
    name = getattr(node, "python_kernel_name", None) or type(node).__name__
    return str(name).replace("extern_kernels.", "aten::")


def _on_spyre(node: Any) -> bool:
    try:
        dev = node.get_device()
    except Exception:  # noqa: BLE001
        dev = None
    if dev is None:
        dev = V.graph.get_current_device_or_throw() if V.graph else None
    return dev is not None and dev.type == "spyre"


class _LaunchTilePrograms:
    def _generate_kernel_call_helper(self, kernel_name: str, call_args: Any, *, device: Any = None,
                                     triton: bool = True, **kwargs: Any) -> None:
        if device is not None and device.type == "spyre":
            self.writeline(f"{kernel_name}.run({', '.join(str(a) for a in call_args)})")
            return
        super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton,  # type: ignore[misc]
                                             **kwargs)

    def _note_host_fallback(self, node: Any) -> None:
        if not _on_spyre(node):
            return
        name = _op_name(node)
        if device_fallback.get_mode() == "strict":
            raise device_fallback.HostFallbackError(
                f"spyre: {name} has no device kernel in the compiled graph and would run on the host; "
                f"strict fallback mode forbids that")
        self.__dict__.setdefault("_spyre_fallbacks", []).append(name)
        log.info("compiled spyre graph runs %s as a host fallback", name)
        self.writeline(f"# host fallback on the card: {name}")  # type: ignore[attr-defined]

    def generate_fallback_kernel(self, node: Any) -> None:
        self._note_host_fallback(node)
        super().generate_fallback_kernel(node)  # type: ignore[misc]

    def generate_extern_kernel_alloc(self, node: Any) -> None:
        self._note_host_fallback(node)
        super().generate_extern_kernel_alloc(node)  # type: ignore[misc]

    def generate_extern_kernel_out(self, node: Any) -> None:
        self._note_host_fallback(node)
        super().generate_extern_kernel_out(node)  # type: ignore[misc]


class SpyreSubgraphWrapperCodegen(_LaunchTilePrograms, SubgraphPythonWrapperCodegen):
    pass


class SpyreWrapperCodegen(_LaunchTilePrograms, PythonWrapperCodegen):
    @staticmethod
    def create(is_subgraph: bool, subgraph_name: str | None, parent_wrapper: Any,
               partition_signatures: Any = None) -> PythonWrapperCodegen:
        if is_subgraph:
            return SpyreSubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return SpyreWrapperCodegen()

    def generate_after_suffix(self, result: IndentedBuffer) -> None:
        super().generate_after_suffix(result)
        result.writeline("from vspyre.inductor.launcher import compiled_region, note_compiled_fallbacks")
        # Recorded when the module loads, so a graph from the FX cache reports its fallbacks too.
        result.writeline(f"note_compiled_fallbacks({self.__dict__.get('_spyre_fallbacks', [])!r})")
        result.writeline("call = compiled_region(call)")
