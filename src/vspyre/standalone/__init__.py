"""The standalone graph compiler for the card ("the old path"), next to the Inductor extension.

    m = torch.compile(model, backend="spyre_standalone")
    with torch.no_grad():
        y = m(**inputs)                           # tile programs on the card
    print(vspyre.standalone.report_text())        # native vs host-fallback ops, fusions, buffer plan
    vspyre.standalone.op_table()                  # the ATen ops it lowers natively

AOTAutograd hands over the ATen forward graph (inference first; a backward graph runs eagerly on
the device, i.e. op by op through the counted host fallback); :mod:`.passes` folds constants,
drops no-op clones, applies the fixed :mod:`.fusions` and removes dead code; :mod:`.lowerings`
(one hand-written lowering per ATen op, data you can list) turns each node into a tile program
from :mod:`.kernels`; :mod:`.compiler` plans buffers and runs the programs through
``vspyre.runtime.launch``. It never imports Inductor's lowering/scheduler/codegen or
``vspyre.inductor``. An op it does not know runs as a counted *host fallback node* inside the
compiled graph (strict mode: an error naming the op).
"""

from __future__ import annotations

from . import fusions as _fusions  # noqa: F401  (registers the fused targets in the op table)
from .compiler import compile_graph, report, report_text, reset_report, spyre_standalone  # noqa: F401
from .lowerings import TABLE

__all__ = ["op_table", "op_table_rows", "report", "report_text", "reset_report", "spyre_standalone",
           "compile_graph", "BACKEND"]
BACKEND = "spyre_standalone"


def op_table_rows() -> list[tuple[str, str, str]]:
    """(op, kind, how) for every entry: kind is ``kernel``, ``view``, ``fused`` or ``collective``."""
    rows = {(low.name, low.kind, low.doc) for low in TABLE.values()}
    order = {"kernel": 0, "view": 1, "fused": 2, "collective": 3}
    return sorted(rows, key=lambda r: (order[r[1]], r[0]))


def op_table() -> list[str]:
    """The ATen ops (and fused patterns) the standalone compiler lowers natively, sorted."""
    return [r[0] for r in op_table_rows()]


# Dynamo finds the backend through the package's "torch_dynamo_backends" entry point
# (pyproject.toml), so backend="spyre_standalone" works without importing this module first.
