"""Eager mode on the card: device kernels against host fallbacks, side by side in one run.

For every suite model's eager forward (no torch.compile):

* the share of ATen op calls that ran as device kernels (``vspyre.eager``; goal >= 90%),
* steady-state host wall time with eager kernels against the same forward with them turned off
  (every op a host fallback, as before eager kernels existed; goal <= 3x), median of N calls,
* the estimated device time of the eager forward (sum over its kernels) and its launch count.

Then, in fresh processes with empty caches: the first eager call of tiny GPT-2 against its
``torch.compile`` cold time (goal: not slower), and a greedy decode loop of the tiny Llama with a
compiled forward, counting what the eager ops between compiled forwards ran as.

    .venv/bin/python benchmarks/bench_eager.py [--repeat N] [--models gpt2 llama ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from rich.console import Console
from rich.table import Table

from vspyre import eager
from vspyre.harness.models import SUITE, get_case

_COLD = r"""
import json, os, sys, time
t0 = time.perf_counter()
import torch, vspyre
from vspyre.harness.models import tiny_gpt2
case = tiny_gpt2().to("spyre")
t1 = time.perf_counter()
with torch.no_grad():
    if sys.argv[1] == "eager":
        case.model(**case.inputs)
    else:
        torch.compile(case.model)(**case.inputs)
t2 = time.perf_counter()
print(json.dumps({"first_call_s": t2 - t1, "import_s": t1 - t0,
                  "builds": sum(torch.spyre.eager_kernel_stats()["builds"].values())}))
"""

_DECODE = r"""
import json, torch, vspyre
from vspyre.harness.models import tiny_llama_generate, greedy_generate
case = tiny_llama_generate(max_new_tokens=8).to("spyre")
model = case.model
model.forward = torch.compile(model.forward, dynamic=True)
greedy_generate(model, case.inputs["input_ids"], 2)            # compile
torch.spyre.reset_fallback_stats(); torch.spyre.reset_eager_kernel_stats()
with torch.spyre.profile() as prof:
    greedy_generate(model, case.inputs["input_ids"], 8)
k = torch.spyre.eager_kernel_stats()["calls"]
print(json.dumps({"kernels": k, "fallbacks": torch.spyre.fallback_stats(),
                  "eager_us": sum(e.est_us for e in prof.kernels if e.source == "eager"),
                  "compiled_us": sum(e.est_us for e in prof.kernels if e.source != "eager")}))
"""


def _fresh(code: str, *args: str, cache: str | None = None) -> dict:
    """``code`` in a new process; with empty Inductor and plan caches unless ``cache`` (a folder
    an earlier call filled) is given."""
    cache = cache or tempfile.mkdtemp(prefix="vspyre-bench-eager-")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, VSPYRE_CACHE_DIR=os.path.join(cache, "vspyre"))
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]), cache=cache)


def _median_s(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--models", nargs="*", default=list(SUITE))
    ap.add_argument("--no-fresh", action="store_true", help="skip the fresh-process measurements")
    args = ap.parse_args()
    console = Console(width=180)
    table = Table(title=f"eager forward on the card: device kernels vs host fallbacks (median of {args.repeat})")
    for col in ("model", "op calls", "device kernels", "host fallbacks", "kernel share", "wall kernels (ms)",
                "wall fallbacks (ms)", "ratio", "est. device (us)", "still on host"):
        table.add_column(col, justify="left" if col in ("model", "still on host") else "right")
    shares, ratios = [], []
    for name in args.models:
        case = get_case(name).to("spyre")
        with torch.no_grad():
            case.forward()                                       # builds the kernels
            torch.spyre.reset_fallback_stats()
            eager.reset_stats()
            with torch.spyre.profile() as prof:
                case.forward()
            k = sum(eager.stats()["calls"].values())
            fb = torch.spyre.fallback_stats()
            f = sum(fb.values())
            wall_k = _median_s(case.forward, args.repeat)
            with eager.enabled(False):
                case.forward()
                wall_f = _median_s(case.forward, args.repeat)
        share = k / max(k + f, 1)
        shares.append(share)
        ratios.append(wall_k / wall_f)
        table.add_row(name, str(k + f), str(k), str(f), f"{share:.1%}", f"{wall_k * 1e3:.1f}", f"{wall_f * 1e3:.1f}",
                      f"{wall_k / wall_f:.2f}x", f"{prof.total_est_us:.0f}",
                      ", ".join(f"{op.removeprefix('aten::')} x{n}" for op, n in fb.items()))
    console.print(table)
    print(f"device-kernel share of eager op calls: min {min(shares):.1%} (goal >= 90%)")
    print(f"steady-state eager wall, kernels / host fallbacks: geomean "
          f"{statistics.geometric_mean(ratios):.2f}x, max {max(ratios):.2f}x (goal <= 3x)")
    if args.no_fresh:
        return
    e, c = _fresh(_COLD, "eager"), _fresh(_COLD, "compile")
    print(f"tiny GPT-2, fresh process, empty caches: first eager call {e['first_call_s']:.2f} s "
          f"({e['builds']} kernels built), torch.compile first call {c['first_call_s']:.2f} s: "
          f"ratio {e['first_call_s'] / c['first_call_s']:.2f} (goal <= 1)")
    e2 = _fresh(_COLD, "eager", cache=e["cache"])
    print(f"tiny GPT-2, next fresh process, the plans the first one stored (vspyre.ir.plan_cache): "
          f"first eager call {e2['first_call_s']:.2f} s")
    d = _fresh(_DECODE)
    nk, nf = sum(d["kernels"].values()), sum(d["fallbacks"].values())
    print(f"tiny Llama greedy decode, 8 tokens, compiled forward: eager ops between forwards ran as {nk} device "
          f"kernels ({', '.join(sorted(op.removeprefix('aten::') for op in d['kernels']))}) and {nf} host "
          f"fallbacks ({', '.join(f'{op} x{n}' for op, n in d['fallbacks'].items()) or 'none'}); "
          f"est. device time eager {d['eager_us']:.0f} us vs compiled {d['compiled_us']:.0f} us")


if __name__ == "__main__":
    main()
