"""Small real models built from ``transformers`` configs with random weights (nothing downloaded)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class ModelCase:
    """A model and the inputs of one forward call."""

    name: str
    model: torch.nn.Module
    inputs: dict[str, Any]

    def to(self, device: str | torch.device) -> "ModelCase":
        inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.inputs.items()}
        return ModelCase(self.name, self.model.to(device), inputs)


def tiny_gpt2(batch: int = 2, seq: int = 32, seed: int = 0) -> ModelCase:
    """GPT-2 with 2 layers, 4 heads, width 128, vocabulary 1000; random weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=1000, n_positions=128,
                     bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(seed))
    return ModelCase("tiny-gpt2", model, {"input_ids": ids})
