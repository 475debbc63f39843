"""Every use of a compressed-tensors internal (and of transformers' compressed-tensors quantizer),
in one place: a new compressed-tensors or transformers release touches this file.

``transformers.AutoModelForCausalLM.from_pretrained`` of a compressed-tensors checkpoint goes
through its ``CompressedTensorsHfQuantizer``: compressed-tensors marks the targeted linears
(``quantization_scheme``, ``quantization_status``), gives them the serialized parameters
(``weight`` as float8_e4m3fn, ``weight_scale``) and the checkpoint's tensors load into those as
they are. It also registers a forward pre-hook on the model that, on the first forward, turns
every such linear back into a dense bfloat16 one (``ModelCompressor.decompress_model``): the
default route dequantises, it does not run fp8. ``dequantize=True`` dequantises at load instead,
and ``use_optimized_inference=True`` (fp8 ``scaled_mm`` linears) is taken on CUDA sm89+, XPU or
MPS only. So the loader asks for neither, takes the fp8 weights and scales before the first
forward, and then removes compressed-tensors' marks and hook (:func:`release`).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch


def import_compressed_tensors() -> Any:
    from . import QuantError
    try:
        import compressed_tensors
    except ImportError as e:
        raise QuantError(f"compressed-tensors checkpoints need compressed-tensors ({e}); install it with "
                         "`pip install 'vspyre[quant]'` (compressed-tensors 0.20.1)") from None
    return compressed_tensors


def parse_config(quantization_config: dict) -> Any:
    """The config.json ``quantization_config`` as compressed-tensors' ``QuantizationConfig``
    (its groups as ``QuantizationScheme``s, arguments as ``QuantizationArgs``)."""
    import_compressed_tensors()
    from compressed_tensors.quantization import QuantizationConfig
    keep = {k: v for k, v in quantization_config.items()
            if k not in ("sparsity_config", "transform_config", "version")}
    return QuantizationConfig.model_validate(keep)


def load_compressed(path: str, dtype: torch.dtype) -> torch.nn.Module:
    """The model on the host, its targeted linears still holding the checkpoint's fp8 ``weight``
    and ``weight_scale`` (transformers' compressed-tensors quantizer, neither dequantising nor
    taking its CUDA fp8 linears)."""
    import_compressed_tensors()
    import transformers
    qcfg = transformers.CompressedTensorsConfig(dequantize=False, use_optimized_inference=False)
    with warnings.catch_warnings():    # "loading attributes ... will be overwritten": the two above, as meant
        warnings.filterwarnings("ignore", message="You passed `quantization_config`")
        return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, quantization_config=qcfg)


def quantized_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, Any]]:
    """``(name, module, scheme)`` for each module compressed-tensors quantised."""
    return [(n, m, m.quantization_scheme) for n, m in model.named_modules()
            if getattr(m, "quantization_scheme", None) is not None]


def release(model: torch.nn.Module, modules: list[torch.nn.Module]) -> None:
    """Remove compressed-tensors' marks from ``modules`` (scheme, status, qparams such as
    ``weight_scale``, a wrapped forward) and its decompress-on-first-forward hook from ``model``:
    they are plain linears again, for the caller to give fp8 weights."""
    from compressed_tensors.quantization import QuantizationMetadata
    for m in modules:
        QuantizationMetadata.clear_quantization(m)
        fwd = m.__dict__.get("forward")                # the unwrapped forward, bound to the instance
        if getattr(fwd, "__func__", None) is type(m).forward:
            del m.forward
        for attr in ("quantization_status", "quantization_enabled"):
            if hasattr(m, attr):
                delattr(m, attr)
    hook = getattr(model, "ct_decompress_hook", None)
    if hook is not None:
        hook.remove()
        del model.ct_decompress_hook
