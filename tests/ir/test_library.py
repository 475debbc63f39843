"""The routing library programs (vspyre.ir.library) in fast and checked mode against torch: the
checked executor runs them tile by tile on the planned schedule, proving the plan."""

import pytest
import torch

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
