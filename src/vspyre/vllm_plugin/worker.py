"""The worker vLLM's executor drives: one per card (one card in this release).

It answers the engine's start-up questions (the KV-cache layout and spec per layer, the device
memory left for the cache after the weights and the largest step's activations), allocates the
cache vLLM sized, compiles the step graph, and hands every scheduler output to the model runner.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import torch
from vllm.v1.worker.worker_base import CompilationTimes, WorkerBase

from . import backend
from .runner import SpyreModelRunner

log = logging.getLogger("vllm.vspyre")   # under vLLM's logger, so vLLM's log set-up prints it

# Functional runs back device memory with host RAM: the cache vLLM would size from the card's free
# memory (~100 GiB) cannot be backed on a laptop, so it is capped at this share of the host's
# available memory (estimate-only runs have no such cap: their memory has no pages).
HOST_SHARE = 0.5


class SpyreWorker(WorkerBase):
    def init_device(self) -> None:
        if backend() == "cpu":                  # the baseline: the same runner on the host CPU
            self.device = torch.device("cpu")
            self.model_runner = SpyreModelRunner(self.vllm_config, self.device)
            return
        if not torch.spyre.is_available():
            raise RuntimeError("vspyre: the spyre device is not available (is vspyre installed in this environment?)")
        self.device = torch.device("spyre", self.local_rank)
        torch.spyre.set_device(self.device)
        torch.manual_seed(self.model_config.seed or 0)
        self.model_runner = SpyreModelRunner(self.vllm_config, self.device)

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        if load_dummy_weights:
            raise ValueError("vspyre vLLM plugin: dummy weights (load_format='dummy') are not supported")
        self.model_runner.load_model()

    def get_model(self) -> torch.nn.Module:
        return self.model_runner.model

    def get_supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    def get_supported_kv_cache_layouts(self) -> list[str]:
        return ["LBNHC"]      # per layer: [blocks, tokens of a block, kv heads, head dim]

    def get_kv_cache_spec(self) -> dict[str, Any]:
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        r = self.model_runner
        spec = FullAttentionSpec(block_size=r.block_size, num_kv_heads=r.kv_heads, head_size=r.head_dim,
                                 dtype=r.dtype)
        return {name: spec for name in r.layer_names()}

    def determine_available_memory(self) -> int:
        """Device bytes for the KV cache: the card's memory x ``gpu_memory_utilization``, less
        what the weights and the largest step (a prefill of the whole token budget) take, measured
        on the card; capped by what the host can back in functional mode."""
        if self.cache_config.kv_cache_memory_bytes:           # --kv-cache-memory-bytes: the user's size
            return int(self.cache_config.kv_cache_memory_bytes)
        if self.device.type == "cpu":
            import psutil
            return int(psutil.virtual_memory().available * HOST_SHARE * self.cache_config.gpu_memory_utilization)
        dev = self.device
        torch.spyre.synchronize()
        total = torch.spyre.get_device_properties(dev).total_memory
        peak = self._profile_step_peak()
        budget = int(total * self.cache_config.gpu_memory_utilization) - peak
        cap = None
        from ..runtime.memory import estimate_only
        if not estimate_only():
            import psutil
            cap = int(psutil.virtual_memory().available * HOST_SHARE)
            budget = min(budget, cap)
        if budget <= 0:
            raise RuntimeError(f"vspyre: no device memory left for the KV cache on {dev}: capacity {total / 2**30:.2f} GiB "
                               f"x gpu_memory_utilization {self.cache_config.gpu_memory_utilization}, weights and "
                               f"the largest step take {peak / 2**30:.2f} GiB")
        log.info("vspyre: %.2f GiB of %s for the KV cache (capacity %.2f GiB x %.2f; weights + largest step %.2f GiB%s)",
                 budget / 2**30, dev, total / 2**30, self.cache_config.gpu_memory_utilization, peak / 2**30,
                 f"; capped at {HOST_SHARE:.0%} of the host's available RAM, {cap / 2**30:.2f} GiB, since device "
                 "memory is host RAM in functional mode" if cap is not None and budget == cap else "")
        return budget

    def _profile_step_peak(self) -> int:
        """Device memory in use at the peak of the largest step (weights included), measured by
        running it uncompiled with a temporary cache just big enough for it."""
        r = self.model_runner
        tokens = r.max_tokens
        blocks = -(-tokens // r.block_size) + 1
        torch.spyre.reset_peak_memory_stats(self.device)
        base = torch.spyre.memory_allocated(self.device)
        saved, backend = r.kv_caches, r.backend
        try:
            r.kv_caches = r.allocate_kv(blocks)
            cache_bytes = torch.spyre.memory_allocated(self.device) - base
            seqs = [([0] * tokens, list(range(1, blocks)), 0, tokens)]
            r.backend = "eager"
            with torch.no_grad():
                # twice: a weight re-laid in place by the first step and read as stored by the next (a
                # tied embedding and LM head) holds its second layout from then on
                for _ in range(2):
                    r._forward(*r._inputs(seqs, layout="continuous")[0], r.kv_caches)
            peak = torch.spyre.max_memory_allocated(self.device) - cache_bytes
        finally:
            r.kv_caches, r.backend = saved, backend
            r.stats.shapes.clear()
            r.stats.padded_tokens = 0
        return peak

    def initialize_from_config(self, kv_cache_config: Any) -> None:
        self.model_runner.initialize_kv_cache(kv_cache_config.num_blocks)

    def compile_or_warm_up_model(self) -> CompilationTimes:
        t = self.model_runner.warm_up()
        return CompilationTimes(language_model=t, encoder=0.0)

    def execute_model(self, scheduler_output: Any) -> Any:
        return self.model_runner.execute_model(scheduler_output)

    def sample_tokens(self, grammar_output: Any) -> Any:
        raise RuntimeError("vspyre vLLM plugin: execute_model samples in the same call (no structured outputs)")

    def get_cache_block_size_bytes(self) -> int:
        return self.model_runner.cache_block_bytes()

    def synchronize_device(self) -> None:
        if self.device.type == "spyre":
            torch.spyre.synchronize()

    def check_health(self) -> None:
        return

    def add_lora(self, lora_request: Any) -> bool:
        raise ValueError("vspyre vLLM plugin: LoRA adapters are not supported")

    def remove_lora(self, lora_id: int) -> bool:
        raise ValueError("vspyre vLLM plugin: LoRA adapters are not supported")

    def pin_lora(self, lora_id: int) -> bool:
        raise ValueError("vspyre vLLM plugin: LoRA adapters are not supported")

    def list_loras(self) -> set[int]:
        return set()

    def runner_object(self) -> Any:
        """The model runner itself (in-process engines: ``vspyre serve-estimate`` reads its step
        costs as the engine steps)."""
        return self.model_runner

    def runner_stats(self) -> dict:
        """The runner's counters (``collective_rpc("runner_stats")``): steps, tokens, host
        fallbacks, estimated device time, graphs compiled and compile time."""
        s = self.model_runner.stats
        return {"steps": s.steps, "prefill_tokens": s.prefill_tokens, "decode_tokens": s.decode_tokens,
                "prefix_hit_tokens": s.prefix_hit_tokens,
                "padded_tokens": s.padded_tokens, "step_shapes": len(s.shapes), "wall_s": s.wall_s, "device_est_us": s.device_est_us,
                "host_fallbacks": s.host_fallbacks, "fallback_ops": dict(s.fallback_ops), "graphs": s.graphs, "compile_s": s.compile_s,
                "backend": self.model_runner.backend, "per_step": list(s.per_step), "pid": os.getpid(),
                "time": time.time()}
