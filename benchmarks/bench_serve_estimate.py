"""What a full-size serving estimate costs on this host: ``vspyre serve-estimate`` at the issue's
size (1,000 requests of granite-3-8b, prompt 512, output 128, at 4 rates, one compiler) against its
goal of at most 10 minutes and 4 GB of host memory on 2 cores.

The run is the command's own (vLLM's engine in estimate-only mode on a virtual clock, one engine
for the 4 rates); it is made in a child process so its peak RSS is its own. Printed: wall time
(cold: Inductor's caches emptied first; engine start-up with the step graph's compile included),
peak RSS, steps driven and distinct step shapes costed, host time per step after start-up, and the
two ratios to the goal (below 1: within it). Also the figures of each rate, on the card's preset.

    python benchmarks/bench_serve_estimate.py [--model granite-3-8b] [--requests 1000] [--qps 1,2,4,inf]
                                              [--backend inductor] [--batching continuous] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

GOAL_S, GOAL_RSS_GB = 600.0, 4.0


def child(opts: argparse.Namespace) -> dict:
    import torch

    torch.set_num_threads(2)
    from vspyre.vllm_plugin import serve_estimate as SE

    path = SE.model_dir(opts.model)
    loads = [SE.Load(math.inf if q == "inf" else float(q), opts.requests, (512, 512), (128, 128), seed=0)
             for q in opts.qps.split(",")]
    t0 = time.perf_counter()
    shapes = SE.default_warmup_shapes(loads[0]) if opts.batching == "static" else None
    runs = SE.run_loads(path, opts.backend, loads, SE.Engine(), None, opts.batching, shapes)
    wall = time.perf_counter() - t0
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    return {"wall_s": wall, "rss_gb": rss_gb, "runs": runs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="granite-3-8b")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--qps", default="1,2,4,inf")
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--batching", default="continuous")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.child:
        with open(opts.child, "w") as f:
            json.dump(child(opts), f)
        return 0
    out = tempfile.mktemp(suffix=".json")
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS="2",
               TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="vspyre-bench-inductor-"))
    args = [sys.executable, __file__, "--child", out, "--model", opts.model, "--requests", str(opts.requests),
            "--qps", opts.qps, "--backend", opts.backend, "--batching", opts.batching]
    t0 = time.perf_counter()
    subprocess.run(args, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    total = time.perf_counter() - t0
    shutil.rmtree(env["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)
    with open(out) as f:
        r = json.load(f)
    os.unlink(out)
    runs = r["runs"]
    steps = sum(m["steps"] for m in runs)
    serve_wall = sum(m["wall_s"] for m in runs)
    print(f"serve-estimate cost: {opts.model}, {opts.requests} requests x {len(runs)} rates (prompt 512, output 128), "
          f"{opts.backend} {opts.batching}, hardware preset {runs[0]['hw']}; this host, 2 threads")
    print(f"  wall (process, cold caches)  {total:8.1f} s   goal {GOAL_S:.0f} s   ratio {total / GOAL_S:.2f}")
    print(f"  peak RSS                     {r['rss_gb']:8.2f} GB  goal {GOAL_RSS_GB:.0f} GB    ratio "
          f"{r['rss_gb'] / GOAL_RSS_GB:.2f}")
    print(f"  engine start-up              {runs[0]['engine_startup_s']:8.1f} s   (step graph compile "
          f"{runs[0]['startup_compile_s']:.1f} s, {runs[0]['startup_graphs']} graph(s))")
    print(f"  steps driven                 {steps:8d}     shapes costed {sum(m['shapes_costed'] for m in runs)}, "
          f"host {1e3 * serve_wall / max(steps, 1):.1f} ms/step")
    print(f"  {'qps':>5} {'req/s':>7} {'out tok/s':>10} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} "
          f"{'KV max':>7}  (ms; device time only, no host overhead)")
    for m in runs:
        print(f"  {m['qps']:>5g} {m['request_throughput']:7.2f} {m['output_throughput']:10.1f} {m['p50_ttft_ms']:9.1f} "
              f"{m['p99_ttft_ms']:9.1f} {m['p50_itl_ms']:8.2f} {m['p99_itl_ms']:8.2f} "
              f"{100 * m['kv_cache_usage_max']:6.1f}%")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"total_s": total, **r}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
