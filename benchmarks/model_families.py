"""Every causal-LM model type of the installed transformers, at tiny size, on the card.

    python benchmarks/model_families.py                      # all types, resumes from --out
    python benchmarks/model_families.py --only llama,mistral --jobs 2
    python benchmarks/model_families.py --doc-only           # rewrite the doc from the rows

Each (type, mode) runs in its own process (at most --timeout s): estimate-only and functional, on
Inductor and the standalone compiler (vspyre.harness.families). Rows are appended to --out as they
finish (a rerun skips the rows there; --retry-failed runs the failed ones again), then the table is
written to --doc (docs/model-families.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated model types (default: every causal-LM type)")
    ap.add_argument("--modes", default="estimate,execute", help="estimate, execute or both (default)")
    ap.add_argument("--out", default=str(ROOT / "build" / "model-families.jsonl"), help="rows (JSONL; resumed)")
    ap.add_argument("--doc", default=str(ROOT / "docs" / "model-families.md"), help="the Markdown table")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per (type, mode) process")
    ap.add_argument("--jobs", type=int, default=1, help="processes at once")
    ap.add_argument("--fresh", action="store_true", help="discard the rows in --out first")
    ap.add_argument("--retry-failed", action="store_true", help="run rows that are not ok again")
    ap.add_argument("--doc-only", action="store_true", help="only rewrite --doc from --out")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args()

    from vspyre.harness import families as F

    only = tuple(t.strip() for t in args.only.split(",") if t.strip())
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    bad = [m for m in modes if m not in F.MODES]
    if bad:
        ap.error(f"unknown mode(s) {', '.join(bad)}; modes: {', '.join(F.MODES)}")
    opts = F.Options(out=args.out, only=only, modes=modes, timeout=args.timeout, jobs=args.jobs,
                     fresh=args.fresh, retry_failed=args.retry_failed)
    meta_path = args.out + ".meta.json"
    meta = json.loads(Path(meta_path).read_text()) if os.path.exists(meta_path) and not args.fresh else {}
    t0 = time.perf_counter()
    if not args.doc_only:
        try:
            F.sweep(opts, progress=not args.no_progress)
        except ValueError as e:
            print(f"model_families: {e}", file=sys.stderr)
            return 2
        meta["wall_s"] = meta.get("wall_s", 0.0) + time.perf_counter() - t0     # summed over resumed runs
        Path(meta_path).write_text(json.dumps(meta))
    rows = F.rows(args.out)
    if only:
        rows = [r for r in rows if r["model_type"] in only]
    Path(args.doc).write_text(F.markdown(rows, wall_s=meta.get("wall_s")), encoding="utf-8")
    print(f"{len(rows)} rows -> {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
