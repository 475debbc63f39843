"""torch.compile with the default backend on spyre: kernels are tile programs on the card."""

import pytest
import torch
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code

from vspyre.device.fallback import HostFallbackError
from vspyre.inductor.wrapper import compiled_fallbacks

from .helpers import Launches, on_card

torch.manual_seed(0)


def _close(a, b, tol=1e-4):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_pointwise_chain_is_one_kernel():
    x, y = torch.randn(64, 130), torch.randn(64, 130)
    f = lambda x, y: torch.sigmoid((x * 2 + y).relu()) - torch.tanh(y) / 3
    out, got = on_card(f, x, y)
    _close(out, f(x, y))
    assert len(got.kernels) == 1 and not got.fallbacks
    assert got.kernels[0].source == "inductor"


REDUCTIONS = {
    "sum_rows": lambda x: x.sum(-1),
    "sum_cols": lambda x: x.sum(0),
    "mean": lambda x: x.mean(1, keepdim=True),
    "amax": lambda x: x.amax(-1),
    "amin": lambda x: x.amin(0),
    "argmax": lambda x: x.argmax(-1),
    "argmin": lambda x: x.argmin(0),
    "any": lambda x: (x > 2).any(-1),
    "all": lambda x: (x > -3).all(0),
    "var": lambda x: x.var(-1),
    "prod": lambda x: (x / 4 + 1).prod(-1),
    "full": lambda x: x.sum(),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reductions(name):
    f = REDUCTIONS[name]
    x = torch.randn(24, 77)
    out, got = on_card(f, x)
    ref = f(x)
    if ref.dtype.is_floating_point:
        _close(out, ref, 1e-4)
    else:
        assert torch.equal(out, ref)
    assert got.kernels and not got.fallbacks


@pytest.mark.parametrize("name,f", [
    ("softmax", lambda x: torch.softmax(x, -1)),
    ("log_softmax", lambda x: torch.log_softmax(x, -1)),
    ("layer_norm", lambda x: F.layer_norm(x, (x.shape[-1],))),
    ("rms_norm", lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)),
])
def test_normalisations_fuse_into_one_kernel(name, f):
    x = torch.randn(16, 96)
    out, got = on_card(f, x)
    _close(out, f(x))
    assert len(got.kernels) == 1 and not got.fallbacks


@pytest.mark.parametrize("name,f,shapes", [
    ("mm", lambda a, b: a @ b, [(33, 40), (40, 17)]),
    ("addmm_alpha_beta", lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0), [(17,), (33, 40), (40, 17)]),
    ("bmm", lambda a, b: torch.bmm(a, b), [(3, 9, 16), (3, 16, 5)]),
    ("baddbmm", lambda c, a, b: torch.baddbmm(c, a, b), [(3, 9, 5), (3, 9, 16), (3, 16, 5)]),
    ("linear_bias_gelu", lambda x, w, b: F.gelu(F.linear(x, w, b)), [(4, 7, 32), (48, 32), (48,)]),
    ("residual_scale", lambda x, w, r: (x @ w) * 0.5 + r, [(10, 20), (20, 30), (10, 30)]),
])
def test_matmul_runs_on_the_systolic_array_with_fused_epilogue(name, f, shapes):
    args = [torch.randn(s) for s in shapes]
    out, got = on_card(f, *args)
    _close(out, f(*args), 1e-4)
    assert not got.fallbacks
    assert len(got.kernels) == 1, [k.name for k in got.kernels]     # epilogue fused into the matmul
    assert got.kernels[0].flops >= 2 * args[-2].shape[-2] * args[-1].shape[-1]  # counted as systolic flops


def test_generated_code_shows_tile_programs():
    f = lambda a, b: (a @ b).relu()
    a, b = torch.randn(8, 16, device="spyre"), torch.randn(16, 4, device="spyre")
    _, (code,) = run_and_get_code(torch.compile(f), a, b)
    assert "TileKernel(" in code and "k.matmul(" in code and "b.relu(" in code and ".run(" in code


@pytest.mark.parametrize("name,f,make", [
    ("embedding", lambda w, i: F.embedding(i, w) * 2, lambda: [torch.randn(50, 16), torch.randint(0, 50, (3, 6))]),
    ("gather", lambda x, i: torch.gather(x, 1, i) + 1, lambda: [torch.randn(5, 9), torch.randint(0, 9, (5, 4))]),
    ("index", lambda x, i: x[i] - 1, lambda: [torch.randn(12, 7), torch.tensor([3, 0, 11, 3])]),
    ("cat", lambda a, b: torch.cat([a, b * 2], 1), lambda: [torch.randn(4, 5), torch.randn(4, 3)]),
    ("pad", lambda x: F.pad(x, (1, 2, 0, 3), value=-1.0) + 1, lambda: [torch.randn(4, 5)]),
    ("slice_offsets", lambda x: x[1:, 3:10:2] * x[:-1, :4], lambda: [torch.randn(6, 12)]),
    ("transpose_copy", lambda x: x.t().contiguous() + 0, lambda: [torch.randn(9, 70)]),
    ("where_mask", lambda x: torch.where(x > 0, x, torch.zeros_like(x)).cumsum(0) if False else torch.where(x > 0, x, -x), lambda: [torch.randn(7, 3)]),
])
def test_indirect_masked_and_view_access(name, f, make):
    args = make()
    out, got = on_card(f, *args)
    _close(out, f(*args))
    assert got.kernels and not got.fallbacks


