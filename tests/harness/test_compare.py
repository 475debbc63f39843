"""`vspyre compare` / `vspyre report`: rows from subprocesses, crashes and hangs as rows, resume,
schema round trip, graph breaks and host fallbacks reported, Markdown and HTML rendering.

The subprocess tests use the tiny models of ``toy_models.py`` with 1 timed repeat, no warm-cache
process and no recompile variants, to stay fast.
"""

from __future__ import annotations

import json
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from vspyre.cli import main as cli_main
from vspyre.harness import backends as B
from vspyre.harness import cases, compare, report, schema

TOY = "tests.harness.toy_models"
SPYRE = B.BUILTIN["inductor-spyre"]
CPU = B.BUILTIN["eager-cpu"]


def _opts(tmp_path: Path, **kw) -> compare.Options:
    base = dict(out_dir=str(tmp_path / "out"), jobs=1, timeout=120, repeat=1, warm=False, recompiles=False)
    base.update(kw)
    return compare.Options(**base)


def _row(model="m", backend="inductor-spyre", status="ok", torch_v="2.13.0", **kw):
    r = schema.empty_row(model, backend, B.BUILTIN.get(backend, SPYRE).spec())
    r.update(status=status, stages={s: "ok" for s in schema.STAGES}, versions={"torch": torch_v, "vspyre": "0.1.0"},
             wall_ms=1.5, device_est_us=3.0, compile_cold_s=2.0, compile_warm_s=0.5, graph_breaks=0,
             host_fallbacks={}, accuracy={"ok": True, "rule": "allclose 0.001", "max_abs_err": 0.0,
                                          "cosine": 1.0, "rmse": None, "rmse_fp32": None})
    r.update(kw)
    return r


# -- pure (no subprocess) ------------------------------------------------------------------------

def test_backends_as_data():
    assert [b.name for b in B.parse_backends("eager-cpu,inductor-spyre")] == ["eager-cpu", "inductor-spyre"]
    b = B.parse_backend("aot_eager@spyre?dynamic=true&mode=default")
    assert (b.compiler, b.device, b.options) == ("aot_eager", "spyre", {"dynamic": True, "mode": "default"})
    assert B.parse_backend("none@spyre").compiler is None
    assert B.from_spec(b.name, b.spec()) == b
    with pytest.raises(ValueError, match="unknown backend"):
        B.parse_backend("nonsense")


def test_registry_has_suite_and_decode_cases():
    assert set(cases.SUITES["default"]) >= {"gpt2", "llama", "resnet", "llama-decode"}
    assert len(cases.SUITES["default"]) >= 10
    assert cases.variants("gpt2") == [("batch=3,seq=48", {"batch": 3, "seq": 48})]
    assert cases.variants("resnet") == [("batch=3,image_size=128", {"batch": 3, "image_size": 128})]
    assert [label for label, _ in cases.variants(f"{TOY}:simple")] == ["batch=3,seq=6"]
    assert cases.variants(f"{TOY}:crash") == []


def test_schema_round_trip(tmp_path):
    rows = [_row("a"), _row("b", status="crash", error={"stage": "run", "type": "crash", "message": "x"})]
    for r in rows:
        assert schema.validate(r) == []
    p = tmp_path / "r.jsonl"
    for r in rows:
        schema.append_jsonl(p, r)
    with open(p, "a") as f:
        f.write('{"model": "cut-by-a-cr')                 # a torn last line is ignored
    assert schema.read_rows(p) == rows
    schema.write_json(tmp_path / "r.json", rows)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["schema"] == schema.SCHEMA and doc["schema_version"] == schema.SCHEMA_VERSION
    assert schema.read_rows(tmp_path / "r.json") == rows
    bad = dict(rows[0], status="weird")
    del bad["wall_ms"]
    assert len(schema.validate(bad)) == 2


def test_merge_two_torch_installs_into_one_matrix(tmp_path):
    a = [_row("gpt2", torch_v="2.12.0"), _row("bert", torch_v="2.12.0", status="error")]
    b = [_row("gpt2", torch_v="2.13.0"), _row("bert", torch_v="2.12.0", status="ok")]   # re-run wins
    merged = schema.merge([a, b])
    assert len(merged) == 3
    assert {schema.row_key(r): r["status"] for r in merged}[("bert", "inductor-spyre", "2.12.0")] == "ok"
    models, cols, _ = report.matrix(merged)
    assert cols == ["inductor-spyre @ torch 2.12.0", "inductor-spyre @ torch 2.13.0"]
    schema.write_json(tmp_path / "a.json", a)
    for i, r in enumerate(b):
        schema.append_jsonl(tmp_path / "b.jsonl", r)
    assert cli_main(["report", str(tmp_path / "a.json"), str(tmp_path / "b.jsonl"), "--out", str(tmp_path / "rep")]) == 0
    assert len(schema.read_rows(tmp_path / "rep" / "results.json")) == 3
    assert "2.12.0" in (tmp_path / "rep" / "report.md").read_text()


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.imgs, self.tables, self.tags = [], 0, []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "img":
            self.imgs.append(dict(attrs))
        if tag == "table":
            self.tables += 1


