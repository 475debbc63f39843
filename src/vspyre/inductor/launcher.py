"""What compiled wrappers call: a tile program built once from its source, launched per call.

The Inductor extension emits, per kernel, Python source that builds a tile program with
``vspyre.ir.ProgramBuilder`` (readable in ``TORCH_LOGS=output_code``). :class:`TileKernel`
builds it once and launches it on the runtime with the wrapper's arguments: device tensors
(passed as flat views of their memory, since Inductor indexes buffers by element offset) and
integer sizes.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Sequence

import torch

from .. import runtime
from ..ir import ProgramBuilder

__all__ = ["TileKernel", "compiled_region", "note_compiled_fallbacks", "compiled_fallbacks",
           "reset_compiled_fallbacks"]

_lock = threading.Lock()
_compiled_fallbacks: collections.Counter[str] = collections.Counter()


def note_compiled_fallbacks(ops: Sequence[str]) -> None:
    """Called by a compiled module when it loads: the ops it runs as host fallbacks."""
    with _lock:
        _compiled_fallbacks.update(ops)


def compiled_fallbacks() -> dict[str, int]:
    """Ops that compiled spyre graphs run as host fallbacks (counted once per loaded graph)."""
    with _lock:
        return dict(_compiled_fallbacks.most_common())


def reset_compiled_fallbacks() -> None:
    with _lock:
        _compiled_fallbacks.clear()


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A 1-D view over the elements a tensor can address, starting at its first element. It stays
    a device tensor (a view: same storage, same version counter), so the runtime can tell a
    weight it has already re-laid from a changed one."""
    if t.dim() == 1 and t.stride(0) == 1:
        return t
    if t.numel() == 0:
        return t.as_strided((0,), (1,))
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.as_strided((span,), (1,))


class _DotOperands:
    """``ops.dot(a, b)``: the operands of a matmul, waiting for its ``reduction("dot")``."""

    def __init__(self, a: str, b: str):
        self.a, self.b = a, b

    def __str__(self) -> str:
        raise TypeError("ops.dot operands used outside a matmul reduction")


class _MatmulHelper:
    """Inductor's native-matmul pair (``ops.dot`` then ``reduction("dot")``) as one Matmul."""

    def __init__(self, b: ProgramBuilder):
        self.b = b

    def dot(self, a: str, b: str) -> _DotOperands:
        return _DotOperands(a, b)

    def matmul(self, operands: _DotOperands, dim: str) -> str:
        if not isinstance(operands, _DotOperands):
            raise TypeError(f"reduction('dot') of {operands!r}: expected ops.dot operands")
        a, b_, d = operands.a, operands.b, str(dim)
        if not (_moves_with(self.b, a, d) and _moves_with(self.b, b_, d)):
            # an operand broadcast along the contraction (a bmm with an expanded operand, as the
            # linear attention of hybrid models computes): not a systolic matmul, but the same sum
            # of products on the vector unit, accumulated in fp32 like the array's accumulator
            f32 = torch.float32
            return self.b.reduce("sum", self.b.compute("mul", self.b.to(a, f32), self.b.to(b_, f32)), (d,))
        return self.b.matmul(a, b_, d)


def _moves_with(b: ProgramBuilder, value: str, dim: str) -> bool:
    """Whether ``value`` (built so far in ``b``) depends on the iteration dim ``dim``."""
    made = {out: op for op in b.body for out in getattr(op, "outputs", ())}
    seen: set[str] = set()
    todo = [value]
    while todo:
        v = todo.pop()
        if v in seen or v not in made:
            continue
        seen.add(v)
        op = made[v]
        expr = getattr(op, "index", None) if hasattr(op, "buffer") else getattr(op, "expr", None)
        if expr is not None and dim in {str(x) for x in getattr(expr, "free_symbols", ())}:
            return True
        todo += [x for x in getattr(op, "inputs", ()) if isinstance(x, str)]
    return False


class TileKernel:
    """One kernel of a compiled graph: its tile program and how the wrapper's arguments map to it."""

    def __init__(self, name: str, source: str, scalars: Sequence[str] = ()):
        self.name = name
        self.source = source
        self.scalars = tuple(scalars)
        env: dict[str, Any] = {"torch": torch}
        exec(compile(source, f"<spyre kernel {name}>", "exec"), env)
        b = ProgramBuilder(name, source="inductor")
        env["build"](b, _MatmulHelper(b))
        self.program = b.build()
        self.nbuf = len(self.program.buffers)

    def run(self, *args: Any) -> None:
        tensors = [_flat(t) for t in args[: self.nbuf]]
        sizes = {k: int(v) for k, v in zip(self.scalars, args[self.nbuf:])}
        runtime.launch(self.program, *tensors, sizes=sizes, source="inductor")

    def __repr__(self) -> str:
        return f"TileKernel({self.name})"


