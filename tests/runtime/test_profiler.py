"""Profiler: table, key averages, Chrome trace (per-core tracks + host fallbacks); text form."""

import json
import time

import torch

from vspyre import runtime, trace
from vspyre.ir import format_program
from vspyre.runtime.profiler import profile

from . import programs as P


def test_profile_records_kernels_and_fallbacks(tmp_path):
    ew, _ = P.elementwise(torch.float16)
    mm, _ = P.matmul_bias_relu(torch.float16)
    x, w, y = torch.randn(128, 256).half(), torch.randn(256).half(), torch.empty(128, 256).half()
    a, b, bias, o = torch.randn(64, 64).half(), torch.randn(64, 128).half(), torch.randn(128).half(), torch.empty(64, 128).half()
    with profile() as prof:
        for _ in range(3):
            runtime.launch(ew, x, w, y)
        runtime.launch(mm, a, b, bias, o)
        t = time.perf_counter_ns()
        trace.publish(trace.FallbackEvent("aten::nonzero", 0, t, t + 2000))
    runtime.launch(ew, x, w, y)                    # after the block: not recorded
    assert not trace.listening()
    rows = {r.name: r for r in prof.key_averages()}
    assert rows["elementwise"].calls == 3 and rows["mm_bias_relu"].calls == 1
    assert abs(sum(r.share for r in rows.values()) - 1) < 1e-9
    assert rows["mm_bias_relu"].flops >= 2 * 64 * 64 * 128
    assert 0 < rows["elementwise"].efficiency <= 1
    text = prof.table()
    for s in ("elementwise", "mm_bias_relu", "bottleneck", "roofline", "[host fallback] aten::nonzero"):
        assert s in text

    path = prof.export_chrome_trace(tmp_path / "t.json")
    data = json.loads(open(path).read())
    ev = data["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "host fallbacks (host time)" in names.values() and "kernels" in names.values()
    assert any(v.startswith("core 00 dma") for v in names.values())
    assert any(v.startswith("core 31 compute") for v in names.values())
    xs = [e for e in ev if e["ph"] == "X"]
    assert {e["cat"] for e in xs} >= {"kernel", "dma_in", "dma_out", "compute", "matmul", "fallback"}
    kernels = sorted((e for e in xs if e["cat"] == "kernel"), key=lambda e: e["ts"])
    assert len(kernels) == 4
    for k1, k2 in zip(kernels, kernels[1:]):       # one card: kernels do not overlap on its clock
        assert k2["ts"] >= k1["ts"] + k1["dur"] - 1e-6
    for e in xs:                                   # segments lie inside their kernel
        if e["cat"] in ("dma_in", "compute"):
            k = max((k for k in kernels if k["ts"] <= e["ts"] + 1e-9), key=lambda k: k["ts"])
            assert e["ts"] + e["dur"] <= k["ts"] + k["dur"] + 1e-6


def test_segments_per_core_and_merge():
    prog, _ = P.elementwise(torch.float32, tile={"x0": 1, "x1": 256})     # many tiles per core
    x, w, y = torch.randn(4096, 256), torch.randn(256), torch.empty(4096, 256)
    with profile() as prof:
        runtime.launch(prog, x, w, y)
    (k,) = prof.kernels
    cores = {s.core for s in k.segments}
    assert len(cores) == 32
    assert any("merged" in s.label for s in k.segments)
    assert max(s.start_us + s.dur_us for s in k.segments) <= k.est_us + 1e-6


def test_torch_profiler_sees_launches():
    prog, _ = P.row_sum()
    x, y = torch.randn(8, 64), torch.empty(8)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as tp:
        runtime.launch(prog, x, y)
    assert any(e.key == "spyre::row_sum" for e in tp.key_averages())


def test_text_form_is_stable_and_complete():
    p1, _ = P.softmax()
    p2, _ = P.softmax()
    t = format_program(p1)
    assert t == format_program(p2)                     # no ids or addresses: diffable
    for s in ("program softmax  source=test", "in   x: f16[n, 128] strides=[128, 1]",
              "dims: x0 in [0, n) parallel; r0 in [0, 128) reduction", "reduce.max(%ld1) over r0",
              "store y[r0 + 128*x0] <- %v6"):
        assert s in t, s
    mm, _ = P.splitk_matmul()
    t = format_program(mm)
    assert "matmul(%ld1, %ld2) over r0" in t and "ring.sum(%mm3) over r0" in t and "divide: r0 over 4 cores" in t


def test_dump_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("VSPYRE_DUMP_DIR", str(tmp_path))
    prog, _ = P.row_sum()
    runtime.launch(prog, torch.randn(4, 32), torch.empty(4))
    (f,) = list(tmp_path.iterdir())
    text = f.read_text()
    assert f.name.startswith("row_sum.") and "schedule: cores=" in text and "estimate:" in text