def test_in_place_mutation_of_an_input():
    def f(x, y):
        x.add_(y)
        x.mul_(2)
        return x.sum()

    x, y = torch.randn(5, 40), torch.randn(5, 40)
    xd, yd = x.to("spyre"), y.to("spyre")
    out = torch.compile(f)(xd, yd)
    ref_x = x.clone()
    ref = f(ref_x, y)
    _close(out.cpu(), ref)
    _close(xd.cpu(), ref_x)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_runs_on_the_card(causal):
    q, k, v = (torch.randn(2, 4, 10, 16) for _ in range(3))
    mask = None if causal else (torch.rand(2, 1, 10, 10) > 0.3)
    f = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=m is None)
    out, got = on_card(f, q, k, v, mask)
    _close(out, f(q, k, v, mask))
    assert not got.fallbacks and any(e.flops > 0 for e in got.kernels)


def test_unlowered_op_is_a_counted_host_fallback():
    f = lambda x: torch.median(x, -1).values * 2
    x = torch.randn(4, 9)
    out, got = on_card(f, x)
    _close(out, f(x))
    assert any("median" in op for op in compiled_fallbacks())
    assert [e.context for e in got.fallbacks] == ["compiled"] and "median" in got.fallbacks[0].op


@pytest.mark.parametrize("descending", [False, True])
def test_stable_sort_is_three_library_kernels(descending):
    """sort(stable) along the last dim: the ranks, then the values and the indices (library
    programs, no host fallback); ties keep their order, as the CPU's stable sort."""
    x = torch.randn(4, 37)
    x[1, 4] = x[1, 30] = x[1, 9]
    f = lambda x: torch.sort(x, stable=True, dim=-1, descending=descending)
    out, got = on_card(f, x)
    want = f(x)
    assert torch.equal(out[0], want.values) and torch.equal(out[1], want.indices)
    assert not got.fallbacks and not compiled_fallbacks()
    assert sorted(k.name for k in got.kernels if k.name.startswith("sort")) == \
        ["sort_indices", "sort_rank", "sort_values"]


def test_strict_mode_forbids_host_fallback_in_compiled_graph():
    f = lambda x: torch.median(x, -1).values + 1
    x = torch.randn(4, 9, device="spyre")
    with torch.spyre.fallback_mode("strict"), torch._inductor.config.patch(fx_graph_cache=False):
        with pytest.raises(Exception, match=r"aten::median.*no device kernel"):
            torch.compile(f)(x)
    torch._dynamo.reset()
    assert torch.compile(lambda x: x + 1)(x).device.type == "spyre"   # still usable


def test_graph_breaks_stay_dynamos():
    def f(x):
        y = x * 2
        print("side effect")          # a graph break
        return y + 1

    x = torch.randn(8, device="spyre")
    explained = torch._dynamo.explain(f)(x)
    assert explained.graph_break_count == 1 and explained.graph_count == 2
    _close(torch.compile(f)(x).cpu(), f(x.cpu()))


def test_dynamic_shapes_compile_once():
    from torch._dynamo.utils import counters

    counters.clear()
    w = torch.randn(32, 16)
    f = lambda x, w: torch.softmax(x @ w, -1).sum(0)
    cf = torch.compile(f, dynamic=True)
    for n in (5, 9, 17, 64):
        x = torch.randn(n, 32)
        _close(cf(x.to("spyre"), w.to("spyre")).cpu(), f(x, w))
    assert counters["stats"]["unique_graphs"] == 1


def test_fp16_numerics_follow_the_setting():
    x = torch.randn(64, 64).half()
    f = lambda x: x * 1.0009765625           # 1 + 2**-10: exact in IEEE fp16, not in DLFloat16
    with torch._inductor.config.patch(fx_graph_cache=False):
        out_dl16, _ = on_card(f, x)
        torch._dynamo.reset()
        with torch.spyre.fallback_mode("allow"):
            prev = torch.spyre.set_numerics("ieee")
            try:
                out_ieee, _ = on_card(f, x)
            finally:
                torch.spyre.set_numerics(prev)
    ref = (x.float() * 1.0009765625).half()
    assert torch.equal(out_ieee, ref)
    from vspyre.numerics import round_to_dl16
    assert torch.equal(out_dl16, round_to_dl16(x.float() * 1.0009765625).half())
