"""Render compare results: Markdown, and one self-contained HTML page with embedded plots.

``vspyre report RUN.jsonl [RUN2.jsonl|RUN.json ...] --out DIR`` merges runs (the last row of each
model x backend x PyTorch version wins) and writes ``DIR/results.json``, ``report.md``,
``report.html``.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

from . import schema

STATUS_SCORE = {"ok": 4, "accuracy_fail": 3, "error": 2, "timeout": 1, "crash": 0, "skipped": -1}
_STAGE_MARK = {"ok": "✓", "fail": "✗", "error": "E", "crash": "C", "timeout": "T", "skipped": "-", "not_run": "."}


def column(row: dict[str, Any]) -> str:
    """A matrix column: the backend, with the PyTorch version when rows come from several installs."""
    return f"{row['backend']} @ torch {(row.get('versions') or {}).get('torch', '?')}"


def _f(v: Any, fmt: str = "{:.2f}", none: str = "–") -> str:
    return none if v is None else fmt.format(v)


def _mib(v: Any) -> str:
    return "–" if v is None else f"{v / 2**20:.1f}"


def _stages(row: dict[str, Any]) -> str:
    return "".join(_STAGE_MARK.get(row["stages"].get(s, "not_run"), "?") for s in schema.STAGES)


def _fallbacks(row: dict[str, Any]) -> str:
    fb = row.get("host_fallbacks")
    if fb is None:
        return "–"
    return str(sum(fb.values())) + (f" ({len(fb)} ops)" if fb else "")


def _acc(row: dict[str, Any]) -> str:
    a = row.get("accuracy")
    if not a:
        return "–"
    return f"{'pass' if a['ok'] else 'FAIL'} {a['max_abs_err']:.1e} / cos {a['cosine']:.5f}"


def summary_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    multi = len({(r.get("versions") or {}).get("torch") for r in rows}) > 1
    head = ["model", "backend"] + (["torch"] if multi else []) + [
        "status", "stages L/C/R/A", "graph breaks", "host fallbacks / call", "compile cold s", "compile warm s",
        "recompiles", "wall ms (median)", "device est. µs", "accuracy (max err / cosine)", "peak dev MiB",
        "host RSS MiB"]
    body = []
    for r in rows:
        body.append([r["model"], r["backend"]] + ([(r.get("versions") or {}).get("torch", "?")] if multi else []) + [
            r["status"], _stages(r), _f(r.get("graph_breaks"), "{}"), _fallbacks(r),
            _f(r.get("compile_cold_s")), _f(r.get("compile_warm_s")), _f(r.get("recompiles"), "{}"),
            _f(r.get("wall_ms")), _f(r.get("device_est_us"), "{:.1f}"), _acc(r),
            _mib(r.get("peak_device_mem_bytes")), _mib(r.get("host_peak_rss_bytes"))])
    return head, body


def matrix(rows: list[dict[str, Any]]) -> tuple[list[str], list[str], dict[tuple[str, str], dict]]:
    models = list(dict.fromkeys(r["model"] for r in rows))
    cols = list(dict.fromkeys(column(r) for r in rows))
    cells = {(r["model"], column(r)): r for r in rows}
    return models, cols, cells


def _versions(rows: list[dict[str, Any]]) -> list[str]:
    seen = dict.fromkeys(" ".join(f"{k}={v}" for k, v in sorted((r.get("versions") or {}).items()) if k != "backend")
                         for r in rows)
    return list(seen)


def _runs(rows: list[dict[str, Any]]) -> list[str]:
    """How the rows were run: host, CPUs, rows in parallel, timed calls (one line per distinct setup)."""
    seen = dict.fromkeys(
        f"run on {env.get('hostname', '?')}: {env.get('cpus', '?')} CPUs, {env.get('jobs', '?')} row(s) in "
        f"parallel with {env.get('threads', '?')} torch thread(s) each, {env.get('repeat', '?')} timed calls, "
        f"timeout {env.get('timeout_s', '?')} s"
        for env in ((r.get("env") or {}) for r in rows) if env)
    return list(seen)


SECONDS = ("startup", "load", "compile", "run", "accuracy", "recompiles", "warm_process")


def time_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Where each row's time went (``row['seconds']``), to see what a run spends its time on."""
    head = ["model", "backend"] + [s.replace("_", " ") for s in SECONDS] + ["row total"]
    body = [[r["model"], r["backend"]] + [_f((r.get("seconds") or {}).get(s), "{:.1f}") for s in SECONDS]
            + [_f(r.get("duration_s"), "{:.1f}")] for r in rows if r.get("seconds")]
    if body:
        total = sum(r.get("duration_s") or 0.0 for r in rows if r.get("seconds"))
        body.append(["all rows", ""] + [_f(sum((r.get("seconds") or {}).get(s) or 0.0 for r in rows), "{:.1f}")
                                        for s in SECONDS] + [_f(total, "{:.1f}")])
    return head, body


