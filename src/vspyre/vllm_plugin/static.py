"""Static batching with warmup shapes: how the old Spyre stack (the standalone graph compiler,
sendnn) served LLMs, so the old compiler can be measured as it really ran, and either compiler
under either strategy.

A warmup shape is ``prompt x new_tokens x batch``: one prefill graph of ``batch`` prompts padded to
``prompt`` tokens and one decode graph of ``batch`` sequences over a static KV length of ``prompt +
new_tokens``, both compiled when the server starts (never afterwards). A request is served by the
smallest shape that holds its prompt and its ``max_tokens``; a request no shape holds is refused.
The scheduler forms a batch only when the card is idle: the oldest waiting request picks the shape,
waiting requests that fit that shape join it (first come, first served) up to its batch size, all
are prefilled in one step, then decoded together until the last one finishes; nothing joins a
running batch. Padding (prompts to ``prompt`` tokens, the batch to ``batch`` sequences, the KV to
``prompt + new_tokens``) is computed like real work, and counted.

Settings (environment, read by every vLLM process):

* ``VSPYRE_VLLM_BATCHING`` - ``continuous`` (default: vLLM's scheduler as is, chunked prefill,
  symbolic shapes) or ``static`` (this module).
* ``VSPYRE_VLLM_WARMUP_SHAPES`` - the shapes, ``PROMPTxNEWxBATCH`` separated by commas (default
  ``512x128x4``); prompts are whole 64-token KV blocks.

The scheduler (:mod:`.scheduler`) is the one vLLM subclass (a platform plugin's part, as the real
plugin's static scheduler was); vLLM's KV-cache manager, request queues and outputs are used as
they are. This module imports nothing from vLLM.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable

BATCHINGS = ("continuous", "static")
DEFAULT_SHAPES = "512x128x4"
BLOCK = 64


@dataclass(frozen=True, order=True)
class WarmupShape:
    prompt: int
    new_tokens: int
    batch: int

    def __str__(self) -> str:
        return f"{self.prompt}x{self.new_tokens}x{self.batch}"

    @property
    def kv_len(self) -> int:
        """The decode graph's static KV length (whole blocks)."""
        return -(-(self.prompt + self.new_tokens) // BLOCK) * BLOCK


def batching() -> str:
    b = os.environ.get("VSPYRE_VLLM_BATCHING", "continuous").strip().lower() or "continuous"
    if b not in BATCHINGS:
        raise ValueError(f"VSPYRE_VLLM_BATCHING={b!r}: one of {', '.join(BATCHINGS)}")
    return b


def parse(spec: str) -> tuple[WarmupShape, ...]:
    """``"512x128x4,1024x64x1"`` -> the shapes, sorted; a clear error naming the bad one."""
    out = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        try:
            p, n, b = (int(x) for x in part.lower().split("x"))
        except ValueError:
            raise ValueError(f"warmup shape {part!r}: want PROMPTxNEW_TOKENSxBATCH, e.g. 512x128x4") from None
        if p < 1 or n < 1 or b < 1 or p % BLOCK:
            raise ValueError(f"warmup shape {part!r}: prompt, new tokens and batch must be >= 1 and the prompt a "
                             f"multiple of {BLOCK} (whole KV blocks)")
        out.append(WarmupShape(p, n, b))
    if not out:
        raise ValueError(f"no warmup shapes in {spec!r}")
    return tuple(sorted(set(out)))


def shapes() -> tuple[WarmupShape, ...]:
    return parse(os.environ.get("VSPYRE_VLLM_WARMUP_SHAPES", DEFAULT_SHAPES))


def fit(table: Iterable[WarmupShape], prompt: int, new_tokens: int, count: int = 1) -> WarmupShape | None:
    """The smallest shape (prompt, then new tokens, then batch) holding ``count`` requests of at
    most ``prompt`` prompt tokens and ``new_tokens`` output tokens; None if none does."""
    ok = [s for s in table if s.prompt >= prompt and s.new_tokens >= new_tokens and s.batch >= count]
    return min(ok, default=None)


def batch_limit(table: Iterable[WarmupShape], prompt: int, new_tokens: int) -> tuple[WarmupShape, int] | None:
    """The (prompt, new tokens) class of the smallest shape that holds one such request, and the
    most requests a batch of that class can take (its largest batch size)."""
    table = tuple(table)
    first = fit(table, prompt, new_tokens)
    if first is None:
        return None
    return first, max(s.batch for s in table if (s.prompt, s.new_tokens) == (first.prompt, first.new_tokens))


def refusal(table: Iterable[WarmupShape], prompt: int, max_tokens: int | None) -> str | None:
    """Why no warmup shape serves this request (None: one does)."""
    table = tuple(table)
    if max_tokens is None:
        return "static batching needs max_tokens (each warmup shape has a fixed number of new tokens)"
    if fit(table, prompt, max_tokens) is None:
        return (f"no warmup shape holds a {prompt}-token prompt with max_tokens={max_tokens} (shapes "
                f"{', '.join(map(str, table))}; VSPYRE_VLLM_WARMUP_SHAPES)")
    return None


def configure(vllm_config: Any, log: Any) -> None:
    """The engine settings static batching needs (called by the platform): vLLM's scheduler replaced
    by :class:`.scheduler.StaticBatchingScheduler`, no chunked prefill, a step budget of the largest batch of
    prompts, as many sequences as the largest batch, no prefix caching (the old stack had none)."""
    table = shapes()
    sc, cc, mc = vllm_config.scheduler_config, vllm_config.cache_config, vllm_config.model_config
    sc.scheduler_cls = "vspyre.vllm_plugin.scheduler.StaticBatchingScheduler"
    sc.enable_chunked_prefill = False
    sc.long_prefill_token_threshold = 0
    sc.max_num_batched_tokens = max(s.prompt * s.batch for s in table)
    sc.max_num_seqs = max(s.batch for s in table)
    if cc.enable_prefix_caching:
        log.info("vspyre: static batching: prefix caching off (the old stack had none)")
        cc.enable_prefix_caching = False
    need = max(s.prompt + s.new_tokens for s in table)
    if mc is not None and mc.max_model_len < need:
        raise ValueError(f"vspyre vLLM plugin: warmup shapes need a context of {need} tokens, max_model_len is "
                         f"{mc.max_model_len} (VSPYRE_VLLM_WARMUP_SHAPES, --max-model-len)")
    log.info("vspyre: static batching on warmup shapes %s (prompt x new tokens x batch): %d graphs compiled at "
             "start-up, nothing joins a running batch", ", ".join(map(str, table)), 2 * len(table))
