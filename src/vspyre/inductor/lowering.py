"""The matmul family on the systolic array.

Inductor already knows how to lower ``mm``/``bmm``/``addmm``/``baddbmm`` as a *native matmul*:
``ops.dot`` followed by ``reduction("dot")``, with pointwise epilogues fused into the same kernel
(bias, activation, residual, scaling). Upstream enables that form only for Triton on GPUs; this
module enables it for ``spyre`` tensors, and the card's kernel turns the pair into one systolic
``Matmul``. Nothing else of Inductor's lowering is replaced.
"""

from __future__ import annotations

from typing import Any

import torch

_MATMUL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.uint8)


def _on_spyre(x: Any) -> bool:
    try:
        d = x.get_device()
    except Exception:  # noqa: BLE001 - not an IR node
        return False
    return d is not None and d.type == "spyre"


def register() -> None:
    from torch._inductor.kernel import bmm as bmm_mod
    from torch._inductor.kernel import mm as mm_mod

    for mod in (mm_mod, bmm_mod):
        upstream = mod.use_native_matmul
        if getattr(upstream, "_vspyre", False):
            continue

        def use_native_matmul(mat1: Any, mat2: Any, _upstream: Any = upstream) -> bool:
            if _on_spyre(mat1) and _on_spyre(mat2):
                return mat1.get_dtype() in _MATMUL_DTYPES and mat1.get_dtype() == mat2.get_dtype()
            return _upstream(mat1, mat2)

        use_native_matmul._vspyre = True  # type: ignore[attr-defined]
        mod.use_native_matmul = use_native_matmul
