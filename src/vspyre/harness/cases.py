"""The model registry of ``vspyre compare``: the built-in suite, decode cases, user models.

Decode cases (``*-decode``) run greedy ``generate()`` through the compiled forward, so the sequence
length changes on every step (prefill, then one token at a time with a growing KV cache).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

from . import models
from .models import ModelCase


def llama_decode(batch: int = 1, seq: int = 8, max_new_tokens: int = 4, seed: int = 0) -> ModelCase:
    """Tiny Llama, greedy decode with the KV cache (lengths vary every step)."""
    case = models.tiny_llama_generate(batch=batch, seq=seq, max_new_tokens=max_new_tokens, seed=seed)
    return dataclasses.replace(case, name="llama-decode")


def gpt2_decode(batch: int = 1, seq: int = 8, max_new_tokens: int = 4, seed: int = 0) -> ModelCase:
    """Tiny GPT-2, greedy decode without a KV cache (the whole prefix every step)."""
    case = models.tiny_gpt2(batch=batch, seq=seq, seed=seed)
    return dataclasses.replace(case, name="gpt2-decode", max_new_tokens=max_new_tokens)


DECODE: dict[str, Callable[..., ModelCase]] = {"llama-decode": llama_decode, "gpt2-decode": gpt2_decode}
REGISTRY: dict[str, Callable[..., ModelCase]] = {**models.SUITE, **DECODE}
SUITES: dict[str, list[str]] = {
    "default": list(models.DEFAULT_SUITE) + list(DECODE),
    "forward": list(models.DEFAULT_SUITE),
    "decode": list(DECODE),
    "smoke": ["gpt2", "resnet", "llama-decode"],
}


# ViT's position embeddings are sized for its image size: vary only the batch.
FIXED_IMAGE_SIZE = {"vit"}


def build(name: str, **kw: Any) -> ModelCase:
    if name in REGISTRY:
        return REGISTRY[name](**kw)
    return models.get_case(name, **kw)


def variants(name: str) -> list[tuple[str, dict[str, Any]]]:
    """Shape variants used to count recompiles: one call with another batch *and* another sequence
    length (or image size) -- one variant, not two, because each recompile is a full compile."""
    kw: dict[str, Any] = {}
    try:
        fn = REGISTRY[name] if name in REGISTRY else models._import_target(name)
        defaults = {k: v.default for k, v in inspect.signature(fn).parameters.items()
                    if v.default is not inspect.Parameter.empty}
    except Exception:
        return []
    if isinstance(defaults.get("batch"), int):
        kw["batch"] = defaults["batch"] + 1
    if isinstance(defaults.get("seq"), int):
        kw["seq"] = defaults["seq"] + max(1, defaults["seq"] // 2)
    elif isinstance(defaults.get("image_size"), int) and name not in FIXED_IMAGE_SIZE:
        kw["image_size"] = defaults["image_size"] * 2
    return [(",".join(f"{k}={v}" for k, v in kw.items()), kw)] if kw else []
