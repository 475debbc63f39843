"""What the plugin does not run is refused at start-up (or per request) with a message naming it."""

import pytest

from .test_generate import _llm


def test_unsupported_family_is_named(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    from vspyre.harness.checkpoints import tokenizer

    cfg = GPT2Config(n_embd=64, n_layer=1, n_head=2, vocab_size=512, n_positions=1024, bos_token_id=1, eos_token_id=2)
    GPT2LMHeadModel(cfg).save_pretrained(tmp_path)
    tokenizer(512).save_pretrained(tmp_path)
    with pytest.raises(Exception, match="family 'gpt2'.*not supported"):
        with _llm(tmp_path, "inductor"):
            pass


def test_lora_is_refused(tiny_models):
    with pytest.raises(Exception, match="LoRA"):
        with _llm(tiny_models["llama"], "eager", enable_lora=True):
            pass


def test_bad_backend_setting_is_named(tiny_models):
    with pytest.raises(Exception, match="VSPYRE_VLLM_BACKEND='tvm'"):
        with _llm(tiny_models["llama"], "tvm"):
            pass


def test_unsupported_sampling_parameters_are_named(tiny_models):
    from vllm import SamplingParams

    with _llm(tiny_models["llama"], "eager") as llm:
        for kw, name in ((dict(logprobs=2), "logprobs"), (dict(repetition_penalty=1.3), "repetition_penalty"),
                         (dict(min_p=0.1), "min_p")):
            with pytest.raises(Exception, match=name):
                llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=2, **kw), use_tqdm=False)
        # the engine is still usable after a refused request
        out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=2, temperature=0.0),
                           use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 2
