"""The text form of a tile program: what a person reads in logs and dump directories.

Stable (no addresses, no ids, deterministic order) so two dumps diff cleanly. Example::

    program add_relu  source=test
      buffers:
        in   x: f16[s0, 1024] strides=[1024, 1]
        out  y: f16[s0, 1024] strides=[1024, 1]
      dims: x0 in [0, s0) parallel; x1 in [0, 1024) parallel
      divide: x0 over 32 cores (chunk auto)
      tiles: auto
      body:
        %a = load x[1024*x0 + x1]                      : f16  (x0, x1)
        %b = relu(%a)                                  : f16  (x0, x1)
        store y[1024*x0 + x1] <- %b
"""

from __future__ import annotations

import torch

from .program import Program

__all__ = ["format_program", "dtype_name"]

_SHORT = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64",
          torch.int8: "i8", torch.uint8: "u8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
          torch.bool: "bool"}


def dtype_name(dt: torch.dtype) -> str:
    return _SHORT.get(dt, str(dt).replace("torch.", ""))


def format_program(p: Program, schedule=None) -> str:
    """The program as text; with a resolved ``Schedule``, its concrete division and tiles too."""
    lines = [f"program {p.name}" + (f"  source={p.source}" if p.source else "")]
    lines.append("  buffers:")
    for b in p.buffers:
        shape = ", ".join(str(s) for s in b.shape)
        strides = ", ".join(str(s) for s in b.strides)
        off = f" offset={b.offset}" if b.offset is not None else ""
        lines.append(f"    {b.role:<5}{b.name}: {dtype_name(b.dtype)}[{shape}] strides=[{strides}]{off}")
    if p.scalars:
        lines.append(f"  scalars: {', '.join(p.scalars)}")
    lines.append("  dims: " + "; ".join(f"{d.name} in [0, {d.size}) {d.kind}" for d in p.dims))
    if p.division is None:
        lines.append("  divide: auto")
    elif not p.division.splits:
        lines.append("  divide: none (1 core)")
    else:
        parts = []
        for s in p.division.splits:
            c = "auto" if s.chunk is None else str(s.chunk)
            st = f" starts={list(s.starts)}" if s.starts is not None else ""
            parts.append(f"{s.dim} over {s.parts} cores (chunk {c}){st}")
        lines.append("  divide: " + "; ".join(parts))
    if p.tiles is None:
        lines.append("  tiles: auto")
    else:
        t = ", ".join(f"{d}={v}" for d, v in p.tiles.sizes) or "whole core extent"
        db = {None: "auto", True: "yes", False: "no"}[p.tiles.double_buffer]
        lines.append(f"  tiles: {t}; double_buffer={db}")
    if schedule is not None:
        lines.append(f"  schedule: {schedule.describe()}")
    lines.append("  body:")
    try:
        an = p.analysis
    except Exception:  # print malformed programs too
        an = None
    for op in p.body:
        text = op.text()
        if an is not None and op.outputs:
            o = op.outputs[0]
            dims = ", ".join(d for d in p.dim_names if d in an.dims[o])
            text = f"{text:<56} : {dtype_name(an.dtypes[o])}  ({dims})"
        lines.append("    " + text)
    return "\n".join(lines) + "\n"
