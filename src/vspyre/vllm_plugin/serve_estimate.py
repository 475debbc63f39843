"""``vspyre serve-estimate``: a served LLM's throughput and latency on the card at a given load,
without the card and without the model's weights.

vLLM's own engine, scheduler and KV-cache manager drive the plugin's model runner in
estimate-only mode (every step compiled, planned and costed on the card, not run; the weights are
only accounted). The clock is virtual: requests arrive at their times (Poisson at ``qps``, or a
trace), and each engine step advances the clock by the card's estimated time for that step. A
step's cost depends only on its bucketed shape (tokens, sequences, block-table widths), so the
runner costs each shape once and reuses it (:attr:`SpyreModelRunner.cost_cache`); a step is then
the scheduler's work only, and a thousand requests of an 8B model take minutes.

What the figures assume, printed with them: the hardware preset; device time only (no host
overhead between steps or launches); outputs run to their length (no early stop); sampling on the
card (greedy).
"""

from __future__ import annotations

import csv
import json
import math
import os
import random
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

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


def model_dir(name: str | None = None, config: str | None = None, layers: int | None = None) -> str:
    """A directory with the model's config.json only (estimate-only needs no weights)."""
    from ..harness.estimate import load_config

    cfg = load_config(name, config, layers)
    d = tempfile.mkdtemp(prefix="vspyre-serve-estimate-")
    cfg.to_json_file(os.path.join(d, "config.json"))
    return d


def run(path: str, backend: str, load: Load, engine: Engine, progress: Any = None) -> dict[str, Any]:
    """One compiler at one load (see :func:`run_loads`)."""
    return run_loads(path, backend, [load], engine, progress)[0]


def run_loads(path: str, backend: str, loads: list[Load], engine: Engine, progress: Any = None) -> list[dict[str, Any]]:
    """One compiler at each load in turn, on ONE engine (compiled once; the clock restarts at 0
    for each load, whose requests start on an idle engine): vLLM's engine on the virtual clock.
    Returns, per load, the metrics (vLLM's benchmark client's names, in ms) and the engine's
    start-up (graphs, compile time)."""
    os.environ["VSPYRE_VLLM_BACKEND"] = backend
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    from .. import compat

    compat.get("dynamo_reset")()
    t0 = time.perf_counter()
    out = []
    with torch.spyre.estimate_only():
        args = EngineArgs(model=path, skip_tokenizer_init=True, dtype=engine.dtype, seed=0,
                          max_num_seqs=engine.max_num_seqs, max_num_batched_tokens=engine.max_num_batched_tokens,
                          max_model_len=engine.max_model_len, enable_prefix_caching=engine.enable_prefix_caching)
        llm = LLMEngine.from_engine_args(args)
        try:
            startup_s = time.perf_counter() - t0
            runner = llm.collective_rpc("runner_object")[0]
            start = {"startup_graphs": runner.stats.graphs, "startup_compile_s": runner.stats.compile_s,
                     "engine_startup_s": startup_s}
            for k, load in enumerate(loads):
                out.append({**_drive(llm, runner, load, backend, f"{k}-", progress), **start})
        finally:
            llm.engine_core.shutdown()
            runner = llm.collective_rpc("runner_object")[0]
            runner.kv_caches, runner.model, runner._compiled = [], None, None    # the card's memory, freed now
            del llm
            import gc
            gc.collect()
    return out


def _drive(llm: Any, runner: Any, load: Load, backend: str, prefix: str, progress: Any) -> dict[str, Any]:
    """One load through an idle engine on a virtual clock starting at 0: the metrics."""
    from vllm import SamplingParams

    from .. import hardware

    arrivals = load.arrivals()
    vocab = llm.model_config.get_vocab_size()
    rng = random.Random(load.seed + 1)
    reqs: dict[str, dict] = {}
    clock, i = 0.0, 0
    st = runner.stats
    n_start, hits0, shapes0 = len(st.per_step), st.cost_cache_hits, len(runner.cost_cache)
    pad0, fb0 = st.padded_tokens, st.host_fallbacks
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
        clock += sum(s.est_us for s in st.per_step[n0:]) / 1e6
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
    done = [r for r in reqs.values() if len(r["times"]) >= r["output"]]
    duration = max((r["times"][-1] for r in done), default=0.0) - min((r["arrival"] for r in reqs.values()),
                                                                      default=0.0)
    out_tokens = sum(len(r["times"]) for r in reqs.values())
    kinds = by_kind(per_step)
    m = {
        "backend": backend, "hw": hardware.get_config().name, "qps": load.qps, "requests": len(reqs),
        "completed": len(done), "duration_s": duration,
        "request_throughput": len(done) / duration if duration else float("nan"),
        "output_throughput": out_tokens / duration if duration else float("nan"),
        "total_token_throughput": (sum(r["prompt"] for r in done) + out_tokens) / duration if duration else float("nan"),
        "steps": steps, "step_kinds": kinds, "wall_s": wall_s, "shapes_costed": shapes, "cost_cache_hits": cache_hits,
        "padded_tokens": st.padded_tokens - pad0, "host_fallbacks": st.host_fallbacks - fb0,
        "graphs_total": st.graphs,
    }
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2e)):
        m[f"mean_{name}_ms"] = float(np.mean(xs)) if xs else float("nan")
        for p, v in zip(PERCENTILES, np.percentile(xs, PERCENTILES) if xs else [float("nan")] * len(PERCENTILES)):
            m[f"p{p}_{name}_ms"] = float(v)
    return m


