"""Host-fallback overhead per eager op: the same op on CPU tensors and on spyre tensors, side by side.

Eager ops without a device kernel run on the host through ``vspyre.device.fallback`` (aliasing
device memory, counted). This prints, per op and size, the median wall time on CPU, on the card as
a host fallback (eager device kernels turned off), their ratio and the absolute overhead the
fallback adds per call, and beside it the same op as an eager device kernel (``vspyre.eager``).

    .venv/bin/python benchmarks/bench_fallback.py [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

OPS = {
    "add (a + b)": lambda a, b: a + b,
    "mul_ in place": lambda a, b: a.mul_(1.0),
    "exp": lambda a, b: torch.exp(a),
    "sum(dim=0)": lambda a, b: a.sum(0),
    "softmax(dim=-1)": lambda a, b: torch.softmax(a, -1),
    "matmul": lambda a, b: a @ b,
    "split (views)": lambda a, b: torch.split(a, 16),
    "transpose+contiguous": lambda a, b: a.t().contiguous(),
}


def _median_us(fn, a, b, repeat: int) -> float:
    for _ in range(max(3, repeat // 10)):
        fn(a, b)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        fn(a, b)
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (1 keeps the comparison stable on a busy 2-core machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    table = Table(title="eager op: CPU vs spyre (host fallback), median of "
                        f"{args.repeat} calls, {torch.get_num_threads()} threads")
    for col in ("op", "shape", "cpu (us)", "spyre fallback (us)", "ratio", "overhead (us)", "eager kernel (us)"):
        table.add_column(col, justify="left" if col in ("op", "shape") else "right")
    overheads = []
    for n in (64, 1024):
        a = torch.randn(n, n)
        b = torch.randn(n, n)
        ad, bd = a.to("spyre"), b.to("spyre")
        for name, fn in OPS.items():
            cpu = _median_us(fn, a, b, args.repeat)
            with torch.spyre.eager_kernels(False):
                dev = _median_us(fn, ad, bd, args.repeat)
            kern = _median_us(fn, ad, bd, args.repeat)
            overheads.append(dev - cpu)
            table.add_row(name, f"{n}x{n}", f"{cpu:.1f}", f"{dev:.1f}", f"{dev / cpu:.2f}x", f"{dev - cpu:.1f}",
                          f"{kern:.1f}")
    Console(width=140).print(table)
    print(f"median fallback overhead per op: {statistics.median(overheads):.1f} us")
    print(f"fallback calls counted: {sum(torch.spyre.fallback_stats().values())}")


if __name__ == "__main__":
    main()
