"""Quantised models on the card, through torchao (the ecosystem's quantisation library).

Four schemes, those of the real stack (``../shared/spyre-hardware.md``):

* ``fp8``   - fp8 (e4m3) weights, one scale per output channel, and fp8 activations quantised per
  token at run time: torchao's ``Float8DynamicActivationFloat8WeightConfig`` per row, the layout
  of llm-compressor's ``FP8_DYNAMIC`` checkpoints (torchao takes per-row scales for bfloat16
  weights only: a float16 model gets one scale per tensor, the same bytes and kernels to within
  the scales). Every linear is ``torch._scaled_mm``: the card's fp8 systolic matmul with the
  scales in its epilogue.
* ``fp8-static`` - fp8 weights and fp8 activations, one scale per tensor each, the activation
  scale fixed offline from calibration tokens (llm-compressor's ``FP8`` scheme: the static scaling
  the real FP8 Granite checkpoints are served with). Calibration runs torchao's min-max observer
  on each linear's input (``calibration``: token ids, by default 64 random ones, right for the
  layout and the cost, not for accuracy); each weight is then torchao's static fp8 tensor
  (``Float8StaticActivationFloat8WeightConfig``'s direct path): the input divided by its scale
  and cast to fp8, no reduction over the activations at run time, then ``torch._scaled_mm``.
* ``w8a8``  - int8 weights per channel, int8 activations per token (SmoothQuant-style W8A8):
  ``Int8DynamicActivationInt8WeightConfig``. The matmul is torchao's ``out_dtype(mm, int32)``,
  which the card runs as ``torch._int_mm`` (``vspyre.device.out_dtype``), dequantised after it.
* ``w4a16`` - int4 weights in groups of 128 with an fp16 scale each, 16-bit activations
  (GPTQ-style weight-only): ``IntxWeightOnlyConfig(int4, PerGroup(128))``. torchao's packed-int4
  layouts are each tied to one vendor's kernel (CUDA's mslk and tinygemm, XPU, NPU, the CPU's
  opaque pack); its portable layout, the one usable on a new device, holds one int4 value per
  int8 byte and dequantises before the matmul. So on the card w4a16 stores and streams 1 byte per
  weight (plus the group scales), not half a byte: the figures say so.

The LM head stays in the model's dtype, as in the real FP8 checkpoints (``lm_head`` is in their
``ignore`` list). ``quantize`` works on weights on the card, in estimate-only mode too (the
scales are then computed by kernels that are costed, not run: the layouts and bytes are exact).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch


class QuantError(Exception):
    """A scheme the card cannot run, or torchao missing; said in one line."""


@dataclass(frozen=True)
class Scheme:
    name: str
    weights: str          # what a weight is stored as on the card
    activations: str      # what the matmul's activation operand is
    matmul: str           # the card kernel each linear becomes
    config: Callable[[torch.dtype], Any]     # torchao's config for weights of this dtype
    static: bool = False  # activation scales calibrated before quantising (the config given one per linear)


def _import_torchao() -> Any:
    """torchao, imported quietly: its wheel ships CUDA kernels that cannot load on this machine
    and says so once per library (harmless here: the card's kernels are vspyre's)."""
    logs = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]   # and its pytree deprecation
    levels = [lg.level for lg in logs]
    for lg in logs:
        lg.setLevel(logging.ERROR)
    try:
        import torchao.quantization as q
    except ImportError as e:
        raise QuantError(f"quantisation needs torchao ({e}); install it with `pip install 'vspyre[quant]'` "
                         "(torchao 0.18.0)") from None
    finally:
        for lg, lv in zip(logs, levels):
            lg.setLevel(lv)
    return q


def _fp8(dtype: torch.dtype) -> Any:
    """Per row for bfloat16 weights; torchao's per-row fp8 takes bfloat16 weights only, so other
    dtypes get one scale per tensor (weights and activations)."""
    q = _import_torchao()
    gran = q.PerRow() if dtype == torch.bfloat16 else q.PerTensor()
    return q.Float8DynamicActivationFloat8WeightConfig(granularity=gran, set_inductor_config=False)


def _fp8_static(dtype: torch.dtype) -> Any:
    """The static config without its activation scale: :func:`quantize` calibrates one per linear."""
    q = _import_torchao()
    return q.Float8StaticActivationFloat8WeightConfig(granularity=q.PerTensor(), set_inductor_config=False)


def _w8a8(dtype: torch.dtype) -> Any:
    q = _import_torchao()
    return q.Int8DynamicActivationInt8WeightConfig(set_inductor_config=False)


def _w4a16(dtype: torch.dtype) -> Any:
    q = _import_torchao()
    return q.IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=q.PerGroup(128))


SCHEMES: dict[str, Scheme] = {
    "fp8": Scheme("fp8", "float8_e4m3fn, one fp32 scale per output channel",
                  "float8_e4m3fn, one scale per token (dynamic)", "_scaled_mm at the fp8 rate, scales in the epilogue",
                  _fp8),
    "fp8-static": Scheme("fp8-static", "float8_e4m3fn, one fp32 scale per tensor",
                         "float8_e4m3fn, one scale per tensor calibrated offline (static: no reduction at run time)",
                         "_scaled_mm at the fp8 rate, scales in the epilogue", _fp8_static, static=True),
    "w8a8": Scheme("w8a8", "int8, one scale per output channel", "int8, one scale per token (dynamic, symmetric)",
                   "_int_mm at the int8 rate, then the dequantisation", _w8a8),
    "w4a16": Scheme("w4a16", "int4 in groups of 128 (torchao's portable layout: one value per int8 byte), "
                    "one fp16 scale per group", "the model's 16-bit dtype",
                    "dequantise, then a 16-bit matmul (Inductor fuses the two)", _w4a16),
}


def scheme(name: str) -> Scheme:
    try:
        return SCHEMES[name]
    except KeyError:
        raise QuantError(f"unknown quantisation {name!r}; one of {', '.join(SCHEMES)}") from None


def _skipped(fqn: str, skip: tuple[str, ...]) -> bool:
    return any(fqn == s or fqn.endswith("." + s) for s in skip)


def quantize(model: torch.nn.Module, name: str, skip: tuple[str, ...] = ("lm_head",),
             calibration: torch.Tensor | Callable[[torch.nn.Module], Any] | None = None) -> int:
    """Quantise ``model``'s linears in place with scheme ``name`` (torchao's ``quantize_``), all
    but those named in ``skip``; returns how many were quantised. A static scheme first runs
    ``calibration`` through the model (token ids, or a function of the model), by default 64
    random token ids of the model's vocabulary."""
    sch = scheme(name)
    q = _import_torchao()
    todo = [fqn for fqn, m in model.named_modules() if isinstance(m, torch.nn.Linear) and not _skipped(fqn, skip)]
    if not todo:
        raise QuantError(f"{type(model).__name__} has no linear layers to quantise with {name}")
    chosen = set(todo)
    dtype = model.get_submodule(todo[0]).weight.dtype
    from ._torchao import card_hardware_check
    with card_hardware_check(model):
        if sch.static:
            _quantize_static(model, todo, calibration)
        else:
            q.quantize_(model, sch.config(dtype), filter_fn=lambda m, fqn: fqn in chosen)
    return len(todo)


