"""The result schema of ``vspyre compare`` (versioned; documented in ``docs/harness.md``).

A run is a JSONL file: one JSON object (a *row*) per line, appended as results arrive. One row is
one model x backend on one PyTorch install. ``vspyre report`` reads JSONL files and/or JSON
documents and writes a JSON document::

    {"schema": "vspyre.compare", "schema_version": 1, "created": "...", "rows": [row, ...]}

Rows are keyed by :func:`row_key` = (model, backend, torch version); merging runs keeps the last
row of each key, so results from two PyTorch installs form one compatibility matrix.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterable

SCHEMA = "vspyre.compare"
SCHEMA_VERSION = 2
# v2 added "seconds" (per-stage wall time); older rows are upgraded on read (missing fields = None).

STAGES = ("load", "compile", "run", "accuracy")
# row["status"]: the overall verdict.
STATUSES = ("ok", "accuracy_fail", "error", "crash", "timeout", "skipped")
# row["stages"][stage]: per stage.
STAGE_STATUSES = ("ok", "fail", "error", "crash", "timeout", "skipped", "not_run")

# field -> (type(s), meaning). Every row has every field (None when not measured).
FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "schema_version": ((int,), "SCHEMA_VERSION of the writer"),
    "model": ((str,), "suite name or user spec 'pkg.mod:function'"),
    "backend": ((str,), "backend name (see backends.py), e.g. 'inductor-spyre'"),
    "backend_spec": ((dict,), "{'compiler': torch.compile backend or null for eager, 'device', 'options'}"),
    "status": ((str,), "one of STATUSES"),
    "stages": ((dict,), "stage -> one of STAGE_STATUSES, for STAGES"),
    "error": ((dict, type(None)), "{'stage', 'type', 'message' (first lines)} of the first failure"),
    "graph_breaks": ((int, type(None)), "Dynamo graph breaks (sum of counters['graph_break'])"),
    "graph_break_reasons": ((list,), "unique graph-break reasons (Dynamo's text), with counts: [[reason, n], ...]"),
    "graphs": ((int, type(None)), "graphs Dynamo compiled for the first call (counters['stats']['unique_graphs'])"),
    "host_fallbacks": ((dict, type(None)), "op -> calls during one steady-state call (torch.spyre.fallback_stats())"),
    "compiled_fallbacks": ((dict, type(None)), "op -> count of ops Inductor routed to a host fallback kernel"),
    "compile_cold_s": ((float, type(None)), "first call minus steady call, fresh process, empty TORCHINDUCTOR_CACHE_DIR"),
    "compile_warm_s": ((float, type(None)), "same, in a second process sharing the cache"),
    "first_call_cold_s": ((float, type(None)), "wall time of the first call (cold)"),
    "recompiles": ((int, type(None)), "graphs compiled again when batch / sequence length vary"),
    "recompile_shapes": ((list,), "the variants tried, e.g. ['batch=3', 'seq=16']"),
    "wall_ms": ((float, type(None)), "median wall time of a call after warm-up"),
    "wall_ms_all": ((list,), "every timed call (ms)"),
    "device_est_us": ((float, type(None)), "estimated device time of one call (torch.spyre.profile().total_est_us)"),
    "kernels": ((int, type(None)), "device kernel launches in one call"),
    "accuracy": ((dict, type(None)), "vs CPU fp32 eager, dynamo runner rules: {ok, rule, max_abs_err, cosine, rmse, rmse_fp32}"),
    "peak_device_mem_bytes": ((int, type(None)), "torch.spyre.max_memory_allocated() over load+compile+run"),
    "host_peak_rss_bytes": ((int, type(None)), "peak RSS of the worker process (getrusage)"),
    "versions": ((dict,), "{'torch', 'torch_git', 'vspyre', 'transformers', 'python', 'backend'}"),
    "env": ((dict,), "{'hostname', 'cpus', 'repeat', 'timeout_s', 'jobs' (rows in parallel), 'threads' (torch threads per worker), 'preload', 'ray'}"),
    "duration_s": ((float, type(None)), "wall time of the row (all its processes)"),
    "seconds": ((dict, type(None)), "where the row's time went: {'startup' (interpreter + imports), 'load', "
                                    "'compile', 'run', 'accuracy', 'recompiles', 'warm_process'} in seconds"),
    "timestamp": ((str,), "UTC time the row finished (ISO 8601)"),
    "notes": ((list,), "free-text remarks, e.g. a failed warm-cache process"),
}


def empty_row(model: str, backend: str, backend_spec: dict[str, Any] | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {k: None for k in FIELDS}
    row.update(schema_version=SCHEMA_VERSION, model=model, backend=backend, backend_spec=backend_spec or {},
               status="error", stages={s: "not_run" for s in STAGES}, graph_break_reasons=[],
               recompile_shapes=[], wall_ms_all=[], notes=[], versions={}, env={}, timestamp=now())
    return row


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def upgrade(row: dict[str, Any]) -> dict[str, Any]:
    """A row written by an older schema version, with the fields it lacks set to None."""
    if row.get("schema_version", SCHEMA_VERSION) < SCHEMA_VERSION:
        for k in FIELDS:
            row.setdefault(k, None)
    return row


def validate(row: dict[str, Any]) -> list[str]:
    """Problems with a row (empty list = valid)."""
    errs = []
    for k, (types, _) in FIELDS.items():
        if k not in row:
            errs.append(f"missing field {k!r}")
        elif not isinstance(row[k], types) or (isinstance(row[k], bool) and bool not in types
                                                 and int in types):
            if float in types and isinstance(row[k], int) and not isinstance(row[k], bool):
                continue
            errs.append(f"{k!r}: {type(row[k]).__name__} is not {'/'.join(t.__name__ for t in types)}")
    if row.get("status") not in STATUSES:
        errs.append(f"status {row.get('status')!r} not in {STATUSES}")
    for s, v in (row.get("stages") or {}).items():
        if s not in STAGES or v not in STAGE_STATUSES:
            errs.append(f"stage {s!r}: {v!r}")
    if row.get("schema_version", 0) > SCHEMA_VERSION:
        errs.append(f"schema_version {row.get('schema_version')} is newer than {SCHEMA_VERSION}")
    return errs


def row_key(row: dict[str, Any]) -> tuple[str, str, str]:
    return (row["model"], row["backend"], (row.get("versions") or {}).get("torch", "?"))


def append_jsonl(path: str | Path, row: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")
        f.flush()


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a JSONL run file or a JSON document (a truncated last JSONL line is skipped)."""
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    if p.suffix == ".json" or text.lstrip().startswith("{\"schema\""):
        doc = json.loads(text)
        if doc.get("schema") != SCHEMA:
            raise ValueError(f"{p}: not a {SCHEMA} document")
        if doc.get("schema_version", 0) > SCHEMA_VERSION:
            raise ValueError(f"{p}: schema_version {doc['schema_version']} is newer than this reader ({SCHEMA_VERSION})")
        return [upgrade(r) for r in doc["rows"]]
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(upgrade(json.loads(line)))
        except json.JSONDecodeError:
            continue            # a line cut by a crash of the parent
    return rows


def merge(row_lists: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Merge runs: the last row of each (model, backend, torch version) wins; order kept."""
    out: dict[tuple, dict[str, Any]] = {}
    for rows in row_lists:
        for r in rows:
            out.pop(row_key(r), None)
            out[row_key(r)] = r
    return list(out.values())


def document(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "created": now(), "rows": rows}


def write_json(path: str | Path, rows: list[dict[str, Any]]) -> None:
    Path(path).write_text(json.dumps(document(rows), indent=1, sort_keys=True), encoding="utf-8")
