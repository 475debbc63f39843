"""Inductor's fused kernels as tile programs: a kernel class on Inductor's SIMD kernel base.

Inductor keeps graph capture, decompositions, lowering, scheduling, fusion, index simplification
and CSE. This file only turns what a fused kernel does into calls of ``vspyre.ir.ProgramBuilder``:

* every range tree of the kernel (``z``, ``y``, ``x`` pointwise, ``r0_`` reduction) is one
  dimension of the program's iteration space; index expressions are kept as Inductor simplified
  them (affine, ``FloorDiv``, ``ModularIndexing``, indirect through loaded values);
* every op Inductor's handlers emit becomes one line ``tmpN = b.<op>(...)`` (Inductor's CSE names
  the values, the builder returns the program's SSA names);
* ``ops.dot`` + ``reduction("dot")`` (Inductor's native-matmul form of mm/bmm/addmm) becomes one
  ``Matmul`` on the systolic array, with whatever Inductor fused after it as its epilogue;
* the kernel's source is a function ``build(name)`` returning the program; the wrapper calls it
  once (``vspyre.inductor.launcher.SpyreKernel``) and launches the program per call.

Work division and tiling are not decided here: the runtime plans them per bound sizes with the
latency model (``vspyre.ir.planning``), so a dynamic-shape kernel is planned per shape.
"""

from __future__ import annotations

import re
from typing import Any

import sympy
import torch

from ..compat import (CSEProxy, CSEVariable, DeferredLine, IndentedBuffer, IterationRangesEntry, Kernel,
                      OpOverrides, OpsWrapper, SIMDKernel, V, ops, sympy_subs)
from ..ir.ops import OPS
from ..ir.program import REDUCTIONS

__all__ = ["SpyreKernel", "SpyreOverrides", "UnsupportedKernelOp"]

_DIM_NAMES = {"x": "x", "y": "y", "z": "z", "r0_": "r0", "r1_": "r1"}
_TMP = re.compile(r"^tmp\d+$")


class UnsupportedKernelOp(NotImplementedError):
    """An op inside a fused kernel that the card's tile programs cannot express."""


def _lit(value: Any) -> str:
    """A Python literal for a constant (inf/nan need spelling out)."""
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, float):
        if value != value:
            return "float('nan')"
        if value in (float("inf"), float("-inf")):
            return f"float('{value}')"
    if isinstance(value, (sympy.Integer, sympy.Float)):
        return _lit(int(value) if value.is_Integer else float(value))
    return repr(value)


def _dt(dtype: torch.dtype) -> str:
    return str(dtype)  # "torch.float16"


class SpyreOverrides(OpOverrides):
    """Math ops as builder calls. Each returns the text of one expression; CSE names it."""

    @staticmethod
    def constant(value: Any, dtype: torch.dtype) -> str:
        if dtype in (torch.float64,):
            dtype = torch.float32
        return f"b.const({_lit(value)}, {_dt(dtype)})"

    @staticmethod
    def to_dtype(x: Any, dtype: torch.dtype, src_dtype: torch.dtype | None = None,
                 use_compute_types: bool = True) -> str:
        if dtype == torch.float64:
            dtype = torch.float32  # the card has no fp64; Inductor upcasts scalars this way
        return f"b.to({x}, {_dt(dtype)})"

    @staticmethod
    def to_dtype_bitcast(x: Any, dtype: torch.dtype, src_dtype: torch.dtype) -> str:
        raise UnsupportedKernelOp(f"bitcast from {src_dtype} to {dtype}")

    @classmethod
    def index_expr(cls, expr: sympy.Expr, dtype: torch.dtype) -> str:
        kernel = V.kernel
        index = kernel.prepare_indexing(expr)
        if dtype == torch.float64:
            dtype = torch.float32
        return f"b.index_value({kernel.expr_text(index)}, {_dt(dtype)})"

    @classmethod
    def value_expr(cls, expr: sympy.Expr, dtype: torch.dtype) -> str:
        return cls.index_expr(expr, dtype)

    @staticmethod
    def masked(mask: CSEVariable, body: Any, other: Any) -> CSEVariable:
        with V.kernel.mask_loads(mask, other) as new_mask:
            result = body()
        dtype = getattr(getattr(result, "value", result), "dtype", None) or torch.float32
        if dtype == torch.bool:
            other = bool(other)
        elif not dtype.is_floating_point and not isinstance(other, bool):
            if other == other and other not in (float("inf"), float("-inf")):
                other = int(other)
        other_var = ops.constant(other, dtype)
        return OpsWrapper._unwrap(ops.where(new_mask, result, other_var))

    @staticmethod
    def where(c: Any, a: Any, b_: Any) -> str:
        return f"b.where({c}, {a}, {b_})"

    @staticmethod
    def dot(a: Any, b_: Any) -> str:
        return f"k.dot({a}, {b_})"


