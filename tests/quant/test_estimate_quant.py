"""`vspyre estimate --quant fp8|fp8-static|w8a8|w4a16`: quantised weights' memory (predicted from the config
equals what the card holds), their times against the unquantised model, side by side; the same
figures estimate-only and functional."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("torchao")

from vspyre import cli  # noqa: E402
from vspyre.harness import estimate as E  # noqa: E402

TINY = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 512,
        "tie_word_embeddings": False}


@pytest.fixture
def tiny_config(tmp_path):
    p = tmp_path / "tiny.json"
    p.write_text(json.dumps(TINY))
    return str(p)


def _figures(r: dict) -> dict:
    b = r["backends"]["inductor"]
    return {"prefill": (b["prefill"]["est_us"], b["prefill"]["launches"]),
            "decode": [(s["kv"], s["est_us"], s["launches"]) for s in b["decode"]],
            "fallbacks": (b["prefill"]["fallbacks"], [s["fallbacks"] for s in b["decode"]])}


@pytest.mark.parametrize("scheme", ["fp8", "fp8-static", "w8a8"])
def test_quantised_estimate_only_gives_the_figures_of_a_functional_run(tiny_config, scheme):
    opts = dict(config=tiny_config, prompt=32, new_tokens=4, kv=(32,), backends=("inductor",), dtype="bfloat16",
                quant=scheme, warm=False)
    est = E.estimate(E.Options(**opts), progress=False)
    run = E.estimate(E.Options(**opts, execute=True), progress=False)
    assert _figures(est) == _figures(run)
    b = est["backends"]["inductor"]
    assert b["prefill"]["fallbacks"] == {} and b["decode"][0]["fallbacks"] == {}
    # the weights the config predicts are the bytes the card holds after quantising
    assert est["memory"]["weights_bytes"] == b["weights_bytes"] == run["backends"]["inductor"]["weights_bytes"]


def test_quantised_weights_and_decode_against_bfloat16(tiny_config):
    """Per linear 1 byte a weight instead of 2 (plus scales); the decode step, which streams the
    weights, is faster; the LM head and embeddings are not quantised."""
    opts = dict(config=tiny_config, prompt=16, new_tokens=2, kv=(16,), backends=("inductor",), dtype="bfloat16",
                warm=False)
    base = E.estimate(E.Options(**opts), progress=False)
    fp8 = E.estimate(E.Options(**opts, quant="fp8"), progress=False)
    h, i, layers, v = 256, 512, 2, 1000
    kv_dim = 2 * 64
    linear = layers * (h * h * 2 + h * kv_dim * 2 + 3 * h * i)            # q, o; k, v; gate, up, down
    scales = layers * (h + h + kv_dim * 2 + i * 2 + h) * 4                # one fp32 per output channel
    assert base["memory"]["weights_bytes"] - fp8["memory"]["weights_bytes"] == linear * 2 - (linear + scales)
    assert fp8["quant"]["scheme"] == "fp8" and base["quant"] is None


def test_at_a_real_width_fp8_decodes_faster(tmp_path):
    """One layer at 2048 wide (estimate-only): the decode step streams half the linears' bytes.
    (At the tiny width above, the per-token activation quantisation's kernels cost more than the
    weights' bytes save.)"""
    p = tmp_path / "wide.json"
    p.write_text(json.dumps(TINY | {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 1,
                                    "num_attention_heads": 16, "num_key_value_heads": 4}))
    opts = dict(config=str(p), prompt=16, new_tokens=2, kv=(16,), backends=("inductor",), dtype="bfloat16",
                warm=False)
    base = E.estimate(E.Options(**opts), progress=False)["backends"]["inductor"]
    fp8 = E.estimate(E.Options(**opts, quant="fp8"), progress=False)["backends"]["inductor"]
    assert fp8["decode"][0]["est_us"] < 0.8 * base["decode"][0]["est_us"]
    # static activation scales: no per-token amax before the linears, so a cheaper prefill, fewer kernels
    static = E.estimate(E.Options(**opts, quant="fp8-static"), progress=False)["backends"]["inductor"]
    assert static["prefill"]["est_us"] < fp8["prefill"]["est_us"]
    assert static["prefill"]["launches"] < fp8["prefill"]["launches"]
    assert static["decode"][0]["est_us"] < 0.8 * base["decode"][0]["est_us"]


def test_cli_quant_writes_each_report_and_the_comparison(tiny_config, tmp_path, capsys):
    out = tmp_path / "out"
    rc = cli.main(["estimate", "--config", tiny_config, "--dtype", "bfloat16", "--prompt", "16", "--new-tokens", "2",
                   "--kv", "16", "--quant", "fp8,w4a16", "--backend", "both", "--out", str(out), "--no-progress"])
    assert rc == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["estimate-tiny-fp8.json", "estimate-tiny-fp8.md", "estimate-tiny-quant.json",
                     "estimate-tiny-quant.md", "estimate-tiny-w4a16.json", "estimate-tiny-w4a16.md",
                     "estimate-tiny.json", "estimate-tiny.md"]
    md = (out / "estimate-tiny-quant.md").read_text()
    assert "| | bfloat16 | fp8 | w4a16 |" in md and "## Time: inductor" in md and "## Time: standalone" in md
    assert "Quantised fp8" in (out / "estimate-tiny-fp8.md").read_text()
    reports = json.loads((out / "estimate-tiny-quant.json").read_text())
    assert [r["quant"] and r["quant"]["scheme"] for r in reports] == [None, "fp8", "w4a16"]


@pytest.mark.parametrize("argv, message", [
    (["--quant", "int3"], "unknown --quant 'int3'; one of fp8, fp8-static, w8a8, w4a16"),
    (["--quant", "fp8", "--tp", "2"], "quantised weights are not split over cards yet"),
])
def test_bad_quant_input_is_one_line(tiny_config, tmp_path, capsys, argv, message):
    rc = cli.main(["estimate", "--config", tiny_config, "--no-progress", "--out", str(tmp_path), *argv])
    assert rc == 2
    assert message in capsys.readouterr().err
