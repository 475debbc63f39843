"""Fast and checked mode agree with a CPU reference on hand-written programs."""

import pytest
import torch

from vspyre import hardware, numerics, runtime

from . import programs as P

torch.manual_seed(0)


def _tol(dtype):
    return dict(atol=2e-2, rtol=2e-2) if dtype == torch.float16 else dict(atol=1e-4, rtol=1e-4)


def _run_both(prog, inputs, out_shape, dtype):
    outs = {}
    for mode in ("fast", "checked"):
        out = torch.full(out_shape, float("nan"), dtype=dtype)
        facts = runtime.launch(prog, *inputs, out, mode=mode)
        outs[mode] = (out, facts)
    return outs


def _check(prog, ref, inputs, out_shape, dtype):
    outs = _run_both(prog, inputs, out_shape, dtype)
    want = numerics.store_cast(ref(*inputs), dtype)
    for mode, (out, _) in outs.items():
        torch.testing.assert_close(out.float(), want.float(), **_tol(dtype), msg=lambda m: f"{prog.name} {mode}: {m}")
    # same op semantics, same numerics: bitwise equal up to summation order
    torch.testing.assert_close(outs["fast"][0].float(), outs["checked"][0].float(), **_tol(dtype))
    return outs["checked"][1]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_elementwise(dtype):
    prog, ref = P.elementwise(dtype)
    x, w = torch.randn(300, 256).to(dtype), torch.randn(256).to(dtype)
    facts = _check(prog, ref, (x, w), (300, 256), dtype)
    assert facts["cores"] > 1


def test_elementwise_fast_equals_checked_bitwise():
    prog, _ = P.elementwise(torch.float16)
    x, w = torch.randn(64, 256).half(), torch.randn(256).half()
    a, b = torch.empty(64, 256).half(), torch.empty(64, 256).half()
    runtime.launch(prog, x, w, a, mode="fast")
    runtime.launch(prog, x, w, b, mode="checked")
    assert torch.equal(a, b)


def test_row_reduction_tiled_over_r():
    prog, ref = P.row_sum(tile={"x0": 8, "r0": 64})      # looped reduction: r0 in 64-wide tiles
    x = torch.randn(40, 1000)
    _check(prog, ref, (x,), (40,), torch.float32)


def test_column_reduction():
    prog, ref = P.col_max()
    x = torch.randn(333, 96)
    _check(prog, ref, (x,), (96,), torch.float32)


def test_matmul_with_epilogue_fp16():
    prog, ref = P.matmul_bias_relu(torch.float16)
    a, b, bias = torch.randn(96, 80).half(), torch.randn(80, 128).half(), torch.randn(128).half()
    _check(prog, ref, (a, b, bias), (96, 128), torch.float16)


def test_matmul_tiled_k_accumulates():
    prog, ref = P.matmul_bias_relu(torch.float32, tile={"x0": 16, "x1": 32, "r0": 16})
    a, b, bias = torch.randn(40, 50), torch.randn(50, 64), torch.randn(64)
    _check(prog, ref, (a, b, bias), (40, 64), torch.float32)


def test_matmul_with_empty_rows():
    """M == 0 (mm of a [0, K] matrix): the result keeps its 0 rows instead of the broadcast size 1
    of the operand that does not vary along M (the standalone compiler's mm crashed here)."""
    prog, ref = P.matmul_bias_relu(torch.float32)
    a, b, bias = torch.randn(0, 5), torch.randn(5, 10), torch.randn(10)
    for mode in ("fast", "checked"):
        out = torch.empty(0, 10)
        facts = runtime.launch(prog, a, b, bias, out, mode=mode)
        assert out.shape == (0, 10) and ref(a, b, bias).shape == (0, 10)
        assert (facts is None) if mode == "fast" else (facts["peak_scratchpad_bytes"] >= 0)


def test_softmax():
    prog, ref = P.softmax()
    x = torch.randn(70, 128).half() * 4
    _check(prog, ref, (x,), (70, 128), torch.float16)


def test_layernorm():
    prog, ref = P.layernorm()
    x, w, b = torch.randn(50, 192).half(), torch.randn(192).half(), torch.randn(192).half()
    _check(prog, ref, (x, w, b), (50, 192), torch.float16)


def test_splitk_matmul_ring():
    prog, ref = P.splitk_matmul()
    a, b = torch.randn(16, 512), torch.randn(512, 64)
    facts = _check(prog, ref, (a, b), (16, 64), torch.float32)
    assert facts["ring_transfers"] == 3          # 4 partials -> 3 hops toward the owner


def test_splitk_ring_with_parallel_split():
    prog, ref = P.splitk_matmul(M=32, parts=4, divide=[("x0", 2), ("r0", 4)])
    a, b = torch.randn(32, 512), torch.randn(512, 64)
    facts = _check(prog, ref, (a, b), (32, 64), torch.float32)
    assert facts["cores"] == 8 and facts["ring_transfers"] == 6


def test_ieee_vs_dl16_numerics():
    prog, _ = P.elementwise(torch.float16)
    x, w = torch.randn(64, 256).half(), torch.randn(256).half()
    outs = {}
    for mode in ("dl16", "ieee"):
        with hardware.override(numerics=mode):
            out = torch.empty(64, 256).half()
            runtime.launch(prog, x, w, out)
            outs[mode] = out
    t = x.float() * w.float() + 1
    ref = torch.sigmoid(1.702 * t) * t
    assert torch.equal(outs["ieee"], ref.half())                 # plain IEEE rounding
    assert torch.equal(outs["dl16"], numerics.round_to_dl16(ref).half())
    assert not torch.equal(outs["ieee"], outs["dl16"])


