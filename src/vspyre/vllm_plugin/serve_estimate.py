"""``vspyre serve-estimate``: a served LLM's throughput and latency on the card at a given load,
without the card and without the model's weights.

vLLM's own engine, scheduler and KV-cache manager drive the plugin's model runner in
estimate-only mode (every step compiled, planned and costed on the card, not run; the weights are
only accounted). The clock is virtual: requests arrive at their times (Poisson at ``qps``, or a
trace), and each engine step advances the clock by the card's estimated time for that step. A
step's cost depends only on its bucketed shape (tokens, sequences, block-table widths), so the
runner costs each shape once and reuses it (:attr:`SpyreModelRunner.cost_cache`); a step is then
the scheduler's work only, and a thousand requests of an 8B model take minutes.

Each compiler runs under a batching strategy: continuous (vLLM's scheduler as is: chunked
prefill, prefill beside decodes, the step graph compiled once with symbolic sizes: the new stack)
or static (:mod:`.static`: warmup shapes compiled at start-up, one padded batch at a time: how the
old stack served); ``--batching native`` gives each compiler its own stack's.

What the figures assume, printed with them: the hardware preset; device time only (no host
overhead between steps or launches); outputs run to their length (no early stop); sampling on the
card (greedy).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import gc
import json
import math
import os
import random
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import numpy as np

from .runner import by_kind

PERCENTILES = (50, 90, 99)


@dataclass
class Load:
    """The requests: ``requests`` arrivals, Poisson at ``qps`` (``inf``: all at once), prompt and
    output lengths fixed or uniform over ``(lo, hi)``; or ``trace``, a CSV of ``arrival_s,
    prompt_tokens, output_tokens``."""
    qps: float = math.inf
    requests: int = 100
    prompt: tuple[int, int] = (512, 512)
    output: tuple[int, int] = (128, 128)
    seed: int = 0
    trace: str | None = None

    def arrivals(self) -> list[tuple[float, int, int]]:
        if self.trace:
            with open(self.trace, newline="") as f:
                rows = [r for r in csv.reader(f) if r and not r[0].startswith("#")]
            if rows and not _is_number(rows[0][0]):
                rows = rows[1:]
            return sorted((float(a), int(p), int(o)) for a, p, o, *_ in rows)
        rng = random.Random(self.seed)
        t, out = 0.0, []
        for _ in range(self.requests):
            out.append((t, rng.randint(*self.prompt), rng.randint(*self.output)))
            if math.isfinite(self.qps):
                t += rng.expovariate(self.qps)
        return out


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def lengths(spec: str) -> tuple[int, int]:
    """``"512"`` -> (512, 512); ``"128:2048"`` -> (128, 2048)."""
    lo, _, hi = spec.partition(":")
    a, b = int(lo), int(hi or lo)
    if not 1 <= a <= b:
        raise ValueError(f"length {spec!r}: want N or LO:HI with 1 <= LO <= HI")
    return a, b


@dataclass
class Engine:
    """vLLM's engine settings (its flags' names)."""
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    max_model_len: int | None = None
    enable_prefix_caching: bool = False
    dtype: str = "float16"
    gpu_memory_utilization: float | None = None     # None: vLLM's default
    quant: str | None = None                        # vspyre_quant (vLLM's additional_config): fp8 | w8a8 | w4a16


def model_dir(name: str | None = None, config: str | None = None, layers: int | None = None) -> str:
    """A directory with the model's config.json only (estimate-only needs no weights)."""
    from ..harness.estimate import load_config

    cfg = load_config(name, config, layers)
    d = tempfile.mkdtemp(prefix="vspyre-serve-estimate-")
    cfg.to_json_file(os.path.join(d, "config.json"))
    return d


def default_warmup_shapes(load: Load, batch: int = 4) -> str:
    """The old stack's warmup shape for a load: its longest prompt (whole 64-token blocks) x its
    longest output x ``batch``."""
    rows = load.arrivals()
    p = max((r[1] for r in rows), default=64)
    return f"{-(-p // 64) * 64}x{max((r[2] for r in rows), default=1)}x{batch}"


@contextlib.contextmanager
def _environ(**kv: str | None) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in kv}
    try:
        for k, v in kv.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(path: str, backend: str, load: Load, engine: Engine, progress: Any = None, batching: str = "continuous",
        warmup_shapes: str | None = None) -> dict[str, Any]:
    """One compiler at one load (see :func:`run_loads`)."""
    return run_loads(path, backend, [load], engine, progress, batching, warmup_shapes)[0]


