"""Tensor parallel scaling: `vspyre estimate --tp N` for granite-3-8b and llama-3-8b at TP 1/2/4 and
llama-3-70b at TP 4, prompts 128 and 2048, and the functional wall time of a tiny model on 2 ranks
against 1. Each estimate runs as a child process (wall time and peak RSS against the 10-minute /
4 GB limits); rows are resumed from the JSONL in --out; the table is printed as Markdown.

    python benchmarks/bench_tp.py [--backend inductor] [--out build/bench-tp] [--only granite-3-8b]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROWS = [(m, tp, p) for p in (128, 2048) for m, tps in (("granite-3-8b", (1, 2, 4)), ("llama-3-8b", (1, 2, 4)),
                                                        ("llama-3-70b", (4,))) for tp in tps]
LIMIT_S, LIMIT_RSS = 600.0, 4 * 2**30
# the estimate in a child process that reports its own peak resident memory last on stderr
_CHILD = ("import resource, sys\nfrom vspyre import cli\nrc = cli.main(sys.argv[1:])\n"
          "print('peak RSS KiB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\nsys.exit(rc)")


def _estimate(model: str, tp: int, prompt: int, backend: str) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-c", _CHILD, "estimate", model, "--tp", str(tp), "--prompt", str(prompt),
               "--new-tokens", "128", "--kv", str(prompt), "--backend", backend, "--out", out, "--no-progress"]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            return {"model": model, "tp": tp, "prompt": prompt, "error": proc.stderr.strip().splitlines()[-1]}
        rss = int(proc.stderr.strip().splitlines()[-1].split()[-1]) * 1024
        r = json.loads(next(Path(out).glob("*.json")).read_text())
    b = r["backends"][backend]
    d = b["decode"][0]
    return {"model": model, "tp": tp, "prompt": prompt, "backend": backend, "hw": r["hw"], "ranks": r["ranks"],
            "link": (r.get("link") or {}).get("text", "-"),
            "memory_per_card_gib": r["memory"]["total_bytes"] / 2**30,
            "weights_per_card_gib": r["memory"]["weights_bytes"] / 2**30,
            "ttft_ms": b["prefill"]["est_us"] / 1e3, "ttft_coll_share": b["prefill"]["collective_us"] / b["prefill"]["est_us"],
            "tpot_ms": d["est_us"] / 1e3, "tpot_coll_share": d["collective_us"] / d["est_us"],
            "collectives_per_token": d["collectives"], "tokens_per_s": b["tokens_per_s"],
            "wall_s": wall, "rss_gib": rss / 2**30}


def _tiny_wall() -> dict:
    """Functional wall time of the tiny TP Llama's forward on 1 and 2 ranks (eager)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.distributed import ranks  # noqa: F401 - the same tiny model the tests split
    from vspyre.distributed import launch

    out = {}
    for world in (1, 2):
        res = launch.run(_tiny_rank, world, timeout=600)
        out[world] = res[0]
    return out


def _tiny_rank(rank: int) -> float:
    import torch

    from tests.distributed import ranks
    from vspyre.distributed import tp

    model = ranks.tp_model("llama").to(f"spyre:{rank}")
    tp.parallelize(model)
    ids = ranks.tp_input().to(f"spyre:{rank}")
    with torch.no_grad():
        model(input_ids=ids)
        t0 = time.perf_counter()
        for _ in range(10):
            model(input_ids=ids)
    return (time.perf_counter() - t0) / 10


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="inductor", choices=["inductor", "standalone"])
    ap.add_argument("--out", default="build/bench-tp")
    ap.add_argument("--only", default=None, help="one model")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    log = Path(args.out) / f"rows-{args.backend}.jsonl"
    done = {}
    if log.exists():
        for line in log.read_text().splitlines():
            r = json.loads(line)
            done[(r["model"], r["tp"], r["prompt"])] = r
    for key in ROWS:
        if key in done or (args.only and key[0] != args.only):
            continue
        r = _estimate(*key, args.backend)
        done[key] = r
        with log.open("a") as fh:
            fh.write(json.dumps(r) + "\n")
        print(json.dumps(r), flush=True)
    print(f"\n## Tensor parallel scaling ({args.backend}; estimate-only, ranks simulated by symmetry)\n")
    print("| model | prompt | TP | memory per card | TTFT | collectives | TPOT (KV = prompt) | collectives | "
          "tokens/s | TTFT vs TP1 | TPOT vs TP1 | wall / 600 s | RSS / 4 GB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for key in ROWS:
        r = done.get(key)
        if r is None:
            continue
        if "error" in r:
            print(f"| {key[0]} | {key[2]} | {key[1]} | {r['error']} |")
            continue
        base = done.get((key[0], 1, key[2]))
        sp = (f"{base['ttft_ms'] / r['ttft_ms']:.2f}x | {base['tpot_ms'] / r['tpot_ms']:.2f}x"
              if base and "error" not in base else "- | -")
        print(f"| {r['model']} | {r['prompt']} | {r['tp']} | {r['memory_per_card_gib']:.2f} GiB | {r['ttft_ms']:.1f} ms"
              f" | {r['ttft_coll_share']:.1%} | {r['tpot_ms']:.2f} ms | {r['tpot_coll_share']:.1%} | "
              f"{r['tokens_per_s']:.1f} | {sp} | {r['wall_s'] / LIMIT_S:.2f} | {r['rss_gib'] * 2**30 / LIMIT_RSS:.2f} |")
    any_row = next((r for r in done.values() if "error" not in r and r["tp"] > 1), None)
    if any_row:
        print(f"\nPreset `{any_row['hw']}`; link: {any_row['link']}; host overhead per launch as the preset's.")
    if not args.only:
        w = _tiny_wall()
        print(f"\nFunctional wall time, tiny TP Llama forward (eager, this machine): 1 rank {w[1] * 1e3:.1f} ms, "
              f"2 ranks {w[2] * 1e3:.1f} ms ({w[2] / w[1]:.2f}x of 1 rank)")


if __name__ == "__main__":
    main()
