"""Every use of a torchao internal, in one place (a new torchao release touches this file).

torchao's fp8 configs refuse any device but CUDA (sm89+), ROCm MI300+ and XPU: its
``_check_hardware_support`` asserts on the presence of those, not on the tensors' device. The
card runs per-tensor and per-row fp8 ``torch._scaled_mm``, so while a model on the card is being
quantised that check also accepts those two granularities; blockwise (1x128 / 128x128) scaling
is still refused (the card's ``_scaled_mm`` has no blockwise form). Outside
:func:`card_hardware_check`, and for models not on the card, torchao's own check runs unchanged.

:func:`float8_weight` builds torchao's ``Float8Tensor`` directly from fp8 values and scales a
checkpoint already holds (``vspyre.quant.checkpoints``): its constructor and the activation
kwargs class are internal. :func:`float8_weight_static` does the same for checkpoints with static
activation scales, with the tensor torchao's static fp8 config makes (``PrototypeFloat8Tensor``,
in ``torchao.prototype``: the least stable import here).
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


def float8_weight_static(qdata: torch.Tensor, scale: torch.Tensor, act_scale: torch.Tensor, dtype: torch.dtype) -> Any:
    """torchao's static-activation fp8 weight around a checkpoint's fp8 values: ``[out, in]``
    float8_e4m3fn with one float32 weight scale (``[1, 1]``) and one float32 activation scale
    calibrated offline, shaped as the activations it quantises (``[1, 1, 1]`` for ``[batch, seq,
    hidden]``; torchao keys a static scale by the input's rank). The tensor
    ``Float8StaticActivationFloat8WeightConfig(act_quant_scale=..., granularity=PerTensor())``
    makes from a 16-bit weight; its linear divides the input by the scale, casts it to fp8 and runs
    ``torch._scaled_mm`` with both scales: no reduction over the activations at run time."""
    from torchao.prototype.quantization.float8_static_quant.prototype_float8_tensor import PrototypeFloat8Tensor
    from torchao.quantization import Float8StaticActivationFloat8WeightConfig, PerTensor

    cfg = Float8StaticActivationFloat8WeightConfig(act_quant_scale=act_scale, granularity=PerTensor(),
                                                   set_inductor_config=False)
    return PrototypeFloat8Tensor(qdata, scale, act_quant_scale=act_scale, block_size=[-1] * qdata.ndim,
                                 mm_config=cfg.mm_config, act_quant_kwargs=cfg.get_act_quant_kwargs(),
                                 kernel_preference=cfg.kernel_preference, dtype=dtype)


# A per-tensor block size is written [-1, -1] (torchao's "the whole dimension"): as the weight's own
# shape, a 128x128 weight would read as 128x128-block scaled and its linear refused.

def static_observer() -> Any:
    """torchao's min-max observer as its static fp8 config's prepare step makes it: one symmetric
    float8_e4m3fn scale per tensor, kept with the input's rank."""
    from torchao.quantization import PerTensor
    from torchao.quantization.observer import AffineQuantizedMinMaxObserver
    from torchao.quantization.quant_primitives import MappingType

    return AffineQuantizedMinMaxObserver(mapping_type=MappingType.SYMMETRIC, target_dtype=torch.float8_e4m3fn,
                                         granularity=PerTensor(), eps=torch.finfo(torch.float32).eps,
                                         scale_dtype=torch.float32, zero_point_dtype=torch.float32, keepdim=True)


def quantize_static_fp8(linear: torch.nn.Linear, act_scale: torch.Tensor) -> None:
    """``linear``'s weight as torchao's static fp8 tensor with activation scale ``act_scale``
    (its config's direct path: the weight quantised per tensor), in place."""
    from torchao.quantization import Float8StaticActivationFloat8WeightConfig, PerTensor, quantize_

    quantize_(linear, Float8StaticActivationFloat8WeightConfig(act_quant_scale=act_scale, granularity=PerTensor(),
                                                               set_inductor_config=False),
              filter_fn=lambda m, fqn: m is linear)
    w = linear.weight                       # rebuilt with the per-tensor block size written [-1, -1]
    linear.weight = torch.nn.Parameter(float8_weight_static(w.qdata, w.scale, w.act_quant_scale, w.dtype),
                                       requires_grad=False)
