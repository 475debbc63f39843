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

    @staticmethod
    def _dot(nodes: Any) -> Any:
        for node in nodes:
            if isinstance(node, SchedulerNode) and isinstance(node.node, inductor_ir.ComputedBuffer) \
                    and node.node.get_reduction_type() == "dot":
                return node
        return None

    @classmethod
    def select_tiling(cls, node_schedule: Any, numel: sympy.Expr, reduction_numel: sympy.Expr = sympy.S.One,
                      coalesce_analysis: Any = None) -> dict[str, sympy.Expr]:
        # A matmul (reduction "dot") keeps its (batch, M, N) x K ranges as the kernel's dims, so
        # the systolic Matmul sees its operands' M, N and K directly.
        dot = cls._dot(node_schedule)
        if dot is not None:
            return cls.create_tiling(*dot.get_ranges())
        return cls.create_tiling([numel], [reduction_numel])

    def can_fuse(self, node1: Any, node2: Any) -> bool:
        """Inductor's rule, and: a group holding a matmul takes only nodes whose ranges split into
        the matmul's (batch, M, N) x K dims (select_tiling). Inductor checks fused nodes against
        the default tiling; with symbolic sizes such as a serving step's ``decodes + chunk``
        tokens, a prologue of ``64*(s0 + s1)`` elements cannot be proven to split into ``s0 + s1``
        rows (sympy does not factor the sum), and the fused kernel would fail at codegen
        (CantSplit): such a node gets its own kernel instead."""
        if not super().can_fuse(node1, node2):
            return False
        nodes = [*node1.get_nodes(), *node2.get_nodes()]
        dot = self._dot(nodes)
        if dot is None:
            return True
        ranges, rranges = dot.get_ranges()
        _, (_, rnumel) = dot.group
        return self.tiling_is_compatible(nodes, None, rnumel, self.create_tiling(ranges, rranges))

    can_fuse_vertical = can_fuse
    can_fuse_horizontal = can_fuse

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
