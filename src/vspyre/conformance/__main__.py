"""``python -m vspyre.conformance``: run the OpInfo sweep, write docs/op-coverage.md."""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m vspyre.conformance", description=__doc__)
    p.add_argument("--ops", nargs="*", help="op names (default: every op_db entry)")
    p.add_argument("--families", nargs="*", help="only these families")
    p.add_argument("--dtypes", nargs="*", default=None,
                   help="card dtypes by torch name (default: float32 float16 bfloat16; the 8-bit "
                        "run: int8 float8_e4m3fn float8_e5m2, see --8bit); an op runs in the ones "
                        "its OpInfo lists for the CPU")
    p.add_argument("--8bit", dest="eight_bit", action="store_true",
                   help="the 8-bit run: --dtypes int8 float8_e4m3fn float8_e5m2 (results "
                        "build/conformance-results-8bit.jsonl, doc docs/op-coverage-8bit.md, its "
                        "pass rates also put into docs/op-coverage.md) unless given otherwise")
    p.add_argument("--modes", nargs="*", default=["eager", "compiled", "standalone"])
    p.add_argument("--eager-samples", type=int, default=5)
    p.add_argument("--compiled-samples", type=int, default=2)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per op x dtype x mode")
    p.add_argument("--results", type=Path, nargs="+", default=None,
                   help="JSON-lines results (resumed if it exists); the sweep writes the first, "
                        "the doc is made from all (default build/conformance-results.jsonl)")
    p.add_argument("--fresh", action="store_true", help="discard existing results first")
    p.add_argument("--doc", type=Path, default=None, help="default docs/op-coverage.md")
    p.add_argument("--title", default=None, help="the doc's title")
    p.add_argument("--summary-into", type=Path, metavar="DOC",
                   help="also put this run's pass rates per dtype and mode, with a link to --doc, "
                        "into the report DOC (a generated block, kept when DOC is regenerated)")
    p.add_argument("--report-only", action="store_true", help="only regenerate the doc")
    p.add_argument("--header", default="", help="extra text for the doc header")
    p.add_argument("--check", action="store_true",
                   help="exit 1 on any unexpected mismatch or crash")
    p.add_argument("--shuffle", type=int, metavar="SEED",
                   help="run the ops in a seeded random order (a partial run is an unbiased sample)")
    p.add_argument("--shard", metavar="I/N", help="run only every N-th op starting at I")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    if a.eight_bit:
        from .sweep import EIGHT_BIT_DTYPES
        a.dtypes = a.dtypes or list(EIGHT_BIT_DTYPES)
        a.results = a.results or [Path("build/conformance-results-8bit.jsonl")]
        a.doc = a.doc or Path("docs/op-coverage-8bit.md")
        a.title = a.title or ("Op coverage of the spyre device in its 8-bit dtypes "
                              "(OpInfo conformance sweep)")
        a.summary_into = a.summary_into or Path("docs/op-coverage.md")
    from .sweep import DEFAULT_DTYPES, parse_dtype
    a.dtypes = a.dtypes or list(DEFAULT_DTYPES)
    a.results = a.results or [Path("build/conformance-results.jsonl")]
    a.doc = a.doc or Path("docs/op-coverage.md")
    try:
        dtypes = [parse_dtype(d) for d in a.dtypes]
    except ValueError as e:
        p.error(str(e))

    from . import report
    from .sweep import load_expectations, load_op_db, read_results, select_ops, sweep, unexpected

    from ..compat import dynamo_config
    dynamo_config.cache_size_limit = 64
    if not a.report_only:
        out = a.results[0]
        out.parent.mkdir(parents=True, exist_ok=True)
        if a.fresh and out.exists():
            out.unlink()
        ops = select_ops(load_op_db(), a.ops, a.families)
        if a.shuffle is not None:
            random.Random(a.shuffle).shuffle(ops)
        if a.shard:
            i, n = map(int, a.shard.split("/"))
            ops = ops[i::n]
        sweep(ops, dtypes, a.modes, eager_samples=a.eager_samples,
              compiled_samples=a.compiled_samples, timeout=a.timeout, out=out,
              progress=not a.no_progress)
    merged: dict[tuple, dict] = {}       # a later results file overrides an earlier one
    for path in a.results:
        if path.exists():
            for r in read_results(path):
                merged[(r["op"], r["dtype"], r["mode"])] = r
    results = list(merged.values())
    exp = load_expectations()            # apply the current xfails.toml to older records too
    for r in results:
        if r["verdict"] in ("mismatch", "crash"):
            reason = exp.xfail_reason(r["op"], r["dtype"], r["mode"])
            if reason is not None:
                r["verdict"], r["xfail_reason"] = "xfail", reason
    header = (f"Limits: first {a.eager_samples} sample inputs per op for eager, first "
              f"{a.compiled_samples} for compiled/standalone; per op x dtype x mode timeout "
              f"{a.timeout:g} s. {a.header}").strip()
    command = ("`make conformance-8bit` (`python -m vspyre.conformance --8bit`, "
               "`src/vspyre/conformance/`)" if a.eight_bit else None)
    report.write(results, a.doc, header, a.title, command)
    if a.summary_into is not None and a.summary_into.exists() and a.summary_into != a.doc:
        report.write_summary_block(results, a.doc, a.summary_into)
    print(report.summary_line(results))
    bad = unexpected(results)
    for r in bad[:50]:
        print(f"UNEXPECTED {r['verdict']}: {r['op']} {r['dtype']} {r['mode']}: {r.get('detail', '')}")
    return 1 if (a.check and bad) else 0


if __name__ == "__main__":
    sys.exit(main())
