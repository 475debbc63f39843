"""The planner's choices kept across processes.

Planning a launch (``planning.resolve``: divisions x tilings x loop orders x re-layouts, each
costed by the latency model) is most of a cold first call: about half of an eager forward's first
call, and the first launch of every compiled kernel. The search is deterministic, so its answer
for one program, sizes, hardware config and version of the planner is stored once and re-used by
later processes: the program variant, the re-laid operands, the splits, the tile extents, double
buffering and the loop order. A hit rebuilds that one schedule (``schedule.build_schedule``)
without searching; the result is the schedule the search would have returned.

The key hashes the program's text form (its buffers, dims and body: everything the planner
reads), the bound sizes, the hardware config, the persistent buffers and the source of the
planner and latency model, so a changed program, card or cost model never sees an old answer.

Stored in one SQLite file, ``$VSPYRE_CACHE_DIR/plans.sqlite`` (default
``~/.cache/vspyre``); ``VSPYRE_PLAN_CACHE=0`` turns it off. A cache that cannot be read or written
is skipped (counted in ``planning.plan_stats["cache_errors"]``), never wrong: the search runs.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any, Mapping

from .. import hardware

__all__ = ["enabled", "lookup", "store", "path", "clear"]

_lock = threading.Lock()
_conn: dict[str, sqlite3.Connection] = {}


def enabled() -> bool:
    return os.environ.get("VSPYRE_PLAN_CACHE", "1") not in ("0", "", "off", "false")


def path() -> Path:
    base = os.environ.get("VSPYRE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vspyre")
    return Path(base) / "plans.sqlite"


@functools.cache
def _code_version() -> str:
    """The source of everything a plan depends on (the IR, its costs, the planner, the card)."""
    h = hashlib.sha256()
    here = Path(__file__).parent
    for f in sorted(here.glob("*.py")) + [here.parent / "hardware.py", here.parent / "numerics.py"]:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def key(p: Any, sizes: Mapping[str, int], cfg: Any, persistent: frozenset[str]) -> str:
    from .printer import format_program
    text = format_program(p)
    h = hashlib.sha256()
    for part in (_code_version(), text, repr(sorted(sizes.items())), repr(sorted(hardware.as_dict(cfg).items())),
                 repr(sorted(persistent))):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _db() -> sqlite3.Connection:
    f = path()
    c = _conn.get(str(f))
    if c is None:
        f.parent.mkdir(parents=True, exist_ok=True)
        c = sqlite3.connect(str(f), timeout=5.0, check_same_thread=False, isolation_level=None)
        c.execute("CREATE TABLE IF NOT EXISTS plans (key TEXT PRIMARY KEY, plan TEXT NOT NULL)")
        _conn[str(f)] = c
    return c


def lookup(k: str) -> dict | None:
    with _lock:
        row = _db().execute("SELECT plan FROM plans WHERE key = ?", (k,)).fetchone()
    return json.loads(row[0]) if row else None


def store(k: str, plan: dict) -> None:
    with _lock:
        _db().execute("INSERT OR REPLACE INTO plans (key, plan) VALUES (?, ?)", (k, json.dumps(plan)))


def clear() -> None:
    """Forget every stored plan (this process's connection included)."""
    with _lock:
        for c in _conn.values():
            c.close()
        _conn.clear()
        f = path()
        if f.exists():
            f.unlink()


def plan_of(variant: int, s: Any) -> dict:
    """What to store of a schedule the search chose (its ``variant``-th program variant)."""
    return {"variant": variant, "relayout": sorted(s.relayout), "splits": [list(x[:3]) + [list(x[3])] for x in s.splits],
            "tiles": list(s.tiles), "double_buffer": s.double_buffer, "order": list(s.order)}
