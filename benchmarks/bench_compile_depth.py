"""Compile time against depth at full Llama-3-8B width: regional vs whole, cold vs warm.

Builds the model with 2, 4, 8, 16 and 32 layers (estimate-only: no weights in host memory, no
kernels executed) and times the first call of the prefill graph (prompt 128, static shapes) and of
the decode graph (one token, KV cache 128, ``dynamic=True``) on each compiler, compiled whole (one
graph, ``--compile whole``) and regionally (the decoder layer compiled once and reused,
``--compile regional``, vspyre.regional). The first call is what a user waits for: Dynamo,
AOTAutograd, the compiler, and planning every kernel once.

Every row runs in a new process with its own fresh cache directories (Inductor's caches, the
kernel plan cache, the standalone graph cache): *cold*; then again in another new process with
those caches kept: *warm* (what a second start-up of the same model costs). Before timing, each
process compiles a small unrelated function once on each compiler (imports and one-time set-up,
reported apart as ``setup``), so the figures are the model's own compile.

Prints seconds per depth, the ratio to the smallest depth, regional/whole and warm/cold side by
side, and plots it (``--plot``; docs/compile-depth.png).

    python benchmarks/bench_compile_depth.py [--depths 2,4,8,16,32] [--modes regional,whole]
        [--backends inductor,standalone] [--config llama-3-8b] [--plot docs/compile-depth.png]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def child(args: argparse.Namespace) -> None:
    """One measurement in this process: set-up, then the model's prefill and decode first calls."""
    import torch

    from vspyre import regional
    from vspyre.compat import dynamo_reset
    from vspyre.harness import estimate as E
    from vspyre.standalone import cache as graph_cache

    compiler = E.BACKENDS[args.backend]
    t0 = time.perf_counter()
    with torch.no_grad():           # imports and one-time set-up, on a graph unlike the model's
        x = torch.randn(8, 24, dtype=torch.float16).to("spyre")
        w = torch.randn(24, 40, dtype=torch.float16).to("spyre")
        for dyn in (False, True):
            torch.compile(lambda a, b: (a @ b).relu().sum(-1), backend=compiler, dynamic=dyn)(x, w)
            dynamo_reset()
    setup = time.perf_counter() - t0
    graph_cache.reset_stats()
    cfg = E.load_config(args.config, layers=args.layers)
    with torch.spyre.estimate_only(), torch.no_grad():
        model = E._build(cfg, torch.float16, execute=False)
        ids = E._ids(1, args.prompt, cfg.vocab_size, execute=False)
        t0 = time.perf_counter()
        regional.compile_model(model, compiler, args.mode)(input_ids=ids, use_cache=True)
        prefill = time.perf_counter() - t0
        dynamo_reset()
        tok = E._ids(1, 1, cfg.vocab_size, execute=False)
        cache = E._cache(cfg, 1, args.kv, torch.float16, execute=False)
        t0 = time.perf_counter()
        regional.compile_model(model, compiler, args.mode, dynamic=True)(input_ids=tok, cache=cache, use_cache=True)
        decode = time.perf_counter() - t0
    print("RESULT " + json.dumps({"setup_s": setup, "prefill_s": prefill, "decode_s": decode,
                                  "graph_cache": graph_cache.stats_dict()}), flush=True)


def run_child(backend: str, mode: str, layers: int, args: argparse.Namespace, root: str) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(root, "inductor"),
               VSPYRE_CACHE_DIR=os.path.join(root, "vspyre"))
    env.pop("VSPYRE_GRAPH_CACHE_DIR", None)
    cmd = [sys.executable, __file__, "--child", "--backend", backend, "--mode", mode, "--layers", str(layers),
           "--config", args.config, "--prompt", str(args.prompt), "--kv", str(args.kv)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", default="2,4,8,16,32")
    ap.add_argument("--backends", default="inductor,standalone")
    ap.add_argument("--modes", default="regional,whole")
    ap.add_argument("--config", default="llama-3-8b")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--kv", type=int, default=128)
    ap.add_argument("--no-warm", action="store_true", help="cold runs only")
    ap.add_argument("--plot", default=None, help="write a PNG of compile time against depth")
    ap.add_argument("--json", default=None)
    # one measurement (the parent runs each in a new process)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", default="inductor", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="regional", help=argparse.SUPPRESS)
    ap.add_argument("--layers", type=int, default=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    depths = [int(d) for d in args.depths.split(",")]
    backends = args.backends.split(",")
    modes = args.modes.split(",")
    rows = []
    for d in depths:
        for b in backends:
            for m in modes:
                with tempfile.TemporaryDirectory(prefix="vspyre-bench-depth-") as root:
                    cold = run_child(b, m, d, args, root)
                    warm = None if args.no_warm else run_child(b, m, d, args, root)
                r = {"layers": d, "backend": b, "mode": m, "cold": cold, "warm": warm}
                rows.append(r)
                w = (f"  warm: prefill {warm['prefill_s']:6.1f} s decode {warm['decode_s']:6.1f} s "
                     f"(graph cache {warm['graph_cache']['hits']} hits)") if warm else ""
                print(f"  {b:10s} {m:8s} {d:3d} layers: cold prefill {cold['prefill_s']:6.1f} s decode "
                      f"{cold['decode_s']:6.1f} s (setup {cold['setup_s']:.1f} s){w}", flush=True)

    def total(r: dict, k: str = "cold") -> float:
        return r[k]["prefill_s"] + r[k]["decode_s"]

    print(f"\ncompile time (first calls, prefill + first decode step) against depth, {args.config} width, "
          f"prompt {args.prompt}, decode with KV {args.kv} (dynamic=True); each in a new process")
    for b in backends:
        print(f"\n{b}:")
        print(f"{'layers':>6} | " + " | ".join(f"{m + ' cold (x depth ' + str(depths[0]) + ')':>30}" for m in modes)
              + (" | regional/whole cold" if {"regional", "whole"} <= set(modes) else "")
              + ("" if args.no_warm else " | " + " | ".join(f"{m + ' warm (warm/cold)':>24}" for m in modes)))
        by = {(r["mode"], r["layers"]): r for r in rows if r["backend"] == b}
        for d in depths:
            cells = [f"{total(by[m, d]):8.1f} s (x{total(by[m, d]) / total(by[m, depths[0]]):5.2f})"
                     f"{'':>13}" for m in modes]
            line = f"{d:6d} | " + " | ".join(f"{c:>30}" for c in cells)
            if {"regional", "whole"} <= set(modes):
                line += f" | {total(by['regional', d]) / total(by['whole', d]):19.3f}"
            if not args.no_warm:
                line += " | " + " | ".join(f"{total(by[m, d], 'warm'):8.2f} s ({total(by[m, d], 'warm') / total(by[m, d]):5.3f})"
                                           .rjust(24) for m in modes)
            print(line)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import torch

        fig, ax = plt.subplots(figsize=(6.5, 4))
        for b in backends:
            for m in modes:
                pts = [r for r in rows if r["backend"] == b and r["mode"] == m]
                ax.plot([r["layers"] for r in pts], [total(r) for r in pts], "-o" if m == "regional" else "--s",
                        label=f"{b}, {m}, cold")
        ax.set_xlabel(f"layers ({args.config} width)")
        ax.set_ylabel("first calls: prefill + decode (s)")
        ax.set_title("Compile time against depth (estimate-only, torch " + torch.__version__.split("+")[0] + ")")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