def calibration_ids(vocab_size: int) -> torch.Tensor:
    """The default calibration of a static scheme: 64 random token ids (seeded), ``[1, 64]``."""
    return torch.randint(0, vocab_size, (1, 64), generator=torch.Generator().manual_seed(0))


def _calibrate(model: torch.nn.Module, calibration: Any) -> None:
    if callable(calibration):
        calibration(model)
        return
    if calibration is None:
        vocab = getattr(getattr(model, "config", None), "vocab_size", None)
        if vocab is None:
            raise QuantError(f"a static scheme needs calibration inputs for a {type(model).__name__} "
                             "(no config.vocab_size to draw token ids from): pass calibration=")
        calibration = calibration_ids(vocab)
    device = next(model.parameters()).device
    model(input_ids=calibration.to(device))


def _quantize_static(model: torch.nn.Module, todo: list[str], calibration: Any) -> None:
    """Calibrate each linear's activation scale with torchao's min-max observer, then quantise
    it with that scale."""
    from ._torchao import quantize_static_fp8, static_observer
    observers = {fqn: static_observer() for fqn in todo}
    hooks = [model.get_submodule(fqn).register_forward_pre_hook(lambda _, args, o=observers[fqn]: o(args[0]))
             for fqn in todo]
    try:
        with torch.no_grad():
            _calibrate(model, calibration)
    finally:
        for h in hooks:
            h.remove()
    for fqn in todo:
        obs = observers[fqn]
        if getattr(obs, "min_val", None) is None:
            raise QuantError(f"{fqn}: the calibration inputs never reached this linear (no activation scale)")
        scale, _ = obs.calculate_qparams()
        quantize_static_fp8(model.get_submodule(fqn), scale.detach())
    # the calibration re-laid the 16-bit weights just replaced (quantising read them as stored, so
    # each held a copy): freed with them now, not at the runtime's next miss
    from ..runtime import relayout
    relayout.sweep()