def _engine(path: str, engine: Engine) -> Any:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    args = EngineArgs(model=path, skip_tokenizer_init=True, dtype=engine.dtype, seed=0,
                      max_num_seqs=engine.max_num_seqs, max_num_batched_tokens=engine.max_num_batched_tokens,
                      max_model_len=engine.max_model_len, enable_prefix_caching=engine.enable_prefix_caching,
                      additional_config={"vspyre_quant": engine.quant} if engine.quant else {},
                      **({"gpu_memory_utilization": engine.gpu_memory_utilization}
                         if engine.gpu_memory_utilization is not None else {}))
    return LLMEngine.from_engine_args(args)


def _close(llm: Any) -> None:
    llm.engine_core.shutdown()
    runner = llm.collective_rpc("runner_object")[0]
    runner.kv_caches, runner.model, runner._compiled = [], None, None    # the card's memory, freed now
    gc.collect()


def run_loads(path: str, backend: str, loads: list[Load], engine: Engine, progress: Any = None,
              batching: str = "continuous", warmup_shapes: str | None = None,
              startup_warm: bool = False) -> list[dict[str, Any]]:
    """One compiler under one batching strategy at each load in turn, on ONE engine (compiled
    once; the clock restarts at 0 for each load, whose requests start on an idle engine): vLLM's
    engine on the virtual clock. ``batching``: ``continuous`` (vLLM's scheduler, chunked prefill,
    symbolic shapes) or ``static`` (the old stack's warmup shapes, :mod:`.static`). Returns, per
    load, the metrics (vLLM's benchmark client's names, in ms) and the engine's start-up (graphs,
    compile time; with ``startup_warm``, a second engine's start-up with the compiler's caches
    warm)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch

    from .. import compat

    out = []
    env = dict(VSPYRE_VLLM_BACKEND=backend, VSPYRE_VLLM_BATCHING=batching,
               VSPYRE_VLLM_WARMUP_SHAPES=warmup_shapes if batching == "static" else None)
    with _environ(**env), torch.spyre.estimate_only():
        compat.get("dynamo_reset")()
        t0 = time.perf_counter()
        llm = _engine(path, engine)
        try:
            startup_s = time.perf_counter() - t0
            runner = llm.collective_rpc("runner_object")[0]
            sc = llm.vllm_config.scheduler_config
            start = {"startup_graphs": runner.stats.graphs, "startup_compile_s": runner.stats.compile_s,
                     "quant": engine.quant, "weights_bytes": runner.weights_bytes,
                     "engine_startup_s": startup_s, "batching": batching,
                     "kv_cache_blocks": runner.num_blocks, "kv_cache_tokens": runner.num_blocks * runner.block_size,
                     "warmup_shapes": warmup_shapes if batching == "static" else None,
                     "max_num_seqs": sc.max_num_seqs, "max_num_batched_tokens": sc.max_num_batched_tokens}
            for k, load in enumerate(loads):
                out.append({**_drive(llm, runner, load, backend, f"{k}-", progress), **start})
        finally:
            _close(llm)
            del llm
        if startup_warm:
            compat.get("dynamo_reset")()
            llm = _engine(path, engine)
            warm = llm.collective_rpc("runner_object")[0].stats.compile_s
            _close(llm)
            del llm
            for m in out:
                m["startup_compile_warm_s"] = warm
    return out


def _scheduler(llm: Any) -> Any:
    """vLLM's scheduler of an in-process engine (None in another process)."""
    return getattr(getattr(llm.engine_core, "engine_core", None), "scheduler", None)


