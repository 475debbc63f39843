"""The model suite: every model builds deterministically, runs on the CPU and eager on the card."""

import textwrap

import pytest
import torch
from torch.overrides import TorchFunctionMode

from vspyre.harness import models
from vspyre.harness.models import (DEFAULT_SUITE, KINDS, SUITE, ModelCase, get_case, greedy_generate,
                                   load_user_model, tiny_llama_generate)

def _spyre_params(names):
    return list(names)


def test_registry():
    assert DEFAULT_SUITE == ["gpt2", "llama", "mixtral", "bert", "t5", "vit", "resnet", "convnext", "mobilenet_v2"]
    assert set(SUITE) == set(DEFAULT_SUITE)
    with pytest.raises(KeyError, match="unknown model 'nope'.*gpt2"):
        get_case("nope")


class _CountSDPA(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.nn.functional.scaled_dot_product_attention:
            self.calls += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", DEFAULT_SUITE)
def test_cpu_forward_is_deterministic(name):
    a, b = get_case(name, seed=0), get_case(name, seed=0)
    assert isinstance(a, ModelCase) and a.kind in KINDS and not a.model.training
    assert a.is_transformer == (a.kind != "cnn")
    for k, v in a.inputs.items():
        assert torch.equal(v, b.inputs[k])
    with _CountSDPA() as sdpa:
        out = a.output()
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and torch.isfinite(out).all()
    torch.testing.assert_close(out, b.output(), rtol=0, atol=0)
    assert not torch.equal(out, get_case(name, seed=1).output())      # the seed matters
    if a.is_transformer:
        assert a.model.config._attn_implementation == "sdpa"
        assert sdpa.calls >= 2                       # one per attention layer
    else:
        assert sdpa.calls == 0


def test_output_shapes():
    shapes = {n: tuple(get_case(n, batch=1).output().shape) for n in DEFAULT_SUITE}
    assert shapes == {"gpt2": (1, 32, 1000), "llama": (1, 32, 1000), "mixtral": (1, 16, 1000), "bert": (1, 32, 128),
                      "t5": (1, 16, 1000), "vit": (1, 10), "resnet": (1, 10), "convnext": (1, 10),
                      "mobilenet_v2": (1, 10)}


def test_bert_padding_mask_is_used():
    case = get_case("bert")
    assert case.inputs["attention_mask"][1].min() == 0
    out = case.output()
    case.inputs["attention_mask"] = torch.ones_like(case.inputs["attention_mask"])
    assert not torch.allclose(out[1], case.output()[1])


@pytest.mark.parametrize("name", _spyre_params(DEFAULT_SUITE))
def test_eager_on_spyre_matches_cpu(name):
    case = get_case(name)
    ref = case.output()
    dev = case.clone().to("spyre")
    assert next(case.model.parameters()).device.type == "cpu"            # the CPU case is untouched
    with torch.spyre.profile() as prof:
        out = dev.output()
    assert out.device.type == "spyre"
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)
    # eager ops run as device kernels (>= 90% of op calls); the rest are counted host fallbacks
    kernels = sum(torch.spyre.eager_kernel_stats()["calls"].values())
    fallbacks = sum(torch.spyre.fallback_stats().values())
    assert kernels / (kernels + fallbacks) >= 0.9, torch.spyre.fallback_stats()
    eager = [k for k in prof.kernels if k.source == "eager"]
    assert len(eager) >= kernels and prof.total_est_us > 0


def test_greedy_generate_on_spyre_equals_cpu():
    case = tiny_llama_generate(max_new_tokens=4)
    assert case.max_new_tokens == 4 and case.model.config.use_cache
    ref = case.generate()
    assert ref.shape == (1, 8 + 4)
    assert torch.equal(ref[:, :8], case.inputs["input_ids"])
    dev = case.clone().to("spyre")
    out = greedy_generate(dev.model, dev.inputs["input_ids"], 4)
    assert out.device.type == "spyre"
    assert torch.equal(out.cpu(), ref)


def test_greedy_generate_always_makes_n_tokens():
    case = tiny_llama_generate(batch=2, seq=6, max_new_tokens=3)
    ref = case.generate()
    case.model.generation_config.eos_token_id = int(ref[0, 6])          # the model "ends" at once
    assert torch.equal(case.generate(), ref)
    with pytest.raises(ValueError, match="not a decode case"):
        get_case("llama").generate()


# -- user models ----------------------------------------------------------------------------

_USER_MODULE = textwrap.dedent('''
    import torch
    from vspyre.harness.models import ModelCase

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)
        def forward(self, x, scale=1.0):
            return self.lin(x) * scale

    def as_tuple():
        torch.manual_seed(0)
        return Net(), {"x": torch.ones(2, 4)}
    def as_tensor_input():
        torch.manual_seed(0)
        return Net(), torch.ones(2, 4)
    def as_dict():
        torch.manual_seed(0)
        return {"model": Net(), "inputs": {"x": torch.ones(2, 4)}, "name": "net", "kind": "encoder"}
    def as_case(seq=4):
        torch.manual_seed(0)
        return ModelCase("mine", Net(), {"x": torch.ones(2, seq)})
    def wrong_type():
        return 42
    def not_a_module():
        return "model", {"x": torch.ones(1)}
    def bad_inputs():
        return Net(), 3.0
    def raises():
        raise ValueError("boom")
    NOT_CALLABLE = 3
''')


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_user_models.py").write_text(_USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / "my_user_models.py"


def test_load_user_model_accepts_tuple_dict_case_and_file(user_module):
    expected = load_user_model("my_user_models:as_tuple").output()
    for spec in ("my_user_models:as_tuple", "my_user_models:as_tensor_input", "my_user_models:as_dict",
                 "my_user_models:as_case", f"{user_module}:as_tuple"):
        case = get_case(spec)
        assert isinstance(case, ModelCase) and not case.model.training, spec
        torch.testing.assert_close(case.output(), expected)
    assert load_user_model("my_user_models:as_tensor_input").inputs.keys() == {"x"}
    d = load_user_model("my_user_models:as_dict")
    assert (d.name, d.kind, d.is_transformer) == ("net", "encoder", False)
    assert load_user_model("my_user_models:as_case", seq=4).name == "mine"


@pytest.mark.parametrize("spec, exc, match", [
    ("no_colon_here", ValueError, "expected 'pkg.module:function'"),
    ("no_such_pkg_xyz.mod:fn", ImportError, "'no_such_pkg_xyz.mod:fn': cannot import 'no_such_pkg_xyz.mod'"),
    ("/no/such/file.py:fn", ImportError, "cannot import.*no such file"),
    ("my_user_models:missing", ImportError, "'my_user_models:missing'.*no attribute 'missing'"),
    ("my_user_models:NOT_CALLABLE", TypeError, "'NOT_CALLABLE' is a int, not a function"),
    ("my_user_models:wrong_type", TypeError, "'my_user_models:wrong_type': expected a ModelCase.*got int"),
    ("my_user_models:not_a_module", TypeError, "'my_user_models:not_a_module'.*not a torch.nn.Module"),
    ("my_user_models:bad_inputs", TypeError, "'my_user_models:bad_inputs': inputs must be"),
    ("my_user_models:raises", RuntimeError, "'my_user_models:raises': calling it raised ValueError: boom"),
])
def test_load_user_model_errors_name_the_spec(user_module, spec, exc, match):
    with pytest.raises(exc, match=match):
        load_user_model(spec)
