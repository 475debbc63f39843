"""Small real models built from ``transformers`` configs with random weights (nothing downloaded).

The model suite used by the compilers' tests, the benchmarks and the parity harness. Every builder
is ``fn(batch=..., seq=... | image_size=..., seed=0) -> ModelCase``: weights come from
``torch.manual_seed(seed)``, inputs from a local ``torch.Generator`` seeded with ``seed``, the model
is in eval mode, and ``case.model(**case.inputs)`` runs one forward. ``case.output_fn`` picks the
main output tensor from what the model returns.

Attention: the transformer models use ``attn_implementation="sdpa"`` (set explicitly), i.e. the
attention core is one ``torch.nn.functional.scaled_dot_product_attention`` call per layer.
Forward cases run with ``use_cache=False``; the decode case (:func:`tiny_llama_generate`) keeps
the KV cache on, as real decoding does.

>>> case = get_case("llama", batch=1, seq=8)
>>> case.output().shape
torch.Size([1, 8, 1000])
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import importlib.util
import inspect
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

KINDS = ("llm", "encoder", "encoder-decoder", "vision-transformer", "cnn", "custom")


# -- output extraction (module-level functions, so cases deep-copy and pickle) ----------------

def logits(out: Any) -> torch.Tensor:
    """``out.logits``."""
    return out.logits


def last_hidden_state(out: Any) -> torch.Tensor:
    """``out.last_hidden_state``."""
    return out.last_hidden_state


def main_output(out: Any) -> torch.Tensor:
    """The main tensor of any model output: the tensor itself, ``.logits``, ``.last_hidden_state``,
    or the first tensor of a tuple / list / dict / ``ModelOutput``."""
    if isinstance(out, torch.Tensor):
        return out
    for attr in ("logits", "last_hidden_state"):
        value = getattr(out, attr, None)
        if isinstance(value, torch.Tensor):
            return value
    values = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else ()
    for v in values:
        if isinstance(v, torch.Tensor):
            return v
    raise TypeError(f"cannot find an output tensor in a {type(out).__name__}")


def _move(x: Any, device: str | torch.device) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (list, tuple)):
        return type(x)(_move(v, device) for v in x)
    if isinstance(x, dict):
        return {k: _move(v, device) for k, v in x.items()}
    return x


@dataclass
class ModelCase:
    """A model and the inputs of one forward call.

    ``kind`` is one of :data:`KINDS`; ``output_fn`` extracts the main output tensor from the
    model's return value; ``max_new_tokens`` is set on decode cases (see :func:`greedy_generate`).
    """

    name: str
    model: torch.nn.Module
    inputs: dict[str, Any]
    kind: str = "custom"
    output_fn: Callable[[Any], torch.Tensor] = main_output
    is_transformer: bool = False
    max_new_tokens: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)   # config summary: attention impl, shapes, ...

    def to(self, device: str | torch.device) -> "ModelCase":
        """Move model (in place, like ``Module.to``) and inputs; returns a new case."""
        return dataclasses.replace(self, model=self.model.to(device), inputs=_move(self.inputs, device))

    def clone(self) -> "ModelCase":
        """A deep copy (``case.clone().to("spyre")`` leaves the CPU case untouched)."""
        return copy.deepcopy(self)

    def forward(self) -> Any:
        """``model(**inputs)`` without autograd."""
        with torch.no_grad():
            return self.model(**self.inputs)

    def output(self) -> torch.Tensor:
        """The main output tensor of one forward."""
        return self.output_fn(self.forward())

    def generate(self, max_new_tokens: int | None = None) -> torch.Tensor:
        """Greedy decoding from ``inputs["input_ids"]``: prompt plus new tokens."""
        n = max_new_tokens if max_new_tokens is not None else self.max_new_tokens
        if n is None:
            raise ValueError(f"{self.name}: not a decode case; pass max_new_tokens")
        return greedy_generate(self.model, self.inputs["input_ids"], n,
                               attention_mask=self.inputs.get("attention_mask"))

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _build(cls: type, cfg: Any, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(cfg).eval()


def _randomize_norm_stats(model: torch.nn.Module, seed: int) -> None:
    """Give BatchNorm layers non-trivial running statistics and affine parameters.

    Freshly initialised BatchNorm in eval mode is the identity (mean 0, var 1, weight 1, bias 0),
    which would let a wrong BN lowering or folding pass unnoticed.
    """
    g = _gen(seed + 1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                n = m.num_features
                m.running_mean.copy_(0.1 * torch.randn(n, generator=g))
                m.running_var.copy_(0.5 + torch.rand(n, generator=g))
                if m.affine:
                    m.weight.copy_(0.75 + 0.5 * torch.rand(n, generator=g))
                    m.bias.copy_(0.1 * torch.randn(n, generator=g))


# -- language models ------------------------------------------------------------------------

def tiny_gpt2(batch: int = 2, seq: int = 32, seed: int = 0) -> ModelCase:
    """GPT-2 with 2 layers, 4 heads, width 128, vocabulary 1000; random weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=1000, n_positions=128,
                     bos_token_id=0, eos_token_id=0, use_cache=False, attn_implementation="sdpa")
    model = _build(GPT2LMHeadModel, cfg, seed)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=_gen(seed))
    return ModelCase("tiny-gpt2", model, {"input_ids": ids}, kind="llm", output_fn=logits,
                     is_transformer=True, meta={"attn": "sdpa"})


