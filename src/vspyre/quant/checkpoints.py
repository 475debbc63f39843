"""FP8 checkpoints in the compressed-tensors layout, loaded onto the card as fp8.

The FP8 checkpoints the real stack serves (``ibm-granite/granite-3.x-8b-instruct-FP8``, served
with static scaling per ``../shared/spyre-hardware.md``, and the other llm-compressor models) are
written by compressed-tensors. Its ``FP8_DYNAMIC`` layout:

* ``config.json`` has a ``quantization_config`` with ``quant_method: "compressed-tensors"``,
  ``format: "float-quantized"``, ``quantization_status: "compressed"``, one config group
  targeting ``Linear`` with ``weights`` ``{type: float, num_bits: 8, strategy: channel,
  symmetric: true, dynamic: false}`` and ``input_activations`` ``{type: float, num_bits: 8,
  strategy: token, symmetric: true, dynamic: true}``, and ``ignore: ["lm_head"]``;
* the safetensors hold, for each targeted linear ``<m>``, ``<m>.weight`` as ``F8_E4M3
  [out, in]`` and ``<m>.weight_scale`` as ``[out, 1]`` in the model's dtype (``BF16``): the
  weight is ``weight.float() * weight_scale``. There are no activation scales (they are
  computed per token at run time) and no zero points (symmetric). Everything else (embeddings,
  norms, the LM head) is stored as usual in the model's dtype.

:func:`load_fp8_checkpoint` builds the model with transformers (its compressed-tensors
quantizer, which loads those tensors as they are), then makes each quantised linear's weight
torchao's ``Float8Tensor`` on the card from the checkpoint's own fp8 values and scales (the
scales cast to float32, exactly; nothing is quantised again), with dynamic per-token fp8
activations: each linear is then the card's fp8 ``torch._scaled_mm``, in eager mode and through
both compilers. A per-tensor weight scale (``strategy: tensor``) is spread over the rows (the
same values).

**Static activation scales** (llm-compressor's ``FP8`` scheme, the static scaling the real FP8
Granite checkpoints are served with): weights and activations both ``strategy: tensor``, the
activations ``dynamic: false``, and each linear's ``<m>.input_scale`` (one value, calibrated
offline) beside its ``weight_scale``. Such a weight becomes torchao's static fp8 tensor: the
input is divided by its fixed scale and cast to fp8 with no reduction over the activations at
run time, then the same ``_scaled_mm``. torchao's static fp8 takes one scale per tensor for both
operands, so per-channel weights with static activations are refused.

Other layouts are refused before anything is loaded, naming the tensor, its dtype and shape:
block-wise or group-wise scales, static activation scales other than per tensor, asymmetric zero
points, int8/int4 (``int-quantized``, ``pack-quantized``), NVFP4/MXFP4, weight-only fp8,
quantised KV caches.

compressed-tensors and transformers internals are all in ``_compressed_tensors.py``, torchao's in
``_torchao.py``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

import torch

from . import QuantError

FLOAT_FORMATS = ("float-quantized", "naive-quantized")   # naive-quantized: the same bytes, the generic name
_SCALE_DTYPES = ("BF16", "F16", "F32")
# tensors other layouts hold beside a quantised weight, and what each means
_OTHER_LAYOUTS = {
    "weight_zero_point": "a weight zero point (asymmetric weights): the card's fp8 _scaled_mm is symmetric",
    "input_zero_point": "an activation zero point (asymmetric activations): the card's fp8 _scaled_mm is symmetric",
    "weight_packed": "packed integer weights (pack-quantized, e.g. int4 in int32 words), not fp8",
    "weight_shape": "packed integer weights (pack-quantized, e.g. int4 in int32 words), not fp8",
    "weight_global_scale": "a global scale (NVFP4-style tensor-group quantisation), not fp8 per channel",
    "k_scale": "a quantised KV cache (kv_cache_scheme)",
    "v_scale": "a quantised KV cache (kv_cache_scheme)",
}


class CheckpointError(QuantError):
    """A checkpoint whose layout the card's fp8 loader does not take; names the tensor, dtype, shape."""


@dataclass(frozen=True)
class Layout:
    """How one quantised linear of a checkpoint is scaled."""
    weights: str          # "channel" (a scale per output channel) or "tensor" (one scale)
    activations: str      # "token" (dynamic, a scale per token at run time) or "static" (one, calibrated)


def _header(path: str) -> dict[str, tuple[str, list[int]]]:
    """``name -> (safetensors dtype, shape)`` of every tensor of the checkpoint, from the files'
    headers (no tensor is read)."""
    from safetensors import safe_open
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no .safetensors files")
    out: dict[str, tuple[str, list[int]]] = {}
    for name in files:
        with safe_open(os.path.join(path, name), "pt") as f:
            for k in f.keys():
                s = f.get_slice(k)
                out[k] = (s.get_dtype(), list(s.get_shape()))
    return out


