"""Regional compilation: the decoder layer compiled once and reused for every layer, on both compilers."""

from __future__ import annotations

import pytest
import torch

from vspyre import regional
from vspyre.compat import dynamo_counters as counters
from vspyre.compat import dynamo_reset
from vspyre.harness import estimate as E

SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             vocab_size=256)


def _cfg(name: str, layers: int):
    cfg = E.load_config(name, layers=layers)
    for k, v in SMALL.items():
        setattr(cfg, k, v)
    return cfg


def _run(model, cfg, backend: str, mode: str):
    """Prefill logits, then one decode step's logits (dynamic=True), and the Dynamo graphs of each."""
    compiler = E.BACKENDS[backend]
    dynamo_reset()
    counters.clear()
    ids = E._ids(1, 12, cfg.vocab_size, execute=True)
    pre = regional.compile_model(model, compiler, mode)(input_ids=ids, use_cache=True).logits.float().cpu()
    g_pre = int(counters["stats"]["unique_graphs"])
    dynamo_reset()
    counters.clear()
    tok = E._ids(1, 1, cfg.vocab_size, execute=True)
    torch.manual_seed(1)
    m = regional.compile_model(model, compiler, mode, dynamic=True)
    dec = m(input_ids=tok, cache=E._cache(cfg, 1, 12, torch.float16, execute=True), use_cache=True).logits.float().cpu()
    torch.manual_seed(2)
    dec2 = m(input_ids=tok, cache=E._cache(cfg, 1, 20, torch.float16, execute=True), use_cache=True).logits.float().cpu()
    g_dec = int(counters["stats"]["unique_graphs"])
    if mode == "regional":
        m.undo()
    return pre, dec, dec2, g_pre, g_dec


@pytest.mark.parametrize("backend,name", [pytest.param("inductor", "llama-3-8b", marks=pytest.mark.slow),
                                          ("standalone", "granite-3-8b")])
def test_regional_gives_the_output_of_whole_with_one_layer_graph(backend, name):
    cfg = _cfg(name, layers=2)
    with torch.no_grad():
        model = E._build(cfg, torch.float16, execute=True)
        torch.spyre.reset_fallback_stats()
        whole = _run(model, cfg, backend, "whole")
        whole_fallbacks = torch.spyre.fallback_stats()
        torch.spyre.reset_fallback_stats()
        reg = _run(model, cfg, backend, "regional")
        assert torch.spyre.fallback_stats() == whole_fallbacks       # no new host fallbacks outside the layers
    for w, r in zip(whole[:3], reg[:3]):
        assert r.abs().max() > 0
        torch.testing.assert_close(r, w, rtol=2e-2, atol=2e-2)
    # two layers, one compiled layer graph for prefill and one for decode at both KV lengths
    assert reg[3] == 1 and reg[4] == 1


def test_the_layer_graph_is_compiled_once_for_n_layers():
    cfg = _cfg("llama-3-8b", layers=5)
    with torch.spyre.estimate_only(), torch.no_grad():
        model = E._build(cfg, torch.float16, execute=False)
        dynamo_reset()
        counters.clear()
        h = regional.compile_model(model, "inductor", "regional", dynamic=True)
        h(input_ids=E._ids(1, 1, cfg.vocab_size, False), cache=E._cache(cfg, 1, 16, torch.float16, False),
          use_cache=True)
        assert h.compiled_blocks == 5 and len(h.blocks) == 5
        assert int(counters["stats"]["unique_graphs"]) == 1
        assert sum(counters["recompiles"].values()) == 0 if "recompiles" in counters else True
        h.undo()
        dynamo_reset()


def test_a_model_without_repeated_blocks_is_refused_by_name():
    with pytest.raises(regional.RegionalError, match="Linear: no repeated block.*--compile whole"):
        regional.compile_model(torch.nn.Linear(4, 4), "inductor", "regional")
    with pytest.raises(ValueError, match="compile mode 'partial'"):
        regional.compile_model(torch.nn.Linear(4, 4), "inductor", "partial")


def test_estimate_reports_the_compile_mode(tmp_path):
    """The default (regional) is what tests/harness/test_estimate.py runs; whole stays measurable."""
    import json
    p = tmp_path / "tiny.json"
    p.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 1, "max_position_embeddings": 256,
                             "num_key_value_heads": 2, "num_attention_heads": 4, "hidden_size": 128,
                             "intermediate_size": 256, "vocab_size": 512}))
    assert E.Options().compile == "regional"
    r = E.estimate(E.Options(config=str(p), prompt=8, new_tokens=1, kv=(8,), compile="whole",
                             backends=("standalone",)), progress=False)
    b = r["backends"]["standalone"]
    assert r["compile"] == b["compile"] == "whole" and "compiled whole (`--compile whole`" in E.markdown(r)
    assert b["graph_cache"]["misses"] >= 1 and "standalone graph cache: hits / misses" in E.markdown(r)
    assert sum(b["prefill"]["fallbacks"].values()) == 0
    with pytest.raises(E.EstimateError, match="unknown compile mode 'x'"):
        E.estimate(E.Options(config=str(p), compile="x"), progress=False)