def test_gather_indirect_and_masked_load():
    """embedding: y[i, j] = table[idx[i], j]; masked load pads columns >= 100 with -1."""
    from vspyre.ir import ProgramBuilder
    b = ProgramBuilder("embed", source="test")
    idx = b.input("idx", torch.int64, (32,))
    tab = b.input("tab", torch.float32, (50, 100))
    y = b.output("y", torch.float32, (32, 128))
    i, j = b.dim("x0", 32), b.dim("x1", 128)
    row = b.load(idx, i)
    mask = b.lt(b.index_value(j), 100)
    v = b.load(tab, f"{row}*100 + x1", mask=mask, other=-1.0)
    b.store(y, y.index(i, j), v)
    prog = b.build()
    ids = torch.randint(0, 50, (32,))
    table = torch.randn(50, 100)
    want = torch.full((32, 128), -1.0)
    want[:, :100] = table[ids]
    for mode in ("fast", "checked"):
        out = torch.zeros(32, 128)
        runtime.launch(prog, ids, table, out, mode=mode)
        assert torch.equal(out, want), mode


def test_index_value_reading_a_loaded_value():
    """An index_expr over a computed value (max-pool indices: window offset -> input position)
    is evaluated per launch in fast mode and per tile in checked mode, like an indirect load."""
    from vspyre.ir import ProgramBuilder
    b = ProgramBuilder("offsets_to_index", source="test")
    off = b.input("off", torch.int8, (4, 6))
    y = b.output("y", torch.int64, (4, 6))
    i, j = b.dim("x0", 4), b.dim("x1", 6)
    o = b.to(b.load(off, off.index(i, j)), torch.int64)
    b.store(y, y.index(i, j), b.index_value(f"10*x0 + 3*FloorDiv({o}, 3) + ModularIndexing({o}, 1, 3) + x1"))
    prog = b.build()
    assert prog.body[-2].inputs == (o,)
    offs = torch.randint(0, 9, (4, 6), dtype=torch.int8)
    o64 = offs.long()
    want = 10 * torch.arange(4)[:, None] + 3 * (o64 // 3) + o64 % 3 + torch.arange(6)
    for mode in ("fast", "checked"):
        out = torch.empty(4, 6, dtype=torch.int64)
        runtime.launch(prog, offs, out, mode=mode)
        assert torch.equal(out, want), mode


def test_views_floordiv_modular_index():
    """y (n, 6) = x viewed as (n*2, 3): index through FloorDiv/ModularIndexing over a flat dim."""
    from vspyre.ir import ProgramBuilder
    b = ProgramBuilder("view_copy", source="test")
    x = b.input("x", torch.float32, (8, 3))
    y = b.output("y", torch.float32, (4, 6))
    f = b.dim("x0", 24)
    v = b.load(x, "3*FloorDiv(x0, 3) + ModularIndexing(x0, 1, 3)")
    b.store(y, "6*FloorDiv(x0, 6) + ModularIndexing(x0, 1, 6)", b.mul(v, 2.0))
    prog = b.build()
    xx = torch.randn(8, 3)
    for mode in ("fast", "checked"):
        out = torch.empty(4, 6)
        runtime.launch(prog, xx, out, mode=mode)
        assert torch.equal(out, (xx * 2).reshape(4, 6)), mode


def test_argmax_and_int_buffers():
    from vspyre.ir import ProgramBuilder
    b = ProgramBuilder("argmax", source="test")
    x = b.input("x", torch.float32, ("n", 200))
    y = b.output("y", torch.int32, ("n",))
    i, r = b.dim("x0", "n"), b.rdim("r0", 200)
    b.store(y, i, b.reduce("argmax", b.load(x, x.index(i, r)), r))
    b.tile(x0=4, r0=64)
    prog = b.build()
    xx = torch.randn(9, 200)
    for mode in ("fast", "checked"):
        out = torch.empty(9, dtype=torch.int32)
        runtime.launch(prog, xx, out, mode=mode)
        assert torch.equal(out, xx.argmax(1).int()), mode


def test_noncontiguous_input_strides():
    prog, ref = P.row_sum(tile={"r0": 32})
    base = torch.randn(64, 40)
    xt = base.t()                      # (40, 64) with strides (1, 40)
    from vspyre.ir import ProgramBuilder
    b = ProgramBuilder("row_sum_t", source="test")
    x = b.input("x", torch.float32, (40, 64), strides=(1, 40))
    y = b.output("y", torch.float32, (40,))
    i, r = b.dim("x0", 40), b.rdim("r0", 64)
    b.store(y, i, b.reduce("sum", b.load(x, x.index(i, r)), r))
    p2 = b.build()
    for mode in ("fast", "checked"):
        out = torch.empty(40)
        runtime.launch(p2, xt, out, mode=mode)
        torch.testing.assert_close(out, xt.sum(1))
    with pytest.raises(runtime.LaunchError, match="strides"):
        runtime.launch(p2, xt.contiguous(), torch.empty(40))


def test_inplace_reuse_never_writes_inputs():
    """identity/to may alias a loaded buffer view; the fast path must not compute into it."""
    from vspyre.ir import ProgramBuilder
    b = ProgramBuilder("alias", source="test")
    x = b.input("x", torch.float32, (64,))
    y = b.output("y", torch.float32, (64,))
    i = b.dim("x0", 64)
    v = b.to(b.identity(b.load(x, i)), torch.float32)
    b.store(y, i, b.exp(b.add(v, 1.0)))
    prog = b.build()
    xx = torch.randn(64)
    keep = xx.clone()
    out = torch.empty(64)
    runtime.launch(prog, xx, out)
    assert torch.equal(xx, keep)
    torch.testing.assert_close(out, torch.exp(keep + 1))
