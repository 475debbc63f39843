"""``torch.ops.higher_order.out_dtype(aten.mm, torch.int32, a_int8, b_int8)`` on the card.

Quantisation libraries write the int8 x int8 -> int32 matmul as this higher-order op (torchao's
``safe_int_mm`` does on every device but the CPU). PyTorch runs it as ``torch._int_mm`` only for
CUDA and XPU tensors; for any other device its dense kernel casts both operands to int32 and calls
``aten.mm`` on them, which the card has no int32 systolic form of (a host fallback, and four bytes
an element where one suffices). Here the same call on card tensors is ``aten._int_mm``: the
card's int8 systolic matmul (``vspyre.ir.library.scaled_mm``), exact and bit-identical (int32
accumulation of int8 products either way). Every other ``out_dtype`` call keeps PyTorch's
semantics (:func:`out_dtype_on_card` defers to PyTorch's own kernel).

One function, used three ways: the op's kernel for the card's dispatch key (installed with the
device), and the decomposition both compilers trace it with (Inductor's table, the standalone
compiler's list).
"""

from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten


def is_card_int_mm(op: Any, output_dtype: torch.dtype, args: tuple) -> bool:
    """An int8 x int8 -> int32 ``mm`` of two card tensors (what ``torch._int_mm`` computes)."""
    return (op is aten.mm.default and output_dtype == torch.int32 and len(args) == 2
            and all(isinstance(a, torch.Tensor) and a.dtype == torch.int8 and a.device.type == "spyre" for a in args))


def out_dtype_on_card(op: Any, output_dtype: torch.dtype, *args: Any) -> torch.Tensor:
    """``out_dtype(op, output_dtype, *args)``: ``aten._int_mm`` for the card's int8 matmul, else
    PyTorch's own dense kernel (cast to the promoted dtype, run ``op``, cast to ``output_dtype``)."""
    if is_card_int_mm(op, output_dtype, args):
        return aten._int_mm.default(*args)
    from ..compat import out_dtype_dense
    return out_dtype_dense(op, output_dtype, *args)


_registered = False


def register() -> None:
    """The card's eager kernel of the ``out_dtype`` higher-order op (idempotent)."""
    global _registered
    if _registered:
        return
    from ..compat import out_dtype_hop
    out_dtype_hop.py_impl(torch._C.DispatchKey.PrivateUse1)(out_dtype_on_card)
    _registered = True


def decompositions() -> dict:
    """``{out_dtype: out_dtype_on_card}``: for a compiler's decomposition table."""
    from ..compat import out_dtype_hop
    return {out_dtype_hop: out_dtype_on_card}
