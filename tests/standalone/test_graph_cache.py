"""The standalone compiler's persistent compiled-graph cache: hits where the graph is the same,
misses where the graph, its inputs or the hardware preset changed, same results either way."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from vspyre import hardware
from vspyre.compat import dynamo_reset
from vspyre.standalone import cache


@pytest.fixture
def graph_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VSPYRE_GRAPH_CACHE_DIR", str(tmp_path / "graphs"))
    monkeypatch.delenv("VSPYRE_STANDALONE_CACHE", raising=False)
    dynamo_reset()
    cache.reset_stats()
    yield tmp_path / "graphs"
    dynamo_reset()


def _fn(x, w):
    return torch.nn.functional.silu(x @ w) * x.sum(-1, keepdim=True)


def _inputs(n=8):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(n, 16, generator=g, dtype=torch.float16).to("spyre"),
            torch.randn(16, 16, generator=g, dtype=torch.float16).to("spyre"))


def _compile_and_run(*args, dynamic=None):
    dynamo_reset()
    with torch.no_grad():
        return torch.compile(_fn, backend="spyre_standalone", dynamic=dynamic)(*args).cpu()


def test_a_hit_after_reset_gives_the_same_result(graph_cache):
    x, w = _inputs()
    first = _compile_and_run(x, w)
    assert cache.stats["misses"] == 1 and cache.stats["stores"] == 1 and cache.stats["hits"] == 0
    assert len(list(graph_cache.rglob("*.pkl"))) == 1
    again = _compile_and_run(x, w)
    assert cache.stats["hits"] == 1 and cache.stats["misses"] == 1
    assert torch.equal(first, again)
    with torch.no_grad():
        torch.testing.assert_close(first, _fn(x.cpu().float(), w.cpu().float()).half(), rtol=2e-2, atol=2e-2)


def test_a_changed_graph_input_or_preset_misses(graph_cache):
    x, w = _inputs()
    _compile_and_run(x, w)
    _compile_and_run(*_inputs(12))                    # other input shapes
    assert cache.stats["hits"] == 0 and cache.stats["misses"] == 2
    dynamo_reset()
    with torch.no_grad():                            # another graph on the same inputs
        torch.compile(lambda a, b: _fn(a, b) + 1, backend="spyre_standalone")(x, w)
    assert cache.stats["hits"] == 0 and cache.stats["misses"] == 3
    cfg = hardware.get_config()
    prev = hardware.set_config(dataclasses.replace(cfg, name="other-card",
                                                   device_memory_bandwidth=cfg.device_memory_bandwidth / 2))
    try:
        _compile_and_run(x, w)                        # the first graph on another card
    finally:
        hardware.set_config(prev)
    assert cache.stats["hits"] == 0 and cache.stats["misses"] == 4
    _compile_and_run(x, w)                            # back on the first card: its entry
    assert cache.stats["hits"] == 1


def test_symbolic_shapes_hit_with_their_guards(graph_cache):
    x, w = _inputs()
    a = _compile_and_run(x, w, dynamic=True)
    b = _compile_and_run(x, w, dynamic=True)
    assert cache.stats["hits"] == 1 and torch.equal(a, b)
    with torch.no_grad():                            # the hit graph is symbolic: another size runs it
        f = torch.compile(_fn, backend="spyre_standalone", dynamic=True)
        f(x, w)
        y = f(*_inputs(5)).cpu()
    assert y.shape == (5, 16)


@pytest.mark.slow          # a new interpreter importing torch and vspyre: ~10 s alone, ~25 s on a shared machine
def test_a_second_process_hits(graph_cache):
    x, w = _inputs()
    _compile_and_run(x, w)
    code = ("import torch\nfrom vspyre.standalone import cache\nimport tests.standalone.test_graph_cache as T\n"
            "T._compile_and_run(*T._inputs())\nprint('STATS', cache.stats['hits'], cache.stats['misses'])\n")
    env = dict(os.environ, VSPYRE_GRAPH_CACHE_DIR=str(graph_cache))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=root)
    assert "STATS 1 0" in p.stdout, p.stderr[-2000:]


def test_training_graphs_are_not_stored(graph_cache):
    x, w = _inputs()
    w.requires_grad_(True)
    dynamo_reset()
    torch.compile(_fn, backend="spyre_standalone")(x, w)
    assert cache.stats["stores"] == 0 and cache.stats["bypass"] == 1
    assert "grad enabled" in next(iter(cache.bypass_reasons))