def _show(header: dict, key: str) -> str:
    dt, shape = header[key]
    return f"{key} ({dt} {shape})"


def _first(header: dict, suffix: str) -> str | None:
    for k in sorted(header):
        if k.endswith("." + suffix):
            return k
    return None


def _example(header: dict, suffix: str) -> str:
    k = _first(header, suffix)
    return f", e.g. {_show(header, k)}" if k else ""


def _example_scaled(header: dict) -> str:
    k = _first(header, "weight_scale")
    return f", e.g. {_show(header, k[: -len('_scale')])}" if k and k[: -len("_scale")] in header else ""


def check_layout(path: str) -> dict[str, Layout]:
    """Check that the checkpoint at ``path`` is a compressed-tensors FP8 layout the card loads
    (per-channel or per-tensor fp8 weights with dynamic per-token fp8 activations, or per-tensor
    weights with static per-tensor activation scales); returns ``module name -> Layout`` for its
    quantised linears. Raises :class:`CheckpointError` naming what differs."""
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    qc = config.get("quantization_config")
    if not qc:
        raise CheckpointError(f"{path}: config.json has no quantization_config (not a quantised checkpoint)")
    method = qc.get("quant_method")
    if method != "compressed-tensors":
        raise CheckpointError(f"{path}: quantization_config.quant_method is {method!r}; the card's fp8 loader "
                              "takes compressed-tensors checkpoints (quant_method 'compressed-tensors')")
    header = _header(path)
    for key in ("sparsity_config", "transform_config"):
        if qc.get(key):
            raise CheckpointError(f"{path}: quantization_config.{key} is set ({sorted(qc[key])}): sparse or "
                                  "transformed (rotated) checkpoints are not supported")

    from ._compressed_tensors import parse_config
    try:
        cfg = parse_config(qc)
    except ValueError as e:                   # pydantic's ValidationError: compressed-tensors' own checks
        errors = e.errors() if hasattr(e, "errors") else [{"msg": str(e)}]
        raise CheckpointError(f"{path}: compressed-tensors refuses its quantization_config: "
                              f"{errors[0]['msg']}") from None
    if cfg.kv_cache_scheme is not None:
        raise CheckpointError(f"{path}: kv_cache_scheme is set (a quantised KV cache{_example(header, 'k_scale')}); "
                              "the card's fp8 loader keeps the KV cache in the model's dtype")
    static: set[bool] = set()
    for gname, g in cfg.config_groups.items():
        where = f"{path}: config group {gname!r} (targets {g.targets})"
        fmt = g.format or cfg.format
        w, a = g.weights, g.input_activations
        if w is None:
            raise CheckpointError(f"{where} quantises no weights")
        if w.type != "float" or w.num_bits != 8:
            raise CheckpointError(
                f"{where}: {w.type} {w.num_bits}-bit weights (format {fmt!r}"
                f"{_example(header, 'weight_packed') or _example_scaled(header)}); the card's fp8 loader "
                "takes float8_e4m3fn weights only (use vspyre.quant.quantize for int8/int4 schemes)")
        if fmt not in FLOAT_FORMATS:
            raise CheckpointError(f"{where}: format {fmt!r}; the card's fp8 loader takes {' or '.join(FLOAT_FORMATS)}")
        if not w.symmetric:
            raise CheckpointError(f"{where}: asymmetric weights{_example(header, 'weight_zero_point')}: "
                                  "the card's fp8 _scaled_mm is symmetric")
        if w.strategy not in ("channel", "tensor"):
            kind = getattr(w.strategy, "value", w.strategy)
            detail = {"block": f"blocks of {w.block_structure}", "group": f"groups of {w.group_size}"}.get(kind, kind)
            raise CheckpointError(
                f"{where}: {kind}-wise weight scales ({detail}{_example(header, 'weight_scale')}); the card's "
                "_scaled_mm takes one scale per output channel or per tensor")
        if a is None:
            raise CheckpointError(f"{where}: weight-only fp8 (no input_activations); the card's fp8 loader runs "
                                  "fp8 activations (dynamic, per token)")
        if a.type != "float" or a.num_bits != 8 or not a.symmetric:
            raise CheckpointError(f"{where}: activations {'symmetric' if a.symmetric else 'asymmetric'} "
                                  f"{a.type} {a.num_bits}-bit; the card's fp8 loader takes symmetric fp8 activations")
        kind = getattr(a.strategy, "value", a.strategy)
        if a.dynamic is True:
            if kind != "token":
                raise CheckpointError(f"{where}: dynamic activations scaled per {kind}; the card's fp8 loader takes "
                                      "dynamic per-token activation scales (strategy 'token')")
        elif a.dynamic is False:
            if kind != "tensor":
                raise CheckpointError(
                    f"{where}: static activation scales per {kind}{_example(header, 'input_scale')}; the card's fp8 "
                    "loader takes static scales per tensor (strategy 'tensor') or dynamic ones per token")
            wkind = getattr(w.strategy, "value", w.strategy)
            if wkind != "tensor":
                raise CheckpointError(
                    f"{where}: static activation scales with {wkind}-wise weight "
                    f"scales{_example(header, 'weight_scale')}: torchao's static fp8 takes one scale per tensor for "
                    "both operands (weights strategy 'tensor')")
        else:
            raise CheckpointError(f"{where}: input_activations.dynamic = {a.dynamic!r} (locally computed scales); "
                                  "the card's fp8 loader takes static per-tensor or dynamic per-token scales")
        static.add(a.dynamic is False)
        if g.output_activations is not None:
            raise CheckpointError(f"{where}: quantised output activations are not supported")

    if len(static) > 1:
        raise CheckpointError(f"{path}: config groups with static and with dynamic activation scales; the card's fp8 "
                              "loader takes one kind per checkpoint")
    is_static = static == {True}
    # the tensors themselves
    for k in sorted(header):
        suffix = k.rsplit(".", 1)[-1]
        if suffix in _OTHER_LAYOUTS:
            raise CheckpointError(f"{path}: {_show(header, k)} is {_OTHER_LAYOUTS[suffix]}")
    layouts: dict[str, Layout] = {}
    for k in sorted(header):
        if not k.endswith(".weight_scale"):
            continue
        mod = k[: -len(".weight_scale")]
        wk = mod + ".weight"
        if wk not in header:
            raise CheckpointError(f"{path}: {_show(header, k)} has no {wk} beside it")
        wdt, wshape = header[wk]
        sdt, sshape = header[k]
        if wdt != "F8_E4M3" or len(wshape) != 2:
            raise CheckpointError(f"{path}: {_show(header, wk)}: the card's fp8 loader takes 2-D float8_e4m3fn "
                                  "(F8_E4M3) linear weights")
        if sdt not in _SCALE_DTYPES:
            raise CheckpointError(f"{path}: {_show(header, k)}: a weight scale in {'/'.join(_SCALE_DTYPES)} expected")
        n = math.prod(sshape)
        if sshape == [wshape[0], 1]:
            wscale = "channel"
        elif n == 1 and len(sshape) <= 2:
            wscale = "tensor"
        else:
            raise CheckpointError(
                f"{path}: {_show(header, k)} for the weight {_show(header, wk)}: the card's _scaled_mm takes one "
                f"scale per output channel ([{wshape[0]}, 1]) or one per tensor (block-wise or group-wise scales "
                "are not supported)")
        ik = mod + ".input_scale"
        if is_static:
            if ik not in header:
                raise CheckpointError(f"{path}: {_show(header, wk)} has no {ik} beside it (static activation scales "
                                      "are one calibrated value per linear)")
            idt, ishape = header[ik]
            if idt not in _SCALE_DTYPES or math.prod(ishape) != 1 or len(ishape) > 2:
                raise CheckpointError(f"{path}: {_show(header, ik)}: one static activation scale per linear in "
                                      f"{'/'.join(_SCALE_DTYPES)} expected")
        elif ik in header:
            raise CheckpointError(f"{path}: {_show(header, ik)} is a static activation scale, but the config's "
                                  "input_activations are dynamic")
        layouts[mod] = Layout(wscale, "static" if is_static else "token")
    for k, (dt, shape) in header.items():
        if dt.startswith("F8") and k.rsplit(".", 1)[0] not in layouts:
            raise CheckpointError(f"{path}: {_show(header, k)} is an fp8 tensor without a weight_scale beside it")
        if k.endswith(".input_scale") and k[: -len(".input_scale")] not in layouts:
            raise CheckpointError(f"{path}: {_show(header, k)} is a static activation scale without an fp8 weight")
    if not layouts:
        raise CheckpointError(f"{path}: no fp8 weights (no tensor named <module>.weight_scale)")
    return layouts


