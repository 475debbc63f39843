"""`vspyre serve-estimate`: vLLM's engine drives the card in estimate-only mode on a virtual clock."""

import json
import math
import re

import pytest


def test_virtual_clock_run(tiny_models, tmp_path):
    from vspyre.vllm_plugin import serve_estimate as SE

    path = SE.model_dir(config=str(tiny_models["llama"]) + "/config.json")
    load = SE.Load(qps=math.inf, requests=12, prompt=(16, 200), output=(4, 12), seed=0)
    m = SE.run(path, "inductor", load, SE.Engine(max_num_seqs=8, max_num_batched_tokens=128, max_model_len=512))
    assert m["completed"] == m["requests"] == 12
    assert m["host_fallbacks"] == 0 and m["startup_graphs"] >= 1
    # all requests arrive at 0: the run lasts exactly the card's estimated time of its steps
    total_us = sum(k["est_us"] for k in m["step_kinds"].values())
    assert m["duration_s"] == pytest.approx(total_us / 1e6, rel=1e-9)
    assert m["output_throughput"] == pytest.approx(sum(o for _, _, o in load.arrivals()) / m["duration_s"])
    assert 0 < m["p50_ttft_ms"] <= m["p90_ttft_ms"] <= m["p99_ttft_ms"] and m["p50_itl_ms"] > 0
    assert m["cost_cache_hits"] > 0 and m["shapes_costed"] < m["steps"]      # each step shape costed once
    # a slow arrival rate leaves the card idle between requests: latency falls, throughput follows the rate
    slow_load = SE.Load(qps=5.0, requests=6, prompt=(32, 32), output=(4, 4), seed=1)
    fast_load = SE.Load(qps=math.inf, requests=6, prompt=(32, 32), output=(4, 4), seed=1)
    slow, fast = SE.run_loads(path, "inductor", [slow_load, fast_load],
                              SE.Engine(max_num_seqs=8, max_num_batched_tokens=128, max_model_len=512))
    assert slow["completed"] == fast["completed"] == 6 and slow["p50_ttft_ms"] < fast["p50_ttft_ms"]
    assert slow["duration_s"] > slow_load.arrivals()[-1][0] > 0         # the clock follows the arrivals
    # one engine for both rates: compiled once, the second load's shapes already costed
    assert slow["graphs_total"] == fast["graphs_total"] == slow["startup_graphs"]
    assert fast["shapes_costed"] < fast["steps"]


def test_cli_writes_json_and_markdown(tiny_models, tmp_path):
    from vspyre.cli import main

    rc = main(["serve-estimate", "--config", str(tiny_models["llama"]) + "/config.json", "--requests", "4",
               "--prompt", "40", "--output", "3", "--max-num-batched-tokens", "64", "--max-model-len", "256",
               "--out", str(tmp_path), "--no-progress", "--backend", "standalone", "--hw", "measured"])
    assert rc == 0
    rep = json.loads((tmp_path / "serve-estimate-config.json").read_text())
    assert rep["runs"][0]["backend"] == "standalone" and rep["runs"][0]["hw"] == "measured"
    assert "no host overhead" in rep["assumes"]
    assert "hardware preset `measured`" in (tmp_path / "serve-estimate-config.md").read_text()


def test_static_batching_as_the_old_stack_served(tiny_models):
    """Static batching on the virtual clock: the warmup shape's two graphs compiled at start-up and
    none after, batches of at most the shape's size with nothing joining a running one (so the
    decode steps hold at most 4 sequences), prompts padded to the shape (padding counted); and
    against continuous batching at the same load, the latency cost of waiting for a batch to drain."""
    from vspyre.vllm_plugin import serve_estimate as SE

    path = SE.model_dir(config=str(tiny_models["llama"]) + "/config.json")
    load = SE.Load(qps=math.inf, requests=10, prompt=(16, 100), output=(3, 8), seed=2)
    eng = SE.Engine(max_num_seqs=8, max_num_batched_tokens=128, max_model_len=512)
    shapes = SE.default_warmup_shapes(load)
    assert shapes == f"{-(-max(p for _, p, _ in load.arrivals()) // 64) * 64}x{max(o for *_, o in load.arrivals())}x4"
    st = SE.run(path, "standalone", load, eng, batching="static", warmup_shapes=shapes)
    co = SE.run(path, "standalone", load, eng, batching="continuous")
    assert st["completed"] == co["completed"] == 10 and st["host_fallbacks"] == co["host_fallbacks"] == 0
    assert st["startup_graphs"] == st["graphs_total"] == 2 and st["batching"] == "static"
    assert st["max_num_seqs"] == 4 and st["max_num_batched_tokens"] == 4 * int(shapes.split("x")[0])
    assert set(st["step_kinds"]) == {"prefill", "decode"} and "mixed" in co["step_kinds"]
    assert st["step_kinds"]["prefill"]["steps"] == 3                      # 10 requests in batches of 4, 4, 2
    assert st["padding_fraction"] > co["padding_fraction"] > 0
    assert st["p50_queue_ms"] > co["p50_queue_ms"] and st["p99_ttft_ms"] > co["p99_ttft_ms"]
    for m in (st, co):
        assert 0 < m["kv_cache_usage_mean"] <= m["kv_cache_usage_max"] < 1 and m["preemptions"] == 0
        assert 0 <= m["p50_queue_ms"] <= m["p50_ttft_ms"]


