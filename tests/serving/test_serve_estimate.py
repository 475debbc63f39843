"""`vspyre serve-estimate`: vLLM's engine drives the card in estimate-only mode on a virtual clock."""

import json
import math

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