# Inductor op -> card op, where the names differ. Inductor's ops.mod is the C-style modulus (sign
# of a: its fmod lowering emits it for integer fmod), the card's "fmod"; ops.remainder is the
# Python-style one (sign of b), the card's "mod".
_ALIASES = {
    "and_": "bitwise_and", "or_": "bitwise_or", "xor": "bitwise_xor", "lshift": "bitwise_left_shift",
    "rshift": "bitwise_right_shift", "remainder": "mod", "mod": "fmod", "int_truediv": "truediv",
}
# Inductor op -> (card op, then cast to int64).
_TO_INT = {"floor_to_int": "floor", "ceil_to_int": "ceil", "round_to_int": "round", "trunc_to_int": "trunc"}
# Handled by the kernel or the proxy itself, not by the overrides.
_STRUCTURAL = {"load", "store", "store_reduction", "reduction", "scan", "sort", "indirect_indexing", "check_bounds",
               "output", "placeholder", "masked", "index_expr", "value_expr", "constant", "to_dtype",
               "to_dtype_bitcast", "dot", "where", "halide_clamp", "bucketize", "partial_accumulate",
               "device_assert_async", "inline_asm_elementwise"}


# The ops.* names with no tile-program form (filled by _install_vector_ops). The lowerings for the
# card (vspyre.inductor.lowering) read this through has_tile_form: an aten op whose Inductor
# lowering would emit one of these runs as a host fallback for spyre tensors instead.
_NO_TILE_FORM: set[str] = set()


def has_tile_form(op: str) -> bool:
    """Whether a fused kernel can emit ``ops.<op>``; ``"store:<mode>"`` asks about a store mode.

    ``SpyreKernel.store`` emits plain stores only: atomic/scatter store modes have no tile form.
    """
    if op.startswith("store:"):
        return False
    return op not in _NO_TILE_FORM


def _install_vector_ops() -> None:
    """Every op Inductor's handlers know is a card op, or an error naming it: never invalid code."""
    from ..compat import OpsHandler

    def card(op: str):
        return staticmethod(lambda *args: f"b.{op}({', '.join(str(x) for x in args)})")

    def to_int(op: str):
        return staticmethod(lambda x, dtype=torch.int64: f"b.to(b.{op}({x}), {_dt(dtype)})")

    def unsupported(op: str):
        hint = ""
        if op in ("load_seed", "rand", "randn", "randint64", "rand_eager"):
            hint = ("; random numbers on the card are drawn by host fallbacks of the aten random "
                    "ops (vspyre.inductor.lowering), so an in-kernel random op here is a bug")

        def fn(*args: Any, **kwargs: Any) -> str:
            raise UnsupportedKernelOp(f"ops.{op} has no tile-program form on the card{hint}")
        _NO_TILE_FORM.add(op)
        return staticmethod(fn)

    names = {n for n in dir(OpsHandler) if not n.startswith("_")}
    for name in sorted(names - _STRUCTURAL):
        if name in SpyreOverrides.__dict__:
            continue
        if name in _ALIASES:
            setattr(SpyreOverrides, name, card(_ALIASES[name]))
        elif name in _TO_INT:
            setattr(SpyreOverrides, name, to_int(_TO_INT[name]))
        elif name in OPS and OPS[name].unit == "vector" and OPS[name].fn is not None:
            setattr(SpyreOverrides, name, card(name))
        else:
            setattr(SpyreOverrides, name, unsupported(name))
    for name in ("bucketize", "device_assert_async", "inline_asm_elementwise", "halide_clamp", "partial_accumulate"):
        setattr(SpyreOverrides, name, unsupported(name))


_install_vector_ops()


class _SpyreCSEProxy(CSEProxy):
    """Inductor's CSE proxy, except that ``dot`` needs no Triton block shapes."""

    def dot(self, a: Any, b: Any) -> CSEVariable:
        if not self.kernel.inside_reduction:
            # A contraction of length 1 (x[1] @ w[1, 1], [m, 1] @ [1, n]): Inductor turns the
            # size-1 reduction("dot") into a pointwise node that keeps the ops.dot, so the dot is
            # the product itself, in fp32 like the systolic array's accumulator.
            return self.to_dtype(self.mul(a, b), torch.float32)
        value = self.parent_handler.dot(a, b)
        return self.kernel.cse.generate(self.kernel.compute, value, dtype=torch.float32)


