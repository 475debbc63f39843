"""`vspyre estimate llama-3-8b` (32 layers, prompt 2048, 128 new tokens, one compiler) against its
limits: at most 10 minutes on the 2-core machine and 4 GB of host memory.

Runs the command as a child process and prints its wall time and peak resident memory as ratios
to those limits (below 1.0 meets them).

    python benchmarks/bench_estimate.py [--backend inductor|standalone] [--model llama-3-8b]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

LIMIT_S = 600.0
LIMIT_RSS = 4 * 2**30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--new-tokens", type=int, default=128)
    args = ap.parse_args()
    exe = os.path.join(os.path.dirname(sys.executable), "vspyre")
    with tempfile.TemporaryDirectory() as out:
        cmd = [exe, "estimate", args.model, "--prompt", str(args.prompt), "--new-tokens", str(args.new_tokens),
               "--backend", args.backend, "--out", out, "--no-progress"]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    if proc.returncode != 0:
        print(proc.stdout[-2000:], proc.stderr[-2000:])
        raise SystemExit(f"vspyre estimate exited {proc.returncode}")
    print(f"vspyre estimate {args.model} --prompt {args.prompt} --new-tokens {args.new_tokens} --backend {args.backend}")
    print(f"  wall time      {wall:7.1f} s   / limit {LIMIT_S:.0f} s  = {wall / LIMIT_S:.2f}")
    print(f"  peak host RSS  {rss / 2**30:7.2f} GiB / limit {LIMIT_RSS / 2**30:.0f} GiB = {rss / LIMIT_RSS:.2f}")


if __name__ == "__main__":
    main()
