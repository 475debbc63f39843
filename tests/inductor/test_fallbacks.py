"""Per-device host fallbacks at lowering time (vspyre.inductor.lowering): what the card's kernels
cannot express (random numbers, special functions, atomic scatter stores) becomes a counted
Inductor fallback for spyre tensors instead of a compile error, and other devices keep Inductor's
own lowering. Also: the RNG accessors of torch.spyre under Dynamo, div_rn, floor index terms."""

import pytest
import sympy
import torch
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code

from vspyre.inductor import kernel, lowering
from vspyre.inductor.wrapper import compiled_fallbacks
from vspyre.ir.indexing import ModularIndexing, compile_expr, sym
from vspyre.ir.ops import OPS

from .helpers import on_card


def _compile(fn, *args):
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False)(*args)


# -- 1. RNG state accessors are not traced --------------------------------------------------------
def test_freeze_rng_state_around_a_random_op_compiles():
    """torch.testing's wrapper_set_seed (every random OpInfo op) calls torch.spyre.get/set_rng_state
    under no_dispatch(); Dynamo used to trace into them and fail on a fake tensor."""
    from torch.testing._utils import wrapper_set_seed

    x = torch.randn(4, 4, device="spyre")
    for fn, shape in ((lambda t: wrapper_set_seed(torch.randn, 3, 4, device=t.device), (3, 4)),
                      (lambda t: wrapper_set_seed(F.dropout, t, 0.5, True), (4, 4)),
                      (lambda t: wrapper_set_seed(torch.Tensor.item, t[0, 0]), None)):
        for backend in ("inductor", "spyre_standalone"):
            torch._dynamo.reset()
            c = torch.compile(fn, backend=backend)
            r1, r2 = c(x), c(x)
            if shape is None:
                assert r1 == r2 == x[0, 0].item()
            else:   # the seed is set around the op: the same draw twice
                assert r1.device.type == "spyre" and tuple(r1.shape) == shape
                assert torch.equal(r1.cpu(), r2.cpu())


def test_device_code_is_never_traced():
    """torch.spyre and the host fallback kernel are on Dynamo's skip list (as torch.cuda is)."""
    from torch._dynamo import trace_rules

    from vspyre.device import fallback

    for fn in (torch.spyre.get_rng_state, torch.spyre.set_rng_state, torch.spyre.manual_seed,
               fallback._host_fallback):
        assert trace_rules.check(fn), fn

    def f(x):
        s = torch.spyre.get_rng_state()
        torch.spyre.set_rng_state(s)
        return x + 1

    x = torch.randn(3, device="spyre")
    assert torch.equal(_compile(f, x).cpu(), x.cpu() + 1)


# -- 2. random ops in compiled spyre graphs ----------------------------------------------------------
def test_dropout_and_rand_like_are_host_fallbacks_seeded_by_the_card():
    f = lambda x: F.dropout(x, 0.5, training=True) * 3 + torch.rand_like(x)
    x = torch.randn(16, 8)
    torch.spyre.manual_seed(11)
    a, got = on_card(f, x)
    assert a.shape == x.shape and a.dtype == x.dtype
    assert set(compiled_fallbacks()) == {"aten::rand"} and got.fallbacks
    assert all(e.context == "compiled" for e in got.fallbacks)
    assert got.kernels                                  # the mask, scale and add run on the card
    torch.manual_seed(999)                              # the host's generator does not matter
    torch.spyre.manual_seed(11)
    b, _ = on_card(f, x)
    assert torch.equal(a, b)
    torch.spyre.manual_seed(12)
    c, _ = on_card(f, x)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("name", ["randn", "randint", "bernoulli", "normal_", "uniform_", "exponential_"])
