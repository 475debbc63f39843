"""The routing library programs (vspyre.ir.library) in fast and checked mode against torch: the
checked executor runs them tile by tile on the planned schedule, proving the plan."""

import pytest
import torch
import torch.nn.functional as F

from vspyre import runtime
from vspyre.ir import library as L
from vspyre.ir.ops import DeviceAssertError


def _sp(t):
    return (t.dtype, tuple(t.shape), tuple(t.stride()))


@pytest.mark.parametrize("mode", ["fast", "checked"])
def test_routing_programs_match_torch(mode):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 40, generator=g)
    v, i = torch.empty(6, 3), torch.empty(6, 3, dtype=torch.int64)
    runtime.launch(L.topk(_sp(x), 3, _sp(v), _sp(i), True), x, v, i, mode=mode)
    want = torch.topk(x, 3)
    assert torch.equal(v, want.values) and torch.equal(i, want.indices)
    w = torch.randn(7, 4, 5, generator=g)
    a, b = torch.tensor([[0, 6], [-1, 3]]), torch.tensor([[1, 2], [3, 0]])
    o = torch.empty(2, 2, 5)
    runtime.launch(L.gather_rows(_sp(w), (_sp(a), _sp(b)), _sp(o)), w, a, b, o, mode=mode)
    assert torch.equal(o, w[a, b])
    s, idx = torch.zeros(5, 8), torch.tensor([[1, 3], [0, 0], [7, 2], [5, 5], [4, 6]])
    o = torch.empty(5, 8)
    runtime.launch(L.scatter_fill(_sp(s), _sp(idx), _sp(o), 1.0), s, idx, o, mode=mode)
    assert torch.equal(o, s.scatter(-1, idx, 1.0))
    base, rows, src = torch.randn(6, 3, generator=g), torch.tensor([0, 2, 0, 5, 2]), torch.randn(5, 3, generator=g)
    o = torch.empty(6, 3)
    runtime.launch(L.index_add(_sp(base), _sp(rows), _sp(src), _sp(o)), base, rows, src, o, mode=mode)
    torch.testing.assert_close(o, base.index_add(0, rows, src))
    c = torch.randint(0, 5, (3, 9), generator=g)
    o = torch.empty(3, 9, dtype=torch.int64)
    runtime.launch(L.scan("sum", _sp(c), 1, _sp(o)), c, o, mode=mode)
    assert torch.equal(o, c.cumsum(1))
    for desc in (False, True):
        xs = torch.tensor([[2.0, 1.0, 2.0, float("nan"), 1.0, -float("inf"), 0.0]])
        r, sv, si = torch.empty(1, 7, dtype=torch.int64), torch.empty(1, 7), torch.empty(1, 7, dtype=torch.int64)
        runtime.launch(L.sort_ranks(_sp(xs), _sp(r), desc), xs, r, mode=mode)
        runtime.launch(L.sort_select(_sp(xs), _sp(r), _sp(sv), _sp(si)), xs, r, sv, si, mode=mode)
        want = torch.sort(xs, stable=True, descending=desc)         # ties by index, NaN the largest
        assert torch.equal(si, want.indices) and torch.allclose(sv, want.values, equal_nan=True)
    h = torch.randint(0, 4, (50,), generator=g).to(torch.int32)
    o = torch.empty(4, dtype=torch.int32)
    runtime.launch(L.histc(_sp(h), 4, 0.0, 4.0, _sp(o)), h, o, mode=mode)
    assert torch.equal(o.float(), torch.histc(h.float(), 4, 0, 4))


def test_device_assert_stops_the_kernel_with_its_message():
    cond = torch.tensor([True, False])
    ok = torch.empty(1, dtype=torch.bool)
    prog = L.check(_sp(cond), _sp(ok), "every class index must be < 5")
    with pytest.raises(DeviceAssertError, match="device-side assertion failed: every class index must be < 5"):
        runtime.launch(prog, cond, ok)
    runtime.launch(prog, torch.tensor([True, True]), ok)
    assert ok.item()


@pytest.mark.parametrize("case", [
    dict(x=(2, 6, 9, 11), w=(8, 3, 3, 3), stride=(2, 1), padding=(1, 1), dilation=(1, 2), groups=2, bias=True),
    dict(x=(1, 4, 7, 7), w=(4, 4, 1, 1), stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, bias=False),
    dict(x=(2, 4, 17), w=(6, 2, 5), stride=(3,), padding=(2,), dilation=(1,), groups=2, bias=True),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_conv_fast_host_form_and_tile_program_agree(case, dtype):
    """Fast mode computes the convolution with torch's own conv (``library.HOST_FORMS``); checked
    mode runs the implicit GEMM tile by tile. Both give torch's convolution, rounded where stored."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(case["x"], generator=g).to(dtype)
    w = torch.randn(case["w"], generator=g).to(dtype)
    bias = torch.randn(case["w"][0], generator=g).to(dtype) if case["bias"] else None
    f = F.conv1d if len(case["x"]) == 3 else F.conv2d
    ref = f(x.float(), w.float(), None if bias is None else bias.float(), case["stride"], case["padding"],
            case["dilation"], case["groups"])
    outs = {}
    for mode in ("fast", "checked"):
        out = torch.empty(ref.shape, dtype=dtype)
        prog = L.conv(_sp(x), _sp(w), _sp(bias) if bias is not None else None, _sp(out), case["stride"],
                      case["padding"], case["dilation"], case["groups"])
        assert prog.meta["host"][0] == "conv"
        runtime.launch(prog, x, w, *([bias] if bias is not None else []), out, mode=mode)
        outs[mode] = out
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=4e-3, atol=4e-3)
    torch.testing.assert_close(outs["fast"].float(), ref, **tol)
    torch.testing.assert_close(outs["checked"].float(), ref, **tol)
    torch.testing.assert_close(outs["fast"], outs["checked"], **tol)


@pytest.mark.parametrize("mode", ["fast", "checked"])
def test_index_put_takes_the_last_source_per_row(mode):
    """``x.index_put((idx,), values)``: repeated indices (the last one wins, as on the CPU),
    negative ones, rows no index names keep x; an index out of range stops the kernel."""
    g = torch.Generator().manual_seed(2)
    x, v = torch.randn(7, 3, generator=g), torch.randn(5, 3, generator=g)
    idx = torch.tensor([2, -1, 2, 0, 6])
    out = torch.empty(7, 3)
    prog = L.index_put(_sp(x), _sp(idx), _sp(v), _sp(out))
    runtime.launch(prog, x, idx, v, out, mode=mode)
    assert torch.equal(out, x.index_put((idx,), v))
    with pytest.raises(DeviceAssertError, match="index_put"):
        runtime.launch(prog, x, torch.tensor([0, 1, 7, 2, 3]), v, out, mode=mode)