def test_markdown_and_html_render():
    rows = [_row("gpt2"), _row("gpt2", backend="eager-cpu"),
            _row("toy", status="error", graph_breaks=1, graph_break_reasons=[["print() call", 1]],
                 host_fallbacks={"aten::sort.values_stable": 1},
                 error={"stage": "compile", "type": "BackendCompilerFailed", "message": "boom | <b>"})]
    md = report.markdown(rows)
    assert "## Coverage" in md and "| gpt2 |" in md and "print() call" in md and "aten::sort.values_stable" in md
    assert "boom \\| <b>" in md
    page = report.html_page(rows)
    p = _Collect()
    p.feed(page)
    p.close()
    assert p.tables >= 2 and "<b>" not in page                      # escaped
    pngs = [i for i in p.imgs if i.get("src", "").startswith("data:image/png;base64,")]
    assert len(pngs) == 4                                            # wall, device time, compile, heat map
    import base64
    assert all(base64.b64decode(i["src"].split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n" for i in pngs)
    assert "http" not in page.replace("http-equiv", "")              # self-contained


def test_ray_without_ray_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)            # as if ray were not installed
    assert cli_main(["compare", "--model", f"{TOY}:simple", "--backends", "eager-cpu",
                     "--ray", "auto", "--out", str(tmp_path)]) == 2


# -- subprocesses ----------------------------------------------------------------------------------

def test_graph_break_and_host_fallback_are_reported(tmp_path):
    opts = _opts(tmp_path, jobs=2)
    rows = compare.run([f"{TOY}:graph_break", f"{TOY}:host_fallback"], [SPYRE], opts, progress=False)
    by = {r["model"].split(":")[1]: r for r in rows}
    for r in rows:
        assert schema.validate(r) == [], r
        assert r["status"] == "ok", r["error"]
        assert r["versions"]["torch"] and r["versions"]["backend"].startswith("inductor")
        assert r["wall_ms"] > 0 and r["device_est_us"] > 0 and r["accuracy"]["ok"]
        assert r["host_peak_rss_bytes"] > 0 and r["peak_device_mem_bytes"] > 0
        assert set(r["seconds"]) >= {"startup", "load", "compile", "run", "accuracy"}
        assert r["seconds"]["compile"] > 0 and sum(r["seconds"].values()) <= r["duration_s"] + 0.01
    gb = by["graph_break"]
    assert gb["graph_breaks"] >= 1 and gb["graphs"] >= 2
    assert any("print" in reason.lower() for reason, _ in gb["graph_break_reasons"])
    fb = by["host_fallback"]
    assert any("median" in op for op in fb["host_fallbacks"]), fb["host_fallbacks"]
    assert by["graph_break"]["host_fallbacks"] == {}
    out = Path(opts.out_dir)
    assert {p.name for p in out.iterdir()} >= {"results.jsonl", "results.json", "report.md", "report.html"}
    md = (out / "report.md").read_text()
    assert "## Graph breaks" in md and "## Host fallbacks" in md and "median" in md


def test_crash_and_timeout_become_rows_and_resume(tmp_path):
    opts = _opts(tmp_path, timeout=20, jobs=2)
    models = [f"{TOY}:crash", f"{TOY}:hang"]
    rows = compare.run(models, [CPU], opts, progress=False)
    by = {r["model"].split(":")[1]: r for r in rows}
    assert by["crash"]["status"] == "crash" and by["crash"]["stages"]["load"] == "crash"
    assert "signal" in by["crash"]["error"]["message"]
    hang = by["hang"]
    assert hang["status"] == "timeout" and "timed out after 20 s" in hang["error"]["message"]
    stage = hang["error"]["stage"]
    assert hang["stages"][stage] == "timeout" and hang["stages"]["accuracy"] == "skipped"
    if hang["stages"]["load"] == "ok":          # normally; a heavily loaded machine may not get that far
        assert stage == "run"
    assert all(schema.validate(r) == [] for r in rows)

    # resume: a second run with one more model only runs the new one
    seen = []
    opts.jobs = 1
    opts.preload = False                 # and the plain new-interpreter worker path
    rows2 = compare.run(models + [f"{TOY}:simple"], [CPU], opts, on_row=seen.append, progress=False)
    assert [r["model"] for r in seen] == [f"{TOY}:simple"]
    assert len(rows2) == 3 and len(schema.read_rows(Path(opts.out_dir) / "results.jsonl")) == 3
    assert seen[0]["status"] == "ok" and seen[0]["stages"]["compile"] == "skipped"


def test_ray_backend_runs_rows(tmp_path):
    """The --ray path on a local Ray instance that the test starts (ray is a test extra)."""
    pytest.importorskip("ray", reason="ray is not installed (pip install vspyre[ray])")
    opts = _opts(tmp_path, ray="local")
    rows = compare.run([f"{TOY}:simple", f"{TOY}:crash"], [CPU], opts, progress=False)
    by = {r["model"].split(":")[1]: r for r in rows}
    assert by["simple"]["status"] == "ok" and by["simple"]["wall_ms"] > 0
    assert by["crash"]["status"] == "crash"                   # a crash on a Ray worker is a row too
    assert all(schema.validate(r) == [] for r in rows)


def test_compare_exits_nonzero_when_a_row_is_not_ok(tmp_path, capsys):
    """A CI job must notice a failed row: exit 1 unless --allow-failures."""
    base = ["compare", "--model", f"{TOY}:crash", "--backends", "eager-cpu", "--jobs", "1",
            "--no-warm", "--no-recompiles", "--repeat", "1", "--out", str(tmp_path / "o")]
    assert cli_main(base) == 1
    assert "crash" in capsys.readouterr().err
    assert cli_main(base + ["--allow-failures"]) == 0         # resumed: the crash row is taken as done
