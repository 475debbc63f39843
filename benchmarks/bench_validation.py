"""vspyre's estimates against every published time of the real card; writes docs/validation.md.

    .venv/bin/python benchmarks/bench_validation.py [--presets card-limit,torch-spyre,measured,torch-spyre-2026]
                                                    [--fit] [--e2e-presets torch-spyre-2026 | --no-e2e]
                                                    [--markdown docs/validation.md] [--json out.json]

Each case of ``src/vspyre/harness/data/card-measurements.toml`` runs on both compilers with each
preset in estimate-only mode. ``--fit`` also fits ``measured``'s fitted parameters to the cases
marked ``fit = true`` (starting from the published constants) and prints them with their
leave-one-out error; the preset in ``src/vspyre/hardware.py`` holds the numbers it printed.
End-to-end cases (Granite 3.3 8B) go through ``vspyre estimate``'s path, per compiler, with the
presets of ``--e2e-presets`` (a few minutes each). The logic is in ``vspyre.harness.validation``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch

import vspyre  # noqa: F401  (the spyre device)
from vspyre import hardware
from vspyre.harness import validation as V

# the constants published before the fit: the cost model's 150 GB/s, the contributor's 1.1 GHz,
# no fixed cost per kernel (the cost model has none)
PUBLISHED = {"clock_hz": 1.1e9, "device_memory_bandwidth": 150e9, "kernel_launch_us": 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="card-limit,torch-spyre,measured,torch-spyre-2026")
    ap.add_argument("--compilers", default="inductor,standalone")
    ap.add_argument("--fit", action="store_true", help="fit measured's parameters and report leave-one-out error")
    ap.add_argument("--e2e-presets", default="torch-spyre-2026")
    ap.add_argument("--no-e2e", action="store_true")
    ap.add_argument("--markdown", default="docs/validation.md")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    presets = [p for p in args.presets.split(",") if p]
    compilers = [c for c in args.compilers.split(",") if c]
    cases = V.load_cases()
    t0 = time.perf_counter()
    runner = V.KernelRunner()
    rows = V.run(cases, presets, compilers, e2e=False, runner=runner, log=print)

    fr = start_err = None
    if args.fit:
        fitted = [c for c in cases if c.fit]
        ev = V.vspyre_evaluator(runner, hardware.PRESETS["measured"])
        start_err = {c.id: V.error(ev(c, PUBLISHED), c.card_us) for c in fitted}
        fr = V.fit(fitted, ev, PUBLISHED)
        print("fitted:", {k: f"{v:.6g}" for k, v in fr.params.items()},
              f"mean abs {fr.mean_abs:.1%} worst {fr.worst:+.1%}; leave-one-out mean abs {fr.loo_mean_abs:.1%} "
              f"worst {fr.loo_worst:+.1%}")
        held = {k: getattr(hardware.PRESETS["measured"], k) for k in fr.params}
        off = {k: (held[k], v) for k, v in fr.params.items() if abs(held[k] - v) > 1e-3 * max(abs(v), 1.0)}
        if off:
            print(f"note: hardware.PRESETS['measured'] holds {held}, the fit gives {fr.params}: update the preset")

    if not args.no_e2e:
        e2e_presets = [p for p in args.e2e_presets.split(",") if p]
        ends = [c for c in cases if not c.is_kernel]
        for comp in compilers:
            for p in e2e_presets:
                got = V.run_e2e(ends, comp, p)
                for c in ends:
                    g = got[c.id]
                    rows.append(V.Row(c, p, comp, g.est_us, launches=g.launches, kernel_us=g.kernel_us))
                    print(f"{c.id} {comp} {p}: device {g.kernel_us / 1e3:.1f} ms + {g.launches} launches x "
                          f"{hardware.PRESETS[p].host_overhead_us / 1e3:.1f} ms (card {c.card_us / 1e3:.0f} ms)")
    elapsed = time.perf_counter() - t0
    header = [f"Generated {time.strftime('%Y-%m-%d')} on {platform.machine()} with {os.cpu_count()} CPUs, torch "
              f"{torch.__version__}, in {elapsed / 60:.1f} min: `.venv/bin/python benchmarks/bench_validation.py"
              f"{' --fit' if args.fit else ''}`."]
    md = V.markdown(cases, rows, presets, compilers, fr, PUBLISHED if fr else None, start_err, header)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(md)
        print(f"wrote {args.markdown}")
    for s in V.summarize(rows):
        print(f"{s.preset:>18} {s.compiler:>10}: {s.n} kernel cases, mean abs {s.mean_abs:.1%}, worst {s.worst:+.1%} "
              f"({s.worst_case})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": [{"case": r.case.id, "preset": r.preset, "compiler": r.compiler, "est_us": r.est_us,
                                 "card_us": r.case.card_us, "error": r.err, "kernel_us": r.kernel_us,
                                 "launches": r.launches} for r in rows],
                       "fit": None if fr is None else {"params": fr.params, "errors": fr.errors, "loo": fr.loo}},
                      fh, indent=1)


if __name__ == "__main__":
    main()
