"""The wrapper Inductor writes around the kernels: launches tile programs on the runtime."""

from __future__ import annotations

from typing import Any

from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen


class _LaunchTilePrograms:
    def _generate_kernel_call_helper(self, kernel_name: str, call_args: Any, *, device: Any = None,
                                     triton: bool = True, **kwargs: Any) -> None:
        if device is not None and device.type == "spyre":
            self.writeline(f"{kernel_name}.run({', '.join(str(a) for a in call_args)})")
            return
        super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton,  # type: ignore[misc]
                                             **kwargs)


class SpyreSubgraphWrapperCodegen(_LaunchTilePrograms, SubgraphPythonWrapperCodegen):
    pass


class SpyreWrapperCodegen(_LaunchTilePrograms, PythonWrapperCodegen):
    @staticmethod
    def create(is_subgraph: bool, subgraph_name: str | None, parent_wrapper: Any,
               partition_signatures: Any = None) -> PythonWrapperCodegen:
        if is_subgraph:
            return SpyreSubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return SpyreWrapperCodegen()
