"""The planner's cross-process cache (vspyre.ir.plan_cache): a stored plan rebuilds exactly the
schedule the search chose, in another process too, and a changed card does not see it."""

import os
import subprocess
import sys
import textwrap

import pytest

from vspyre import hardware
from vspyre.ir import plan_cache, planning

from tests.runtime import programs as P


def _same(a, b):
    return (a.program.meta.get("swapped"), a.splits, a.tiles, a.double_buffer, a.relayout, a.order) == \
        (b.program.meta.get("swapped"), b.splits, b.tiles, b.double_buffer, b.relayout, b.order)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("VSPYRE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("VSPYRE_PLAN_CACHE", "1")
    yield tmp_path
    plan_cache.clear()


@pytest.mark.parametrize("make,sizes", [
    (lambda: P.matmul_bias_relu()[0], {"M": 512, "N": 768, "K": 1024}),
    (lambda: P.row_sum()[0], {"n": 64, "m": 8192}),
    (lambda: P.elementwise()[0], {"s0": 4096}),
])
def test_a_stored_plan_is_the_searched_schedule(cache_dir, make, sizes):
    st = planning.plan_stats
    h0, s0 = st["cache_hits"], st["cache_stores"]
    searched = planning.resolve(make(), sizes)
    assert st["cache_stores"] == s0 + 1 and st["cache_hits"] == h0
    again = planning.resolve(make(), sizes)          # a new program object: only the cache knows it
    assert st["cache_hits"] == h0 + 1
    assert _same(searched, again)
    from vspyre.ir.latency import estimate_schedule
    assert estimate_schedule(again).cycles == estimate_schedule(searched).cycles


def test_another_card_or_no_cache_searches_again(cache_dir, monkeypatch):
    st = planning.plan_stats
    planning.resolve(P.row_sum()[0], {"n": 64, "m": 8192})
    h0 = st["cache_hits"]
    with hardware.override(num_cores=8):
        planning.resolve(P.row_sum()[0], {"n": 64, "m": 8192})
    assert st["cache_hits"] == h0
    monkeypatch.setenv("VSPYRE_PLAN_CACHE", "0")
    planning.resolve(P.row_sum()[0], {"n": 64, "m": 8192})
    assert st["cache_hits"] == h0


def test_a_second_process_reuses_the_plans(cache_dir):
    code = textwrap.dedent("""
        import json, torch, vspyre
        from vspyre.ir import planning
        from vspyre.harness.models import tiny_gpt2
        case = tiny_gpt2().to("spyre")
        with torch.no_grad():
            case.model(**case.inputs)
        print(json.dumps(planning.plan_stats))
    """)
    env = dict(os.environ, VSPYRE_CACHE_DIR=str(cache_dir))
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    import json
    first, second = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert first["cache_stores"] > 0 and first["cache_hits"] == 0
    assert second["cache_hits"] == first["cache_stores"] and second["cache_stores"] == 0
    assert second["candidates"] == 0                  # no search at all