def _drive(llm: Any, runner: Any, load: Load, backend: str, prefix: str, progress: Any) -> dict[str, Any]:
    """One load through an idle engine on a virtual clock starting at 0: the metrics."""
    from vllm import SamplingParams

    from .. import hardware

    arrivals = load.arrivals()
    vocab = llm.model_config.get_vocab_size()
    rng = random.Random(load.seed + 1)
    sched = _scheduler(llm)
    reqs: dict[str, dict] = {}
    clock, i = 0.0, 0
    st = runner.stats
    n_start, hits0, shapes0 = len(st.per_step), st.cost_cache_hits, len(runner.cost_cache)
    pad0, fb0, pre0 = st.padded_tokens, st.host_fallbacks, st.preemptions
    starts: dict[int, float] = {}           # per_step index -> the clock when that step started
    kv_area, kv_max = 0.0, 0.0
    wall0 = time.perf_counter()
    while i < len(arrivals) or llm.has_unfinished_requests():
        while i < len(arrivals) and arrivals[i][0] <= clock:
            a, p, o = arrivals[i]
            rid = f"{prefix}{i}"
            ids = [rng.randrange(3, vocab) for _ in range(p)]     # distinct prompts: no prefix hits by chance
            llm.add_request(rid, {"prompt_token_ids": ids}, SamplingParams(max_tokens=o, ignore_eos=True, temperature=0.0))
            reqs[rid] = {"arrival": a, "prompt": p, "output": o, "times": []}
            i += 1
        if not llm.has_unfinished_requests():
            clock = arrivals[i][0]
            continue
        n0 = len(st.per_step)
        outs = llm.step()
        t = clock
        for j in range(n0, len(st.per_step)):
            starts[j] = t
            t += st.per_step[j].est_us / 1e6
        if sched is not None:
            use = float(sched.kv_cache_manager.usage)
            kv_area += use * (t - clock)
            kv_max = max(kv_max, use)
        clock = t
        for o_ in outs:
            r = reqs[o_.request_id]
            got = len(o_.outputs[0].token_ids) if o_.outputs else 0
            r["times"].extend([clock] * (got - len(r["times"])))
        if progress is not None:
            progress(len(arrivals), sum(1 for r in reqs.values() if len(r["times"]) >= r["output"]))
    wall_s = time.perf_counter() - wall0
    per_step = st.per_step[n_start:]
    steps = len(per_step)
    cache_hits, shapes = st.cost_cache_hits - hits0, len(runner.cost_cache) - shapes0
    ttft = [1e3 * (r["times"][0] - r["arrival"]) for r in reqs.values() if r["times"]]
    tpot = [1e3 * (r["times"][-1] - r["times"][0]) / (len(r["times"]) - 1) for r in reqs.values()
            if len(r["times"]) > 1]
    itl = [1e3 * (b - a) for r in reqs.values() for a, b in zip(r["times"], r["times"][1:])]
    e2e = [1e3 * (r["times"][-1] - r["arrival"]) for r in reqs.values() if r["times"]]
    # the runner sees vLLM's internal request ids: the caller's id, "-", 8 random characters
    admitted = {k.rsplit("-", 1)[0]: v for k, v in st.admitted.items()}
    queue = [1e3 * (starts[admitted[rid]] - r["arrival"]) for rid, r in reqs.items() if admitted.get(rid) in starts]
    done = [r for r in reqs.values() if len(r["times"]) >= r["output"]]
    first = min((r["arrival"] for r in reqs.values()), default=0.0)
    duration = max((r["times"][-1] for r in done), default=0.0) - first
    out_tokens = sum(len(r["times"]) for r in reqs.values())
    real_tokens = sum(s.tokens for s in per_step)
    padded = st.padded_tokens - pad0
    busy = sum(s.est_us for s in per_step) / 1e6
    m = {
        "backend": backend, "hw": hardware.get_config().name, "qps": load.qps, "requests": len(reqs),
        "completed": len(done), "duration_s": duration,
        "request_throughput": len(done) / duration if duration else float("nan"),
        "output_throughput": out_tokens / duration if duration else float("nan"),
        "total_token_throughput": (sum(r["prompt"] for r in done) + out_tokens) / duration if duration else float("nan"),
        "steps": steps, "step_kinds": by_kind(per_step), "wall_s": wall_s, "shapes_costed": shapes,
        "cost_cache_hits": cache_hits, "padded_tokens": padded,
        "padding_fraction": padded / (padded + real_tokens) if padded + real_tokens else 0.0,
        "host_fallbacks": st.host_fallbacks - fb0, "graphs_total": st.graphs, "preemptions": st.preemptions - pre0,
        "card_busy_fraction": busy / (clock - first) if clock > first else float("nan"),
        "kv_cache_usage_mean": kv_area / busy if sched is not None and busy else float("nan"),
        "kv_cache_usage_max": kv_max if sched is not None else float("nan"),
    }
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2e), ("queue", queue)):
        m[f"mean_{name}_ms"] = float(np.mean(xs)) if xs else float("nan")
        for p, v in zip(PERCENTILES, np.percentile(xs, PERCENTILES) if xs else [float("nan")] * len(PERCENTILES)):
            m[f"p{p}_{name}_ms"] = float(v)
    return m


ASSUMES = ("device time only (no host overhead between steps or launches; the host link's time for host "
           "fallbacks is included); outputs run to their length; greedy sampling on the card")


