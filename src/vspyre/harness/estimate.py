"""``vspyre estimate``: a full-size LLM on one card, without its weights and without running it.

The model is built from its ``transformers`` config on the meta device and moved to the card in
estimate-only mode (``torch.spyre.estimate_only``): device memory is accounted against the card's
capacity, but no host memory backs it and no kernel executes. Everything else is the normal path:
``torch.compile`` with the chosen compiler captures, lowers and plans every kernel at the real
shapes, and the runtime costs each launch with the latency model. So the figures are the same as a
functional run's would be (tests/harness/test_estimate.py checks it on a small config), at a cost
of compile time only.

Prefill is one compiled forward of the prompt (time to first token). Decode is one step with the
KV cache at each length asked for, compiled with ``dynamic=True``: the graph count must not grow
with the length (reported per step). Tokens per second come from the decode steps, linearly
interpolated over the generated range (a decode step's time is affine in the KV length).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch

from .. import hardware

CONFIG_DIR = Path(__file__).with_name("configs")
BACKENDS = {"inductor": "inductor", "standalone": "spyre_standalone"}
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


class EstimateError(Exception):
    """Bad input, said in one line (the command exits non-zero)."""


def builtin_configs() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def load_config(name: str | None = None, path: str | None = None, layers: int | None = None) -> Any:
    """A transformers config: a built-in name (``llama-3-8b``) or a config.json file."""
    from transformers import CONFIG_MAPPING

    if (name is None) == (path is None):
        raise EstimateError("give a built-in config name or --config FILE (one of them)")
    if name is not None:
        file = CONFIG_DIR / f"{name}.json"
        if not file.exists():
            raise EstimateError(f"unknown config {name!r}; built in: {', '.join(builtin_configs())} "
                                "(or --config FILE with a transformers config.json)")
    else:
        file = Path(path)
        if not file.is_file():
            raise EstimateError(f"config file {path} does not exist")
    try:
        d = json.loads(file.read_text())
        d = {k: v for k, v in d.items() if not k.startswith("_")}
        kind = d.pop("model_type")
        cfg = CONFIG_MAPPING[kind](**d)
    except KeyError as e:
        raise EstimateError(f"{file}: transformers cannot read it as a config (no model_type, or unknown "
                            f"model_type {e})") from None
    except Exception as e:  # noqa: BLE001 - one line for the user
        raise EstimateError(f"{file}: transformers cannot read it as a config ({type(e).__name__}: {e})") from None
    if layers is not None:
        cfg.num_hidden_layers = layers
    for need in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if not hasattr(cfg, need):
            raise EstimateError(f"{file}: not a decoder LLM config (no {need})")
    cfg.use_cache = True
    cfg._attn_implementation = "sdpa"
    return cfg


def _head_dim(cfg: Any) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def kv_bytes(cfg: Any, batch: int, length: int, dtype: torch.dtype) -> int:
    """K and V of every layer at ``length`` positions."""
    kvh = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * batch * kvh * _head_dim(cfg) * length * dtype.itemsize


@dataclass
class Options:
    name: str | None = None
    config: str | None = None
    batch: int = 1
    prompt: int = 128
    new_tokens: int = 128
    dtype: str = "float16"
    backends: tuple[str, ...] = ("inductor",)
    cards: int = 1
    hw: str | None = None
    kv: tuple[int, ...] = (128, 2048, 8192)
    layers: int | None = None
    execute: bool = False          # functional run (small configs): same figures, real values
    top: int = 10
    routing: str = "balanced"      # estimate-only: how routed rows split over experts (vspyre.runtime.routing)
    compile: str = "regional"      # regional: the decoder layer compiled once for all layers; whole: one graph
    warm: bool = True              # also time a warm prefill compile (the family sweep skips it)
    tp: int = 1                    # tensor parallel degree: one card per rank (vspyre.distributed.tp)
    quant: str | None = None       # fp8 | w8a8 | w4a16: the linears quantised with torchao (vspyre.quant)


@dataclass
class Phase:
    """One profiled call: what the card would spend on it."""

    est_us: float = 0.0
    kernel_us: float = 0.0
    collective_us: float = 0.0     # collectives between cards (tensor parallel), on the link model
    collectives: int = 0
    fallback_us: float = 0.0       # host fallbacks: the host link's time for their bytes
    launches: int = 0
    host_overhead_us: float = 0.0  # launches x the preset's host_overhead_us (host time, not device time)
    with_host_us: float = 0.0      # est_us + host_overhead_us: the call's time when the host pays per launch
    fallbacks: dict[str, int] = field(default_factory=dict)
    syncs: dict[str, int] = field(default_factory=dict)      # data-dependent sizes read back from the card
    assumed: dict[str, int] = field(default_factory=dict)    # ... or resolved by the routing assumption
    roofline_us: float = 0.0
    graphs: int = 0                # Dynamo graphs compiled so far in this phase
    first_call_s: float = 0.0      # wall time of the first call (compile + plan)
    top: list[dict] = field(default_factory=list)


def _profile_call(fn, top: int) -> Phase:
    from ..runtime import profiler, routing

    routing.reset_sync_stats()
    routing.reset_assumed()
    with profiler.profile(record_segments=False) as p:
        fn()
    ph = Phase(syncs=routing.sync_stats(), assumed=routing.assumed())
    ph.kernel_us = p.kernel_est_us
    ph.collective_us = p.collective_est_us
    ph.collectives = len(p.collectives)
    ph.fallback_us = sum(f.est_us for f in p.fallbacks)
    ph.est_us = ph.kernel_us + ph.fallback_us + ph.collective_us
    ph.launches = len(p.kernels)
    ph.host_overhead_us = ph.launches * hardware.get_config().host_overhead_us
    ph.with_host_us = ph.est_us + ph.host_overhead_us
    ph.roofline_us = sum(k.roofline_us for k in p.kernels)
    for f in p.fallbacks:
        ph.fallbacks[f.op] = ph.fallbacks.get(f.op, 0) + 1
    for r in p.key_averages()[:top]:
        ph.top.append({"kernel": r.name, "calls": r.calls, "est_us": round(r.est_us, 3),
                       "share": round(r.est_us / ph.est_us, 4) if ph.est_us else 0.0, "bottleneck": r.bottleneck,
                       "roofline_eff": round(r.efficiency, 4)})
    return ph


@contextlib.contextmanager
def _hw(name: str | None, cards: int) -> Iterator[hardware.HardwareConfig]:
    """The preset asked for; with ``cards`` > 1 its device memory pooled over that many cards (one
    card's compute: multi-card execution is not modelled, only the memory a split would give)."""
    if name is not None and name not in hardware.PRESETS:
        raise EstimateError(f"unknown hardware preset {name!r}; presets: {', '.join(hardware.PRESETS)}")
    base = hardware.PRESETS[name] if name else hardware.get_config()
    base = dataclasses.replace(base, num_cards=hardware.get_config().num_cards)   # fixed once the device started
    if cards > 1:
        base = dataclasses.replace(base, device_memory_bytes=base.device_memory_bytes * cards,
                                   ecc_bytes=base.ecc_bytes * cards)
    prev = hardware.set_config(base)
    try:
        yield base
    finally:
        hardware.set_config(prev)


def _build(cfg: Any, dtype: torch.dtype, execute: bool, tp: int = 1, quant: str | None = None) -> torch.nn.Module:
    """The model on the card; at ``tp`` > 1 split over the ranks (each rank its slice, stored once);
    with ``quant`` its linears quantised on the card (vspyre.quant: torchao's layouts; in
    estimate-only mode the quantising kernels are costed, not run, and the layouts are exact)."""
    from transformers import AutoModelForCausalLM

    from ..distributed import tp as tensor_parallel

    if execute:                      # small configs only: random weights on the host, then moved
        torch.manual_seed(0)         # (every rank the same weights: each keeps its slice)
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval().to("spyre")
        if tp > 1:
            tensor_parallel.parallelize(model, src_data_rank=None)
    else:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
        if tp > 1:                   # split before it reaches the card: a rank never holds the whole model
            tensor_parallel.parallelize(model, src_data_rank=None)
        model = model.to_empty(device="spyre")       # accounted on the card, no host memory, no values
    # moving a module to an out-of-tree device makes new parameters (as on XLA): tied ones come apart
    model.tie_weights()
    if quant is not None:
        from .. import quant as quantisation
        quantisation.quantize(model, quant)
    return model


def _ids(batch: int, n: int, vocab: int, execute: bool) -> torch.Tensor:
    if execute:
        return torch.randint(0, vocab, (batch, n), generator=torch.Generator().manual_seed(0)).to("spyre")
    return torch.empty(batch, n, dtype=torch.int64, device="spyre")


def _cache(cfg: Any, batch: int, length: int, dtype: torch.dtype, execute: bool, tp: int = 1) -> Any:
    """A KV cache holding ``length`` positions in every layer, its length dimension marked dynamic
    (``dynamic=True`` does not reach tensors nested in the cache object: without the mark Dynamo
    compiles the first length static and recompiles once at the second)."""
    from transformers import DynamicCache

    from ..compat import mark_dynamic

    kvh = (getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads) // tp   # this rank's heads
    cache = DynamicCache(config=cfg)
    shape = (batch, kvh, length, _head_dim(cfg))
    make = torch.randn if execute else torch.empty
    for i in range(cfg.num_hidden_layers):
        k, v = make(shape, dtype=dtype, device="spyre"), make(shape, dtype=dtype, device="spyre")
        cache.update(k, v, i)
    for layer in cache.layers:
        mark_dynamic(layer.keys, 2)
        mark_dynamic(layer.values, 2)
    return cache


def _graphs() -> int:
    from ..compat import dynamo_counters as counters
    return int(counters["stats"]["unique_graphs"])


def run_backend(cfg: Any, opts: Options, backend: str, advance=lambda label: None) -> dict[str, Any]:
    """Prefill and decode estimates of one compiler; ``advance(label)`` ticks a progress bar."""
    from ..compat import dynamo_counters as counters
    from ..compat import dynamo_reset
    from ..runtime import relayout

    from .. import quant as quantisation
    from .. import regional
    from ..standalone import cache as graph_cache

    dtype = DTYPES[opts.dtype]
    compiler = BACKENDS[backend]
    out: dict[str, Any] = {"backend": backend, "compile": opts.compile}

    def compiled(model, **kw):
        return regional.compile_model(model, compiler, opts.compile, **kw)
    dynamo_reset()
    graph_cache.reset_stats()
    gc.collect()               # an earlier backend's model (held in reference cycles) is freed now, not mid-run
    counters.clear()
    torch.spyre.reset_fallback_stats()
    relayout.sweep()           # the re-laid copies of tensors freed since (the earlier model's)
    mem0 = torch.spyre.memory_allocated()
    with torch.spyre.estimate_only(not opts.execute), torch.no_grad():
        model = _build(cfg, dtype, opts.execute, opts.tp, opts.quant)
        weights = torch.spyre.memory_allocated() - mem0
        out["weights_bytes"] = weights
        advance("built")

        # -- prefill: one forward over the prompt -------------------------------------------------
        ids = _ids(opts.batch, opts.prompt, cfg.vocab_size, opts.execute)
        prefill = compiled(model)
        # the re-layouts counted are the weights' (and buffers'): activations the calls leave alive
        # (a KV cache in a reference cycle until gc runs) are not held by the model
        held = [i for t in (*model.parameters(), *model.buffers()) for i in quantisation.inner_tensors(t)]
        rl0 = relayout.stats(held)                # first: sweeps the copies of tensors already freed
        torch.spyre.reset_peak_memory_stats()
        before = torch.spyre.memory_allocated()
        t0 = time.perf_counter()
        prefill(input_ids=ids, use_cache=True)
        cold = time.perf_counter() - t0
        peak = torch.spyre.max_memory_allocated() - before - (relayout.stats()["bytes"] - rl0["bytes"])
        advance("prefill compiled")
        ph = _profile_call(lambda: prefill(input_ids=ids, use_cache=True), opts.top)
        # after the second call: a weight read both ways (a tied embedding and LM head) may be
        # re-laid in place by the first and given its copy by the next call's direct read
        rl = relayout.stats(held)
        out["relayout_bytes"] = rl["bytes"] - rl0["bytes"]                         # copies beside the weights
        out["relayout_in_place_bytes"] = rl["in_place_bytes"] - rl0["in_place_bytes"]   # within the weights
        ph.first_call_s = cold
        ph.graphs = _graphs()
        out["prefill"] = asdict(ph)
        out["peak_prefill_bytes"] = peak          # activations and the prompt's KV cache
        out["prefill_warm_s"] = None
        if opts.warm:
            dynamo_reset()                        # warm: the same graphs again (caches on disk and in memory)
            t0 = time.perf_counter()
            compiled(model)(input_ids=ids, use_cache=True)
            out["prefill_warm_s"] = time.perf_counter() - t0
        advance("prefill estimated")

        # -- decode: one token with the KV cache at each length, one dynamic graph ----------------
        dynamo_reset()
        counters.clear()
        decode = compiled(model, dynamic=True)
        tok = _ids(opts.batch, 1, cfg.vocab_size, opts.execute)
        steps = []
        for length in _kv_lengths(cfg, opts):
            g0 = _graphs()
            t0 = time.perf_counter()
            decode(input_ids=tok, past_key_values=_cache(cfg, opts.batch, length, dtype, opts.execute, opts.tp),
                   use_cache=True)
            first = time.perf_counter() - t0
            cache = _cache(cfg, opts.batch, length, dtype, opts.execute, opts.tp)
            ph = _profile_call(lambda: decode(input_ids=tok, past_key_values=cache, use_cache=True), opts.top)
            ph.first_call_s = first
            ph.graphs = _graphs() - g0
            del cache
            steps.append({"kv": length, **asdict(ph)})
            advance(f"decode kv={length}")
        out["decode"] = steps
        out["decode_graphs"] = _graphs()
        out["recompiles"] = sum(s["graphs"] for s in steps[1:])
        out["graph_breaks"] = int(sum(counters["graph_break"].values()))
        del model, prefill, decode
    if backend == "standalone":                   # its compiled-graph cache (warm prefill: hits)
        out["graph_cache"] = graph_cache.stats_dict()
    out["tokens_per_s"], out["generate_us"] = _throughput(steps, opts)
    return out


@contextlib.contextmanager
def fresh_compile_caches() -> Iterator[str]:
    """Inductor's on-disk caches (FX graphs, AOTAutograd) and the standalone compiler's graph cache
    in a new directory for the duration, so a cold compile is cold even when an earlier run
    compiled the same graphs (the kernel plan cache is kept, as before)."""
    import shutil
    import tempfile

    names = ("TORCHINDUCTOR_CACHE_DIR", "VSPYRE_GRAPH_CACHE_DIR")
    prev = {n: os.environ.get(n) for n in names}
    d = tempfile.mkdtemp(prefix="vspyre-estimate-cache-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = d
    os.environ["VSPYRE_GRAPH_CACHE_DIR"] = os.path.join(d, "standalone")
    try:
        yield d
    finally:
        for n, v in prev.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v
        shutil.rmtree(d, ignore_errors=True)


def _kv_lengths(cfg: Any, opts: Options) -> list[int]:
    """The decode lengths measured: those asked for that the model's positions allow, and the
    generated range's ends (prompt, prompt + new tokens) for the throughput figure."""
    limit = getattr(cfg, "max_position_embeddings", None) or 1 << 30
    ask = {k for k in opts.kv if 0 < k <= limit} | {opts.prompt, min(opts.prompt + opts.new_tokens, limit)}
    return sorted(ask)


def _tpot(steps: list[dict], length: float) -> float:
    """Decode time at ``length`` by linear interpolation between the measured lengths."""
    pts = sorted((s["kv"], s["est_us"]) for s in steps)
    for (l0, t0), (l1, t1) in zip(pts, pts[1:]):
        if l0 <= length <= l1:
            return t0 + (t1 - t0) * (length - l0) / (l1 - l0) if l1 > l0 else t0
    return pts[0][1] if length < pts[0][0] else pts[-1][1]


def _throughput(steps: list[dict], opts: Options) -> tuple[float, float]:
    """Decode tokens per second over the generated range and the decode time of all new tokens."""
    total = sum(_tpot(steps, opts.prompt + i) for i in range(opts.new_tokens))
    return (opts.batch * opts.new_tokens / (total * 1e-6) if total else 0.0), total


def estimate(opts: Options, progress: bool = True) -> dict[str, Any]:
    """Run the estimate; returns the report (a JSON-able dict)."""
    if opts.dtype not in DTYPES:
        raise EstimateError(f"dtype {opts.dtype!r} is not one the card computes LLMs in; use one of "
                            f"{', '.join(DTYPES)} (the card holds {hardware.dtype_names()})")
    for b in opts.backends:
        if b not in BACKENDS:
            raise EstimateError(f"unknown backend {b!r}; one of {', '.join(BACKENDS)} or 'both'")
    from ..regional import MODES
    if opts.compile not in MODES:
        raise EstimateError(f"unknown compile mode {opts.compile!r}; one of {', '.join(MODES)}")
    if opts.batch < 1 or opts.prompt < 1 or opts.new_tokens < 0 or opts.cards < 1 or opts.tp < 1:
        raise EstimateError("--batch, --prompt, --cards and --tp must be >= 1, --new-tokens >= 0")
    if opts.quant is not None:
        from .. import quant as quantisation
        if opts.quant not in quantisation.SCHEMES:
            raise EstimateError(f"unknown --quant {opts.quant!r}; one of {', '.join(quantisation.SCHEMES)}")
        if opts.tp > 1:
            raise EstimateError(f"--quant {opts.quant} with --tp {opts.tp}: quantised weights are not split over "
                                "cards yet (torchao's tensors are not sharded by the tensor-parallel plan); "
                                "estimate one card, or --tp without --quant")
        try:
            quantisation.scheme(opts.quant).config(DTYPES[opts.dtype] if opts.dtype in DTYPES else torch.float16)
        except quantisation.QuantError as e:
            raise EstimateError(str(e)) from None
    if opts.tp > 1 and opts.cards > 1:
        raise EstimateError(f"--tp {opts.tp} with --cards {opts.cards}: at --tp N every rank has a card of its own "
                            "(N cards); --cards pools the memory of several cards for one")
    from ..runtime import routing
    try:
        route = routing.parse(opts.routing)
    except ValueError as e:
        raise EstimateError(str(e)) from None
    cfg = load_config(opts.name, opts.config, opts.layers)
    dtype = DTYPES[opts.dtype]
    limit = getattr(cfg, "max_position_embeddings", None)
    if limit and opts.prompt + opts.new_tokens > limit:
        raise EstimateError(f"prompt {opts.prompt} + {opts.new_tokens} new tokens exceeds the model's "
                            f"{limit} positions (max_position_embeddings)")
    if opts.tp > 1:
        from ..distributed import SpyreDistributedError
        from ..distributed import tp as tensor_parallel
        try:
            tensor_parallel.check_divisible(cfg, opts.tp)
        except SpyreDistributedError as e:
            raise EstimateError(str(e)) from None
    with _hw(opts.hw, opts.cards) as hw_cfg, fresh_compile_caches(), routing.routing(route), \
            _ranks(opts) as ranks:
        report = _memory(cfg, opts, dtype, hw_cfg)
        report.update({"model": opts.name or os.path.basename(opts.config or ""), "dtype": opts.dtype,
                       "quant": _quant_info(opts, dtype),
                       "batch": opts.batch, "prompt": opts.prompt, "new_tokens": opts.new_tokens,
                       "hw": hw_cfg.name, "compile": opts.compile, "host_overhead_us": hw_cfg.host_overhead_us, "layers": cfg.num_hidden_layers, "torch": torch.__version__,
                       "mode": "functional" if opts.execute else "estimate-only", "backends": {},
                       "routing": _routing_info(cfg, route, opts.execute), "tp": opts.tp, "ranks": ranks,
                       "link": _link_info(hw_cfg, opts.tp)})
        if not report["fits"]:
            return report
        steps = 3 + len(_kv_lengths(cfg, opts))
        with _progress(progress, len(opts.backends) * steps) as advance:
            for b in opts.backends:
                t0 = time.perf_counter()
                r = run_backend(cfg, opts, b, lambda label: advance(f"{b}: {label}"))
                r["wall_s"] = time.perf_counter() - t0
                report["backends"][b] = r
        _measured_memory(report, cfg, opts, dtype)
    return report


@contextlib.contextmanager
def _ranks(opts: Options) -> Iterator[str]:
    """The ranks of a ``--tp N`` estimate: the process group this process is a rank of (N processes,
    e.g. ``launch.run(rank_estimate, N, opts)`` or torchrun), else this process simulating rank 0 of
    N identical ranks (tensor parallel is symmetric: every rank runs the same kernels and collectives
    on its slice; collectives are costed, not exchanged)."""
    if opts.tp == 1:
        yield "one card"
        return
    import torch.distributed as dist

    from .. import distributed

    if dist.is_initialized():
        if dist.get_world_size() != opts.tp:
            raise EstimateError(f"--tp {opts.tp} in a process group of {dist.get_world_size()} ranks")
        yield f"{opts.tp} processes (one rank each; figures of rank {dist.get_rank()})"
        return
    if opts.execute:
        raise EstimateError(f"--execute --tp {opts.tp}: a functional run needs {opts.tp} processes (the other ranks' "
                            "values must exist): vspyre.distributed.launch.run(vspyre.harness.estimate.rank_estimate, "
                            f"{opts.tp}, options) or torchrun; estimate-only simulates the ranks in one process")
    with distributed.simulate(opts.tp):
        yield f"simulated: this process is rank 0 of {opts.tp} identical ranks (tensor parallel is symmetric)"


def rank_estimate(rank: int, opts: Options) -> dict[str, Any]:
    """One rank's estimate in an N-process group (for ``vspyre.distributed.launch.run``)."""
    return estimate(opts, progress=False)


def _link_info(hw_cfg: hardware.HardwareConfig, tp: int) -> dict[str, Any] | None:
    """What the collectives' times assume (the card-to-card link model: none of it is published)."""
    if tp == 1:
        return None
    return {"algorithm": hw_cfg.collective_algorithm, "bandwidth": hw_cfg.card_link_bandwidth,
            "latency_us": hw_cfg.card_link_latency_us,
            "text": f"{hw_cfg.collective_algorithm} collectives, {hw_cfg.card_link_bandwidth / 1e9:.0f} GB/s per direction "
                    f"per card link, {hw_cfg.card_link_latency_us:.0f} us per step (estimates, not measured: "
                    "docs/multi-card.md)"}


def _quant_info(opts: Options, dtype: torch.dtype) -> dict[str, str] | None:
    if opts.quant is None:
        return None
    from .. import quant as quantisation
    return quantisation.describe(opts.quant, dtype)


def _experts(cfg: Any) -> tuple[int, int] | None:
    """(experts, experts per token) of a mixture-of-experts config, None for a dense one."""
    for e, k in (("num_local_experts", "num_experts_per_tok"), ("num_experts", "num_experts_per_tok"),
                 ("n_routed_experts", "num_experts_per_tok")):
        n, top = getattr(cfg, e, None), getattr(cfg, k, None)
        if isinstance(n, int) and n > 1 and isinstance(top, int):
            return n, top
    return None


def _routing_info(cfg: Any, route: Any, execute: bool) -> dict[str, Any]:
    """What the report's figures assume about routing: nothing for a dense model or a functional
    run (the router's real choices), else the estimate-only assumption."""
    moe = _experts(cfg)
    if moe is None:
        return {"moe": False, "assumption": None, "text": "dense model: no routing"}
    info = {"moe": True, "experts": moe[0], "top_k": moe[1]}
    if execute:
        return {**info, "assumption": None, "text": "functional run: the router's own choices on random weights"}
    return {**info, "assumption": str(route), "text": route.describe()}


def _memory(cfg: Any, opts: Options, dtype: torch.dtype, hw_cfg: hardware.HardwareConfig) -> dict[str, Any]:
    """Weights and KV cache from the config (exact), against the cards' capacity; at ``--tp N`` one
    rank's (its slice of the split weights, the replicated rest, 1/N of the KV heads)."""
    from ..distributed import tp as tensor_parallel

    with torch.device("meta"):
        from transformers import AutoModelForCausalLM
        m = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    params = sum(p.numel() for p in m.parameters())
    if opts.quant is not None:
        from .. import quant as quantisation
        weights = quantisation.model_weight_bytes(m, opts.quant)      # one card (--quant refuses --tp)
    else:
        weights = tensor_parallel.per_rank_bytes(m, opts.tp)
    del m
    kv = kv_bytes(cfg, opts.batch, opts.prompt + opts.new_tokens, dtype) // opts.tp
    cap = hw_cfg.usable_memory_bytes // opts.cards          # one card's
    cards = max(1, math.ceil((weights + kv) / cap))
    return {"params": params, "memory": {"weights_bytes": weights, "kv_cache_bytes": kv, "capacity_bytes": cap,
                                         "cards": opts.cards},
            "cards_needed": cards, "fits": cards <= opts.cards}


def _measured_memory(report: dict, cfg: Any, opts: Options, dtype: torch.dtype) -> None:
    mem = report["memory"]
    peaks = [r["peak_prefill_bytes"] for r in report["backends"].values()]
    prompt_kv = kv_bytes(cfg, opts.batch, opts.prompt, dtype)
    mem["peak_activations_bytes"] = max(0, max(peaks) - prompt_kv) if peaks else 0
    mem["relayout_bytes"] = max(r["relayout_bytes"] for r in report["backends"].values())
    mem["relayout_in_place_bytes"] = max(r.get("relayout_in_place_bytes", 0) for r in report["backends"].values())
    total = mem["weights_bytes"] + mem["relayout_bytes"] + mem["kv_cache_bytes"] + mem["peak_activations_bytes"]
    mem["total_bytes"] = total
    report["cards_needed"] = max(1, math.ceil(total / mem["capacity_bytes"]))
    report["fits"] = report["cards_needed"] <= mem["cards"]


@contextlib.contextmanager
def _progress(show: bool, total: int):
    if not show:
        yield lambda label: None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), transient=False) as p:
        task = p.add_task("estimate", total=total)
        yield lambda label: p.update(task, advance=1, description=label)


