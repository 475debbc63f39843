"""The decoder-family sweep (docs/model-families.md): its machinery on a few types."""

from __future__ import annotations

import json

import pytest

from vspyre.harness import families as F


def test_scope_and_tiny_configs():
    assert F.scope("llama") is None and F.scope("mistral") is None
    assert F.scope("bart").startswith("encoder-decoder")
    assert F.scope("bert").startswith("encoder architecture")
    assert F.scope("gemma3").startswith("multimodal")
    cfg = F.tiny_config("mixtral")
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_local_experts, cfg.num_experts_per_tok) == (64, 2, 4, 2)
    assert cfg.sliding_window in (None, F.WINDOW) and cfg.vocab_size == 256
    gpt2 = F.tiny_config("gpt2")                       # attribute_map names (n_embd, n_layer)
    assert (gpt2.n_embd, gpt2.n_layer, gpt2.n_head) == (64, 2, 4)


def test_a_failure_is_one_named_line():
    try:
        raise RuntimeError("spyre: item() (a data-dependent read, e.g. control flow on a value): this int64 "
                           "tensor of shape [] has no values: it was produced in estimate-only mode\nmore\nlines")
    except RuntimeError as e:
        r = F.reason(e)
    assert r.startswith("estimate-only: item() (a data-dependent read") and "\n" not in r
    assert "test_families.py" not in r          # a location in transformers or vspyre only


def test_the_sweep_runs_rows_resumes_and_writes_the_table(tmp_path):
    out = str(tmp_path / "rows.jsonl")
    opts = F.Options(out=out, only=("llama", "bart"), modes=("estimate",), timeout=300, jobs=1,
                     compilers=("standalone",))
    rows = F.sweep(opts, progress=False)
    by = {(r["model_type"], r["mode"]): r for r in rows}
    assert by[("bart", "scope")]["status"] == "out_of_scope"
    llama = by[("llama", "estimate")]
    assert llama["status"] == "ok", llama
    assert set(llama["backends"]) == {"standalone"}
    for b in llama["backends"].values():
        assert b["status"] == "ok" and b["fallbacks"] == {} and b["graph_breaks"] == 0 and b["prefill_us"] > 0
    again = F.sweep(opts, progress=False)            # resumes: nothing new
    assert len(again) == len(rows) and len((tmp_path / "rows.jsonl").read_text().splitlines()) == 2
    md = F.markdown(again)
    assert "| llama | LlamaForCausalLM |" in md and "| - | ok | - | - |" in md
    assert "| bart | encoder-decoder" in md and "transformers " in md and "torch " in md
    with pytest.raises(ValueError, match="not a causal-LM model type"):
        F.sweep(F.Options(out=out, only=("no_such_type",)), progress=False)


def test_a_hung_worker_is_a_timeout_row(tmp_path):
    opts = F.Options(out=str(tmp_path / "rows.jsonl"), timeout=0.5)
    row = F._spawn("llama", "estimate", opts, str(tmp_path))
    assert row["status"] == "timeout" and "timeout" in row["reason"]
    json.dumps(row)


def test_no_weight_matrix_is_left_all_zero():
    """AFMoE's router is zero-initialised: every expert score ties and top-k's choice among ties is
    implementation-defined, so the card and the CPU would pick different experts."""
    model = F.build_cpu(F.tiny_config("afmoe"))
    assert all(p.any() for p in model.parameters() if p.dim() >= 2)