def _details(rows: list[dict[str, Any]]) -> list[tuple[str, str, list[str]]]:
    """(title, row label, lines) for errors, graph-break reasons, host fallbacks."""
    out = []
    for r in rows:
        label = f"{r['model']} × {r['backend']} (torch {(r.get('versions') or {}).get('torch', '?')})"
        if r.get("error"):
            e = r["error"]
            out.append(("Errors", label, [f"[{e.get('stage')}] {e.get('type')}:"] + e.get("message", "").splitlines()[:8]))
        if r.get("graph_break_reasons"):
            out.append(("Graph breaks", label, [f"{n}× {reason.splitlines()[0][:300] if reason else ''}"
                                                for reason, n in r["graph_break_reasons"]]))
        fb = {**(r.get("compiled_fallbacks") or {})}
        if r.get("host_fallbacks"):
            out.append(("Host fallbacks", label, [f"{op}: {n} call(s) per forward" for op, n in
                                                  sorted(r["host_fallbacks"].items(), key=lambda kv: -kv[1])]
                        + [f"(compiled to a fallback kernel: {op} ×{n})" for op, n in fb.items()]))
        for note in r.get("notes") or []:
            out.append(("Notes", label, [note]))
    order = ["Errors", "Graph breaks", "Host fallbacks", "Notes"]
    return sorted(out, key=lambda t: order.index(t[0]))


def markdown(rows: list[dict[str, Any]]) -> str:
    def esc(s: str) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")

    lines = [f"# vspyre compare — {len(rows)} rows", "",
             f"Schema `{schema.SCHEMA}` v{schema.SCHEMA_VERSION}. Stages: L=load C=compile R=run A=accuracy "
             "(✓ ok, ✗ accuracy fail, E error, C crash, T timeout, - skipped).", ""]
    for v in _versions(rows) + _runs(rows):
        lines.append(f"- {v}")
    models, cols, cells = matrix(rows)
    lines += ["", "## Coverage", "", "| model | " + " | ".join(esc(c) for c in cols) + " |",
              "|---|" + "---|" * len(cols)]
    for m in models:
        lines.append(f"| {esc(m)} | " + " | ".join(esc(cells[(m, c)]["status"]) if (m, c) in cells else "" for c in cols) + " |")
    head, body = summary_table(rows)
    lines += ["", "## Results", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(esc(c) for c in b) + " |" for b in body]
    head, body = time_table(rows)
    if body:
        lines += ["", "## Where the time went (seconds per row)", "",
                  "`startup`: process start and imports not in a stage; `warm process`: the whole second "
                  "(warm-cache) process.", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(esc(c) for c in b) + " |" for b in body]
    section = None
    for title, label, ls in _details(rows):
        if title != section:
            lines += ["", f"## {title}", ""]
            section = title
        lines.append(f"- **{esc(label)}**")
        lines += [f"    - `{esc(l)}`" if l else "" for l in ls if l]
    return "\n".join(lines) + "\n"


# -- plots ------------------------------------------------------------------------------------

def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _bars(rows: list[dict[str, Any]], fields: list[tuple[str, str]], ylabel: str, title: str,
          log: bool = True) -> str | None:
    import matplotlib.pyplot as plt
    import numpy as np

    models = list(dict.fromkeys(r["model"] for r in rows))
    cols = list(dict.fromkeys(column(r) for r in rows))
    cells = {(r["model"], column(r)): r for r in rows}
    series = [(c, f, lab) for c in cols for f, lab in fields
              if any(cells.get((m, c), {}).get(f) is not None for m in models)]
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(models) + 2), 4))
    w = 0.8 / len(series)
    x = np.arange(len(models))
    for i, (c, f, lab) in enumerate(series):
        vals = [cells.get((m, c), {}).get(f) for m in models]
        ax.bar(x + i * w - 0.4 + w / 2, [v if v is not None else 0 for v in vals], w,
               label=f"{c.split(' @ ')[0] if len({k.split(' @ ')[1] for k in cols}) == 1 else c}{lab}")
    ax.set_xticks(x, models, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=7)
    return _png(fig)