def test_cli_both_strategies_and_plot(tiny_models, tmp_path):
    from vspyre.cli import main

    rc = main(["serve-estimate", "--config", str(tiny_models["llama"]) + "/config.json", "--requests", "5",
               "--prompt", "20:60", "--output", "3", "--qps", "inf,50", "--max-num-batched-tokens", "64",
               "--max-model-len", "256", "--out", str(tmp_path), "--no-progress", "--batching", "both",
               "--warmup-shapes", "64x4x2"])
    assert rc == 0
    rep = json.loads((tmp_path / "serve-estimate-config.json").read_text())
    assert [(r["backend"], r["batching"], r["qps"]) for r in rep["runs"]] == [
        ("inductor", "continuous", math.inf), ("inductor", "continuous", 50.0),
        ("inductor", "static", math.inf), ("inductor", "static", 50.0)]
    assert rep["runs"][2]["warmup_shapes"] == "64x4x2"
    assert (tmp_path / "serve-estimate-config.png").stat().st_size > 10_000
    md = (tmp_path / "serve-estimate-config.md").read_text()
    assert re.search(r"\| inductor \| static 64x4x2 \| float16 0\.\d\d GiB \| 50 \|", md), md
    with pytest.raises(ValueError, match="warmup shape '65x4x2'"):
        main(["serve-estimate", "--config", str(tiny_models["llama"]) + "/config.json", "--warmup-shapes", "65x4x2",
              "--out", str(tmp_path), "--no-progress"])


def test_the_step_graph_does_not_depend_on_the_kv_cache_size(tiny_models, tmp_path, monkeypatch):
    """A server started with another memory budget (so another number of KV-cache blocks) reuses
    the compiled step graph from Inductor's cache: the cache's size is symbolic in the graph."""
    from vspyre import compat
    from vspyre.vllm_plugin import serve_estimate as SE

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    path = SE.model_dir(config=str(tiny_models["llama"]) + "/config.json")
    load = SE.Load(qps=math.inf, requests=3, prompt=(40, 40), output=(3, 3), seed=0)
    runs = []
    for util in (0.5, 0.3):
        m = SE.run(path, "inductor", load, SE.Engine(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256,
                                                     gpu_memory_utilization=util))
        # each run starts with torch._dynamo.reset(), which zeroes the counters: these are this run's
        runs.append((m, compat.get("dynamo_counters")["inductor"]["fxgraph_cache_hit"]))
    (first, _), (second, hits) = runs
    assert first["kv_cache_blocks"] > second["kv_cache_blocks"] > 0
    assert hits >= 1 and second["startup_graphs"] == 1
    assert second["step_kinds"]["decode"]["est_us"] == pytest.approx(first["step_kinds"]["decode"]["est_us"])


def test_quantised_serving_side_by_side(tiny_models, tmp_path):
    """--quant fp8,fp8-static: the unquantised model's runs, then each quantised model's (torchao on
    the card, through vLLM's additional_config; fp8-static calibrated at load): smaller weights, a
    larger KV cache from the same memory, 0 host fallbacks; a scheme the card lacks is refused by
    name."""
    pytest.importorskip("torchao")
    from vspyre.cli import main

    rc = main(["serve-estimate", "--config", str(tiny_models["llama"]) + "/config.json", "--requests", "4",
               "--prompt", "40", "--output", "3", "--max-num-batched-tokens", "64", "--max-model-len", "256",
               "--dtype", "bfloat16", "--quant", "fp8,fp8-static", "--backend", "inductor", "--batching",
               "continuous", "--out", str(tmp_path), "--no-progress", "--no-plot"])
    assert rc == 0
    runs = json.loads((tmp_path / "serve-estimate-config.json").read_text())["runs"]
    assert [(r["quant"], r["backend"]) for r in runs] == [(None, "inductor"), ("fp8", "inductor"),
                                                          ("fp8-static", "inductor")]
    base, fp8, static = runs
    assert fp8["weights_bytes"] < base["weights_bytes"]
    # per-tensor scales: no more than fp8's per-channel ones (the calibration's re-laid copies of the
    # replaced 16-bit weights are not counted)
    assert 0.95 * fp8["weights_bytes"] <= static["weights_bytes"] <= fp8["weights_bytes"]
    assert fp8["kv_cache_tokens"] >= base["kv_cache_tokens"]
    # fp8-static calibrated at load (SDPA for the pass, paged attention after it) and served
    assert all(r["host_fallbacks"] == 0 and r["completed"] == 4 for r in runs)
    md = (tmp_path / "serve-estimate-config.md").read_text()
    assert "| fp8 " in md and "**fp8**: float8_e4m3fn" in md
    with pytest.raises(SystemExit, match="unknown --quant 'int3'"):
        main(["serve-estimate", "--config", str(tiny_models["llama"]) + "/config.json", "--quant", "int3",
              "--out", str(tmp_path), "--no-progress"])
