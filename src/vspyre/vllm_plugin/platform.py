"""The platform class vLLM asks about the device: its name and memory, the worker to start, the
engine settings the card needs, and which features and requests it refuses (with a message that
names them)."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from vllm.platforms.interface import Platform, PlatformEnum

from . import backend, static
from .models import UnsupportedModelError, check_family

log = logging.getLogger("vllm.vspyre")   # under vLLM's logger, so vLLM's log set-up prints it

BLOCK_SIZE = 64                 # tokens per KV-cache block, the real plugin's size
DEFAULT_BATCHED_TOKENS = 512    # the prefill chunk (--max-num-batched-tokens), the real plugin's default
DEFAULT_MAX_SEQS = 32           # the decode batch (--max-num-seqs) when none is given


def quant_scheme(vllm_config: Any) -> str | None:
    """The quantisation the server asked for with ``--additional-config '{"vspyre_quant": "fp8"}'``
    (vLLM's channel for platform settings): fp8, fp8-static, w8a8 or w4a16 (vspyre.quant:
    torchao's configs, applied to the model on the card at load; fp8-static calibrated there on
    random token ids), or None."""
    extra = getattr(vllm_config, "additional_config", None)
    q = extra.get("vspyre_quant") if isinstance(extra, dict) else None
    if q is None:
        return None
    from ..quant import SCHEMES
    if q not in SCHEMES:
        _refuse(f"vspyre_quant {q!r} (the card's schemes: {', '.join(SCHEMES)})")
    return q


def _refuse(what: str) -> None:
    raise UnsupportedModelError(f"vspyre vLLM plugin: {what} is not supported on the spyre card")


class SpyrePlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "spyre"
    device_type: str = "spyre"
    dispatch_key: str = "PrivateUse1"
    device_control_env_var: str = "VSPYRE_VISIBLE_CARDS"
    dist_backend: str = "gloo"
    supported_quantization: list[str] = []
    additional_env_vars: list[str] = ["VSPYRE_VLLM_BACKEND", "VSPYRE_HW", "VSPYRE_NUM_CARDS", "VSPYRE_NUMERICS",
                                      "VSPYRE_RUNTIME_MODE", "VSPYRE_CACHE_DIR"]

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16, torch.float32]

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        from vspyre import hardware
        return f"spyre (virtual, hardware preset {hardware.get_config().name})"

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return torch.spyre.get_device_properties(device_id).total_memory

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.spyre.set_device(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.spyre.manual_seed_all(seed)

    @classmethod
    def inference_mode(cls):
        return torch.no_grad()

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def get_current_memory_usage(cls, device: torch.types.Device | None = None) -> float:
        return float(torch.spyre.memory_allocated(device))

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "vllm.distributed.device_communicators.cpu_communicator.CpuCommunicator"

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        return False

    @classmethod
    def check_and_update_config(cls, vllm_config: Any) -> None:
        """Refuse what the plugin does not run; set the card's engine defaults; choose the worker."""
        mc = vllm_config.model_config
        backend()                              # a bad VSPYRE_VLLM_BACKEND fails at start-up
        if mc is not None:
            check_family(mc.hf_config)
            if getattr(mc, "runner_type", "generate") != "generate":
                _refuse(f"the {mc.runner_type!r} runner (pooling/embedding models)")
            if mc.is_multimodal_model:
                _refuse(f"multimodal model {mc.architecture!r}")
            if mc.quantization:
                _refuse(f"vLLM's quantization {mc.quantization!r} (its kernels are CUDA's; the card quantises with "
                        "torchao: --additional-config '{\"vspyre_quant\": \"fp8\"}' (or w8a8, w4a16)")
            if getattr(mc, "enable_prompt_embeds", False):
                _refuse("prompt embeddings (--enable-prompt-embeds)")
        quant_scheme(vllm_config)              # a bad vspyre_quant fails at start-up
        if vllm_config.lora_config is not None:
            _refuse("LoRA (--enable-lora)")
        if vllm_config.speculative_config is not None:
            _refuse("speculative decoding")
        pc = vllm_config.parallel_config
        if pc.tensor_parallel_size > 1 or pc.pipeline_parallel_size > 1 or pc.data_parallel_size > 1:
            _refuse(f"parallelism (tensor {pc.tensor_parallel_size}, pipeline {pc.pipeline_parallel_size}, "
                    f"data {pc.data_parallel_size}): one card per server in this release")
        if getattr(vllm_config, "kv_transfer_config", None) is not None:
            _refuse("KV transfer (disaggregated prefill)")
        cc = vllm_config.cache_config
        if cc.cache_dtype not in ("auto", None):
            _refuse(f"KV-cache dtype {cc.cache_dtype!r}")
        if cc.user_specified_block_size and cc.block_size != BLOCK_SIZE:
            log.warning("vspyre: block size %d requested; the card uses %d-token KV blocks", cc.block_size,
                        BLOCK_SIZE)
        cc.block_size = BLOCK_SIZE

        sc = vllm_config.scheduler_config
        sc.async_scheduling = False
        if static.batching() == "static":
            static.configure(vllm_config, log)
        else:
            cls._default_chunk(vllm_config)

        from vllm.config import CompilationMode
        comp = vllm_config.compilation_config
        comp.mode = CompilationMode.NONE        # the runner compiles the step graph itself (torch.compile)
        comp.cudagraph_capture_sizes = []
        if hasattr(comp, "cudagraph_mode"):
            from vllm.config import CUDAGraphMode
            comp.cudagraph_mode = CUDAGraphMode.NONE

        if pc.worker_cls == "auto":
            pc.worker_cls = "vspyre.vllm_plugin.worker.SpyreWorker"
        if pc.distributed_executor_backend in (None, "auto"):
            pc.distributed_executor_backend = "uni"

    @classmethod
    def _default_chunk(cls, vllm_config: Any) -> None:
        """The prefill chunk: vLLM's engine picks its default from the device's memory (8192-16384
        tokens for a 112 GiB device); the real Spyre plugin uses 512. vLLM does not tell a default
        from a value the user gave, so a value equal to one of vLLM's defaults is taken for the
        default (``VSPYRE_VLLM_KEEP_BATCHED_TOKENS=1`` keeps it)."""
        from vllm.engine.arg_utils import EngineArgs

        sc = vllm_config.scheduler_config
        if os.environ.get("VSPYRE_VLLM_KEEP_BATCHED_TOKENS") == "1" or not sc.enable_chunked_prefill:
            return
        tokens, seqs = (set(d.values()) for d in EngineArgs.get_batch_defaults(1))
        if sc.max_num_batched_tokens in tokens and sc.max_num_batched_tokens != DEFAULT_BATCHED_TOKENS:
            log.info("vspyre: prefill chunk (max_num_batched_tokens) %d -> %d, the card's default",
                     sc.max_num_batched_tokens, DEFAULT_BATCHED_TOKENS)
            sc.max_num_batched_tokens = DEFAULT_BATCHED_TOKENS
        if sc.max_num_seqs in seqs and sc.max_num_seqs > DEFAULT_MAX_SEQS:
            log.info("vspyre: max_num_seqs %d -> %d, the card's default decode batch", sc.max_num_seqs,
                     DEFAULT_MAX_SEQS)
            sc.max_num_seqs = DEFAULT_MAX_SEQS
        if sc.max_num_seqs > sc.max_num_batched_tokens:
            raise ValueError(f"vspyre vLLM plugin: max_num_seqs {sc.max_num_seqs} > max_num_batched_tokens "
                             f"{sc.max_num_batched_tokens} (every sequence of a decode batch needs a token of the budget)")

    @classmethod
    def validate_request(cls, processed_inputs: Any, params: Any) -> None:
        """Requests the runner cannot honour fail at once, naming the parameter."""
        from vllm import SamplingParams

        if not isinstance(params, SamplingParams):
            _refuse("pooling requests")
        bad = []
        if params.logprobs is not None:
            bad.append(f"logprobs={params.logprobs}")
        if params.prompt_logprobs is not None:
            bad.append(f"prompt_logprobs={params.prompt_logprobs}")
        for name, neutral in (("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0),
                              ("min_p", 0.0), ("min_tokens", 0)):
            if getattr(params, name) != neutral:
                bad.append(f"{name}={getattr(params, name)}")
        for name in ("logit_bias", "allowed_token_ids", "bad_words", "structured_outputs", "logits_processors"):
            if getattr(params, name, None):
                bad.append(name)
        if static.batching() == "static":
            ids = processed_inputs.get("prompt_token_ids") if isinstance(processed_inputs, dict) else None
            why = static.refusal(static.shapes(), len(ids or ()), params.max_tokens)
            if why:
                raise ValueError(f"vspyre vLLM plugin: {why}")
        if bad:
            raise ValueError(f"vspyre vLLM plugin: sampling parameter(s) {', '.join(bad)} not supported "
                             "(supported: greedy, temperature, top_k, top_p, seed, n, stop, max_tokens, ignore_eos)")