def _model_dtype(path: str) -> torch.dtype:
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    name = cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
    dt = getattr(torch, name, None)
    if dt not in (torch.bfloat16, torch.float16, torch.float32):
        raise CheckpointError(f"{path}: config.json dtype {name!r}; bfloat16, float16 or float32 expected")
    return dt


def _to_keeping_ties(model: torch.nn.Module, device: str | torch.device) -> None:
    """``model.to(device)``, parameters shared by several modules (a tied embedding and LM head,
    as Granite's) still shared after it: ``Module.to`` keeps a shared parameter shared only when it
    can swap its data in place, which it cannot from a CPU tensor to a card tensor (their
    TensorImpls differ), so each module would get its own copy."""
    shared: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        shared.setdefault(id(p), []).append(name)
    model.to(device)
    for names in shared.values():
        first = model.get_parameter(names[0])
        for name in names[1:]:
            owner, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner), attr, first)


def load_fp8_checkpoint(path: str | os.PathLike, device: str | torch.device = "spyre",
                        dtype: torch.dtype | None = None) -> torch.nn.Module:
    """The compressed-tensors FP8 checkpoint at ``path`` (a local directory: nothing is
    downloaded) as a transformers model on ``device``, in eval mode: each quantised linear's
    weight is a torchao fp8 tensor holding the checkpoint's fp8 values (1 byte per weight) and its
    scales as float32, so each of those linears runs as fp8 ``torch._scaled_mm``: ``Float8Tensor``
    with scales ``[out, 1]`` and dynamic per-token fp8 activations, or, for static activation
    scales, ``PrototypeFloat8Tensor`` with one weight scale ``[1, 1]`` and the calibrated
    activation scale ``[1, 1, 1]``. Everything else (embeddings, norms, the LM head the checkpoint
    ignores) is in ``dtype`` (default: the checkpoint's ``dtype``, bfloat16)."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: not a checkpoint directory (load_fp8_checkpoint reads local files only)")
    layouts = check_layout(path)
    dtype = dtype or _model_dtype(path)

    from . import _compressed_tensors as ct, _import_torchao
    from ._torchao import float8_weight, float8_weight_static
    _import_torchao()                                             # quietly (its CUDA kernels' load messages)
    model = ct.load_compressed(path, dtype)
    mods = ct.quantized_modules(model)
    found = {n for n, _, _ in mods}
    if found != set(layouts):
        missing, extra = sorted(set(layouts) - found), sorted(found - set(layouts))
        raise CheckpointError(f"{path}: the modules the config quantises and the checkpoint's weight scales differ "
                              f"(scales but not quantised: {missing[:4]}; quantised but no scales: {extra[:4]})")
    taken: list[tuple[torch.nn.Module, torch.Tensor, torch.Tensor | None]] = []
    for name, m, _ in mods:
        w, s = m.weight, getattr(m, "weight_scale", None)
        if not isinstance(m, torch.nn.Linear):
            raise CheckpointError(f"{path}: {name} is a {type(m).__name__}; the card's fp8 loader quantises linears")
        if w.dtype != torch.float8_e4m3fn or tuple(w.shape) != (m.out_features, m.in_features) or s is None:
            raise CheckpointError(f"{path}: {name}.weight loaded as {w.dtype} {list(w.shape)} "
                                  f"(scale {None if s is None else list(s.shape)}); float8_e4m3fn "
                                  f"[{m.out_features}, {m.in_features}] with a weight_scale expected")
        scale = s.detach().to(torch.float32)                       # exact: bf16/fp16 scales are fp32 values
        act = None
        if layouts[name].activations == "static":
            a = getattr(m, "input_scale", None)
            if a is None or a.numel() != 1:
                raise CheckpointError(f"{path}: {name}.input_scale loaded as "
                                      f"{None if a is None else list(a.shape)}; one static activation scale expected")
            scale, act = scale.reshape(1, 1), a.detach().to(torch.float32).reshape(1, 1, 1)
        else:
            scale = scale.reshape(-1, 1)
            if layouts[name].weights == "tensor":
                scale = scale.expand(m.out_features, 1)
        taken.append((m, scale.contiguous(), act))
    ct.release(model, [m for m, _, _ in taken])
    model.eval()
    _to_keeping_ties(model, device)
    with torch.no_grad():
        for m, scale, act in taken:
            qdata = m.weight.data                                 # the checkpoint's fp8 bytes, now on the device
            scale = scale.to(qdata.device)
            w = float8_weight(qdata, scale, dtype) if act is None else \
                float8_weight_static(qdata, scale, act.to(qdata.device), dtype)
            m.weight = torch.nn.Parameter(w, requires_grad=False)
    left = [n for n, p in model.named_parameters() if p.dtype == torch.float8_e4m3fn and type(p.data) is torch.Tensor]
    if left:
        raise CheckpointError(f"{path}: fp8 parameters left unconverted: {left[:4]}")
    return model


FP8_WEIGHTS = ("Float8Tensor", "PrototypeFloat8Tensor")    # torchao's dynamic and static fp8 weights


def fp8_linears(model: torch.nn.Module) -> list[str]:
    """Names of ``model``'s linears whose weight is a torchao fp8 tensor (dynamic or static)."""
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
            and type(m.weight.data).__name__ in FP8_WEIGHTS]
