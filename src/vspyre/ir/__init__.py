"""vspyre's kernel form: tile programs (see docs/tile-programs.md).

Imports go one way: hardware/numerics/trace <- device <- ir <- runtime <- compilers.
"""

from .builder import BufferRef, ProgramBuilder
from .indexing import FloorDiv, ModularIndexing, sym, to_expr
from .ops import OPS, Access, Cost, OpDef, access_layout
from .schedule import Schedule, ScheduleError, live_bytes, persistent_dims, stick_dims
from .planning import legal_divisions, pick_division, resolve, size_tiles
from .printer import format_program
from .program import (Buffer, Compute, Constant, Dim, IndexValue, Load, Matmul, Program, ProgramError, Reduce,
                      RingReduce, Split, Store, TilePlan, WorkDivision, analyze)
from .latency import Estimate, estimate_schedule

__all__ = [
    "Buffer", "Compute", "Constant", "Dim", "IndexValue", "Load", "Matmul", "Program", "ProgramError", "Reduce",
    "RingReduce", "Split", "Store", "TilePlan", "WorkDivision", "analyze", "ProgramBuilder", "BufferRef", "OPS",
    "OpDef", "Cost", "Access", "access_layout", "Schedule", "ScheduleError", "resolve", "legal_divisions",
    "pick_division", "size_tiles", "live_bytes", "persistent_dims", "stick_dims", "format_program", "Estimate",
    "estimate_schedule", "sym", "to_expr", "FloorDiv", "ModularIndexing",
]