def compiled_region(call: Any) -> Any:
    """Run a compiled graph with host fallbacks labelled ``compiled`` (profiler, events)."""
    from ..device import fallback

    def run(args: Any) -> Any:
        with fallback.context("compiled"):
            return call(args)

    run.__wrapped__ = call  # type: ignore[attr-defined]
    return run


class LibraryKernel:
    """A library program of the card (``vspyre.ir.library``) called from a compiled graph: built
    per shape of its arguments (cached) and launched like any kernel. ``kind`` names the builder;
    ``params`` its static arguments. ``paged_attention`` runs the programs of
    ``library.paged_attention_launches`` in order (the KV-cache write, then the attention)."""

    def __init__(self, kind: str, params: dict[str, Any]):
        from ..ir import library
        self.kind = kind
        self.params = dict(params)
        self.builder = getattr(library, kind)

    def run(self, *tensors: torch.Tensor) -> None:
        from ..ir import library
        from ..ir.library import spec_of
        p = self.params
        specs = [spec_of(t) for t in tensors]
        if self.kind == "paged_attention":       # several programs: the cache write, then the attention
            from ..ir.library import paged_attention_launches
            for prog, idx in paged_attention_launches(*specs, p["scale"], p["sliding_window"], p["max_query_len"],
                                                      source="inductor"):
                runtime.launch(prog, *[tensors[i] for i in idx], source="inductor")
            return
        if self.kind == "grouped_mm":            # one matmul per non-empty group (sizes read back or assumed)
            from ..runtime import routing
            x, w, offs, out = tensors
            op = p["op"]
            library.grouped_mm_check(op, x, w, offs)
            bounds = routing.group_bounds(offs, int(x.shape[0]), op)
            for prog, ts in library.grouped_mm_launches(x, w, out, bounds, source="inductor"):
                runtime.launch(prog, *ts, source="inductor")
            end = bounds[-1][1] if bounds else 0
            if end < out.shape[0]:
                out[end:].zero_()
            return
        if self.kind == "scaled_mm":    # _scaled_mm, or _int_mm (integer): scales and bias broadcast to the output
            a, b, *extras, out = tensors
            integer, bias = p.get("integer", False), p.get("bias", False)
            op = "aten::_int_mm" if integer else "aten::_scaled_mm"
            library.scaled_mm_check(op, a, b, *extras, integer=integer)
            extras = [e.expand(out.shape) for e in extras]
            es = tuple(spec_of(e) for e in extras)
            prog = library.scaled_mm(specs[0], specs[1], specs[-1], es[:2], es[2] if bias else None,
                                     name="int_mm" if integer else "scaled_mm", source="inductor")
            runtime.launch(prog, a, b, *extras, out, source="inductor")
            return
        if self.kind == "attention":
            q, k = specs[0], specs[1]
            v = specs[2] if p.get("value", True) else None
            mask = specs[-2] if p.get("mask") else None
            prog = self.builder(q, k, v, specs[-1], mask, p.get("scale"), p.get("causal", False),
                                name=p.get("name", "attention"), source="inductor")
        elif self.kind == "topk":
            want = p["want"]
            prog = self.builder(specs[0], p["k"], specs[1] if want == "values" else None,
                                specs[1] if want == "indices" else None, p["largest"], name=f"topk_{want}",
                                source="inductor")
        elif self.kind == "histc":
            prog = self.builder(specs[0], p["bins"], p["lo"], p["hi"], specs[1], source="inductor")
        elif self.kind == "sort_ranks":
            prog = self.builder(specs[0], specs[1], p["descending"], source="inductor")
        elif self.kind == "sort_select":
            want = p["want"]
            prog = self.builder(specs[0], specs[1], specs[2] if want == "values" else None,
                                specs[2] if want == "indices" else None, name=f"sort_{want}", source="inductor")
        else:  # pragma: no cover - a new library kind must say how its arguments map
            raise NotImplementedError(f"library kernel {self.kind!r}")
        runtime.launch(prog, *tensors, source="inductor")

    def __repr__(self) -> str:
        return f"LibraryKernel({self.kind!r}, {self.params!r})"
