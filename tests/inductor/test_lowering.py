"""Spyre-only lowerings: conv2d as an implicit GEMM on the systolic array, cumsum/cumprod as
masked reductions. Every case checks the result against CPU, that no op ran as a host fallback,
and (for convolutions) that the program holds a real systolic Matmul: operand a varies along an
output dim operand b does not vary along and vice versa."""

import pytest
import torch
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code

import vspyre.runtime
from vspyre.ir.program import Matmul


@pytest.fixture
def programs(monkeypatch):
    """The tile programs launched during the test."""
    seen = []
    real = vspyre.runtime.launch

    def launch(program, *args, **kwargs):
        seen.append(program)
        return real(program, *args, **kwargs)

    monkeypatch.setattr(vspyre.runtime, "launch", launch)
    return seen


def _gemms(programs):
    """(a dims, b dims, contraction dim) of every Matmul launched."""
    out = []
    for p in programs:
        an = p.analysis
        for op in p.body:
            if isinstance(op, Matmul):
                out.append((set(an.dims[op.a]), set(an.dims[op.b]), op.dim))
    return out


def _compile_run(fn, *args):
    torch._dynamo.reset()
    dev = [a.to("spyre") if isinstance(a, torch.Tensor) else a for a in args]
    out, code = run_and_get_code(torch.compile(fn, dynamic=False), *dev)
    return out, "\n".join(code)


CONV_CASES = {
    "bias_relu": dict(x=(2, 3, 9, 9), w=(5, 3, 3, 3), bias=True, kw=dict(stride=1, padding=1)),
    "no_bias_stride2": dict(x=(2, 4, 10, 10), w=(6, 4, 3, 3), bias=False, kw=dict(stride=2)),
    "pad_dilation": dict(x=(1, 3, 12, 11), w=(4, 3, 3, 3), bias=True, kw=dict(padding=(2, 1), dilation=2)),
    "odd_channels_1x1": dict(x=(2, 7, 6, 5), w=(13, 7, 1, 1), bias=True, kw=dict()),
    "rect_kernel_stride": dict(x=(1, 5, 9, 13), w=(3, 5, 2, 4), bias=False, kw=dict(stride=(2, 3), padding=1)),
}


@pytest.mark.parametrize("name", list(CONV_CASES))
def test_conv2d_is_an_implicit_gemm(name, programs):
    c = CONV_CASES[name]
    torch.manual_seed(0)
    x, w = torch.randn(c["x"]), torch.randn(c["w"])
    b = torch.randn(c["w"][0]) if c["bias"] else None

    def fn(x, w, b):
        return F.conv2d(x, w, b, **c["kw"]).relu()

    out, code = _compile_run(fn, x, w, b)
    torch.testing.assert_close(out.cpu(), fn(x, w, b), rtol=1e-4, atol=1e-4)
    assert torch.spyre.fallback_stats() == {}
    assert "extern_kernels.convolution" not in code and "k.matmul(" in code
    # one kernel: the GEMM with bias and relu as its epilogue
    assert code.count("= TileKernel(") == 1 and len(programs) == 1
    (a_dims, b_dims, k), = _gemms(programs)
    assert k in a_dims and k in b_dims
    assert a_dims - b_dims and b_dims - a_dims   # M (output pixels) and N (output channels)


def test_grouped_and_depthwise_conv_batch_over_groups(programs):
    torch.manual_seed(0)
    x = torch.randn(2, 8, 7, 7)
    w_dw, w_g = torch.randn(8, 1, 3, 3), torch.randn(12, 2, 3, 3)

    def fn(x, w_dw, w_g):
        y = F.conv2d(x, w_dw, padding=1, groups=8)
        return F.conv2d(y, w_g, stride=2, groups=4)

    out, code = _compile_run(fn, x, w_dw, w_g)
    torch.testing.assert_close(out.cpu(), fn(x, w_dw, w_g), rtol=1e-4, atol=1e-4)
    assert torch.spyre.fallback_stats() == {}
    assert "extern_kernels.convolution" not in code
    gemms = _gemms(programs)
    assert len(gemms) == 2
    # groups=4, 3 output channels per group: (n, group) is a batch dim both operands share
    assert any((a - b) and (b - a) and (a & b) - {k} for a, b, k in gemms)


def test_transposed_conv_keeps_the_upstream_path():
    x, w = torch.randn(1, 4, 5, 5), torch.randn(4, 3, 3, 3)
    fn = lambda x, w: F.conv_transpose2d(x, w, stride=2)  # noqa: E731
    out, code = _compile_run(fn, x, w)
    torch.testing.assert_close(out.cpu(), fn(x, w), rtol=1e-4, atol=1e-4)
    assert "extern_kernels.convolution" in code


def test_other_devices_keep_the_upstream_lowerings():
    from torch._inductor.lowering import lowerings

    from vspyre.inductor.lowering import _conv_as_gemm, _scan_as_reduction

    torch._dynamo.reset()
    torch.compile(lambda x: x + 1)(torch.ones(2, device="spyre"))   # registers the extension
    aten = torch.ops.aten
    for op in (aten.convolution.default, aten.cumsum.default, aten.cumprod.default):
        assert lowerings[op]._vspyre

    class CpuNode:  # what the dispatch looks at first: the device of the IR node
        def get_device(self):
            return torch.device("cpu")

    cpu = CpuNode()
    assert _conv_as_gemm(cpu, cpu, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1) is None
    assert _scan_as_reduction(cpu, 0, None, "sum") is None


def test_cumsum_int64_position_ids():
    # what GPT-2 / Llama do with the attention mask
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]], dtype=torch.int64)

    def fn(m):
        pos = m.long().cumsum(-1) - 1
        return pos.masked_fill(m == 0, 1)

    out, code = _compile_run(fn, mask)
    assert out.dtype == torch.int64
    assert torch.equal(out.cpu(), fn(mask))
    assert torch.spyre.fallback_stats() == {}
    assert "aten.cumsum" not in code.split("def call")[-1]          # no host fallback call


def test_cumsum_cumprod_float_bool_dims():
    torch.manual_seed(0)
    x = torch.randn(3, 33, 5)

    def fn(x):
        return x.cumsum(1), torch.cumprod(x, -1), torch.cumsum(x > 0, 0), x.cumsum(0, dtype=torch.float16)

    outs, _ = _compile_run(fn, x)
    for o, r in zip(outs, fn(x)):
        assert o.dtype == r.dtype
        torch.testing.assert_close(o.cpu(), r, rtol=1e-4, atol=1e-4 if r.dtype != torch.float16 else 1e-2)
    assert torch.spyre.fallback_stats() == {}


def test_long_cumsum_keeps_the_upstream_behaviour():
    x = torch.ones(4100)
    out, _ = _compile_run(lambda x: x.cumsum(0), x)
    torch.testing.assert_close(out.cpu(), x.cumsum(0))
    assert torch.spyre.fallback_stats() == {"aten::cumsum": 1}