def _llama_config(use_cache: bool) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                       max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                       tie_word_embeddings=False, use_cache=use_cache, attn_implementation="sdpa")


def tiny_llama(batch: int = 2, seq: int = 32, seed: int = 0) -> ModelCase:
    """Llama: RoPE, RMSNorm, SwiGLU MLP, grouped-query attention (4 query / 2 KV heads), width 128,
    MLP 256, 2 layers, vocabulary 1000; random weights."""
    from transformers import LlamaForCausalLM

    cfg = _llama_config(use_cache=False)
    model = _build(LlamaForCausalLM, cfg, seed)
    ids = torch.randint(3, cfg.vocab_size, (batch, seq), generator=_gen(seed))
    return ModelCase("tiny-llama", model, {"input_ids": ids}, kind="llm", output_fn=logits,
                     is_transformer=True, meta={"attn": "sdpa (GQA 4q/2kv)"})


def tiny_llama_generate(batch: int = 1, seq: int = 8, max_new_tokens: int = 4, seed: int = 0) -> ModelCase:
    """The tiny Llama as a decode case (KV cache on): ``case.generate()`` or
    ``greedy_generate(case.model, case.inputs["input_ids"], case.max_new_tokens)``."""
    from transformers import LlamaForCausalLM

    cfg = _llama_config(use_cache=True)
    model = _build(LlamaForCausalLM, cfg, seed)
    ids = torch.randint(3, cfg.vocab_size, (batch, seq), generator=_gen(seed))
    return ModelCase("tiny-llama-generate", model, {"input_ids": ids}, kind="llm", output_fn=logits,
                     is_transformer=True, max_new_tokens=max_new_tokens,
                     meta={"attn": "sdpa (GQA 4q/2kv)", "kv_cache": "DynamicCache"})


