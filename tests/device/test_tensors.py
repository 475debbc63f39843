"""Creation, round trips, views and aliasing on the spyre device."""

import pytest
import torch

SUPPORTED = [torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.int16, torch.int32,
             torch.int64, torch.uint8, torch.bool]


def _sample(dtype, shape=(5, 7)):
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    lo, hi = (0, 255) if dtype == torch.uint8 else (-100, 100)
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", SUPPORTED, ids=str)
def test_round_trip_every_supported_dtype(dtype):
    x = _sample(dtype)
    d = x.to("spyre")
    assert d.device == torch.device("spyre", 0)
    assert d.dtype == dtype and d.shape == x.shape
    assert torch.equal(d.cpu(), x)


@pytest.mark.parametrize("dtype", SUPPORTED, ids=str)
def test_factory_and_fill(dtype):
    z = torch.zeros(3, 4, dtype=dtype, device="spyre")
    assert torch.equal(z.cpu(), torch.zeros(3, 4, dtype=dtype))
    z.fill_(1)
    assert torch.equal(z.cpu(), torch.ones(3, 4, dtype=dtype))
    assert torch.spyre.fallback_stats() == {}  # empty, zeros (fill_) and copies are native


def test_views_with_storage_offset_round_trip():
    x = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5)
    d = x.to("spyre")
    cases = {
        "slice": lambda t: t[1:, 1:3],
        "step": lambda t: t[:, ::2, 1::2],
        "transpose": lambda t: t.transpose(0, 2),
        "select": lambda t: t[2],
        "permute": lambda t: t.permute(2, 0, 1)[1:],
        "unfold": lambda t: t.reshape(-1).unfold(0, 4, 3),
        "diagonal": lambda t: t[0].diagonal(),
        "expand": lambda t: t[:, :1, :].expand(3, 4, 5),
    }
    for name, f in cases.items():
        v = f(d)
        assert v.untyped_storage().data_ptr() == d.untyped_storage().data_ptr(), name
        assert torch.equal(v.cpu(), f(x)), name
    assert torch.spyre.fallback_stats() == {}  # views are native


def test_non_contiguous_host_to_device():
    x = torch.randn(6, 8).t()[1:]
    d = x.to("spyre")
    assert torch.equal(d.cpu(), x)
    back = torch.empty(7, 6).t()
    back.copy_(d.t())
    assert torch.equal(back, x.t())


def test_in_place_on_view_writes_base():
    d = torch.zeros(4, 4, device="spyre")
    d[1:3, 1:3].add_(5)              # a device kernel on a view with a storage offset
    d.t()[0].fill_(2)                # native fill on a strided view
    expected = torch.zeros(4, 4)
    expected[1:3, 1:3] += 5
    expected.t()[0].fill_(2)
    assert torch.equal(d.cpu(), expected)
    assert torch.spyre.eager_kernel_stats()["calls"].get("aten::add_.Tensor") == 1
    assert torch.spyre.fallback_stats() == {}


def test_fallback_view_ops_alias_device_memory():
    d = torch.arange(12, dtype=torch.float32, device="spyre")
    parts = torch.split(d, 5)                      # may go through the fallback
    chunks = d.view(3, 4).unbind(0)
    for p in list(parts) + list(chunks):
        assert p.device.type == "spyre"
        assert p.untyped_storage().data_ptr() == d.untyped_storage().data_ptr()
    parts[1].mul_(10)
    assert d.cpu()[5:10].tolist() == [50.0, 60.0, 70.0, 80.0, 90.0]
    as_int = d.view(torch.int32)
    assert as_int.untyped_storage().data_ptr() == d.untyped_storage().data_ptr()
    assert torch.equal(as_int.cpu(), d.cpu().view(torch.int32))


def test_out_variant_resizes_device_output():
    a = torch.randn(3, 4)
    out = torch.empty(0, device="spyre")
    torch.mul(a.to("spyre"), 2.0, out=out)
    assert out.shape == (3, 4)
    assert torch.equal(out.cpu(), a * 2)
    mask = a > 0
    sel = torch.masked_select(a.to("spyre"), mask.to("spyre"))   # data-dependent output size
    assert torch.equal(sel.cpu(), torch.masked_select(a, mask))


def test_scalar_and_item():
    d = torch.tensor([3.5, -1.0], device="spyre")
    assert d[0].item() == 3.5
    assert d.sum().item() == 2.5
    assert int(torch.tensor(7, device="spyre")) == 7


def test_resize_and_set():
    d = torch.arange(4.0, device="spyre")
    d.resize_(2, 8)
    assert d.shape == (2, 8)
    assert d.cpu().reshape(-1)[:4].tolist() == [0.0, 1.0, 2.0, 3.0]
    e = torch.empty(0, device="spyre")
    e.set_(d.untyped_storage(), 2, (3,), (1,))
    assert e.cpu().tolist() == [2.0, 3.0, d.cpu().reshape(-1)[4].item()]


def test_autograd_on_device():
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 3)
    x = torch.randn(5, 8)
    ref = lin(x).square().sum()
    ref.backward()
    ref_grad = lin.weight.grad.clone()
    lin.zero_grad()
    lin_d = lin.to("spyre")
    out = lin_d(x.to("spyre")).square().sum()
    out.backward()
    assert lin_d.weight.grad.device.type == "spyre"
    torch.testing.assert_close(lin_d.weight.grad.cpu(), ref_grad)


def test_random_ops_follow_the_card_seed():
    torch.spyre.manual_seed(123)
    a = torch.randn(16, device="spyre").cpu()
    torch.spyre.manual_seed(123)
    b = torch.randn(16, device="spyre").cpu()
    assert torch.equal(a, b)
    torch.spyre.manual_seed(124)
    assert not torch.equal(torch.randn(16, device="spyre").cpu(), a)
    g = torch.Generator(device="spyre").manual_seed(5)
    c = torch.rand(8, device="spyre", generator=g).cpu()
    g.manual_seed(5)
    assert torch.equal(torch.rand(8, device="spyre", generator=g).cpu(), c)


def test_random_op_without_generator_argument_follows_the_card_seed():
    """native_dropout has no generator argument: its host fallback lends the host's default
    generator the card's state, so torch.spyre.manual_seed decides it and the host's state does not
    change."""
    x = torch.ones(64, device="spyre")
    torch.spyre.manual_seed(5)
    a = torch.nn.functional.dropout(x, 0.5, True).cpu()
    torch.manual_seed(1234)                      # reseeds the card too: reseed it after
    torch.spyre.manual_seed(5)
    before = torch.get_rng_state()
    b = torch.nn.functional.dropout(x, 0.5, True).cpu()
    assert torch.equal(a, b)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.spyre.fallback_stats() == {"aten::native_dropout": 2}
    c = torch.nn.functional.dropout(x, 0.5, True).cpu()   # the card's generator advanced
    assert not torch.equal(b, c)


def test_printing_shows_values_and_device():
    d = torch.tensor([1.5, 2.0], device="spyre")
    assert repr(d) == "tensor([1.5000, 2.0000], device='spyre:0')"
    assert torch.spyre.fallback_stats() == {}
