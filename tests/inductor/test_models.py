"""The model suite compiled with the default backend on the card, against CPU fp32 eager."""

import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from vspyre.harness.accuracy import compare
from vspyre.harness.models import DEFAULT_SUITE, get_case, greedy_generate, tiny_llama_generate
from vspyre.inductor.wrapper import compiled_fallbacks

TRANSFORMERS = {"gpt2", "llama", "bert", "t5", "vit"}


@pytest.mark.parametrize("name", DEFAULT_SUITE)
def test_suite_model_compiles_and_matches_cpu(name):
    case = get_case(name)
    ref = case.output()
    dev = case.clone().to("spyre")
    torch.spyre.reset_fallback_stats()
    with torch.no_grad():
        out = dev.output_fn(torch.compile(dev.model)(**dev.inputs))
    verdict = compare(out, ref)
    assert verdict.ok, str(verdict)
    if name in TRANSFORMERS:
        assert torch.spyre.fallback_stats() == {}, "transformer models run with zero host fallbacks"
        assert compiled_fallbacks() == {}


def test_fp16_gpt2_by_the_dynamo_runner_rules():
    case = get_case("gpt2")
    ref = case.output()
    m64 = copy.deepcopy(case.model).double()
    with torch.no_grad():
        ref64 = case.output_fn(m64(**case.inputs))
    dev = case.clone().to("spyre")
    dev.model.half()
    with torch.no_grad():
        out = dev.output_fn(torch.compile(dev.model)(**dev.inputs))
    assert out.dtype == torch.float16
    verdict = compare(out, ref, ref64)
    assert verdict.ok and verdict.cosine >= 0.999, str(verdict)


@pytest.mark.slow
def test_greedy_generate_compiled_does_not_recompile_per_token():
    from torch._dynamo.utils import counters

    case = tiny_llama_generate(max_new_tokens=6)
    ids = case.inputs["input_ids"]
    ref = greedy_generate(case.model, ids, 6)
    dev = case.clone().to("spyre")
    counters.clear()
    dev.model.forward = torch.compile(dev.model.forward, dynamic=True)
    got = greedy_generate(dev.model, ids.to("spyre"), 6)
    assert torch.equal(got.cpu(), ref)
    assert counters["stats"]["unique_graphs"] <= 3      # prefill + decode, not one per token


_CACHE_SCRIPT = textwrap.dedent("""
    import time, torch
    from torch._dynamo.utils import counters
    from vspyre.harness.models import get_case
    case = get_case("bert").clone().to("spyre")
    t = time.perf_counter()
    with torch.no_grad():
        torch.compile(case.model)(**case.inputs)
    print("hits", counters["inductor"]["fxgraph_cache_hit"], "misses", counters["inductor"]["fxgraph_cache_miss"])
""")


@pytest.mark.slow
def test_fx_graph_cache_is_warm_in_a_second_process(tmp_path):
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
               TORCHINDUCTOR_FX_GRAPH_CACHE="1", TORCHINDUCTOR_AUTOGRAD_CACHE="1")
    runs = [subprocess.run([sys.executable, "-c", _CACHE_SCRIPT], env=env, capture_output=True, text=True,
                           timeout=600) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    cold, warm = (r.stdout.strip().splitlines()[-1] for r in runs)
    assert "hits 0" in cold and "misses 0" not in cold
    assert "misses 0" in warm and "hits 0" not in warm
