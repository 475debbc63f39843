"""Tensor parallel with DTensor / torch.distributed.tensor.parallel on 2 and 4 ranks: the split model
gives the single-card result eagerly and compiled on both compilers, its collectives are the spyre
backend's (no graph break, no host fallback, no standalone host-fallback node)."""

import pytest
import torch

from vspyre.distributed import SpyreDistributedError, launch, tp

from . import ranks

MODES = ("eager", "inductor", "spyre_standalone")


def _single_card(family):
    model = ranks.tp_model(family).to("spyre:0")
    with torch.no_grad():
        return model(input_ids=ranks.tp_input().to("spyre:0")).logits.cpu()


@pytest.mark.slow
@pytest.mark.parametrize("family,world", [("llama", 2), ("granite", 2), ("llama", 4)])
def test_a_split_model_gives_the_single_card_result(family, world):
    want = _single_card(family)
    results = launch.run(ranks.tp_forward, world, family, MODES, timeout=900)
    for rank, res in enumerate(results):
        for mode in MODES:
            r = res[mode]
            torch.testing.assert_close(r["logits"], want, rtol=1e-4, atol=1e-5, msg=lambda m: f"{mode} rank {rank}: {m}")
            # two all_reduces per layer (attention output, MLP output), through the backend
            assert r["collectives"] == ["all_reduce"] * 4, (mode, r["collectives"])
            assert r["fallbacks"] == {} and r["graph_breaks"] == 0 and r["standalone_fallback_nodes"] == 0, (mode, r)
            assert r["local_q_weight"] == (8 * 16 // world, 128)          # each rank holds 1/world of the heads
            assert r["collective_est_us"] > 0 and r["kernel_est_us"] > 0


def test_a_degree_that_does_not_divide_the_heads_names_the_sizes():
    model = ranks.tp_model("llama")
    with pytest.raises(SpyreDistributedError, match=r"tensor parallel 3: num_attention_heads=8, num_key_value_heads=4,"
                                                    r" intermediate_size=256 do not divide by 3"):
        tp.check_divisible(model.config, 3)
    with pytest.raises(SpyreDistributedError, match=r"num_key_value_heads=4 does not divide by 8"):
        tp.check_divisible(model.config, 8)


def test_the_plan_comes_from_transformers_config():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    p = tp.plan(ranks.tp_model("granite"))
    assert isinstance(p["model.layers.1.self_attn.q_proj"], ColwiseParallel)
    assert isinstance(p["model.layers.0.mlp.down_proj"], RowwiseParallel)
    assert len(p) == 2 * 7 and "lm_head" not in p
    with pytest.raises(SpyreDistributedError, match="no tensor-parallel plan"):
        tp.plan(torch.nn.Linear(2, 2))
