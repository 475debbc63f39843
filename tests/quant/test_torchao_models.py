"""torchao's configs (vspyre.quant: fp8 dynamic activation + fp8 weight, fp8 static
activation + fp8 weight, int8 dynamic activation + int8 weight, int4 weight-only) on a transformers model put on the card: eager, the
Inductor extension and the standalone compiler, each with 0 host fallbacks, the logits within the
scheme's error of the unquantised model on the CPU."""

import pytest
import torch

pytest.importorskip("torchao")
transformers = pytest.importorskip("transformers")

from vspyre import quant  # noqa: E402
from vspyre.compat import dynamo_reset  # noqa: E402

# relative error of the logits against the bfloat16 model on the CPU (fp8's 3 mantissa bits,
# int8's 127 levels per row, int4's 15 levels per group, through 2 layers)
REL = {"fp8": 0.12, "fp8-static": 0.12, "w8a8": 0.05, "w4a16": 0.25}


def _model() -> torch.nn.Module:
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                   max_position_embeddings=64)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


@pytest.fixture(scope="module")
def reference():
    m = _model()
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return ids, m(input_ids=ids).logits.float()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("path", ["eager", "inductor", "spyre_standalone"])
@pytest.mark.parametrize("name", list(quant.SCHEMES))
def test_quantised_llama_on_the_card(name, path, reference):
    ids, ref = reference
    m = _model().to("spyre")
    n = quant.quantize(m, name)
    assert n == 2 * 7                                  # every linear of both layers; not the LM head
    assert type(m.lm_head.weight.data) is torch.Tensor
    assert type(m.model.layers[0].mlp.down_proj.weight).__module__.startswith("torchao")
    dynamo_reset()
    f = m if path == "eager" else torch.compile(m, backend=path)
    torch.spyre.reset_fallback_stats()
    with torch.no_grad():
        got = f(input_ids=ids.to("spyre")).logits
    assert torch.spyre.fallback_stats() == {}, f"{name} on {path}: host fallbacks"
    rel = _rel(got.cpu(), ref)
    assert rel < REL[name], f"{name} on {path}: logits {rel:.3f} from the unquantised model's"
    assert rel > 1e-4, f"{name} on {path}: no quantisation error at all (were the weights quantised?)"


def test_the_card_kernels_each_scheme_becomes():
    """fp8 linears are _scaled_mm kernels, w8a8 ones _int_mm kernels (torchao's out_dtype(mm) on
    the card), in eager mode."""
    for name, op in (("fp8", "aten::_scaled_mm"), ("fp8-static", "aten::_scaled_mm"), ("w8a8", "aten::_int_mm")):
        m = _model().to("spyre")
        quant.quantize(m, name)
        torch.spyre.reset_eager_kernel_stats()
        with torch.no_grad():
            m(input_ids=torch.zeros(1, 4, dtype=torch.long, device="spyre"))
        assert torch.spyre.eager_kernel_stats()["calls"].get(op) == 14, name