@dataclass
class Report:
    model: str
    engine: Engine
    load: Load
    runs: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"schema": "vspyre.serve-estimate/2", "model": self.model, "engine": asdict(self.engine),
                "load": {**asdict(self.load), "qps": sorted({r["qps"] for r in self.runs})}, "runs": self.runs,
                "assumes": ASSUMES}

    def markdown(self) -> str:
        hw = self.runs[0]["hw"] if self.runs else "?"
        e, ld = self.engine, self.load
        load = (f"trace `{ld.trace}`" if ld.trace else
                f"{ld.requests} requests, prompt {_span(ld.prompt)} tokens, output {_span(ld.output)} tokens, "
                f"Poisson arrivals (seed {ld.seed})")
        lines = [f"# Serving estimate: {self.model}", "",
                 f"vLLM's scheduler on the card's estimated step times (hardware preset `{hw}`; {ASSUMES}). "
                 f"Load: {load}. Engine: block size 64, prefix caching {'on' if e.enable_prefix_caching else 'off'}, "
                 f"{e.dtype}; continuous batching: max_num_seqs {e.max_num_seqs}, max_num_batched_tokens "
                 f"{e.max_num_batched_tokens} (the prefill chunk); static batching: the warmup shapes "
                 "(prompt x new tokens x batch), one batch at a time.", "",
                 "| compiler | batching | weights | qps | req/s | out tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms "
                 "| ITL p50 / p99 ms | queue p50 ms | KV use mean / max | preempt | padding | start-up graphs, "
                 "compile s |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in self.runs:
            strat = r["batching"] + (f" {r['warmup_shapes']}" if r.get("warmup_shapes") else "")
            warm = f" (warm {r['startup_compile_warm_s']:.1f})" if "startup_compile_warm_s" in r else ""
            wb = r.get("weights_bytes")
            weights = (r.get("quant") or e.dtype) + (f" {wb / 2**30:.2f} GiB" if wb else "")
            lines.append(
                f"| {r['backend']} | {strat} | {weights} | {r['qps']:g} | {r['request_throughput']:.2f} | "
                f"{r['output_throughput']:.1f} | {r['p50_ttft_ms']:.1f} / {r['p99_ttft_ms']:.1f} "
                f"| {r['p50_tpot_ms']:.2f} / {r['p99_tpot_ms']:.2f} | {r['p50_itl_ms']:.2f} / {r['p99_itl_ms']:.2f} "
                f"| {r['p50_queue_ms']:.1f} | {100 * r['kv_cache_usage_mean']:.1f}% / {100 * r['kv_cache_usage_max']:.1f}% "
                f"| {r['preemptions']} | {100 * r['padding_fraction']:.1f}% "
                f"| {r['startup_graphs']}, {r['startup_compile_s']:.1f}{warm} |")
        lines += ["", "TTFT, TPOT, ITL and E2E latency as vLLM's benchmark client defines them; queue: arrival to "
                  "first scheduled step; KV use: vLLM's KV-cache manager's, mean over the card's busy time; padding: "
                  "padded tokens / tokens computed; start-up: graphs compiled (and planned and costed) before "
                  "serving and their time on this host, cold (fresh caches) and warm (a second engine started in "
                  "the same process after `torch._dynamo.reset()`, with the on-disk caches kept: Inductor's FX-graph "
                  "and AOTAutograd caches and vspyre's plan cache; the standalone compiler has no compiled-graph "
                  "cache, so its warm start-up re-compiles)."]
        kv = sorted({(r["backend"], r["batching"], r.get("quant") or e.dtype, r.get("kv_cache_tokens"))
                     for r in self.runs if r.get("kv_cache_tokens")})
        if kv:
            lines.append("")
            lines.append("KV cache (tokens, from the card's memory less the weights and the largest step): "
                         + "; ".join(f"{b} {k} {w}: {t:,}" for b, k, w, t in kv) + ".")
        if any(r.get("quant") for r in self.runs):
            from ..quant import describe
            lines.append("")
            lines.append("Weights: the model's dtype, or its linears quantised on the card with torchao "
                         "(vspyre.quant; vLLM's `--additional-config '{\"vspyre_quant\": ...}'`): "
                         + "; ".join(f"**{q}**: {describe(q, torch_dtype(e.dtype))['weights']}, "
                                     f"{describe(q, torch_dtype(e.dtype))['matmul']}"
                                     for q in dict.fromkeys(r["quant"] for r in self.runs if r.get("quant")))
                         + f"; the LM head, embeddings and the KV cache stay {e.dtype}.")
        return "\n".join(lines) + "\n"


def torch_dtype(name: str) -> Any:
    import torch
    return getattr(torch, name)


def _span(x: tuple[int, int]) -> str:
    return str(x[0]) if x[0] == x[1] else f"{x[0]}-{x[1]} (uniform)"


def plot(report: Report, path: str) -> str:
    """TTFT and ITL (p50 solid, p99 dashed) against achieved output throughput, one line per
    compiler and batching strategy; a PNG at ``path``."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    groups: dict[tuple, list[dict]] = {}
    for r in report.runs:
        groups.setdefault((r["backend"], r["batching"]), []).append(r)
    for k, ((backend, batching), rs) in enumerate(groups.items()):
        rs = sorted(rs, key=lambda r: r["output_throughput"])
        x = [r["output_throughput"] for r in rs]
        color = f"C{k}"
        for ax, name in zip(axes, ("ttft", "itl")):
            ax.plot(x, [r[f"p50_{name}_ms"] for r in rs], "o-", color=color, label=f"{backend}, {batching}: p50")
            ax.plot(x, [r[f"p99_{name}_ms"] for r in rs], "s--", color=color, alpha=0.7, label=f"{backend}, {batching}: p99")
    hw = report.runs[0]["hw"] if report.runs else "?"
    for ax, name in zip(axes, ("time to first token (ms)", "inter-token latency (ms)")):
        ax.set_xlabel("output tokens / s (achieved)")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")          # TTFT spans queueing (seconds to minutes) and prefill alone
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{report.model}: serving estimate (preset {hw}; device time only, no host overhead)", fontsize=10)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path


def strategies(backends: list[str], batching: str) -> list[tuple[str, str]]:
    """(compiler, batching) pairs: ``native`` is each stack as it really served (the standalone
    compiler with static batching, Inductor with continuous); ``both`` every pair."""
    if batching == "native":
        return [(b, "static" if b == "standalone" else "continuous") for b in backends]
    kinds = ["continuous", "static"] if batching == "both" else [batching]
    return [(b, k) for b in backends for k in kinds]


def main(opts: Any) -> int:
    """The CLI command (``vspyre serve-estimate``)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from . import static

    path = model_dir(opts.name, opts.config, opts.layers)
    label = opts.name or opts.config
    engine = Engine(opts.max_num_seqs, opts.max_num_batched_tokens, opts.max_model_len, opts.prefix_caching,
                    opts.dtype)
    backends = ["inductor", "standalone"] if opts.backend == "both" else [opts.backend]
    qps_list = [math.inf if q in ("inf", "all") else float(q) for q in opts.qps.split(",")]
    loads = [Load(q, opts.requests, lengths(opts.prompt), lengths(opts.output), opts.seed, opts.trace)
             for q in qps_list]
    shapes = opts.warmup_shapes or default_warmup_shapes(loads[0], opts.static_batch)
    static.parse(shapes)                      # a bad shape fails before any engine starts
    report = Report(label, engine, loads[0])
    # --quant A[,B]: the model as it is first (unless --no-baseline), then each scheme, every strategy
    quants = [q.strip() for q in (getattr(opts, "quant", None) or "").split(",") if q.strip()]
    from ..quant import SCHEMES
    bad = [q for q in quants if q not in SCHEMES]
    if bad:
        raise SystemExit(f"vspyre serve-estimate: unknown --quant {bad[0]!r}; one of {', '.join(SCHEMES)}")
    variants = ([None] if not quants or not getattr(opts, "no_baseline", False) else []) + quants
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  disable=opts.no_progress) as bar:
        for q in variants:
            eng = dataclasses.replace(engine, quant=q)
            for b, batching in strategies(backends, opts.batching):
                task = bar.add_task(f"{label}{' ' + q if q else ''} {b} {batching} ({len(loads)} "
                                    f"rate{'s' * (len(loads) > 1)}): requests done", total=None)
                done: list[int] = []

                def step(n: int, k: int, t: Any = task, done: list = done) -> None:
                    bar.update(t, total=n * len(loads), completed=sum(done) + k)
                    if k == n:
                        done.append(n)
                report.runs.extend(run_loads(path, b, loads, eng, step, batching, shapes, opts.startup_warm))
    os.makedirs(opts.out, exist_ok=True)
    base = os.path.join(opts.out, f"serve-estimate-{os.path.basename(label).removesuffix('.json')}")
    with open(base + ".json", "w") as f:
        json.dump(report.to_json(), f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(report.markdown())
    wrote = [base + ".json", base + ".md"]
    if not opts.no_plot:
        try:
            wrote.append(plot(report, base + ".png"))
        except ImportError:
            print("(no plot: matplotlib is not installed; pip install vspyre[plots])")
    print(report.markdown())
    print("wrote " + ", ".join(wrote))
    return 0