def inner_tensors(t: torch.Tensor) -> Iterator[torch.Tensor]:
    """The plain tensors holding a (possibly torchao-quantised) tensor's bytes: its inner tensors,
    recursively, or the tensor itself."""
    inner = t.data if isinstance(t, torch.nn.Parameter) else t
    if type(inner) is not torch.Tensor and hasattr(inner, "__tensor_flatten__"):
        names, _ = inner.__tensor_flatten__()
        for n in names:
            if isinstance(getattr(inner, n), torch.Tensor):
                yield from inner_tensors(getattr(inner, n))
    else:
        yield t


def stored_bytes(t: torch.Tensor) -> int:
    """Bytes a (possibly torchao-quantised) tensor holds: the sum over its inner tensors."""
    return sum(i.numel() * i.element_size() for i in inner_tensors(t))


def allocated_bytes(t: torch.Tensor) -> int:
    """Device bytes a (possibly torchao-quantised) tensor takes: each inner tensor rounded up to
    whole sticks, as the card's allocator gives them (a 4-byte per-tensor scale takes one stick)."""
    stick = torch.spyre.get_device_properties().stick_bytes
    return sum(-(-i.numel() * i.element_size() // stick) * stick for i in inner_tensors(t))


_linear_cache: dict[tuple, int] = {}


def linear_weight_bytes(out_features: int, in_features: int, dtype: torch.dtype, name: str) -> int:
    """Device bytes one ``[out, in]`` linear weight takes once quantised with ``name`` (quantised
    on the card in estimate-only mode: torchao's own layout, no values, no memory kept; each inner
    tensor in whole sticks)."""
    key = (out_features, in_features, dtype, name)
    if key not in _linear_cache:
        with torch.spyre.estimate_only(True), torch.no_grad():
            lin = torch.nn.Linear(in_features, out_features, bias=False, device="meta", dtype=dtype)
            lin = lin.to_empty(device="spyre")
            quantize(lin, name, skip=(), calibration=lambda m: m(torch.zeros(1, 1, in_features, dtype=dtype,
                                                                               device="spyre")))
            _linear_cache[key] = allocated_bytes(lin.weight)
            del lin
    return _linear_cache[key]



def quantized_linears(model: torch.nn.Module, skip: tuple[str, ...] = ("lm_head",)) -> list[tuple[str, torch.nn.Linear]]:
    """The linears :func:`quantize` quantises (all but those named in ``skip``)."""
    return [(fqn, m) for fqn, m in model.named_modules() if isinstance(m, torch.nn.Linear) and not _skipped(fqn, skip)]


def model_weight_bytes(model: torch.nn.Module, name: str, skip: tuple[str, ...] = ("lm_head",)) -> int:
    """Bytes of ``model``'s parameters and buffers once quantised with ``name`` (``model``
    unquantised, on any device, the meta device too): each quantised linear's weight in torchao's
    layout, everything else (embeddings, norms, biases, the LM head, buffers) as it is; a
    parameter shared by two modules counts once."""
    scheme(name)
    quantised = {id(m.weight): m for _, m in quantized_linears(model, skip)}
    total, seen = 0, set()
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        lin = quantised.get(id(p))
        total += (linear_weight_bytes(lin.out_features, lin.in_features, p.dtype, name) if lin is not None
                  else p.numel() * p.element_size())
    return total + sum(b.numel() * b.element_size() for b in model.buffers())


def describe(name: str, dtype: torch.dtype) -> dict[str, str]:
    """What a report says about scheme ``name`` on a model of ``dtype``."""
    s = scheme(name)
    return {"scheme": s.name, "weights": s.weights, "activations": s.activations, "matmul": s.matmul,
            "not quantised": f"the LM head, embeddings and norms ({str(dtype).removeprefix('torch.')}); "
                             f"the KV cache ({str(dtype).removeprefix('torch.')})",
            "library": "torchao 0.18 (vspyre.quant)"}