@dataclass
class Report:
    model: str
    engine: Engine
    load: Load
    runs: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"schema": "vspyre.serve-estimate/1", "model": self.model, "engine": asdict(self.engine),
                "load": {**asdict(self.load), "qps": [r["qps"] for r in self.runs]}, "runs": self.runs,
                "assumes": "device time only (no host overhead between steps or launches); outputs run to their "
                           "length; greedy sampling on the card; continuous batching with chunked prefill"}

    def markdown(self) -> str:
        hw = self.runs[0]["hw"] if self.runs else "?"
        e = self.engine
        lines = [f"# Serving estimate: {self.model}", "",
                 f"vLLM's scheduler on the card's estimated step times (hardware preset `{hw}`; device time only, "
                 f"no host overhead; outputs run to their length). Engine: max_num_seqs {e.max_num_seqs}, "
                 f"max_num_batched_tokens {e.max_num_batched_tokens}, block size 64, prefix caching "
                 f"{'on' if e.enable_prefix_caching else 'off'}, {e.dtype}.", "",
                 "| compiler | qps | req/s | out tok/s | TTFT p50 / p90 / p99 ms | TPOT p50 / p99 ms | ITL p50 / p99 ms "
                 "| steps | start-up graphs, compile s |", "|---|---|---|---|---|---|---|---|---|"]
        for r in self.runs:
            lines.append(f"| {r['backend']} | {r['qps']:g} | {r['request_throughput']:.2f} | {r['output_throughput']:.1f} "
                         f"| {r['p50_ttft_ms']:.1f} / {r['p90_ttft_ms']:.1f} / {r['p99_ttft_ms']:.1f} "
                         f"| {r['p50_tpot_ms']:.2f} / {r['p99_tpot_ms']:.2f} | {r['p50_itl_ms']:.2f} / {r['p99_itl_ms']:.2f} "
                         f"| {r['steps']} | {r['startup_graphs']}, {r['startup_compile_s']:.1f} |")
        return "\n".join(lines) + "\n"


def main(opts: Any) -> int:
    """The CLI command (``vspyre serve-estimate``)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    path = model_dir(opts.name, opts.config, opts.layers)
    label = opts.name or opts.config
    engine = Engine(opts.max_num_seqs, opts.max_num_batched_tokens, opts.max_model_len, opts.prefix_caching,
                    opts.dtype)
    backends = ["inductor", "standalone"] if opts.backend == "both" else [opts.backend]
    qps_list = [math.inf if q in ("inf", "all") else float(q) for q in opts.qps.split(",")]
    loads = [Load(q, opts.requests, lengths(opts.prompt), lengths(opts.output), opts.seed, opts.trace)
             for q in qps_list]
    report = Report(label, engine, loads[0])
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  disable=opts.no_progress) as bar:
        for b in backends:
            task = bar.add_task(f"{label} {b} ({len(loads)} rate{'s' * (len(loads) > 1)}): requests done",
                                total=None)
            done: list[int] = []

            def step(n: int, k: int, t: Any = task, done: list = done) -> None:
                bar.update(t, total=n * len(loads), completed=sum(done) + k)
                if k == n:
                    done.append(n)
            report.runs.extend(run_loads(path, b, loads, engine, progress=step))
    os.makedirs(opts.out, exist_ok=True)
    base = os.path.join(opts.out, f"serve-estimate-{os.path.basename(label).removesuffix('.json')}")
    with open(base + ".json", "w") as f:
        json.dump(report.to_json(), f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(report.markdown())
    print(report.markdown())
    print(f"wrote {base}.json and {base}.md")
    return 0
