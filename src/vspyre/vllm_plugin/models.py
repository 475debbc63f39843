"""The models the plugin serves: transformers' own decoder implementations, with attention over
the paged KV cache.

transformers lets a backend plug in its attention (``AttentionInterface``): every decoder layer
then calls :func:`paged_attention_forward` with its queries, keys and values after the family's
own projections, norms and rotary embedding (Llama's, Granite's multipliers, Qwen's biases and
q/k norms, Mistral's sliding window all stay transformers' code). The function hands them to
``torch.ops.spyre.paged_attention`` with the step's block tables (the keyword argument
``spyre_paged`` the model runner passes through the model's forward: one part for the step's
decodes, one for its prefill chunks), which writes the new keys and values into
the layer's cache blocks and attends over them on the card. No causal mask is built: a backend
not in transformers' mask registry gets none, and the op masks by position itself.
"""

from __future__ import annotations

from typing import Any

import torch

ATTN_IMPLEMENTATION = "spyre_paged"

# transformers model_type -> what the family brings that the plugin handles
SUPPORTED_FAMILIES = {
    "llama": "RoPE (and Llama-3 rope scaling), RMSNorm, SwiGLU, grouped-query attention",
    "granite": "Llama-like with embedding/attention/residual/logit multipliers",
    "mistral": "Llama-like with a sliding attention window",
    "qwen2": "Llama-like with q/k/v biases and per-layer sliding windows",
    "qwen3": "Llama-like with q/k RMSNorm",
}


class UnsupportedModelError(ValueError):
    """A model the plugin refuses at start-up (the message names the family or feature)."""


def check_family(hf_config: Any) -> None:
    mt = getattr(hf_config, "model_type", None)
    if mt not in SUPPORTED_FAMILIES:
        raise UnsupportedModelError(
            f"vspyre vLLM plugin: model family {mt!r} ({', '.join(getattr(hf_config, 'architectures', None) or [])}) "
            f"is not supported; supported decoder families: {', '.join(sorted(SUPPORTED_FAMILIES))}")
    if getattr(hf_config, "num_experts", 0) or getattr(hf_config, "num_local_experts", 0):
        raise UnsupportedModelError(f"vspyre vLLM plugin: mixture-of-experts models ({mt}) are not supported")


def geometry(hf_config: Any) -> tuple[int, int, int]:
    """(layers, kv heads, head dim) of a decoder config."""
    heads = hf_config.num_attention_heads
    kvh = getattr(hf_config, "num_key_value_heads", None) or heads
    hd = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    return hf_config.num_hidden_layers, kvh, hd


def paged_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: Any, scaling: float | None = None, dropout: float = 0.0,
                            sliding_window: int | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention signature (``query`` ``[1, heads, tokens, head_dim]``, the step's
    tokens flattened into one row) -> ``[1, tokens, heads, head_dim]``."""
    meta = kwargs.get("spyre_paged")
    if meta is None:
        raise RuntimeError(f"{ATTN_IMPLEMENTATION} attention runs only inside the vspyre vLLM model runner "
                           "(it needs the step's block table: the spyre_paged keyword argument)")
    if dropout:
        raise ValueError(f"{ATTN_IMPLEMENTATION} attention: dropout={dropout} (inference only)")
    k_cache, v_cache = meta["kv_caches"][module.layer_idx]
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    outs, t0 = [], 0
    bounds = meta.get("max_query_len", (0,) * len(meta["parts"]))
    for (slot_mapping, block_table, query_start_loc, seq_lens), qmax in zip(meta["parts"], bounds):
        if block_table.shape[0] == 0:              # a part with no sequence (static batching's graphs)
            continue
        t1 = t0 + slot_mapping.shape[0]              # the step's decodes, then its chunks
        outs.append(torch.ops.spyre.paged_attention(q[t0:t1], k[t0:t1], v[t0:t1], k_cache, v_cache, slot_mapping,
                                                    block_table, query_start_loc, seq_lens, scale,
                                                    int(sliding_window or 0), int(qmax)))
        t0 = t1
    return torch.cat(outs).unsqueeze(0), None


CALIBRATION_ATTENTION = "spyre_calibration"


def calibration_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                                  value: torch.Tensor, attention_mask: Any, scaling: float | None = None,
                                  dropout: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Causal attention over one sequence without a KV cache, for a calibration pass at load
    (before the engine has block tables): PyTorch's SDPA, causal by itself, so no mask is built
    (like the paged backend, it is not in transformers' mask registry: a mask would be built from
    values an estimate-only card does not have). A sliding window is not applied: the pass is
    shorter than any window the families have."""
    groups = query.shape[1] // key.shape[1]
    k, v = (t.repeat_interleave(groups, dim=1) for t in (key, value))
    out = torch.nn.functional.scaled_dot_product_attention(query, k, v, is_causal=True, scale=scaling)
    return out.transpose(1, 2), None


def register_attention() -> None:
    from transformers import AttentionInterface

    import vspyre.runtime.paged  # noqa: F401 - defines torch.ops.spyre.paged_attention
    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
    AttentionInterface.register(CALIBRATION_ATTENTION, calibration_attention_forward)


def load(path: str, dtype: torch.dtype, device: torch.device, revision: str | None = None,
         weights: bool = True) -> torch.nn.Module:
    """The causal LM in ``path`` (config.json + safetensors), weights on ``device``, attention paged.
    ``weights=False`` (estimate-only mode: the card accounts memory but holds no values) builds the
    model from its config alone on the meta device and gives it device memory without values; the
    directory then needs only ``config.json``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    register_attention()
    cfg = AutoConfig.from_pretrained(path, revision=revision)
    check_family(cfg)
    if not weights:
        cfg._attn_implementation = ATTN_IMPLEMENTATION
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION)
        return _retie(model.eval().to_empty(device=device))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION,
                                                 revision=revision)
    return _retie(model.eval().to(device))


def _retie(model: torch.nn.Module) -> torch.nn.Module:
    """Moving a module to another device type makes new parameters per module, so an embedding
    tied to the LM head (Granite's) would sit on the card twice: tie it again."""
    model.tie_weights()
    return model
