"""The new path, measured: Inductor on the virtual card, model by model, ratios side by side.

Per model of the suite (each measurement in a fresh process so "cold" means cold):

* est. device time vs the roofline bound (efficiency = roofline / estimate; goal >= 0.7 geomean);
* cold compile time on spyre vs stock Inductor on CPU (goal <= 1.0), warm vs cold (goal <= 0.1:
  a second process with the same FX graph cache);
* wall time of the compiled model on the card vs CPU eager (goal <= 2.0);
* what fusion buys: est. device time and bytes moved with fusion disabled vs enabled.

    .venv/bin/python benchmarks/bench_inductor.py [--models gpt2,bert] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

MODES = ("spyre", "spyre_warm", "spyre_nofusion", "cpu_inductor", "cpu_eager")


def worker(model: str, mode: str) -> dict:
    import torch

    from vspyre.harness.models import get_case

    case = get_case(model)
    device = "cpu" if mode.startswith("cpu") else "spyre"
    run = case.clone().to(device) if device == "spyre" else case
    m = run.model
    if mode == "spyre_nofusion":
        torch._inductor.config.max_fusion_size = 1
        torch._inductor.config.epilogue_fusion = False
    fn = m if mode == "cpu_eager" else torch.compile(m)
    with torch.no_grad():
        t0 = time.perf_counter()
        fn(**run.inputs)
        compile_s = time.perf_counter() - t0
        out = {"compile_s": compile_s}
        if device == "spyre":
            with torch.spyre.profile() as prof:
                fn(**run.inputs)
            out.update(est_us=prof.total_est_us, roofline_us=sum(k.roofline_us for k in prof.kernels),
                       bytes=sum(k.bytes_moved for k in prof.kernels), kernels=len(prof.kernels),
                       fallbacks=sum(torch.spyre.fallback_stats().values()))
        walls = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn(**run.inputs)
            walls.append(time.perf_counter() - t0)
        out["wall_ms"] = statistics.median(walls) * 1e3
    try:
        from torch._dynamo.utils import counters
        out["fx_cache_hits"] = counters["inductor"]["fxgraph_cache_hit"]
    except Exception:  # noqa: BLE001
        pass
    return out


def _spawn(model: str, mode: str, cache_dir: str) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir, TORCHINDUCTOR_FX_GRAPH_CACHE="1")
    mode_arg = "spyre" if mode == "spyre_warm" else mode
    r = subprocess.run([sys.executable, __file__, "--worker", model, mode_arg], env=env, capture_output=True,
                       text=True, timeout=1800)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="gpt2,llama,bert,t5,vit,resnet,convnext,mobilenet_v2")
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", nargs=2, metavar=("MODEL", "MODE"))
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return
    from rich.console import Console
    from rich.table import Table

    results: dict[str, dict] = {}
    for model in args.models.split(","):
        res = {}
        with tempfile.TemporaryDirectory() as spyre_cache, tempfile.TemporaryDirectory() as cpu_cache, \
                tempfile.TemporaryDirectory() as nofuse_cache:
            res["spyre"] = _spawn(model, "spyre", spyre_cache)
            res["spyre_warm"] = _spawn(model, "spyre_warm", spyre_cache)
            res["spyre_nofusion"] = _spawn(model, "spyre_nofusion", nofuse_cache)
            res["cpu_inductor"] = _spawn(model, "cpu_inductor", cpu_cache)
            res["cpu_eager"] = _spawn(model, "cpu_eager", cpu_cache)
        results[model] = res
        print(f"{model}: done", file=sys.stderr, flush=True)

    def g(m, mode, key):
        return results[m][mode].get(key)

    t = Table(title="Inductor on the virtual card: ratios measured side by side in one run")
    cols = ["model", "est us", "roofline us", "roofline/est", "cold compile s (spyre / cpu)", "cold ratio",
            "warm/cold", "wall ms (spyre / cpu eager)", "wall ratio", "no-fusion est / fused",
            "no-fusion bytes / fused", "kernels (fused / not)", "host fallbacks"]
    for c in cols:
        t.add_column(c, justify="left" if c == "model" else "right")
    ratios: dict[str, list[float]] = {k: [] for k in ("eff", "cold", "warm", "wall", "fuse_t", "fuse_b")}
    for m in results:
        if "error" in results[m]["spyre"]:
            t.add_row(m, "error: " + results[m]["spyre"]["error"], *[""] * (len(cols) - 2))
            continue
        est, roof = g(m, "spyre", "est_us"), g(m, "spyre", "roofline_us")
        cold, cpu_cold = g(m, "spyre", "compile_s"), g(m, "cpu_inductor", "compile_s")
        warm = g(m, "spyre_warm", "compile_s")
        wall, eager = g(m, "spyre", "wall_ms"), g(m, "cpu_eager", "wall_ms")
        nf_t, nf_b = g(m, "spyre_nofusion", "est_us"), g(m, "spyre_nofusion", "bytes")
        r = {"eff": roof / est, "cold": cold / cpu_cold if cpu_cold else math.nan, "warm": warm / cold,
             "wall": wall / eager, "fuse_t": (nf_t or math.nan) / est,
             "fuse_b": (nf_b or math.nan) / max(1, g(m, "spyre", "bytes"))}
        for k, v in r.items():
            if v == v:
                ratios[k].append(v)
        t.add_row(m, f"{est:.1f}", f"{roof:.1f}", f"{r['eff']:.3f}", f"{cold:.1f} / {cpu_cold or float('nan'):.1f}",
                  f"{r['cold']:.2f}", f"{r['warm']:.2f}", f"{wall:.1f} / {eager:.1f}", f"{r['wall']:.2f}",
                  f"{r['fuse_t']:.2f}", f"{r['fuse_b']:.2f}",
                  f"{g(m, 'spyre', 'kernels')} / {g(m, 'spyre_nofusion', 'kernels')}", str(g(m, "spyre", "fallbacks")))

    def geo(v):
        return math.exp(sum(math.log(x) for x in v) / len(v)) if v else math.nan

    t.add_row("geomean", "", "", f"{geo(ratios['eff']):.3f}", "", f"{geo(ratios['cold']):.2f}",
              f"{geo(ratios['warm']):.2f}", "", f"{geo(ratios['wall']):.2f}", f"{geo(ratios['fuse_t']):.2f}",
              f"{geo(ratios['fuse_b']):.2f}", "", "")
    Console(width=220).print(t)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