# -- rendering --------------------------------------------------------------------------------

def _cards(n: int) -> str:
    return "one card" if n == 1 else f"{n} cards"


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _ms(us: float) -> str:
    return f"{us / 1e3:.2f} ms" if us >= 1000 else f"{us:.1f} us"


_COMPILE_WORDS = {"regional": "regionally (`--compile regional`: the decoder layer compiled once and reused for "
                               "every layer; embedding, masks, final norm and LM head as eager device kernels)",
                  "whole": "whole (`--compile whole`: the model as one graph)"}


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown (the same numbers as the JSON)."""
    mem = report["memory"]
    lines = [f"# vspyre estimate: {report['model']}",
             "",
             f"{report['params'] / 1e9:.2f}B parameters, {report['layers']} layers, {report['dtype']}, batch "
             f"{report['batch']}, prompt {report['prompt']}, {report['new_tokens']} new tokens; hardware preset "
             f"`{report['hw']}`; torch {report['torch']}; {report['mode']} (kernels planned and costed"
             f"{'' if report['mode'] == 'functional' else ', not executed'}); compiled "
             f"{_COMPILE_WORDS[report.get('compile', 'whole')]}."
             + (f" **Tensor parallel {report['tp']}** (DTensor, transformers' TP plan; ranks: {report['ranks']}); "
                f"collectives: {report['link']['text']}." if report.get("tp", 1) > 1 else "")
             + (f" **Quantised {report['quant']['scheme']}** ({report['quant']['library']}): weights "
                f"{report['quant']['weights']}; activations {report['quant']['activations']}; each linear: "
                f"{report['quant']['matmul']}; not quantised: {report['quant']['not quantised']}."
                if report.get("quant") else ""),
             "",
             "## Device memory" + (" (per card)" if report.get("tp", 1) > 1 else ""),
             "",
             "| | bytes |", "|---|---|",
             f"| weights | {_gib(mem['weights_bytes'])} |"]
    if "peak_activations_bytes" in mem:
        lines.append(f"| of which re-laid in place (transposed matmul operands, stored once) | "
                     f"{_gib(mem.get('relayout_in_place_bytes', 0))} |")
    lines.append(f"| KV cache at {report['prompt'] + report['new_tokens']} positions | {_gib(mem['kv_cache_bytes'])} |")
    if "peak_activations_bytes" in mem:
        lines.append(f"| re-laid copies (weights also read as stored, such as a tied embedding) | "
                     f"{_gib(mem['relayout_bytes'])} |")
        lines.append(f"| peak activations (prefill) | {_gib(mem['peak_activations_bytes'])} |")
        lines.append(f"| total | {_gib(mem['total_bytes'])} |")
    lines += [f"| one card's capacity | {_gib(mem['capacity_bytes'])} |", ""]
    rt = report.get("routing") or {}
    if rt.get("moe"):
        lines += [f"Mixture of experts: {rt['experts']} experts, top-{rt['top_k']}. Routing: "
                  + (f"**{rt['assumption']}** ({rt['text']}); every time below assumes it (in estimate-only mode "
                     "the card holds no router values; `--routing balanced|skewed:F` changes it)."
                     if rt.get("assumption") else rt["text"] + "."), ""]
    if mem["cards"] > 1:
        lines += [f"Device memory pooled over {mem['cards']} cards; times are one card's (multi-card execution "
                  "is not modelled).", ""]
    if not report["fits"]:
        lines += [f"**Does not fit {_cards(mem['cards'])}"
                  + (f" at tensor parallel {report['tp']}" if report.get("tp", 1) > 1 else "")
                  + f": needs {report['cards_needed']} times one card's memory** (no times are estimated; "
                  "`--tp N` splits the model over N cards).", ""]
        return "\n".join(lines)
    bs = report["backends"]
    names = list(bs)
    head = "| | " + " | ".join(names) + " |"
    sep = "|---|" + "---|" * len(names)
    lines += ["## Time", "", head, sep]

    def row(label: str, fn) -> None:
        lines.append(f"| {label} | " + " | ".join(fn(bs[n]) for n in names) + " |")

    tag = f" [routing {rt['assumption']}]" if rt.get("assumption") else ""
    row(f"time to first token (prefill), device time{tag}", lambda r: _ms(r["prefill"]["est_us"]))
    if report.get("tp", 1) > 1:
        def coll(ph: dict) -> str:
            c, t = ph.get("collective_us", 0.0), ph["est_us"]
            return f"{_ms(c)} ({c / t:.0%}; {ph.get('collectives', 0)} collectives)" if t else "-"
        row("of which collectives between cards (prefill)", lambda r: coll(r["prefill"]))
        for i, s in enumerate(bs[names[0]]["decode"][:1]):
            row(f"of which collectives (output token, KV {s['kv']})", lambda r, i=i: coll(r["decode"][i]))
    row("prefill roofline efficiency", lambda r: f"{r['prefill']['roofline_us'] / r['prefill']['est_us']:.0%}"
        if r["prefill"]["est_us"] else "-")
    for i, s in enumerate(bs[names[0]]["decode"]):
        row(f"time per output token, KV {s['kv']}, device time{tag}", lambda r, i=i: _ms(r["decode"][i]["est_us"]))
    over = report.get("host_overhead_us", 0.0)
    row(f"with the host's overhead per call ({_ms(over)} x launches): first token",
        lambda r: _ms(r["prefill"].get("with_host_us", r["prefill"]["est_us"])))
    for i, s in enumerate(bs[names[0]]["decode"]):
        row(f"with the host's overhead per call: output token, KV {s['kv']}",
            lambda r, i=i: _ms(r["decode"][i].get("with_host_us", r["decode"][i]["est_us"])))
    row(f"decode tokens/s (batch {report['batch']}){tag}", lambda r: f"{r['tokens_per_s']:.1f}")
    row("kernel launches (prefill / decode step)",
        lambda r: f"{r['prefill']['launches']} / {r['decode'][0]['launches']}")
    row("host fallbacks (prefill / decode step)",
        lambda r: f"{sum(r['prefill']['fallbacks'].values())} / {sum(r['decode'][0]['fallbacks'].values())}")
    if rt.get("moe"):
        row("data-dependent sizes per prefill: read back (syncs) / assumed",
            lambda r: f"{sum(r['prefill'].get('syncs', {}).values())} / "
                      f"{sum(r['prefill'].get('assumed', {}).values())}")
    row("compile, prefill: cold / warm", lambda r: f"{r['prefill']['first_call_s']:.1f} s / "
        + (f"{r['prefill_warm_s']:.1f} s" if r["prefill_warm_s"] is not None else "not timed"))
    row("compile, decode (first step)", lambda r: f"{r['decode'][0]['first_call_s']:.1f} s")
    if any("graph_cache" in r for r in bs.values()):
        row("standalone graph cache: hits / misses", lambda r: f"{r['graph_cache']['hits']} / "
            f"{r['graph_cache']['misses']}" if "graph_cache" in r else "-")
    row("decode graphs / recompiles over KV lengths",
        lambda r: f"{r['decode_graphs']} / {r['recompiles']}")
    row("graph breaks", lambda r: str(r["graph_breaks"]))
    lines.append("")
    for n in names:
        lines += [f"## Top prefill kernels: {n}", "", "| kernel | calls | est. | share | bottleneck | roofline eff. |",
                  "|---|---|---|---|---|---|"]
        for k in bs[n]["prefill"]["top"]:
            lines.append(f"| `{k['kernel']}` | {k['calls']} | {_ms(k['est_us'])} | {k['share']:.1%} | "
                         f"{k['bottleneck']} | {k['roofline_eff']:.0%} |")
        lines.append("")
    return "\n".join(lines)


def _label(report: dict[str, Any]) -> str:
    return report["quant"]["scheme"] if report.get("quant") else report["dtype"]


def quant_comparison(reports: list[dict[str, Any]]) -> str:
    """The unquantised estimate (first) beside each quantised one: memory, time to first token,
    time per output token and tokens/s per compiler, with the ratio to the first."""
    base = reports[0]
    lines = [f"# vspyre estimate: {base['model']}, {' vs '.join(_label(r) for r in reports)}", "",
             f"Batch {base['batch']}, prompt {base['prompt']}, {base['new_tokens']} new tokens; hardware preset "
             f"`{base['hw']}` (the fp8/int8 systolic rate is its `matmul_speedup`, docs/hardware.md); torch "
             f"{base['torch']}; {base['mode']}; times are device time (the host's overhead per launch, "
             f"{base.get('host_overhead_us', 0):.0f} us on this preset, is in each report's own table). Quantised with "
             "torchao (vspyre.quant); the LM head, embeddings, norms "
             f"and KV cache stay {base['dtype']}. Ratios (x) are against {base['dtype']}: memory is smaller by, "
             "times are faster by.", ""]
    for r in reports[1:]:
        q = r["quant"]
        lines.append(f"- **{q['scheme']}**: weights {q['weights']}; activations {q['activations']}; {q['matmul']}.")
    lines.append("")
    cols = [_label(r) for r in reports]
    lines += ["## Device memory", "", "| | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]

    def mem_row(label: str, key: str) -> None:
        vals = [r["memory"].get(key) for r in reports]
        if any(v is None for v in vals):
            return
        lines.append(f"| {label} | " + " | ".join(
            _gib(v) + ("" if i == 0 or not v else f" ({vals[0] / v:.2f}x)") for i, v in enumerate(vals)) + " |")
    mem_row("weights", "weights_bytes")
    mem_row("KV cache", "kv_cache_bytes")
    mem_row("total", "total_bytes")
    lines.append("| cards needed | " + " | ".join(str(r["cards_needed"]) for r in reports) + " |")
    lines.append("")
    fitting = [r for r in reports if r["fits"]]
    if len(fitting) < len(reports):
        lines += ["Times only for the variants that fit: " + ", ".join(_label(r) for r in fitting) + ".", ""]
    for b in dict.fromkeys(b for r in fitting for b in r["backends"]):
        rs = [r for r in fitting if b in r["backends"]]
        if not rs:
            continue
        lines += [f"## Time: {b}", "", "| | " + " | ".join(_label(r) for r in rs) + " |", "|---|" + "---|" * len(rs)]

        def t_row(label: str, fn, faster_is_smaller: bool = True) -> None:
            vals = [fn(r["backends"][b]) for r in rs]
            cells = []
            for i, v in enumerate(vals):
                ratio = "" if i == 0 or not v or not vals[0] else \
                    f" ({(vals[0] / v) if faster_is_smaller else (v / vals[0]):.2f}x)"
                cells.append((_ms(v) if faster_is_smaller else f"{v:.1f}") + ratio)
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        t_row("time to first token (prefill), device time", lambda x: x["prefill"]["est_us"])
        for i, s in enumerate(rs[0]["backends"][b]["decode"]):
            t_row(f"time per output token, KV {s['kv']}, device time", lambda x, i=i: x["decode"][i]["est_us"])
        t_row(f"decode tokens/s (batch {base['batch']})", lambda x: x["tokens_per_s"], faster_is_smaller=False)
        lines.append("| host fallbacks (prefill / decode step) | " + " | ".join(
            f"{sum(r['backends'][b]['prefill']['fallbacks'].values())} / "
            f"{sum(r['backends'][b]['decode'][0]['fallbacks'].values())}" for r in rs) + " |")
        lines.append("| compile, prefill (cold) | " + " | ".join(
            f"{r['backends'][b]['prefill']['first_call_s']:.1f} s" for r in rs) + " |")
        lines.append("")
    return "\n".join(lines)


def write_comparison(reports: list[dict[str, Any]], out_dir: str) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, f"estimate-{reports[0]['model'].removesuffix('.json')}-quant")
    with open(stem + ".json", "w") as fh:
        json.dump(reports, fh, indent=1)
    with open(stem + ".md", "w") as fh:
        fh.write(quant_comparison(reports) + "\n")
    return [stem + ".json", stem + ".md"]


def write(report: dict[str, Any], out_dir: str) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    suffix = f"-{report['quant']['scheme']}" if report.get("quant") else ""
    stem = os.path.join(out_dir, f"estimate-{report['model'].removesuffix('.json')}{suffix}")
    with open(stem + ".json", "w") as fh:
        json.dump(report, fh, indent=1)
    with open(stem + ".md", "w") as fh:
        fh.write(markdown(report) + "\n")
    return [stem + ".json", stem + ".md"]