def test_random_factories_and_inplace_draws(name):
    fns = {
        "randn": lambda x: torch.randn(3, 5, device=x.device) + 1,
        "randint": lambda x: torch.randint(0, 7, (3, 5), device=x.device),
        "bernoulli": lambda x: torch.bernoulli(torch.sigmoid(x)),
        "normal_": lambda x: x.clone().normal_(),
        "uniform_": lambda x: x.clone().uniform_(-2, 2),
        "exponential_": lambda x: x.clone().exponential_(),
    }
    f = fns[name]
    x = torch.randn(3, 5)
    torch.spyre.manual_seed(3)
    a, _ = on_card(f, x)
    ref = f(x)
    assert a.shape == ref.shape and a.dtype == ref.dtype
    assert compiled_fallbacks(), name
    torch.spyre.manual_seed(3)
    b, _ = on_card(f, x)
    assert torch.equal(a, b)


def test_random_ops_on_cpu_keep_inductors_in_kernel_rng():
    f = lambda x: F.dropout(x, 0.5, training=True)
    x = torch.randn(64)
    torch._dynamo.reset()
    _, code = run_and_get_code(torch.compile(f), x)
    src = "\n".join(code)
    assert "normalized_rand_cpu" in src          # Inductor's in-kernel RNG of the cpp backend
    assert "aten.rand.default" not in src and "torch.ops.aten.rand" not in src
    assert compiled_fallbacks() == {}


def test_strict_mode_names_the_random_fallback():
    x = torch.randn(8, device="spyre")
    with torch.spyre.fallback_mode("strict"), torch._inductor.config.patch(fx_graph_cache=False):
        with pytest.raises(Exception, match=r"aten::rand.*no device kernel"):
            _compile(lambda t: t + torch.rand_like(t), x)


# -- 3. ops with no tile form --------------------------------------------------------------------
def test_the_fallback_table_follows_the_kernel():
    aten = torch.ops.aten
    needs = lowering._kernel_needs()
    assert needs[aten.special_airy_ai] == {"airy_ai"} and not kernel.has_tile_form("airy_ai")
    assert kernel.has_tile_form("exp") and kernel.has_tile_form("div_rn")
    assert not kernel.has_tile_form("store:atomic_add")
    x = torch.empty(2)
    assert lowering._accumulate_needs(aten.index_put.default, (x, [x], x, True), {}) == {"store:atomic_add"}
    assert lowering._accumulate_needs(aten.index_put.default, (x, [x], x), {}) == set()
    assert lowering._scatter_reduce_needs(aten.scatter_reduce.two, (x, 0, x, x, "sum"), {}) == {"store:atomic_add"}
    assert lowering._scatter_reduce_needs(aten.scatter_reduce.two, (x, 0, x, x, "amax"), {}) == set()


SPECIAL = {
    "airy_ai": lambda x: torch.special.airy_ai(x) * 2,
    "bessel_j0": lambda x: torch.special.bessel_j0(x) + 1,
    "modified_bessel_k0": lambda x: torch.special.modified_bessel_k0(x),
    "zeta": lambda x: torch.special.zeta(x + 1, x),
    "polygamma": lambda x: torch.polygamma(2, x + 1),
    "igamma": lambda x: torch.igamma(x + 1, x),
    "chebyshev_t": lambda x: torch.special.chebyshev_polynomial_t(x, 3),
    "frexp": lambda x: torch.frexp(x)[0],
    "ldexp_int_exponent": lambda x: torch.ldexp(x, (x * 4).to(torch.int32)),
}


@pytest.mark.parametrize("name", list(SPECIAL))
def test_special_functions_are_host_fallbacks(name):
    f = SPECIAL[name]
    x = torch.rand(6, 5) + 0.1
    out, got = on_card(f, x)
    torch.testing.assert_close(out, f(x), equal_nan=True)
    assert compiled_fallbacks() and got.fallbacks