def test_quantised_weight_bytes():
    """Device bytes per weight: 1 for fp8, w8a8 and torchao's portable int4 layout (one value per
    byte), plus torchao's scales (fp32 per channel; w8a8 and w4a16 also keep an int8 zero point
    per scale; w4a16's scales are per group of 128, in the model's dtype)."""
    k = n = 256
    assert quant.linear_weight_bytes(n, k, torch.bfloat16, "fp8") == n * k + n * 4
    # fp8-static: one fp32 scale for the weight, one for its input, each in a whole 128-byte stick on the card
    assert quant.linear_weight_bytes(n, k, torch.bfloat16, "fp8-static") == n * k + 128 + 128
    assert quant.linear_weight_bytes(n, k, torch.bfloat16, "w8a8") == n * k + n * (4 + 1)
    assert quant.linear_weight_bytes(n, k, torch.bfloat16, "w4a16") == n * k + n * (k // 128) * (2 + 1)


def test_bad_scheme_and_blockwise_fp8_are_refused():
    with pytest.raises(quant.QuantError, match="unknown quantisation 'int3'"):
        quant.quantize(_model(), "int3")
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerBlock, quantize_
    from vspyre.quant._torchao import card_hardware_check
    m = torch.nn.Sequential(torch.nn.Linear(256, 256, bias=False)).to(torch.bfloat16).to("spyre")
    with card_hardware_check(m), pytest.raises(AssertionError, match="per-tensor or per-row"):
        quantize_(m, Float8DynamicActivationFloat8WeightConfig(granularity=[PerBlock([1, 128]), PerBlock([128, 128])],
                                                             set_inductor_config=False))


def test_static_fp8_calibrates_one_scale_per_linear_and_reduces_nothing_at_run_time():
    """fp8-static: each linear's activation scale is its calibration inputs' max / 448 (torchao's
    min-max observer), and a forward quantises with it: no amax over the activations (the dynamic
    scheme's per-token reduction), so fewer kernels than fp8."""
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(4))
    m = _model()
    seen = {}
    hooks = [lin.register_forward_pre_hook(lambda _, a, n=n: seen.__setitem__(n, a[0].abs().amax().float()))
             for n, lin in quant.quantized_linears(m)]
    with torch.no_grad():
        m(input_ids=ids)
    for h in hooks:
        h.remove()
    m = m.to("spyre")
    quant.quantize(m, "fp8-static", calibration=ids)
    for n, lin in quant.quantized_linears(m):
        s = lin.weight.act_quant_scale
        # the card's bfloat16 activations against the CPU's: within a few bfloat16 steps (measured <= 0.3%)
        assert s.shape == (1, 1, 1) and abs(float(s.cpu()) - float(seen[n]) / 448) <= 1e-2 * float(seen[n]) / 448, n
    counts = {}
    for name in ("fp8", "fp8-static"):
        q = _model().to("spyre")
        quant.quantize(q, name, calibration=ids)
        torch.spyre.reset_eager_kernel_stats()
        with torch.no_grad():
            q(input_ids=ids.to("spyre"))
        counts[name] = torch.spyre.eager_kernel_stats()["calls"]
    assert counts["fp8"].get("aten::amax", 0) >= 14 and counts["fp8-static"].get("aten::amax", 0) == 0
    with pytest.raises(quant.QuantError, match="calibration inputs never reached"):
        quant.quantize(_model().to("spyre"), "fp8-static", calibration=lambda model: None)


def test_static_fp8_over_a_symbolic_sum_of_token_counts_compiles():
    """A serving step's tokens are ``decodes + chunk`` (two symbols): the static fp8 linear's
    quantisation (a pointwise op over ``K * (s0 + s1)`` elements) cannot be proven to split into
    the matmul's ``s0 + s1`` rows, so Inductor must not fuse it as the matmul's prologue (it did,
    and failed at codegen with CantSplit); it becomes its own kernel and the result is exact."""
    lin = torch.nn.Linear(64, 32, bias=False).to(torch.bfloat16).to("spyre")
    quant.quantize(torch.nn.Sequential(lin), "fp8-static",
                   calibration=lambda m: m(torch.randn(1, 8, 64, dtype=torch.bfloat16, device="spyre")))

    def step(decodes, chunk):
        return lin(torch.cat([decodes, chunk], 1))
    g = torch.Generator().manual_seed(5)
    a, b = (torch.randn(1, n, 64, generator=g).to(torch.bfloat16).to("spyre") for n in (3, 5))
    torch._dynamo.mark_dynamic(a, 1)
    torch._dynamo.mark_dynamic(b, 1)
    dynamo_reset()
    torch.spyre.reset_fallback_stats()
    with torch.no_grad():
        want = step(a, b).cpu()
        got = torch.compile(step, backend="inductor")(a, b).cpu()
    assert torch.equal(got, want)
    assert torch.spyre.fallback_stats() == {}
