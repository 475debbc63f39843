"""The standalone graph compiler (backend "spyre_standalone"): op lowerings, fusions, fallback,
models against the CPU."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import vspyre.standalone as S
from vspyre.device.fallback import HostFallbackError


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    S.reset_report()
    yield


def _compile(fn):
    return torch.compile(fn, backend="spyre_standalone", fullgraph=True, dynamic=False)


def _run(fn, *cpu_args, atol=1e-3, rtol=1e-3):
    want = fn(*cpu_args)
    dev = [a.to("spyre") if isinstance(a, torch.Tensor) else a for a in cpu_args]
    with torch.no_grad():
        got = _compile(fn)(*dev)
    if isinstance(want, torch.Tensor):
        want, got = (want,), (got,)
    for w, g in zip(want, got):
        assert g.device.type == "spyre"
        assert g.dtype == w.dtype and g.shape == w.shape
        if w.dtype == torch.bool or not w.is_floating_point():
            assert torch.equal(g.cpu(), w)
        else:
            torch.testing.assert_close(g.cpu(), w, atol=atol, rtol=rtol)
    return S.report()


def _r(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------ per-op lowerings
OPS = {
    "add_broadcast": (lambda x, y: x + y * 2, (_r(4, 8, 16), _r(16, seed=1))),
    "sub_rsub": (lambda x, y: 1.0 - x - y, (_r(4, 16), _r(4, 16, seed=1))),
    "mul_div": (lambda x, y: x * y / (y.abs() + 1), (_r(4, 16), _r(1, 16, seed=1))),
    "unary": (lambda x: torch.exp(x).log() + x.tanh() + x.sigmoid() + x.abs().sqrt() + x.abs().add(1).rsqrt()
              + x.neg() + x.erf() + x.sin() + x.cos(), (_r(8, 32),)),
    "activations": (lambda x: F.gelu(x) + F.gelu(x, approximate="tanh") + F.silu(x) + F.relu(x), (_r(8, 32),)),
    "pow_clamp": (lambda x: x.pow(2) + x.clamp(-0.5, 0.5) + torch.maximum(x, x * 0.5), (_r(8, 32),)),
    "where_compare": (lambda x, y: torch.where(x > y, x, y) + (x <= 0).float(), (_r(8, 32), _r(8, 32, seed=1))),
    "masked_fill": (lambda x: x.masked_fill(x < 0, -1.0), (_r(8, 32),)),
    "cast": (lambda x: (x * 3).to(torch.int64).to(torch.float32) + x.half().float(), (_r(8, 32),)),
    "sum_mean": (lambda x: (x.sum(-1), x.mean(dim=(0, 2), keepdim=True), x.sum()), (_r(4, 8, 16),)),
    "amax_argmax": (lambda x: (x.amax(1), x.argmax(-1), x.amin(0)), (_r(4, 8, 16),)),
    "mm": (lambda a, b: a @ b, (_r(16, 32), _r(32, 24, seed=1))),
    "addmm_linear": (lambda a, w, b: F.linear(a, w, b), (_r(2, 8, 32), _r(24, 32, seed=1), _r(24, seed=2))),
    "bmm_transposed": (lambda a, b: a @ b.transpose(-1, -2), (_r(3, 8, 16), _r(3, 12, 16, seed=1))),
    "softmax": (lambda x: (x.softmax(-1), F.log_softmax(x, 1)), (_r(4, 8, 16),)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (16,), w, b), (_r(4, 8, 16), _r(16, seed=1), _r(16, seed=2))),
    "embedding": (lambda w, i: F.embedding(i, w), (_r(50, 16), torch.randint(0, 50, (3, 7)))),
    "cat_transpose": (lambda x, y: torch.cat([x.transpose(0, 1), y], 0).contiguous(), (_r(8, 4), _r(3, 8, seed=1))),
    "tril_arange": (lambda x: x.tril() + torch.arange(16, dtype=torch.float32, device=x.device)
                    + torch.ones(16, 16, device=x.device).triu(1),
                    (_r(16, 16),)),
    "sdpa": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
             (_r(2, 4, 8, 16), _r(2, 4, 8, 16, seed=1), _r(2, 4, 8, 16, seed=2))),
}


@pytest.mark.parametrize("name", list(OPS))
def test_op_lowering_matches_cpu(name):
    fn, args = OPS[name]
    rep = _run(fn, *args)
    assert rep["fallback_ops"] == 0, rep["fallback"]


def test_fp16_matches_fp64_reference():
    torch.manual_seed(0)
    x, w, b = _r(16, 64).half(), (_r(64, 64, seed=1) / 8).half(), _r(64, seed=2).half()

    def fn(x, w, b):
        return F.layer_norm(F.gelu(F.linear(x, w, b)), (64,)).softmax(-1)
    with torch.no_grad():
        got = _compile(fn)(x.to("spyre"), w.to("spyre"), b.to("spyre")).cpu()
    ref64 = fn(x.double(), w.double(), b.double())
    ref16 = fn(x.float(), w.float(), b.float()).half()       # the CPU fp16-ish reference
    cos = F.cosine_similarity(got.double().flatten(), ref64.flatten(), dim=0)
    assert got.dtype == torch.float16 and cos >= 0.999
    rmse = lambda a: (a.double() - ref64).pow(2).mean().sqrt()   # noqa: E731
    assert rmse(got) <= 1.5 * rmse(ref16) + 1e-4


# ------------------------------------------------------------------------------ fusions
def _fusions(fn, *args):
    torch._dynamo.reset()
    S.reset_report()
    rep = _run(fn, *args)
    return rep["fusions"], rep


def test_linear_bias_activation_fuses():
    f, rep = _fusions(lambda x, w, b: F.gelu(F.linear(x, w, b)), _r(2, 8, 32), _r(16, 32, seed=1), _r(16, seed=2))
    assert f.get("linear_act") == 1
    assert rep["graphs"][0].kernels == 1           # one program


def test_linear_act_near_miss_when_preactivation_escapes():
    def fn(x, w, b):
        h = F.linear(x, w, b)
        return h, F.gelu(h)
    f, _ = _fusions(fn, _r(2, 8, 32), _r(16, 32, seed=1), _r(16, seed=2))
    assert "linear_act" not in f


def test_residual_add_fuses_and_broadcast_add_does_not():
    f, _ = _fusions(lambda x, w, r: F.linear(x, w) + r, _r(8, 32), _r(32, 32, seed=1), _r(8, 32, seed=2))
    assert f.get("residual_add") == 1
    f, _ = _fusions(lambda x, w, r: F.linear(x, w) + r, _r(8, 32), _r(32, 32, seed=1), _r(32, seed=2))
    assert "residual_add" not in f


def _attn(q, k, v, mask):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + mask
    return s.softmax(-1) @ v


def test_attention_fuses_into_one_program():
    q, k, v = _r(2, 4, 8, 16), _r(2, 4, 8, 16, seed=1), _r(2, 4, 8, 16, seed=2)
    mask = torch.zeros(2, 1, 1, 8)
    mask[1, ..., 5:] = -1e9
    f, rep = _fusions(_attn, q, k, v, mask)
    assert f.get("attention") == 1
    assert rep["graphs"][0].kernels == 1


def test_attention_near_miss_when_probabilities_escape():
    q, k, v = _r(2, 4, 8, 16), _r(2, 4, 8, 16, seed=1), _r(2, 4, 8, 16, seed=2)

    def fn(q, k, v):
        p = (q @ k.transpose(-1, -2)).softmax(-1)
        return p @ v, p
    f, _ = _fusions(fn, q, k, v)
    assert "attention" not in f


def _rms(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def test_rmsnorm_fuses_and_near_miss():
    f, rep = _fusions(_rms, _r(4, 8, 32), _r(32, seed=1))
    assert f.get("rmsnorm") == 1 and rep["graphs"][0].kernels == 1
    f, _ = _fusions(lambda x, w: w * (x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + 1e-6)),
                    _r(4, 8, 32), _r(32, seed=1))
    assert "rmsnorm" not in f


def test_add_layernorm_fuses_and_near_miss():
    def fn(a, b, w, bias):
        h = a + b
        return F.layer_norm(h, (32,), w, bias), h
    f, rep = _fusions(fn, _r(4, 32), _r(4, 32, seed=1), _r(32, seed=2), _r(32, seed=3))
    assert f.get("add_layernorm") == 1 and rep["graphs"][0].kernels == 1
    f, _ = _fusions(fn, _r(4, 32), _r(32, seed=1), _r(32, seed=2), _r(32, seed=3))   # broadcast add
    assert "add_layernorm" not in f


def test_decomposed_softmax_fuses():
    def fn(x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)
    f, rep = _fusions(fn, _r(4, 16))
    assert f.get("softmax") == 1 and rep["graphs"][0].kernels == 1


# ------------------------------------------------------------------------------ fallback, report, profile
def _unknown(x):
    return torch.special.bessel_j0(x) + 1


def test_unknown_op_is_a_counted_host_fallback_node():
    rep = _run(_unknown, _r(8, 16))
    assert rep["fallback"] == {"aten::special_bessel_j0": 1}
    assert rep["fallback_calls"] == {"aten::special_bessel_j0": 1}
    assert any("bessel_j0" in k for k in torch.spyre.fallback_stats())       # the device counted it too
    assert "aten::special_bessel_j0" in S.report_text()


def test_unknown_op_strict_mode_names_the_op():
    torch.spyre.set_fallback_mode("strict")
    with pytest.raises(Exception, match="bessel_j0"):
        with torch.no_grad():
            _compile(_unknown)(_r(8, 16).to("spyre"))


def test_op_table_lists_native_ops():
    t = S.op_table()
    for op in ("aten::addmm", "aten::bmm", "aten::native_layer_norm", "aten::_softmax",
               "aten::embedding", "aten::view", "fused_attention", "fused_matmul"):
        assert op in t
    assert "aten::special_bessel_j0" not in t and "aten::cumsum" in t
    assert {k for _, k, _ in S.op_table_rows()} == {"kernel", "view", "fused", "collective"}


def test_profiler_sees_standalone_kernels():
    fn = _compile(lambda x, w: F.linear(x, w).relu())
    x, w = _r(8, 32).to("spyre"), _r(16, 32).to("spyre")
    with torch.no_grad():
        fn(x, w)
        with torch.spyre.profile() as prof:
            fn(x, w)
    stats = prof.key_averages()
    assert stats and all(getattr(s, "source", "standalone") == "standalone" for s in stats)
    assert prof.total_est_us > 0


def test_view_ops_launch_no_kernel():
    fn = _compile(lambda x: x.view(4, 32).transpose(0, 1).unsqueeze(0))
    x = _r(8, 16).to("spyre")
    with torch.no_grad(), torch.spyre.profile() as prof:
        y = fn(x)
    assert torch.equal(y.cpu(), _r(8, 16).view(4, 32).transpose(0, 1).unsqueeze(0))
    assert prof.key_averages() == []


def test_dump_dir_gets_graph_and_programs(tmp_path, monkeypatch):
    monkeypatch.setenv("VSPYRE_DUMP_DIR", str(tmp_path))
    _run(lambda x: x.softmax(-1) * 3.0, _r(4, 8))
    names = [p.name for p in tmp_path.iterdir()]
    assert any(n.startswith("standalone.") and n.endswith(".graph.txt") for n in names)
    assert any(n.endswith(".tprog") for n in names)
