"""Data-dependent sizes on the card: read back (a counted sync), or assumed in estimate-only mode.

Some kernels need sizes that are values on the card: how many rows each expert of a
mixture-of-experts layer gets (the grouped matmul's offsets), how many entries ``nonzero`` finds.
A GPU reads such a size back to the host (a device-to-host *sync*, not a fallback: the work stays
on the device); so does the card: :func:`read_sizes` copies the values to the host and counts the
sync per op (:func:`sync_stats`, also ``torch.spyre.sync_stats()``).

In estimate-only mode (``torch.spyre.estimate_only()``) the card holds no values, so there is
nothing to read: the sizes come from the *routing assumption* instead, set here and nowhere else:

* ``balanced`` (default): the routed rows (tokens x top-k) spread evenly over the experts (the
  first ``rows % experts`` experts get one more);
* ``skewed:F``: a fraction ``F`` of the routed rows go to one expert (expert 0), the rest spread
  evenly over the others. With top-k routing an expert sees a token at most once, so ``F`` above
  ``1/k`` routes more rows to one expert than there are tokens (``skewed:0.5`` with top-2 is the
  extreme: every token picks the hot expert).

:func:`assumed` counts the sizes each op resolved by assumption, so a report can say which of its
figures rest on the assumption. ``nonzero`` of a tensor without values has no assumption that
fits every mask: it raises ``torch.spyre.EstimateOnlyError`` naming the op, as before.
"""

from __future__ import annotations

import collections
import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch

from .memory import estimate_only, has_values

__all__ = ["Routing", "parse", "get", "set_routing", "routing", "read_sizes", "group_bounds", "sync_stats",
           "reset_sync_stats", "assumed", "reset_assumed"]


@dataclass(frozen=True)
class Routing:
    """How estimate-only mode splits routed rows over experts."""
    kind: str = "balanced"      # "balanced" | "skewed"
    hot: float = 0.0            # skewed: the fraction of the routed rows the hot expert gets

    def __str__(self) -> str:
        return "balanced" if self.kind == "balanced" else f"skewed:{self.hot:g}"

    def describe(self) -> str:
        if self.kind == "balanced":
            return "balanced: the routed rows (tokens x top-k) spread evenly over the experts"
        return (f"skewed:{self.hot:g}: {self.hot:.0%} of the routed rows (tokens x top-k) go to one expert, "
                "the rest spread evenly over the others")

    def split(self, rows: int, groups: int) -> list[int]:
        """Rows per group (sums to ``rows``)."""
        if groups <= 0:
            raise ValueError(f"routing {self}: {groups} groups")
        if self.kind == "balanced" or groups == 1:
            q, r = divmod(rows, groups)
            return [q + (1 if g < r else 0) for g in range(groups)]
        hot = min(rows, round(self.hot * rows))
        q, r = divmod(rows - hot, groups - 1)
        return [hot] + [q + (1 if g < r else 0) for g in range(groups - 1)]


def parse(text: str | Routing) -> Routing:
    """``"balanced"`` or ``"skewed:F"`` (0 <= F <= 1) -> :class:`Routing`; anything else raises a
    ``ValueError`` saying what is accepted."""
    if isinstance(text, Routing):
        return text
    t = str(text).strip().lower()
    if t == "balanced":
        return Routing()
    if t.startswith("skewed:"):
        try:
            f = float(t.split(":", 1)[1])
        except ValueError:
            f = -1.0
        if 0.0 <= f <= 1.0:
            return Routing("skewed", f)
    raise ValueError(f"routing {text!r}: expected 'balanced' or 'skewed:F' with F a fraction in [0, 1] "
                     "(e.g. skewed:0.5)")


_current = Routing()
_syncs: collections.Counter[str] = collections.Counter()
_assumed: collections.Counter[str] = collections.Counter()


def get() -> Routing:
    return _current


def set_routing(r: str | Routing) -> Routing:
    """Set the routing assumption; returns the previous one."""
    global _current
    prev, _current = _current, parse(r)
    return prev


@contextlib.contextmanager
def routing(r: str | Routing) -> Iterator[Routing]:
    prev = set_routing(r)
    try:
        yield _current
    finally:
        set_routing(prev)


def sync_stats() -> dict[str, int]:
    """Device-to-host reads of data-dependent sizes, per op."""
    return dict(_syncs)


def reset_sync_stats() -> None:
    _syncs.clear()


def assumed() -> dict[str, int]:
    """Sizes resolved by the routing assumption (estimate-only mode), per op."""
    return dict(_assumed)


def reset_assumed() -> None:
    _assumed.clear()


def read_sizes(t: torch.Tensor, op: str) -> list[int] | None:
    """The values of ``t`` on the host (one counted sync), or None when the card holds none
    (estimate-only mode): the caller then resolves the sizes by the routing assumption."""
    if t.device.type != "cpu" and estimate_only() and not has_values(t):
        _assumed[op] += 1
        return None
    if t.device.type != "cpu":
        _syncs[op] += 1
    return [int(v) for v in t.detach().reshape(-1).cpu().tolist()]


def group_bounds(offs: torch.Tensor, rows: int, op: str) -> list[tuple[int, int]]:
    """``(start, end)`` rows of each group from cumulative offsets (a grouped matmul's ``offs``),
    read back or, in estimate-only mode, assumed: ``rows`` routed rows split by :func:`get`."""
    vals = read_sizes(offs, op)
    if vals is None:
        vals, tot = [], 0
        for n in _current.split(rows, offs.shape[0]):
            tot += n
            vals.append(tot)
    bounds, start = [], 0
    for g, end in enumerate(vals):
        if end < start or end > rows:
            raise RuntimeError(f"{op}: offsets {vals} are not non-decreasing within the {rows} input rows "
                               f"(group {g} ends at {end})")
        bounds.append((start, end))
        start = end
    return bounds
