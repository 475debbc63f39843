"""Tiny checkpoints on disk, as ``save_pretrained`` writes them: what a server loads.

``write(DIR, family)`` writes a decoder of one of the served families (Llama, Granite, Mistral,
Qwen2, Qwen3) at tiny size with random weights (config.json + model.safetensors), and a tokenizer
built here (byte-level BPE over the 256 bytes, no merges: any text encodes, nothing is
downloaded), so ``vllm serve DIR`` and ``vllm bench serve --tokenizer DIR`` work offline.
``vspyre make-model DIR --family llama`` is the command.
"""

from __future__ import annotations

import os
from typing import Any

import torch

FAMILIES = ("llama", "granite", "mistral", "qwen2", "qwen3")

# one shape for every family: 2 layers, width 128, 4 query heads over 2 KV heads (GQA), head 32
_COMMON = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=512, max_position_embeddings=2048, rms_norm_eps=1e-5,
               bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)


def config(family: str, **overrides: Any) -> Any:
    """The tiny config of ``family`` (transformers' config class), with ``overrides``."""
    import transformers as tf

    kw = dict(_COMMON)
    if family == "llama":
        cls = tf.LlamaConfig
        kw["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 256}
    elif family == "granite":
        cls = tf.GraniteConfig
        kw.update(embedding_multiplier=12.0, attention_multiplier=0.0078125, residual_multiplier=0.22,
                  logits_scaling=8.0)
    elif family == "mistral":
        cls = tf.MistralConfig
        kw.update(sliding_window=48, head_dim=32)
    elif family == "qwen2":
        cls = tf.Qwen2Config
        kw.update(use_sliding_window=False)
    elif family == "qwen3":
        cls = tf.Qwen3Config
        kw.update(head_dim=32)
    else:
        raise ValueError(f"unknown family {family!r}: one of {', '.join(FAMILIES)}")
    kw.update(overrides)
    return cls(**kw)


def tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE tokenizer with no merges (ids 0-2: <pad>, <s>, </s>; then the 256 bytes)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {t: i for i, t in enumerate(specials + sorted(alphabet))}
    if len(vocab) > vocab_size:
        raise ValueError(f"the byte tokenizer needs {len(vocab)} ids; the model has {vocab_size}")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token=None, model_max_length=_COMMON["max_position_embeddings"])


def write(path: str | os.PathLike, family: str = "llama", seed: int = 0, dtype: torch.dtype = torch.float16,
          **overrides: Any) -> str:
    """Write the tiny ``family`` model (random weights from ``seed``) and its tokenizer to ``path``."""
    from transformers import AutoModelForCausalLM

    cfg = config(family, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():                       # weights of a size that keeps fp16 logits well apart
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
    model = model.to(dtype)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer(cfg.vocab_size).save_pretrained(path)
    return str(path)
