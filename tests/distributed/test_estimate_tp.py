"""`vspyre estimate --tp N`: one process simulating N symmetric ranks gives the figures N processes
measure (functionally, with values and real collectives), per-card memory, errors."""

import json

import pytest

from vspyre import cli
from vspyre.distributed import launch
from vspyre.harness import estimate as E

TINY = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 512, "max_position_embeddings": 256,
        "tie_word_embeddings": False}


@pytest.fixture
def tiny_config(tmp_path):
    p = tmp_path / "tiny-tp.json"
    p.write_text(json.dumps(TINY))
    return str(p)


def _figures(r: dict, backend: str) -> dict:
    b = r["backends"][backend]
    return {"prefill": (round(b["prefill"]["est_us"], 6), b["prefill"]["launches"], b["prefill"]["collectives"],
                        round(b["prefill"]["collective_us"], 6)),
            "decode": [(s["kv"], round(s["est_us"], 6), s["launches"], s["collectives"]) for s in b["decode"]],
            "fallbacks": (b["prefill"]["fallbacks"], [s["fallbacks"] for s in b["decode"]]),
            "weights": b["weights_bytes"]}


@pytest.mark.slow
def test_simulated_ranks_give_what_two_processes_measure(tiny_config):
    opts = dict(config=tiny_config, prompt=16, new_tokens=4, kv=(16,), backends=("inductor", "standalone"), tp=2,
                warm=False)
    sim = E.estimate(E.Options(**opts), progress=False)
    assert sim["ranks"].startswith("simulated")
    ranks = launch.run(E.rank_estimate, 2, E.Options(**opts, execute=True), timeout=600)
    for rank, r in enumerate(ranks):
        assert r["mode"] == "functional" and r["ranks"].startswith("2 processes")
        for b in opts["backends"]:
            assert _figures(r, b) == _figures(sim, b), (rank, b)
    for b in opts["backends"]:
        pre = sim["backends"][b]["prefill"]
        assert pre["collectives"] == 4 and 0 < pre["collective_us"] < pre["est_us"]   # two all_reduces per layer


def test_tp_halves_what_is_split_and_keeps_the_rest(tiny_config):
    one = E.estimate(E.Options(config=tiny_config, prompt=16, new_tokens=0, kv=(16,), warm=False), progress=False)
    two = E.estimate(E.Options(config=tiny_config, prompt=16, new_tokens=0, kv=(16,), warm=False, tp=2),
                     progress=False)
    h, ffn, layers, vocab = 128, 256, 2, 512
    split = layers * (h * h + 2 * h * h // 2 + h * h + 3 * h * ffn) * 2     # q, k and v (GQA: half), o, MLP; fp16
    assert one["memory"]["weights_bytes"] - two["memory"]["weights_bytes"] == split // 2
    n_tensors = 2 + layers * 9 + 2                     # measured on the card: each tensor in whole 128-byte sticks
    assert 0 <= two["backends"]["inductor"]["weights_bytes"] - two["memory"]["weights_bytes"] < 128 * n_tensors
    assert two["memory"]["kv_cache_bytes"] * 2 == one["memory"]["kv_cache_bytes"]
    assert one["backends"]["inductor"]["prefill"]["collectives"] == 0


@pytest.mark.parametrize("argv,message", [
    (["--tp", "3"], "tensor parallel 3: num_attention_heads=8, num_key_value_heads=4, intermediate_size=256 do not "
                    "divide by 3"),
    (["--tp", "2", "--execute"], "a functional run needs 2 processes"),
    (["--tp", "2", "--cards", "2"], "every rank has a card of its own"),
])
def test_bad_tp_is_one_line_and_nonzero(tiny_config, argv, message, capsys, tmp_path):
    assert cli.main(["estimate", "--config", tiny_config, "--out", str(tmp_path), "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
