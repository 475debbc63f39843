"""Standalone compiler ("spyre_standalone") vs the Inductor path ("inductor") on the model suite.

    .venv/bin/python benchmarks/bench_standalone.py [--models gpt2,llama] [--quick]

Per model and backend, in one run: compile time (wall time of the first compiled call minus an
eager-free steady call), estimated device time (sum of KernelEvent.est_us of one steady-state
forward, from torch.spyre.profile), kernels per forward, host-fallback calls per forward, and the
ratios standalone / inductor. For the standalone path also the ATen op nodes it lowers natively
vs as host fallbacks (vspyre.standalone.report). A backend that fails prints "n/a" with the first
line of its error instead of stopping the run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

import vspyre.standalone as S
from vspyre.harness.models import DEFAULT_SUITE, get_case

BACKENDS = ("spyre_standalone", "inductor")


def _inductor_ready() -> str | None:
    try:
        import vspyre.inductor as I   # the other compiler; only the benchmark compares both
        if hasattr(I, "register"):
            I.register()
        return None
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def measure(name: str, backend: str) -> dict:
    torch._dynamo.reset()
    S.reset_report()
    case = get_case(name)
    want = case.output()
    dev = case.clone().to("spyre")
    m = torch.compile(dev.model, backend=backend)
    torch.spyre.reset_fallback_stats()
    with torch.no_grad():
        t = time.perf_counter()
        got = dev.output_fn(m(**dev.inputs))
        first = time.perf_counter() - t
        t = time.perf_counter()
        m(**dev.inputs)
        steady = time.perf_counter() - t
        with torch.spyre.profile() as prof:
            m(**dev.inputs)
    w, g = want.float(), got.cpu().float()
    match = bool(torch.allclose(g, w, atol=1e-3, rtol=1e-3))
    r = {"compile_s": max(first - steady, 0.0), "run_s": steady, "est_us": prof.total_est_us,
         "kernels": len(prof.kernels), "fallback_calls": sum(c for _, c, _ in prof.fallback_summary()),
         "fallback_names": sorted({op for op, _, _ in prof.fallback_summary()}), "match": match,
         "maxdiff": float((g - w).abs().max())}
    if backend == "spyre_standalone":
        rep = S.report()
        r.update(native_ops=rep["native_ops"], fallback_ops=rep["fallback_ops"], fallback=rep["fallback"],
                 fusions=rep["fusions"])
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(DEFAULT_SUITE))
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--one", nargs=2, metavar=("MODEL", "BACKEND"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:       # child process: one (model, backend), JSON on the last line
        name, be = args.one
        err = _inductor_ready() if be == "inductor" else None
        if err:
            r = {"error": err}
        else:
            try:
                r = measure(name, be)
            except Exception as e:  # noqa: BLE001 - report and go on
                msg = str(e).strip().splitlines()
                r = {"error": f"{type(e).__name__}: {msg[0][:160] if msg else ''}"}
        print("\n" + json.dumps(r))
        return 0
    ind_err = None
    rows = []
    for name in args.models.split(","):
        res = {}
        for be in args.backends.split(","):
            if be == "inductor" and ind_err:
                res[be] = {"error": ind_err}
                continue
            # a fresh process per (model, backend): one compiler's global state cannot affect the other
            p = subprocess.run([sys.executable, __file__, "--one", name, be], capture_output=True, text=True)
            try:
                res[be] = json.loads(p.stdout.strip().splitlines()[-1])
            except Exception:  # noqa: BLE001
                tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
                res[be] = {"error": f"process failed: {tail[:160]}"}
        rows.append((name, res))
        _print_row(name, res)
        sys.stdout.flush()
    return 0


def _fmt(r: dict, key: str, f: str) -> str:
    return "n/a" if "error" in r else format(r[key], f)


def _print_row(name: str, res: dict) -> None:
    s, i = res.get("spyre_standalone", {"error": "-"}), res.get("inductor", {"error": "-"})
    print(f"== {name}")
    for be, r in res.items():
        if "error" in r:
            print(f"  {be:17s} n/a  ({r['error']})")
            continue
        extra = ""
        if be == "spyre_standalone":
            extra = (f" native_ops={r['native_ops']} fallback_ops={r['fallback_ops']}"
                     f"{' ' + str(r['fallback']) if r['fallback'] else ''}")
        print(f"  {be:17s} compile={r['compile_s']:.2f}s est_device={r['est_us']:.0f}us kernels={r['kernels']} "
              f"host_fallback_calls={r['fallback_calls']} match={r['match']} (maxdiff {r['maxdiff']:.2e}){extra}")
    if "error" not in s and "error" not in i:
        print(f"  ratio standalone/inductor: est_device {s['est_us'] / max(i['est_us'], 1e-9):.2f}x, "
              f"compile {s['compile_s'] / max(i['compile_s'], 1e-9):.2f}x, kernels {s['kernels']}/{i['kernels']}")


if __name__ == "__main__":
    sys.exit(main())