class SpyreKernel(SIMDKernel):
    """A fused Inductor kernel, generated as the source of a tile-program builder."""

    overrides = SpyreOverrides  # type: ignore[assignment]
    kexpr = staticmethod(str)

    def __init__(self, tiling: dict[str, sympy.Expr], **kwargs: Any) -> None:
        features = kwargs.get("features")
        if features is not None:
            # Tile programs compute addresses exactly (no 32-bit index type to pick), so the kernel
            # must not ask Inductor's 32-bit check, which guards symbolic sizes to fit int32: an
            # 8B model's matmul range (tokens x 4096 x 4096) recompiled the vLLM step graph at 128
            # tokens, and again at every size past each guard.
            features.select_index_dtype = lambda: torch.int64
        super().__init__(tiling, **kwargs)
        self._entries: dict[sympy.Symbol, sympy.Expr] = {}
        self._loaded: set[str] = set()
        self._stored: set[str] = set()

    def __enter__(self) -> "SpyreKernel":
        super(Kernel, self).__enter__()
        self.exit_stack.enter_context(V.set_ops_handler(_SpyreCSEProxy(self, self.overrides())))
        self.exit_stack.enter_context(V.set_kernel_handler(self))
        return self

    def dtype_to_str(self, dtype: torch.dtype) -> str:
        return str(dtype)

    # -- index expressions ---------------------------------------------------------------------
    def codegen_iteration_ranges_entry(self, entry: IterationRangesEntry) -> None:
        self._entries[entry.symbol()] = entry.expr

    def _root_dim(self, tree: Any) -> str:
        return _DIM_NAMES[tree.prefix]

    def expr_text(self, index: sympy.Expr) -> str:
        """An index expression as the text of a Python f-string over the program's dims.

        Range-tree entries become expressions of their tree's dim; sizes become the kernel's size
        arguments; Inductor's CSE temporaries (indirect indexing) become ``{tmpN}``, which at build
        time is the SSA name of the loaded index.
        """
        for _ in range(4):
            subs = {s: e for s, e in self._entries.items() if s in index.free_symbols}
            if not subs:
                break
            index = sympy_subs(index, subs)
        roots = {}
        for tree in self.range_trees:
            roots[tree.symbol()] = sympy.Symbol(self._root_dim(tree), integer=True, nonnegative=True)
            if tree.is_reduction and not self.inside_reduction:
                roots[tree.symbol()] = sympy.Integer(0)
        index = sympy_subs(index, roots)
        index = self.rename_indexing(index)
        text = str(index)
        text = re.sub(r"\b(tmp\d+)\b", r"{\1}", text)
        return f'f"{text}"'

    def device_assert_async(self, cond: CSEVariable, msg: str) -> None:
        """An async assert (F.one_hot's range check) as the IR's ``device_assert``: the condition
        passes through and the kernel fails with ``msg`` where it is false. Inductor's lowering
        stores the assert's (``None``) result; :meth:`store` stores the checked condition."""
        self._asserted = self.cse.generate(self.compute, f"b.device_assert({cond}, {msg!r})", dtype=torch.bool)

    def check_bounds(self, expr: sympy.Expr, size: sympy.Expr, lower: bool, upper: bool) -> None:
        """Out-of-bounds indirect accesses are caught by the runtime (it checks every gather)."""

    # -- memory ----------------------------------------------------------------------------------
    def load(self, name: str, index: sympy.Expr) -> CSEVariable:
        var = self.args.input(name)
        self._loaded.add(name)
        index = self.prepare_indexing(index)
        idx = self.expr_text(index)
        dtype = V.graph.get_dtype(name)
        if self._load_mask is not None:
            other = self._load_other if self._load_other is not None else 0
            line = f"b.load({var}, {idx}, mask={self._load_mask}, other={_lit(other)})"
        else:
            line = f"b.load({var}, {idx})"
        # A load whose mask or index is computed must come after that computation.
        buf = self.compute if (self._load_mask is not None or "{tmp" in idx) else self.loads
        return self.cse.generate(buf, line, dtype=dtype)

    def store(self, name: str, index: sympy.Expr, value: CSEVariable, mode: Any = None) -> None:
        if mode is not None:
            raise UnsupportedKernelOp(f"store mode {mode!r} (atomic/scatter stores) into {name}")
        if value is None and getattr(self, "_asserted", None) is not None:
            value = self._asserted
        var = self.args.output(name)
        self._stored.add(name)
        index = self.prepare_indexing(index)
        line = DeferredLine(name, f"b.store({var}, {self.expr_text(index)}, {value})")
        (self.compute if self.inside_reduction else self.stores).writeline(line)

    def store_reduction(self, name: str, index: sympy.Expr, value: CSEVariable) -> None:
        var = self.args.output(name)
        self._stored.add(name)
        index = self.prepare_indexing(index)
        self.stores.writeline(DeferredLine(name, f"b.store({var}, {self.expr_text(index)}, {value})"))

    # -- reductions ------------------------------------------------------------------------------
    def reduction(self, dtype: torch.dtype, src_dtype: torch.dtype, reduction_type: str,
                  value: Any) -> Any:
        cache_key = (src_dtype, reduction_type, value)
        if cache_key in self.cse.reduction_cache:
            return self.cse.reduction_cache[cache_key]
        result = self._reduction(dtype, src_dtype, reduction_type, value)
        self.cse.reduction_cache[cache_key] = result
        return result

    def _reduction(self, dtype: torch.dtype, src_dtype: torch.dtype, reduction_type: str, value: Any) -> Any:
        assert self.inside_reduction
        rdims = tuple(self._root_dim(t) for t in self.range_trees if t.is_reduction)
        dims = "(" + ", ".join(repr(d) for d in rdims) + ",)"
        if reduction_type == "welford_reduce":
            return self.welford_reduce_fallback(dtype, value)
        if reduction_type == "online_softmax_reduce":
            return self.prepare_softmax_twopass_fallback(dtype, value)
        if reduction_type == "dot":
            if len(rdims) != 1:
                raise UnsupportedKernelOp("matmul over more than one reduction dim")
            line = f"k.matmul({value}, {rdims[0]!r})"
            return self.cse.generate(self.compute, line, dtype=dtype)
        if reduction_type in REDUCTIONS:
            out_dt = torch.int64 if REDUCTIONS[reduction_type].result == "index" else None
            dt = f", dtype={_dt(out_dt)}" if out_dt is not None else ""
            line = f"b.reduce({reduction_type!r}, {value}, {dims}{dt})"
            return self.cse.generate(self.compute, line, dtype=out_dt or dtype)
        raise UnsupportedKernelOp(f"reduction {reduction_type!r}")

    def scan(self, *args: Any, **kwargs: Any) -> Any:
        raise UnsupportedKernelOp("scan (cumsum/cumprod) inside a kernel")

    def sort(self, *args: Any, **kwargs: Any) -> Any:
        raise UnsupportedKernelOp("sort inside a kernel")

    # -- source ----------------------------------------------------------------------------------
    def codegen_body(self) -> None:
        self.body.splice(self.loads)
        self.body.splice(self.compute)
        self.body.splice(self.stores)
        self.loads.clear()
        self.compute.clear()
        self.stores.clear()

    def buffer_roles(self) -> list[tuple[str, str, str, torch.dtype]]:
        """(inner name, outer name, role, dtype) for every buffer argument, in call order."""
        arg_defs, call_args, _, _ = self.args.python_argdefs()
        out = []
        nbuf = len(call_args) - len(self.args.sizevars)
        for argdef, outer in list(zip(arg_defs, call_args))[:nbuf]:
            inner = argdef.name
            if inner.startswith("in_out_ptr"):
                role = "inout"
            elif inner.startswith("in_ptr"):
                role = "in"
            else:
                role = "inout" if outer in self._loaded else "out"
            out.append((inner, outer, role, V.graph.get_dtype(outer)))
        return out

    def codegen_kernel(self, name: str | None = None) -> str:
        self.codegen_body()
        code = IndentedBuffer()
        code.writeline("def build(b, k):")
        with code.indent():
            for inner, _, role, dtype in self.buffer_roles():
                # Buffers are flat spans of device memory: Inductor indexes them by element offset.
                # Outputs may be views with gaps (slices of a larger buffer): "inout" never asks
                # that every element be written.
                role = "inout" if role == "out" else role
                code.writeline(f"{inner} = b.buffer({inner!r}, {_dt(dtype)}, ({(inner + '_numel')!r},), role={role!r})")
            for inner in self.args.sizevars.values():
                code.writeline(f"b.scalar({inner!r})")
            for tree in self.range_trees:
                numel = self.rename_indexing(tree.numel)
                if tree.is_reduction and V.graph.sizevars.statically_known_equals(tree.numel, 1):
                    continue
                kind = "reduction" if tree.is_reduction else "parallel"
                if not tree.is_reduction and V.graph.sizevars.statically_known_equals(tree.numel, 1) \
                        and len([t for t in self.range_trees if not t.is_reduction]) > 1:
                    continue
                code.writeline(f"b.dim({self._root_dim(tree)!r}, {str(numel)!r}, {kind!r})")
            code.splice(self.body)
        return code.getvalue()

    def call_kernel(self, name: str, node: Any = None, deallocate_ws: bool = True) -> None:
        wrapper = V.graph.wrapper_code
        _, call_args, _, arg_types = self.args.python_argdefs()
        for i in range(len(call_args)):
            if isinstance(arg_types[i], type) and issubclass(arg_types[i], sympy.Basic):
                call_args[i] = wrapper.codegen_sizevar(V.graph.sizevars.simplify(sympy.sympify(call_args[i])))
        wrapper.generate_kernel_call(name, call_args, device=V.graph.get_current_device_or_throw(),
                                     triton=False, arg_types=arg_types)

    def scalar_args(self) -> list[str]:
        """The kernel's size arguments, in call order (after the buffers)."""
        return list(self.args.sizevars.values())
