"""Every use of a torchao internal, in one place (a new torchao release touches this file).

torchao's fp8 configs refuse any device but CUDA (sm89+), ROCm MI300+ and XPU: its
``_check_hardware_support`` asserts on the presence of those, not on the tensors' device. The
card runs per-tensor and per-row fp8 ``torch._scaled_mm``, so while a model on the card is being
quantised that check also accepts those two granularities; blockwise (1x128 / 128x128) scaling
is still refused (the card's ``_scaled_mm`` has no blockwise form). Outside
:func:`card_hardware_check`, and for models not on the card, torchao's own check runs unchanged.

:func:`float8_weight` builds torchao's ``Float8Tensor`` directly from fp8 values and scales a
checkpoint already holds (``vspyre.quant.checkpoints``): its constructor and the activation
kwargs class are internal.
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


def float8_weight(qdata: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> Any:
    """torchao's Float8Tensor around fp8 weights that are already quantised (a checkpoint's
    ``[out, in]`` float8_e4m3fn values and ``[out, 1]`` float32 scales, one per output channel),
    with dynamic per-row (per-token) fp8 activations: the tensor torchao's
    ``Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())`` makes from a bfloat16
    weight, built from the given values instead of quantising them again. Its linear is
    ``torch._scaled_mm`` of the two fp8 operands with both scales."""
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, Float8Tensor, PerRow
    from torchao.quantization.quantize_.workflows.float8.float8_tensor import QuantizeTensorToFloat8Kwargs
    from torchao.quantization.utils import get_block_size

    cfg = Float8DynamicActivationFloat8WeightConfig(granularity=PerRow(), set_inductor_config=False)
    act_granularity, weight_granularity = cfg.granularity
    act = QuantizeTensorToFloat8Kwargs(cfg.activation_dtype, act_granularity, hp_value_lb=cfg.activation_value_lb,
                                       hp_value_ub=cfg.activation_value_ub, kernel_preference=cfg.kernel_preference)
    return Float8Tensor(qdata, scale, block_size=list(get_block_size(qdata.shape, weight_granularity)),
                        mm_config=cfg.mm_config, act_quant_kwargs=act, kernel_preference=cfg.kernel_preference,
                        dtype=dtype)
