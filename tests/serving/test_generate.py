"""vLLM's engine on the virtual card: greedy generation equals transformers on the CPU, token for
token, with chunked prefill, mixed prefill/decode batches and prefix caching, on both compilers."""

import gc
import os
from contextlib import contextmanager
from unittest import mock

import pytest
import torch

N_NEW = 10
LENS = [5, 17, 70, 150, 3, 200, 33, 64]     # > the 64-token chunk for some: chunked prefill


def _prompts(seed=0, vocab=500):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in LENS]


@contextmanager
def _llm(path, backend, **kw):
    from vllm import LLM

    from vspyre import compat

    compat.get("dynamo_reset")()    # each engine compiles its step graph (no graph reused from the last test)
    args = dict(dtype="float32", kv_cache_memory_bytes=64 << 20, max_model_len=512, max_num_batched_tokens=64,
                max_num_seqs=8, enable_prefix_caching=False, seed=0)
    args.update(kw)
    llm = None
    with mock.patch.dict(os.environ, VSPYRE_VLLM_BACKEND=backend):
        try:
            llm = LLM(str(path), **args)
            yield llm
        finally:
            if llm is not None:
                llm.llm_engine.engine_core.shutdown()      # frees the card's KV cache and weights
            del llm
            gc.collect()


_refs: dict = {}


def _reference(path, prompts, n=N_NEW):
    """transformers' own greedy generate on the CPU in fp32 (the checkpoint's weights)."""
    from transformers import AutoModelForCausalLM

    key = (str(path), tuple(map(tuple, prompts)), n)
    if key not in _refs:
        m = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        out = []
        for p in prompts:
            ids = m.generate(torch.tensor([p]), do_sample=False, max_new_tokens=n, min_new_tokens=n,
                             eos_token_id=None, pad_token_id=0)
            out.append(ids[0, len(p):].tolist())
        _refs[key] = out
    return _refs[key]


def _greedy(llm, prompts, n=N_NEW):
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate([{"prompt_token_ids": p} for p in prompts], sp,
                                                                use_tqdm=False)]


def _stats(llm):
    return llm.collective_rpc("runner_stats")[0]


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["no-prefix-cache", "prefix-cache"])
@pytest.mark.parametrize("backend", ["inductor", "standalone"])
def test_greedy_equals_transformers(tiny_models, backend, prefix_caching):
    path = tiny_models["llama"]
    prompts = _prompts()
    want = _reference(path, prompts)
    with _llm(path, backend, enable_prefix_caching=prefix_caching) as llm:
        assert _greedy(llm, prompts) == want
        st = _stats(llm)
        kinds = {k for k, *_ in st["per_step"]}
        assert "mixed" in kinds and "decode" in kinds, kinds        # prefill chunks beside decodes
        assert st["prefill_tokens"] == sum(LENS) and st["decode_tokens"] == len(LENS) * (N_NEW - 1)
        assert max(t for _, t, *_ in st["per_step"]) <= 64                # the chunk budget held
        assert st["host_fallbacks"] == 0, st["fallback_ops"]
        assert st["backend"] == backend and st["graphs"] >= 1 and st["compile_s"] > 0
        assert st["device_est_us"] > 0
        assert 2 <= st["step_shapes"] < len(st["per_step"])          # steps share bucketed shapes
        if prefix_caching:
            # the same prompts again (one longer, diverging after its shared prefix): served from the
            # prefix cache, still the same tokens
            again = [p[:] for p in prompts]
            again[5] = again[5][:150] + [7, 8, 9]
            assert _greedy(llm, again) == _reference(path, again)
            assert _stats(llm)["prefix_hit_tokens"] >= 64 * sum(len(p) // 64 for p in again) - 64
        graphs = _stats(llm)["graphs"]
    assert graphs <= 2       # the symbolic step graph serves every step (no recompile per shape)


@pytest.mark.parametrize("family", ["granite", "mistral", "qwen2", "qwen3"])
def test_families(tiny_models, family):
    path = tiny_models[family]
    prompts = _prompts(seed=1)[:5]
    with _llm(path, "inductor") as llm:
        assert _greedy(llm, prompts) == _reference(path, prompts)
        assert _stats(llm)["host_fallbacks"] == 0


def test_families_standalone(tiny_models):
    path = tiny_models["mistral"]        # its sliding window (48) is shorter than the longer prompts
    prompts = _prompts(seed=2)[:6]
    with _llm(path, "standalone") as llm:
        assert _greedy(llm, prompts) == _reference(path, prompts)
        assert _stats(llm)["host_fallbacks"] == 0


def test_kv_cache_sized_from_the_card(tiny_models):
    """No explicit cache size: vLLM sizes it from the card's free memory (capped by what the host
    can back); the cache is device memory, in torch.spyre's statistics."""
    from vspyre.vllm_plugin import worker as W

    path = tiny_models["llama"]
    with _llm(path, "eager", kv_cache_memory_bytes=None, gpu_memory_utilization=0.5) as llm:
        runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
        cache = runner.num_blocks * runner.cache_block_bytes()
        assert cache > 1 << 30                                    # sized from memory, not a fixed small number
        assert torch.spyre.memory_allocated() >= cache
        import psutil
        assert cache <= psutil.virtual_memory().total * W.HOST_SHARE
        assert _greedy(llm, _prompts()[:2], n=3)


def test_sampling_with_a_seed_repeats(tiny_models):
    from vllm import SamplingParams

    path = tiny_models["llama"]
    sp = SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=1234, max_tokens=8, ignore_eos=True)
    with _llm(path, "eager") as llm:
        a = [list(o.outputs[0].token_ids) for o in llm.generate([{"prompt_token_ids": [5, 6, 7]}] * 2, sp,
                                                                 use_tqdm=False)]
        b = [list(o.outputs[0].token_ids) for o in llm.generate([{"prompt_token_ids": [5, 6, 7]}], sp,
                                                                 use_tqdm=False)]
    assert a[0] == a[1] == b[0] and len(a[0]) == 8