SCATTER = {
    "index_add": lambda x, i, s: x.index_add(0, i, s),
    "index_put_accumulate": lambda x, i, s: x.index_put((i,), s, accumulate=True),
    "scatter_add": lambda x, i, s: x.scatter_add(0, i.view(4, 1).expand(4, 5), s),
    "scatter_reduce_sum": lambda x, i, s: x.scatter_reduce(0, i.view(4, 1).expand(4, 5), s, "sum",
                                                        include_self=False),
    "scatter_reduce_add": lambda x, i, s: x.scatter(0, i.view(4, 1).expand(4, 5), s, reduce="add"),
    "put_accumulate": lambda x, i, s: x.put(i, s[:, 0], accumulate=True),
    # two re-inplaced index_put_ fallbacks in one graph: the first result must keep its storage
    "two_index_adds": lambda x, i, s: (x.index_fill(0, i, 0).index_add(0, i, s),
                                       torch.zeros_like(x).index_add(0, i, torch.ones_like(s))),
    "index_reduce_mean": lambda x, i, s: x.index_reduce(0, i, s, "mean", include_self=False),
}


@pytest.mark.parametrize("name", list(SCATTER))
def test_accumulating_scatters_are_host_fallbacks(name):
    f = SCATTER[name]
    x, i, s = torch.rand(6, 5), torch.tensor([0, 2, 2, 1]), torch.rand(4, 5)
    out, _ = on_card(f, x, i, s)
    torch.testing.assert_close(out, f(x, i, s))
    assert compiled_fallbacks()


def test_plain_index_put_stays_on_the_card():
    f = lambda x, i, s: x.index_put((i,), s)
    x, i, s = torch.rand(6, 5), torch.tensor([0, 3, 1]), torch.rand(3, 5)
    out, got = on_card(f, x, i, s)
    torch.testing.assert_close(out, f(x, i, s))
    assert compiled_fallbacks() == {} and got.kernels


def test_strict_mode_names_the_special_function():
    x = torch.rand(8, device="spyre")
    with torch.spyre.fallback_mode("strict"), torch._inductor.config.patch(fx_graph_cache=False):
        with pytest.raises(Exception, match=r"special_bessel_j0.*no device kernel"):
            _compile(lambda t: torch.special.bessel_j0(t) + 1, x)


def test_cpu_keeps_inductors_special_function_kernel():
    f = lambda x: torch.special.bessel_j0(x) + 1
    x = torch.rand(16)
    torch._dynamo.reset()
    out, code = run_and_get_code(torch.compile(f), x)
    torch.testing.assert_close(out, f(x))
    assert "bessel_j0" in "\n".join(code) and compiled_fallbacks() == {}


# -- 4. div_rn -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_floor_divide_runs_on_the_card(dtype):
    assert OPS["div_rn"].unit == "vector"
    a = torch.tensor([7.0, -7.0, 7.5, -0.5, 1e-3, 6.0, 5.0]).to(dtype)
    b = torch.tensor([2.0, 2.0, -2.5, 3.0, 7.0, 3.0, -0.3]).to(dtype)
    f = lambda a, b: torch.floor_divide(a, b) + torch.div(a, b, rounding_mode="floor")
    out, got = on_card(f, a, b)
    torch.testing.assert_close(out, f(a, b))
    assert compiled_fallbacks() == {} and got.kernels


# -- 5. floor/ceiling index terms ---------------------------------------------------------------------
def test_floor_of_a_rational_index_term_is_exact():
    x = sym("x")
    e = sympy.floor(8 * ModularIndexing(x, 7, 5) / 5 + sympy.Rational(12, 5))
    xs = torch.arange(300)
    assert torch.equal(compile_expr(e)({"x": xs}), (8 * ((xs // 7) % 5) + 12) // 5)
    c = sympy.ceiling(3 * x / 4 - sympy.Rational(1, 2))
    assert torch.equal(compile_expr(c)({"x": xs}), -((-(3 * xs - 2)) // 4))
    with pytest.raises(NotImplementedError, match="floor"):
        compile_expr(sympy.floor(sympy.Symbol("y", real=True) / 2))


@pytest.mark.parametrize("out_size", [(5, 4), (3, 7)])
def test_adaptive_avg_pool2d_compiles_for_the_card(out_size):
    f = lambda x: F.adaptive_avg_pool2d(x, out_size)
    x = torch.randn(2, 3, 7, 9)
    out, got = on_card(f, x)
    torch.testing.assert_close(out, f(x))
    assert compiled_fallbacks() == {} and got.kernels
