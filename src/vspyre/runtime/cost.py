"""The runtime's front door to the latency model (``vspyre.ir.latency``), cached per bound program.

    est = vspyre.runtime.cost.estimate(program, x, y)      # tensors as for launch
    est.us, est.bottleneck, est.roofline_us, est.segments
"""

from __future__ import annotations

from typing import Mapping

import torch

from ..ir.latency import MAX_TRACE_STEPS, Estimate, StepCost, estimate_schedule
from ..ir.planning import resolve
from ..ir.program import Program

__all__ = ["estimate", "estimate_sizes", "Estimate", "estimate_schedule", "StepCost", "MAX_TRACE_STEPS"]


def estimate(program: Program, *tensors: torch.Tensor, sizes: Mapping[str, int] | None = None) -> Estimate:
    """Estimate for a launch with these tensors (cached like the launch itself)."""
    from . import _bound_for
    return _bound_for(program, tensors, dict(sizes or {})).estimate()


def estimate_sizes(program: Program, sizes: Mapping[str, int], segments: bool = False) -> Estimate:
    """Estimate from bound size symbols alone (no tensors); plans what the program leaves open."""
    return estimate_schedule(resolve(program, dict(sizes)), segments=segments)