def greedy_generate(model: torch.nn.Module, input_ids: torch.Tensor, n: int, *,
                    attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Greedy decoding of exactly ``n`` new tokens on the device ``input_ids`` lives on.

    Returns prompt plus ``n`` tokens, shape ``(batch, prompt + n)``. End-of-sequence stopping is
    off (``eos_token_id=None``), so the length never depends on what a random model emits; the pad
    id is set so ``generate`` has nothing to warn about.
    """
    cfg = model.config
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else 0
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    with torch.no_grad():
        return model.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=False,
                              max_new_tokens=n, min_new_tokens=None, num_beams=1,
                              eos_token_id=None, pad_token_id=pad, bos_token_id=cfg.bos_token_id,
                              temperature=None, top_p=None, top_k=None)


# -- encoders, encoder-decoders --------------------------------------------------------------

def tiny_bert(batch: int = 2, seq: int = 32, seed: int = 0) -> ModelCase:
    """BERT encoder (``BertModel``): 2 layers, 4 heads, width 128, MLP 256, vocabulary 1000; the
    second sequence's last quarter is padding, so ``attention_mask`` matters."""
    from transformers import BertConfig, BertModel

    cfg = BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
                     vocab_size=1000, max_position_embeddings=128, pad_token_id=0,
                     attn_implementation="sdpa", use_cache=False)
    model = _build(BertModel, cfg, seed)
    g = _gen(seed)
    ids = torch.randint(1, cfg.vocab_size, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    if batch > 1:
        mask[1, seq - max(1, seq // 4):] = 0
        ids[1, seq - max(1, seq // 4):] = cfg.pad_token_id
    tt = torch.zeros(batch, seq, dtype=torch.long)
    tt[:, seq // 2:] = 1
    return ModelCase("tiny-bert", model, {"input_ids": ids, "attention_mask": mask, "token_type_ids": tt},
                     kind="encoder", output_fn=last_hidden_state, is_transformer=True,
                     meta={"attn": "sdpa (padding mask)"})


def tiny_t5(batch: int = 2, seq: int = 32, tgt_seq: int | None = None, seed: int = 0) -> ModelCase:
    """T5 encoder-decoder (``T5ForConditionalGeneration``): width 128, 4 heads of 32, MLP 256,
    2 encoder + 2 decoder layers, relative position buckets 32, vocabulary 1000; decoder inputs
    of length ``tgt_seq`` (default ``seq // 2``)."""
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(d_model=128, d_kv=32, d_ff=256, num_layers=2, num_decoder_layers=2, num_heads=4,
                   vocab_size=1000, relative_attention_num_buckets=32, relative_attention_max_distance=64,
                   dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                   use_cache=False, attn_implementation="sdpa")
    model = _build(T5ForConditionalGeneration, cfg, seed)
    tgt = tgt_seq if tgt_seq is not None else max(1, seq // 2)
    g = _gen(seed)
    ids = torch.randint(2, cfg.vocab_size, (batch, seq), generator=g)
    dec = torch.randint(2, cfg.vocab_size, (batch, tgt), generator=g)
    dec[:, 0] = cfg.decoder_start_token_id
    mask = torch.ones(batch, seq, dtype=torch.long)
    return ModelCase("tiny-t5", model, {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec},
                     kind="encoder-decoder", output_fn=logits, is_transformer=True,
                     meta={"attn": "sdpa (relative position bias as float mask)"})


# -- vision ----------------------------------------------------------------------------------

def _pixels(batch: int, image_size: int, seed: int) -> torch.Tensor:
    return torch.randn(batch, 3, image_size, image_size, generator=_gen(seed))


def tiny_vit(batch: int = 2, image_size: int = 32, seed: int = 0) -> ModelCase:
    """ViT classifier: 32x32 images, 8x8 patches (16 tokens + CLS), width 128, 4 heads, MLP 256,
    2 layers, 10 classes."""
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(image_size=image_size, patch_size=8, num_channels=3, hidden_size=128,
                    num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, num_labels=10,
                    attn_implementation="sdpa")
    model = _build(ViTForImageClassification, cfg, seed)
    return ModelCase("tiny-vit", model, {"pixel_values": _pixels(batch, image_size, seed)},
                     kind="vision-transformer", output_fn=logits, is_transformer=True, meta={"attn": "sdpa"})


def tiny_resnet(batch: int = 2, image_size: int = 64, seed: int = 0) -> ModelCase:
    """ResNet classifier: basic blocks, depths (1, 1, 1, 1), widths 16/16/32/64/128, 10 classes;
    BatchNorm statistics randomised."""
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                       layer_type="basic", num_labels=10)
    model = _build(ResNetForImageClassification, cfg, seed)
    _randomize_norm_stats(model, seed)
    return ModelCase("tiny-resnet", model, {"pixel_values": _pixels(batch, image_size, seed)},
                     kind="cnn", output_fn=logits, meta={"attn": "none"})


def tiny_convnext(batch: int = 2, image_size: int = 64, seed: int = 0) -> ModelCase:
    """ConvNeXt classifier: depths (1, 1, 2, 1), widths 16/32/64/128, 7x7 depthwise convs,
    channels-first LayerNorm, GELU; layer scale 0.5 (not 1e-6) so every block shows in the output."""
    from transformers import ConvNextConfig, ConvNextForImageClassification

    cfg = ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1], patch_size=4,
                         image_size=image_size, layer_scale_init_value=0.5, num_labels=10)
    model = _build(ConvNextForImageClassification, cfg, seed)
    return ModelCase("tiny-convnext", model, {"pixel_values": _pixels(batch, image_size, seed)},
                     kind="cnn", output_fn=logits, meta={"attn": "none"})


def tiny_mobilenet_v2(batch: int = 2, image_size: int = 64, seed: int = 0) -> ModelCase:
    """MobileNetV2 classifier: depth multiplier 0.35, 17 inverted-residual blocks (depthwise
    convs, ReLU6, TF 'same' padding), final conv not widened to 1280, 10 classes; BatchNorm
    statistics randomised."""
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    cfg = MobileNetV2Config(image_size=image_size, depth_multiplier=0.35, finegrained_output=False,
                            num_labels=10)
    model = _build(MobileNetV2ForImageClassification, cfg, seed)
    _randomize_norm_stats(model, seed)
    return ModelCase("tiny-mobilenet-v2", model, {"pixel_values": _pixels(batch, image_size, seed)},
                     kind="cnn", output_fn=logits, meta={"attn": "none"})

MOE_EXPERTS = ("eager", "batched_mm", "grouped_mm")


def tiny_mixtral(batch: int = 2, seq: int = 16, seed: int = 0, experts: str = "eager") -> ModelCase:
    """Mixtral: a mixture-of-experts decoder - per layer a router picks 2 of 4 SwiGLU experts per
    token (softmax, top-k, renormalised weights) - with grouped-query attention (4 query / 2 KV
    heads), width 64, expert MLP 128, 2 layers, vocabulary 1000; random weights. ``experts``
    selects transformers' expert implementation: ``"eager"`` (its default: a loop over the hit
    experts, found with ``one_hot`` and ``nonzero``), ``"batched_mm"`` (each token's expert weights
    gathered, one batched matmul) or ``"grouped_mm"`` (tokens sorted by expert, counted with
    ``histc``, one grouped matmul)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    if experts not in MOE_EXPERTS:
        raise ValueError(f"tiny_mixtral: experts must be one of {MOE_EXPERTS}, got {experts!r}")
    cfg = MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, vocab_size=1000,
                        max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                        use_cache=False, attn_implementation="sdpa", experts_implementation=experts)
    model = _build(MixtralForCausalLM, cfg, seed)
    ids = torch.randint(3, cfg.vocab_size, (batch, seq), generator=_gen(seed))
    return ModelCase("tiny-mixtral" + ("" if experts == "eager" else f"-{experts}"), model, {"input_ids": ids},
                     kind="llm", output_fn=logits, is_transformer=True,
                     meta={"attn": "sdpa (GQA 4q/2kv)", "moe": f"4 experts, top-2, {experts} experts"})


def tiny_granitemoe(batch: int = 2, seq: int = 16, seed: int = 0, experts: str = "grouped_mm") -> ModelCase:
    """GraniteMoE (IBM's granite-3.x-aNNNm layout): a router picks 2 of 4 SwiGLU experts per token
    (top-k, then softmax over the picked logits), Granite's scaling multipliers, grouped-query
    attention (4 query / 2 KV heads), width 64, expert MLP 64, 2 layers; random weights.
    ``experts`` as in :func:`tiny_mixtral` (the same transformers expert implementations)."""
    from transformers import GraniteMoeConfig, GraniteMoeForCausalLM

    if experts not in MOE_EXPERTS:
        raise ValueError(f"tiny_granitemoe: experts must be one of {MOE_EXPERTS}, got {experts!r}")
    cfg = GraniteMoeConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, vocab_size=1000,
                           max_position_embeddings=128, embedding_multiplier=12.0, logits_scaling=6.0,
                           residual_multiplier=0.22, attention_multiplier=0.015625, bos_token_id=1, eos_token_id=2,
                           pad_token_id=0, use_cache=False, attn_implementation="sdpa",
                           experts_implementation=experts)
    model = _build(GraniteMoeForCausalLM, cfg, seed)
    ids = torch.randint(3, cfg.vocab_size, (batch, seq), generator=_gen(seed))
    return ModelCase(f"tiny-granitemoe-{experts}", model, {"input_ids": ids}, kind="llm", output_fn=logits,
                     is_transformer=True,
                     meta={"attn": "sdpa (GQA 4q/2kv)", "moe": f"4 experts, top-2, {experts} experts"})


def tiny_qwen3_moe(batch: int = 2, seq: int = 16, seed: int = 0, experts: str = "grouped_mm") -> ModelCase:
    """Qwen3-MoE: every layer sparse, a router picks 2 of 4 SwiGLU experts per token (softmax,
    top-k, renormalised), q/k RMS norms, grouped-query attention (4 query / 2 KV heads, head dim
    16), width 64, expert MLP 64, 2 layers; random weights. ``experts`` as in :func:`tiny_mixtral`."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    if experts not in MOE_EXPERTS:
        raise ValueError(f"tiny_qwen3_moe: experts must be one of {MOE_EXPERTS}, got {experts!r}")
    cfg = Qwen3MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4,
                         num_experts_per_tok=2, decoder_sparse_step=1, norm_topk_prob=True, vocab_size=1000,
                         max_position_embeddings=128, bos_token_id=1, eos_token_id=2, use_cache=False,
                         attn_implementation="sdpa", experts_implementation=experts)
    model = _build(Qwen3MoeForCausalLM, cfg, seed)
    ids = torch.randint(3, cfg.vocab_size, (batch, seq), generator=_gen(seed))
    return ModelCase(f"tiny-qwen3-moe-{experts}", model, {"input_ids": ids}, kind="llm", output_fn=logits,
                     is_transformer=True,
                     meta={"attn": "sdpa (GQA 4q/2kv)", "moe": f"4 experts, top-2, {experts} experts"})


# -- registry --------------------------------------------------------------------------------

SUITE: dict[str, Callable[..., ModelCase]] = {
    "gpt2": tiny_gpt2,
    "llama": tiny_llama,
    "mixtral": tiny_mixtral,
    "bert": tiny_bert,
    "t5": tiny_t5,
    "vit": tiny_vit,
    "resnet": tiny_resnet,
    "convnext": tiny_convnext,
    "mobilenet_v2": tiny_mobilenet_v2,
}

DEFAULT_SUITE: list[str] = list(SUITE)


def get_case(name: str, **kw: Any) -> ModelCase:
    """Build suite model ``name`` (keyword arguments go to its builder), or a user model given as
    ``"pkg.mod:function"`` / ``"path/to/file.py:function"``."""
    if name in SUITE:
        return SUITE[name](**kw)
    if ":" in name:
        return load_user_model(name, **kw)
    raise KeyError(f"unknown model {name!r}; suite models: {', '.join(SUITE)}; "
                   f"or give a user model as 'pkg.module:function'")


def _import_target(spec: str) -> Callable[..., Any]:
    mod_name, sep, attr = spec.rpartition(":")
    if not sep or not mod_name or not attr:
        raise ValueError(f"user model {spec!r}: expected 'pkg.module:function' or 'file.py:function'")
    try:
        if mod_name.endswith(".py") or "/" in mod_name or "\\" in mod_name:
            path = Path(mod_name).resolve()
            if not path.is_file():
                raise FileNotFoundError(f"no such file: {path}")
            mspec = importlib.util.spec_from_file_location(f"_vspyre_user_{path.stem}", path)
            module = importlib.util.module_from_spec(mspec)
            sys.modules[mspec.name] = module
            mspec.loader.exec_module(module)
        else:
            module = importlib.import_module(mod_name)
    except Exception as e:
        raise ImportError(f"user model {spec!r}: cannot import {mod_name!r}: {type(e).__name__}: {e}") from e
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ImportError(f"user model {spec!r}: {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"user model {spec!r}: {attr!r} is a {type(obj).__name__}, not a function")
    return obj


def _as_kwargs(spec: str, model: torch.nn.Module, inputs: Any) -> dict[str, Any]:
    """Inputs as ``model(**inputs)`` kwargs; a tensor or tuple of tensors is bound to
    ``forward``'s positional parameters."""
    if isinstance(inputs, dict):
        if not all(isinstance(k, str) for k in inputs):
            raise TypeError(f"user model {spec!r}: input dict keys must be argument names (str)")
        return dict(inputs)
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if isinstance(inputs, (tuple, list)):
        try:
            bound = inspect.signature(model.forward).bind(*inputs)
        except (TypeError, ValueError) as e:
            raise TypeError(f"user model {spec!r}: cannot bind {len(inputs)} positional inputs to "
                            f"{type(model).__name__}.forward: {e}") from e
        if any(p.kind is p.VAR_POSITIONAL for p in inspect.signature(model.forward).parameters.values()):
            raise TypeError(f"user model {spec!r}: forward takes *args; return the inputs as a dict")
        return dict(bound.arguments)
    raise TypeError(f"user model {spec!r}: inputs must be a dict of keyword arguments, a tensor or a "
                    f"tuple of tensors, got {type(inputs).__name__}")


def _looks_like_transformer(model: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.MultiheadAttention) or "Attention" in type(m).__name__
               for m in model.modules())


def load_user_model(spec: str, **kw: Any) -> ModelCase:
    """Import ``"pkg.mod:function"`` (or ``"path/file.py:function"``), call it with ``**kw`` and wrap
    the result in a :class:`ModelCase` (model put in eval mode).

    The function may return a ``ModelCase``; a ``(model, inputs)`` tuple; or a dict with ``model``,
    ``inputs`` and optionally ``name``, ``kind``, ``output_fn``, ``is_transformer``. ``inputs`` is a
    dict of keyword arguments, a tensor, or a tuple of tensors (bound to ``forward``'s parameters).
    """
    fn = _import_target(spec)
    try:
        result = fn(**kw)
    except Exception as e:
        raise RuntimeError(f"user model {spec!r}: calling it raised {type(e).__name__}: {e}") from e
    if isinstance(result, ModelCase):
        result.model.eval()
        return result
    extra: dict[str, Any] = {}
    if isinstance(result, dict) and "model" in result and "inputs" in result:
        model, inputs = result["model"], result["inputs"]
        unknown = set(result) - {"model", "inputs", "name", "kind", "output_fn", "is_transformer"}
        if unknown:
            raise TypeError(f"user model {spec!r}: unknown keys {sorted(unknown)} in the returned dict")
        extra = {k: result[k] for k in ("name", "kind", "output_fn", "is_transformer") if k in result}
    elif isinstance(result, tuple) and len(result) == 2:
        model, inputs = result
    else:
        raise TypeError(f"user model {spec!r}: expected a ModelCase, a (model, inputs) tuple or a dict "
                        f"with 'model' and 'inputs', got {type(result).__name__}")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"user model {spec!r}: the model is a {type(model).__name__}, not a torch.nn.Module")
    kind = extra.get("kind", "custom")
    if kind not in KINDS:
        raise ValueError(f"user model {spec!r}: kind {kind!r} is not one of {KINDS}")
    output_fn = extra.get("output_fn", main_output)
    if not callable(output_fn):
        raise TypeError(f"user model {spec!r}: output_fn is not callable")
    return ModelCase(extra.get("name", spec.rpartition(":")[2]), model.eval(), _as_kwargs(spec, model, inputs),
                     kind=kind, output_fn=output_fn,
                     is_transformer=bool(extra.get("is_transformer", _looks_like_transformer(model))),
                     meta={"source": spec})