def _heatmap(rows: list[dict[str, Any]]) -> str | None:
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap

    models, cols, cells = matrix(rows)
    if not models:
        return None
    data = np.full((len(models), len(cols)), np.nan)
    for i, m in enumerate(models):
        for j, c in enumerate(cols):
            if (m, c) in cells:
                data[i, j] = STATUS_SCORE.get(cells[(m, c)]["status"], -1)
    cmap = ListedColormap(["#999999", "#7b1e1e", "#d9534f", "#f0ad4e", "#f7e463", "#5cb85c"])
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(cols) + 2), max(3, 0.4 * len(models) + 1.5)))
    ax.imshow(data, cmap=cmap, vmin=-1.5, vmax=4.5, aspect="auto")
    for i, m in enumerate(models):
        for j, c in enumerate(cols):
            if (m, c) in cells:
                ax.text(j, i, cells[(m, c)]["status"], ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(cols)), cols, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(models)), models, fontsize=8)
    ax.set_title("coverage (status per model × backend)")
    return _png(fig)


def plots(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    import matplotlib
    matplotlib.use("Agg", force=True)
    out = []
    for title, png in [
        ("Wall time per call (median)", _bars(rows, [("wall_ms", "")], "ms", "wall time per call (median)")),
        ("Estimated device time per call", _bars(rows, [("device_est_us", "")], "µs", "estimated device time")),
        ("Compile time, cold and warm cache", _bars(rows, [("compile_cold_s", " cold"), ("compile_warm_s", " warm")],
                                                    "s", "compile time")),
        ("Coverage", _heatmap(rows)),
    ]:
        if png:
            out.append((title, png))
    return out


_CSS = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}th{background:#f2f2f2}
.ok{background:#dff0d8}.accuracy_fail{background:#fcf8e3}.error{background:#f2dede}.crash,.timeout{background:#e8b7b7}
pre{background:#f7f7f7;padding:4px;font-size:12px;white-space:pre-wrap}img{max-width:100%;display:block;margin:8px 0}"""


def html_page(rows: list[dict[str, Any]]) -> str:
    e = html.escape
    parts = ["<!DOCTYPE html>", "<html><head><meta charset=\"utf-8\"><title>vspyre compare</title>",
             f"<style>{_CSS}</style></head><body>", f"<h1>vspyre compare — {len(rows)} rows</h1>",
             f"<p>Schema <code>{schema.SCHEMA}</code> v{schema.SCHEMA_VERSION}. Stages: L=load C=compile R=run "
             "A=accuracy (✓ ok, ✗ accuracy fail, E error, C crash, T timeout, - skipped).</p><ul>"]
    parts += [f"<li>{e(v)}</li>" for v in _versions(rows) + _runs(rows)]
    parts.append("</ul><h2>Coverage</h2><table><tr><th>model</th>")
    models, cols, cells = matrix(rows)
    parts += [f"<th>{e(c)}</th>" for c in cols]
    parts.append("</tr>")
    for m in models:
        parts.append(f"<tr><td>{e(m)}</td>")
        for c in cols:
            st = cells[(m, c)]["status"] if (m, c) in cells else ""
            parts.append(f"<td class=\"{e(st)}\">{e(st)}</td>")
        parts.append("</tr>")
    parts.append("</table><h2>Results</h2><table><tr>")
    head, body = summary_table(rows)
    parts += [f"<th>{e(h)}</th>" for h in head]
    parts.append("</tr>")
    for r, b in zip(rows, body):
        parts.append(f"<tr class=\"{e(r['status'])}\">" + "".join(f"<td>{e(c)}</td>" for c in b) + "</tr>")
    parts.append("</table>")
    head, body = time_table(rows)
    if body:
        parts.append("<h2>Where the time went (seconds per row)</h2><table><tr>"
                     + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>")
        parts += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in b) + "</tr>" for b in body]
        parts.append("</table>")
    for title, png in plots(rows):
        parts.append(f"<h2>{e(title)}</h2><img alt=\"{e(title)}\" src=\"data:image/png;base64,{png}\">")
    section = None
    for title, label, ls in _details(rows):
        if title != section:
            parts.append(f"<h2>{e(title)}</h2>")
            section = title
        parts.append(f"<h4>{e(label)}</h4><pre>{e(chr(10).join(ls))}</pre>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_all(rows: list[dict[str, Any]], out_dir: str | Path) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "md": out / "report.md", "html": out / "report.html"}
    schema.write_json(paths["json"], rows)
    paths["md"].write_text(markdown(rows), encoding="utf-8")
    paths["html"].write_text(html_page(rows), encoding="utf-8")
    return paths


def load(paths: list[str | Path]) -> list[dict[str, Any]]:
    return schema.merge(schema.read_rows(p) for p in paths)
