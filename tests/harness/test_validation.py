"""Estimates against the card's published times: the cases file, the fit, the presets, the errors."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from vspyre import hardware
from vspyre.harness import validation as V

HW_DOC = Path(__file__).resolve().parents[3] / "shared" / "spyre-hardware.md"
# rows of the measured table that are a time but a preset's parameter, not a kernel or end-to-end case
PARAMETER_ROWS = {"per-call overhead, synchronising after each call"}


def _measured_table_rows(text: str) -> list[tuple[str, str]]:
    part = text.split("## Measured on the real card", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in part.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 3 and cells[0] not in ("what", "---"):
            rows.append((cells[0], cells[1]))
    return rows


def test_cases_file_parses():
    cases = V.load_cases()
    assert len(cases) >= 14
    assert {c.kind for c in cases} == set(V.KINDS)
    fitted = [c for c in cases if c.fit]
    assert fitted and all(c.is_kernel for c in fitted)
    for c in cases:
        assert c.card_us > 0 and c.source and c.dtype == "float16"
        assert c.fit or c.note, f"{c.id}: a case left out of the fit says why"
    assert {c.compiler for c in cases if c.stack == "sendnn"} == {"standalone"}


@pytest.mark.skipif(not HW_DOC.exists(), reason="the shared hardware doc is not beside the checkout")
def test_every_timed_row_of_the_hardware_docs_measured_table_is_a_case():
    rows = _measured_table_rows(HW_DOC.read_text())
    assert len(rows) > 15
    timed = [w for w, v in rows if re.search(r"\d\s*(ms|us)\b", v) and w not in PARAMETER_ROWS]
    assert len(timed) >= 9
    covered = {c.table_row for c in V.load_cases()}
    missing = [w for w in timed if w not in covered]
    assert not missing, f"rows of the measured table with a time but no case: {missing}"
    # and every case names a row that is there
    assert covered <= {w for w, _ in rows}


def test_load_cases_rejects_bad_files(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[[case]]\nid = "a"\nkind = "matmul"\nwhat = "x"\ndtype = "float16"\nstack = "torch-spyre"\n'
                 'card_us = 1.0\nsource = "s"\ntable_row = "r"\nm = 1\nk = 2\n')
    with pytest.raises(ValueError, match="missing"):
        V.load_cases(p)
    p.write_text(p.read_text() + 'n = 3\nbogus = 1\n')
    with pytest.raises(ValueError, match="unknown field"):
        V.load_cases(p)


# -- the fit ------------------------------------------------------------------------------------

def _synthetic(m: int, k: int, n: int, card_us: float = 1.0) -> V.Case:
    return V.Case(id=f"{m}x{k}x{n}", kind="matmul", what="synthetic", dtype="float16", stack="torch-spyre",
                  card_us=card_us, source="test", table_row="-", fit=True, shape={"m": m, "k": k, "n": n})


def _roofline_model(case: V.Case, p) -> float:
    """A toy card: max(compute at 2048 FLOP/cycle x clock, bytes at the bandwidth) + a launch cost."""
    s = case.shape
    flops = 2 * s["m"] * s["k"] * s["n"] * 32
    nbytes = 2 * (s["m"] * s["k"] + s["k"] * s["n"] + s["m"] * s["n"])
    return max(flops / (2048 * 32 * p["clock_hz"]), nbytes / p["device_memory_bandwidth"]) * 1e6 + p["kernel_launch_us"]


BOUNDS = {"clock_hz": (0.5e9, 1.5e9), "device_memory_bandwidth": (80e9, 204.8e9), "kernel_launch_us": (0.0, 100.0)}


def test_fit_recovers_known_parameters_on_synthetic_cases():
    truth = {"clock_hz": 0.9e9, "device_memory_bandwidth": 130e9, "kernel_launch_us": 30.0}
    shapes = [(4, 4096, 4096), (32, 4096, 12800), (512, 4096, 4096), (2048, 4096, 4096), (1024, 8192, 8192),
              (16, 1024, 1024), (8, 2048, 2048)]
    cases = [dataclasses.replace(c, card_us=_roofline_model(c, truth)) for c in (_synthetic(*s) for s in shapes)]
    start = {"clock_hz": 1.4e9, "device_memory_bandwidth": 190e9, "kernel_launch_us": 0.0}
    res = V.fit(cases, _roofline_model, start, BOUNDS)
    for k, v in truth.items():
        assert res.params[k] == pytest.approx(v, rel=0.03, abs=1.0), (k, res.params)
    assert res.mean_abs < 0.01 and res.loo_mean_abs < 0.02
    assert set(res.loo) == {c.id for c in cases}


def test_fit_reports_leave_one_out_error_of_an_outlier():
    truth = {"clock_hz": 1.0e9, "device_memory_bandwidth": 150e9, "kernel_launch_us": 10.0}
    shapes = [(4, 4096, 4096), (32, 4096, 12800), (512, 4096, 4096), (2048, 4096, 4096), (8, 2048, 2048)]
    cases = [dataclasses.replace(c, card_us=_roofline_model(c, truth)) for c in (_synthetic(*s) for s in shapes)]
    cases[2] = dataclasses.replace(cases[2], card_us=cases[2].card_us * 2)       # a case no parameter explains
    res = V.fit(cases, _roofline_model, truth, BOUNDS)
    assert abs(res.loo[cases[2].id]) > abs(res.errors[cases[2].id]) > 0.2
    assert res.loo_mean_abs > res.mean_abs


# -- the presets --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["card-limit", "measured", "torch-spyre-2026"])
def test_presets_exist_and_every_number_they_set_has_a_source(name):
    cfg = hardware.PRESETS[name]
    assert cfg.name == name
    default = hardware.HardwareConfig()
    srcs = hardware.PRESET_SOURCES[name]
    for f in dataclasses.fields(cfg):
        if f.name != "name" and getattr(cfg, f.name) != getattr(default, f.name):
            assert srcs.get(f.name), f"{name}: {f.name} = {getattr(cfg, f.name)} has no source"
        assert f.metadata.get("source"), f"{f.name}: the field's own source"


def test_preset_order_and_host_overhead():
    lim, meas, ts = (hardware.PRESETS[n] for n in ("card-limit", "measured", "torch-spyre-2026"))
    assert lim.peak_fp16_flops >= meas.peak_fp16_flops and lim.device_memory_bandwidth >= meas.device_memory_bandwidth
    assert lim.kernel_launch_us == 0 and lim.host_overhead_us == 0 and meas.host_overhead_us == 0
    assert 2900 <= ts.host_overhead_us <= 3100
    assert dataclasses.replace(ts, name="measured", host_overhead_us=0.0) == meas


# -- errors on a small case -----------------------------------------------------------------------

def test_errors_on_a_small_case():
    case = dataclasses.replace(_synthetic(64, 128, 256, card_us=10.0), id="small")
    runner = V.KernelRunner()
    cfg = hardware.PRESETS["measured"]
    got = runner.estimate(case, "inductor", cfg)
    assert got.est_us > 0 and got.launches == 1 and got.roofline_us <= got.est_us
    # the same config again: the same figure (re-planned from the cache, not recompiled)
    assert runner.estimate(case, "inductor", cfg).est_us == got.est_us
    # the fixed cost per kernel adds once
    more = runner.estimate(case, "inductor", dataclasses.replace(cfg, kernel_launch_us=cfg.kernel_launch_us + 7.0))
    assert more.est_us == pytest.approx(got.est_us + 7.0)
    rows = [V.Row(case, "measured", "inductor", got.est_us),
            V.Row(dataclasses.replace(case, id="other", card_us=got.est_us * 2), "measured", "inductor", got.est_us)]
    assert rows[0].err == pytest.approx(got.est_us / 10.0 - 1)
    assert rows[1].err == pytest.approx(-0.5)
    (s_ind, s_match) = V.summarize(rows)
    assert s_ind.compiler == "inductor" and s_match.compiler == "matching" and s_ind.n == 2
    assert s_ind.mean_abs == pytest.approx((abs(rows[0].err) + 0.5) / 2)
    assert s_ind.worst == max((rows[0].err, -0.5), key=abs)
    assert V.error(120.0, 100.0) == pytest.approx(0.2) and V.error(80.0, 100.0) == pytest.approx(-0.2)


# -- end to end: device time and the host's overhead per call ------------------------------------

def test_estimate_reports_device_time_and_time_with_host_overhead(tmp_path):
    import json

    from vspyre.harness import estimate as E
    from tests.harness.test_estimate import TINY

    p = tmp_path / "tiny.json"
    p.write_text(json.dumps(TINY))
    rep = E.estimate(E.Options(config=str(p), prompt=16, new_tokens=2, kv=(16,), hw="torch-spyre-2026"), progress=False)
    assert rep["host_overhead_us"] == hardware.PRESETS["torch-spyre-2026"].host_overhead_us
    b = rep["backends"]["inductor"]
    for ph in [b["prefill"], *b["decode"]]:
        assert ph["launches"] > 0
        assert ph["host_overhead_us"] == pytest.approx(ph["launches"] * 3000.0)
        assert ph["with_host_us"] == pytest.approx(ph["est_us"] + ph["host_overhead_us"])
    md = E.markdown(rep)
    assert "device time" in md and "with the host's overhead per call (3.00 ms x launches)" in md


def test_markdown_names_presets_errors_and_the_fit():
    a = dataclasses.replace(_synthetic(4, 4096, 4096, card_us=100.0), id="a")
    b = dataclasses.replace(_synthetic(8, 4096, 4096, card_us=200.0), id="b", stack="sendnn", fit=False, note="old")
    rows = [V.Row(a, "measured", "inductor", 110.0), V.Row(b, "measured", "inductor", 150.0),
            V.Row(a, "measured", "standalone", 110.0), V.Row(b, "measured", "standalone", 160.0)]
    fr = V.FitResult({"device_memory_bandwidth": 146e9, "kernel_launch_us": 40.0}, {"a": 0.1}, {"a": 0.2}, 0.01, 12)
    md = V.markdown([a, b], rows, ["measured"], ["inductor", "standalone"], fr,
                    {"device_memory_bandwidth": 150e9, "kernel_launch_us": 0.0}, {"a": -0.3})
    assert "| `a` | 100.0 us | **110.0 us (+10%)** | 110.0 us (+10%) |" in md
    assert "| `b` | 200.0 us | 150.0 us (-25%) | **160.0 us (-20%)** |" in md
    assert "| `measured` | matching | 2 | 15.0% | -20% (`b`) |" in md        # b on standalone, the old compiler's match
    assert "| `device_memory_bandwidth` | 150.0 GB/s | 146.0 GB/s |" in md and "leave-one-out 20.0%" in md
    assert "## What vspyre does not model" in md and "- `b`: old" in md


def test_end_to_end_decomposition():
    c = V.Case(id="e", kind="e2e", what="x", dtype="float16", stack="torch-spyre", card_us=900_000.0, source="s",
               table_row="r", fit=False, shape={"model": "m", "batch": 1, "prompt": 128, "phase": "prefill"})
    r = V.Row(c, "torch-spyre-2026", "inductor", 100_000.0 + 100 * 3000.0, launches=100, kernel_us=100_000.0)
    md = "\n".join(V._e2e_section([r]))
    # device 100 ms + 100 x 3 ms = 400 ms; the card's 900 ms leaves 800 ms: 8 ms per launch, room for 267 calls
    assert "| 900.0 ms | 100.0 ms | 100 | 300.0 ms | 400.0 ms (-56%) | 500.0 ms | 8000.0 us | 267 |" in md
