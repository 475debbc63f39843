"""Fast-mode wall time against the same computation in plain torch CPU ops, and launch overhead.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_runtime.py [--quick]

Each pair is timed interleaved (A, B, A, B, ...) and the median of the repetitions is reported,
so a noisy machine affects both sides alike. fp32 cases measure the runtime's own overhead;
the fp16 case also pays the DL16 rounding (numerics="dl16") that plain torch does not do.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from vspyre import hardware, runtime
from vspyre.ir import ProgramBuilder


def _pair(fa, fb, reps):
    fa(), fb()
    ta, tb = [], []
    for _ in range(reps):
        t = time.perf_counter(); fa(); ta.append(time.perf_counter() - t)
        t = time.perf_counter(); fb(); tb.append(time.perf_counter() - t)
    return statistics.median(ta), statistics.median(tb)


def elementwise(dtype):
    b = ProgramBuilder(f"ew_{dtype}".replace("torch.", ""))
    x = b.input("x", dtype, ("n", "m")); w = b.input("w", dtype, ("m",)); y = b.output("y", dtype, ("n", "m"))
    i, j = b.dim("x0", "n"), b.dim("x1", "m")
    b.store(y, y.index(i, j), b.relu(b.add(b.mul(b.load(x, x.index(i, j)), b.load(w, j)), 1.0)))
    return b.build()


def row_sum():
    b = ProgramBuilder("row_sum")
    x = b.input("x", torch.float32, ("n", "m")); y = b.output("y", torch.float32, ("n",))
    i, r = b.dim("x0", "n"), b.rdim("r0", "m")
    b.store(y, i, b.reduce("sum", b.load(x, x.index(i, r)), r))
    return b.build()


def matmul():
    b = ProgramBuilder("mm_bias")
    a = b.input("a", torch.float32, ("M", "K")); bb = b.input("b", torch.float32, ("K", "N"))
    bias = b.input("bias", torch.float32, ("N",)); y = b.output("y", torch.float32, ("M", "N"))
    m, n, k = b.dim("x0", "M"), b.dim("x1", "N"), b.rdim("r0", "K")
    acc = b.matmul(b.load(a, a.index(m, k)), b.load(bb, bb.index(k, n)), k)
    b.store(y, y.index(m, n), b.add(acc, b.load(bias, n)))
    return b.build()


def main() -> None:
    quick = "--quick" in sys.argv
    reps = 5 if quick else 15
    big = 1024 if quick else 4096
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, numerics={hardware.get_config().numerics}")
    rows = []

    p = elementwise(torch.float32)
    x, w, y = torch.randn(big, 1024), torch.randn(1024), torch.empty(big, 1024)
    rows.append((f"elementwise f32 relu(x*w+1) {big}x1024",
                 *_pair(lambda: runtime.launch(p, x, w, y), lambda: torch.relu(torch.addcmul(torch.ones(()), x, w), out=y) if False else torch.clamp_min_(torch.add(x * w, 1.0, out=y), 0), reps)))
    p16 = elementwise(torch.float16)
    xh, wh, yh = x.half(), w.half(), y.half()
    rows.append((f"elementwise f16 (dl16 rounding) {big}x1024",
                 *_pair(lambda: runtime.launch(p16, xh, wh, yh), lambda: torch.clamp_min_(torch.add(xh * wh, 1.0, out=yh), 0), reps)))
    with hardware.override(numerics="ieee"):
        rows.append((f"elementwise f16 (ieee) {big}x1024",
                     *_pair(lambda: runtime.launch(p16, xh, wh, yh), lambda: torch.clamp_min_(torch.add(xh * wh, 1.0, out=yh), 0), reps)))
    p = row_sum()
    ys = torch.empty(big)
    rows.append((f"row sum f32 {big}x1024", *_pair(lambda: runtime.launch(p, x, ys), lambda: torch.sum(x, 1, out=ys), reps)))
    p = matmul()
    n = 512 if quick else 1024
    a, bm, bias, ym = torch.randn(n, n), torch.randn(n, n), torch.randn(n), torch.empty(n, n)
    rows.append((f"matmul+bias f32 {n}^3", *_pair(lambda: runtime.launch(p, a, bm, bias, ym),
                                                  lambda: torch.addmm(bias, a, bm, out=ym), reps)))
    print(f"{'case':<44}{'vspyre fast (ms)':>18}{'plain torch (ms)':>18}{'ratio':>8}")
    for name, ta, tb in rows:
        print(f"{name:<44}{ta * 1e3:>18.3f}{tb * 1e3:>18.3f}{ta / tb:>8.2f}")

    # per-launch overhead: a 16-element kernel, against the same torch op on the same tensors
    p = elementwise(torch.float32)
    xs, ws, ysm = torch.randn(1, 16), torch.randn(16), torch.empty(1, 16)
    N = 2000 if quick else 20000

    def loop_vs():
        for _ in range(N):
            runtime.launch(p, xs, ws, ysm)

    def loop_torch():
        for _ in range(N):
            torch.clamp_min_(torch.add(xs * ws, 1.0, out=ysm), 0)
    ta, tb = _pair(loop_vs, loop_torch, 3)
    print(f"per-launch: vspyre fast {ta / N * 1e6:.1f} us, plain torch ops {tb / N * 1e6:.1f} us, "
          f"overhead {(ta - tb) / N * 1e6:.1f} us per kernel (no profiler listening)")
    from vspyre.runtime.profiler import profile
    with profile():
        ta2, _ = _pair(loop_vs, loop_torch, 3)
    print(f"per-launch with the profiler listening (estimate cached, event published): {ta2 / N * 1e6:.1f} us")


if __name__ == "__main__":
    main()
