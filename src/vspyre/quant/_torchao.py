"""Every use of a torchao internal, in one place (a new torchao release touches this file).

torchao's fp8 configs refuse any device but CUDA (sm89+), ROCm MI300+ and XPU: its
``_check_hardware_support`` asserts on the presence of those, not on the tensors' device. The
card runs per-tensor and per-row fp8 ``torch._scaled_mm``, so while a model on the card is being
quantised that check also accepts those two granularities; blockwise (1x128 / 128x128) scaling
is still refused (the card's ``_scaled_mm`` has no blockwise form). Outside
:func:`card_hardware_check`, and for models not on the card, torchao's own check runs unchanged.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch


def _on_card(model: torch.nn.Module) -> bool:
    return any(p.device.type == "spyre" for p in model.parameters())


@contextlib.contextmanager
def card_hardware_check(model: torch.nn.Module) -> Iterator[None]:
    import torchao.quantization.quant_api as qa

    original = qa._check_hardware_support
    if not _on_card(model):
        yield
        return

    def check(granularities: Any) -> None:
        from torchao.quantization.granularity import PerRow, PerTensor
        try:
            original(granularities)
        except AssertionError:
            kinds = {type(g) for g in granularities}
            if not (kinds == {PerTensor} or kinds == {PerRow}):
                raise AssertionError(f"the spyre card's _scaled_mm takes per-tensor or per-row fp8 scales, "
                                     f"not {granularities}") from None

    qa._check_hardware_support = check
    try:
        yield
    finally:
        qa._check_hardware_support = original
