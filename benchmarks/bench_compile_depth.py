"""Compile time against depth at full Llama-3-8B width (the seed's second check, at real scale).

Builds Llama-3-8B with 2, 4, 8, 16 and 32 layers (estimate-only: no weights in host memory, no
kernels executed), and times the first call of the prefill graph (prompt 128, static shapes) and
of the decode graph (one token, KV cache 128, ``dynamic=True``) on each compiler. The first call
is what a user waits for: Dynamo, AOTAutograd, the compiler, and planning every kernel once.
Prints seconds per depth, seconds per layer and the ratio to the 2-layer time, side by side for
the two compilers, and plots it (``--plot``; docs/compile-depth.png).

    python benchmarks/bench_compile_depth.py [--depths 2,4,8,16,32] [--plot docs/compile-depth.png]
"""

from __future__ import annotations

import argparse
import json
import time

import torch  # noqa: F401  (autoloads the card)

from vspyre.compat import dynamo_reset
from vspyre.harness import estimate as E


def first_calls(cfg, backend: str, prompt: int, kv: int) -> tuple[float, float]:
    """Seconds of the first prefill call and of the first decode call (fresh Dynamo state each)."""
    import torch

    compiler = E.BACKENDS[backend]
    dynamo_reset()
    with torch.spyre.estimate_only(), torch.no_grad():
        model = E._build(cfg, torch.float16, execute=False)
        ids = E._ids(1, prompt, cfg.vocab_size, execute=False)
        t0 = time.perf_counter()
        torch.compile(model, backend=compiler)(input_ids=ids, use_cache=True)
        prefill = time.perf_counter() - t0
        dynamo_reset()
        tok = E._ids(1, 1, cfg.vocab_size, execute=False)
        cache = E._cache(cfg, 1, kv, torch.float16, execute=False)
        t0 = time.perf_counter()
        torch.compile(model, backend=compiler, dynamic=True)(input_ids=tok, past_key_values=cache, use_cache=True)
        decode = time.perf_counter() - t0
        del model, cache
    dynamo_reset()
    return prefill, decode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", default="2,4,8,16,32")
    ap.add_argument("--backends", default="inductor,standalone")
    ap.add_argument("--config", default="llama-3-8b")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--kv", type=int, default=128)
    ap.add_argument("--plot", default=None, help="write a PNG of compile time against depth")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    backends = args.backends.split(",")
    rows = []
    with E.fresh_compile_caches():      # every depth compiles cold, even after earlier runs
        first_calls(E.load_config(args.config, layers=1), backends[0], 8, 8)     # imports, one-time set-up
        for d in depths:
            cfg = E.load_config(args.config, layers=d)
            for b in backends:
                p, dec = first_calls(cfg, b, args.prompt, args.kv)
                rows.append({"layers": d, "backend": b, "prefill_s": p, "decode_s": dec})
                print(f"  {b:10s} {d:3d} layers: prefill {p:6.1f} s  decode {dec:6.1f} s", flush=True)
    print(f"\ncompile time (first call) against depth, {args.config} width, prefill {args.prompt} tokens, "
          f"decode with KV {args.kv} (dynamic=True)")
    print(f"{'layers':>6} | " + " | ".join(f"{b + ' prefill':>18} {b + ' decode':>18}" for b in backends)
          + " | standalone/inductor (prefill, decode)")
    base = {(r["backend"]): r for r in rows if r["layers"] == depths[0]}
    for d in depths:
        cells, by = [], {r["backend"]: r for r in rows if r["layers"] == d}
        for b in backends:
            r = by[b]
            cells.append(f"{r['prefill_s']:7.1f} s (x{r['prefill_s'] / base[b]['prefill_s']:4.1f}) "
                         f"{r['decode_s']:7.1f} s (x{r['decode_s'] / base[b]['decode_s']:4.1f})")
        ratio = ""
        if {"inductor", "standalone"} <= set(by):
            ratio = (f"{by['standalone']['prefill_s'] / by['inductor']['prefill_s']:.2f}, "
                     f"{by['standalone']['decode_s'] / by['inductor']['decode_s']:.2f}")
        print(f"{d:6d} | " + " | ".join(cells) + f" | {ratio}")
    for b in backends:     # the marginal cost of a layer: linear if this stays flat
        pts = [r for r in rows if r["backend"] == b]
        per = [(y["prefill_s"] - x["prefill_s"]) / (y["layers"] - x["layers"]) for x, y in zip(pts, pts[1:])]
        print(f"{b}: prefill seconds per added layer between depths: " + ", ".join(f"{p:.2f}" for p in per))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.5, 4))
        for b in backends:
            pts = [r for r in rows if r["backend"] == b]
            for key, style in (("prefill_s", "-o"), ("decode_s", "--s")):
                ax.plot([r["layers"] for r in pts], [r[key] for r in pts], style,
                        label=f"{b}, {key.removesuffix('_s')}")
        ax.set_xlabel("layers (Llama-3-8B width)")
        ax.set_ylabel("first call: compile + plan (s)")
        ax.set_title("Compile time against depth (estimate-only, torch " + torch.__version__.split("+")[0] + ")")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