def test_preemption_keeps_tokens(tiny_models):
    """A KV cache too small for every request at once: as decodes grow into new blocks, vLLM's
    scheduler preempts requests and later resumes them (recomputed into new blocks); the tokens
    stay transformers'."""
    path = tiny_models["llama"]
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (60, 50, 40, 62, 30, 55, 45, 58)]
    want = _reference(path, prompts, n=100)
    block_bytes = 2 * 2 * 64 * 2 * 32 * 4            # k and v x layers x tokens x kv heads x head dim x fp32
    with _llm(path, "standalone", kv_cache_memory_bytes=12 * block_bytes) as llm:
        assert _greedy(llm, prompts, n=100) == want
        st = _stats(llm)
        assert st["host_fallbacks"] == 0
        # more prefill tokens than the prompts hold: preempted requests were computed again
        assert st["prefill_tokens"] > sum(map(len, prompts)), st["prefill_tokens"]


def test_fp16_as_served(tiny_models):
    """The checkpoint's own dtype, as `vllm serve` runs it: fp16 on the card (DLFloat16 rounding)
    still gives transformers' fp32 tokens on this model (logits well apart at its weight scale)."""
    path = tiny_models["llama"]
    prompts = _prompts()
    with _llm(path, "inductor", dtype="float16") as llm:
        assert _greedy(llm, prompts) == _reference(path, prompts)


@pytest.mark.parametrize("backend,batching", [("inductor", "continuous"), ("standalone", "static")])
def test_estimate_only_steps_equal_functional(tiny_models, backend, batching):
    """The engine in estimate-only mode (the card plans and costs every step without running it,
    weights from the config alone) makes the same scheduling decisions as a functional run of the
    same load, step by step, at the same estimated device time per step: the ground a virtual-clock
    serving estimate stands on. Each stack as it served: Inductor with continuous batching, the
    standalone compiler with static batching."""
    path = tiny_models["llama"]
    prompts = _prompts()
    env = {"VSPYRE_VLLM_BATCHING": batching, "VSPYRE_VLLM_WARMUP_SHAPES": "256x16x4"}

    def steps(st):
        return [(kind, tokens, seqs, round(est, 6), fb) for kind, tokens, seqs, _, est, fb, _ in st["per_step"]]

    with mock.patch.dict(os.environ, env), _llm(path, backend) as llm:
        _greedy(llm, prompts)
        functional = _stats(llm)
    with mock.patch.dict(os.environ, env), torch.spyre.estimate_only():
        with _llm(path, backend) as llm:
            out = _greedy(llm, prompts)
            estimated = _stats(llm)
    assert [len(o) for o in out] == [N_NEW] * len(prompts)
    assert steps(estimated) == steps(functional) and len(steps(functional)) > 5
    assert estimated["host_fallbacks"] == 0


@pytest.mark.parametrize("backend", ["standalone", "inductor"])
def test_static_batching_equals_transformers(tiny_models, backend):
    """Static batching on warmup shapes (the old stack's way): one prefill and one decode graph per
    shape compiled at start-up and none after; batches of up to the shape's size, nothing joining
    a running batch; prompts padded to the shape; the same greedy tokens as transformers."""
    from vllm import SamplingParams

    path = tiny_models["llama"]
    prompts = _prompts()
    want = _reference(path, prompts)
    env = {"VSPYRE_VLLM_BATCHING": "static", "VSPYRE_VLLM_WARMUP_SHAPES": "64x16x4,256x16x2"}
    with mock.patch.dict(os.environ, env), _llm(path, backend) as llm:
        st0 = _stats(llm)
        assert st0["graphs"] == 4                      # 2 shapes x (prefill, decode), at start-up
        assert _greedy(llm, prompts) == want
        st = _stats(llm)
        assert st["graphs"] == 4 and st["host_fallbacks"] == 0
        kinds = [k for k, *_ in st["per_step"]]
        assert "mixed" not in kinds
        # per batch: one prefill step, then N_NEW - 1 decode steps with the same sequences
        prefills = [i for i, k in enumerate(kinds) if k == "prefill"]
        for a, b in zip(prefills, prefills[1:] + [len(kinds)]):
            assert b - a == N_NEW and {s[2] for s in st["per_step"][a:b]} == {st["per_step"][a][2]}
        # arrival order 5 17 70 150 3 200 33 64: the oldest picks the shape, whoever fits joins:
        # [5 17 3 33] on 64x16x4, then [70 150] and [200 64] on 256x16x2
        assert [st["per_step"][i][2] for i in prefills] == [4, 2, 2]
        assert st["padded_tokens"] > 0
        with pytest.raises(ValueError, match="no warmup shape holds a 300-token prompt"):
            llm.generate([{"prompt_token_ids": [5] * 300}], SamplingParams(max_tokens=4), use_tqdm=False)
