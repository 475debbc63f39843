"""Inductor's scheduling for the card: SIMD scheduling with spyre kernels and matmul tiling."""

from __future__ import annotations

from typing import Any

import sympy

from ..compat import (BackendFeature, IndentedBuffer, OrderedSet, SchedulerNode, SIMDScheduling, V,
                      get_fused_kernel_name, get_kernel_metadata, inductor_ir)
from .kernel import SpyreKernel


class SpyreScheduling(SIMDScheduling):
    kernel_type = SpyreKernel  # type: ignore[assignment]

    @classmethod
    def get_backend_features(cls, device: Any) -> OrderedSet[BackendFeature]:
        # Reductions stay in one kernel (the card splits them over cores itself, finishing over
        # the ring); welford and softmax use Inductor's two-pass fallbacks.
        return OrderedSet([BackendFeature.REDUCE_TO_SINGLE_ELEMENT, BackendFeature.TUPLE_REDUCTION])

    @classmethod
    def select_tiling(cls, node_schedule: Any, numel: sympy.Expr, reduction_numel: sympy.Expr = sympy.S.One,
                      coalesce_analysis: Any = None) -> dict[str, sympy.Expr]:
        # A matmul (reduction "dot") keeps its (batch, M, N) x K ranges as the kernel's dims, so
        # the systolic Matmul sees its operands' M, N and K directly.
        for node in node_schedule:
            if isinstance(node, SchedulerNode) and isinstance(node.node, inductor_ir.ComputedBuffer) \
                    and node.node.get_reduction_type() == "dot":
                ranges, rranges = node.get_ranges()
                return cls.create_tiling(ranges, rranges)
        return cls.create_tiling([numel], [reduction_numel])

    @classmethod
    def get_tiling_and_scores(cls, node_schedule: Any, numel: sympy.Expr, reduction_numel: sympy.Expr = sympy.S.One,
                              coalesce_analysis: Any = None) -> tuple[dict[str, sympy.Expr], Any]:
        # Inductor's codegen_node asks this (not select_tiling) for the kernel's tiling.
        return cls.select_tiling(node_schedule, numel, reduction_numel, coalesce_analysis), None

    def define_kernel(self, src_code: str, node_schedule: Any, kernel: SpyreKernel) -> str:
        wrapper = V.graph.wrapper_code
        if src_code in wrapper.src_to_kernel:
            return wrapper.src_to_kernel[src_code]
        # named after the ATen ops it fuses, as Inductor names its Triton kernels (profiles and
        # reports show e.g. spyre_red_fused_add_mean_mul_pow_rsqrt_3)
        fused = get_fused_kernel_name(node_schedule, "original_aten")[:60].strip("_") or "kernel"
        kernel_name = f"spyre_{'red' if kernel.inside_reduction else 'poi'}_{fused}_{wrapper.next_kernel_suffix()}"
        wrapper.src_to_kernel[src_code] = kernel_name
        wrapper.add_import_once("from vspyre.inductor.launcher import TileKernel")
        body = IndentedBuffer()
        body.writeline(f"TileKernel({kernel_name!r}, '''")
        body.splice(src_code, strip=True)
        body.writeline(f"''', scalars={kernel.scalar_args()!r})")
        origins, detailed = get_kernel_metadata(node_schedule, wrapper)
        wrapper.define_kernel(kernel_name, body.getvalue(), f"{origins}\n{detailed}")
        return kernel_name
