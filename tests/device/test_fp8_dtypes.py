"""fp8 tensors on the card (float8_e4m3fn, float8_e5m2): copies, views, casts both ways, memory
accounting and printing against the CPU; casts to fp8 inside a program round and saturate as
PyTorch's CPU cast does (e4m3fn: +-448 for every larger value, inf included; e5m2: inf past its
range; NaN stays NaN)."""

import pytest
import torch

from vspyre import hardware
from vspyre.compat import dynamo_reset

FP8 = hardware.fp8_dtypes()
pytestmark = pytest.mark.skipif(len(FP8) != 2, reason="this torch lacks the fp8 dtypes")

# values round to nearest even, tie cases, saturating/overflowing ones, specials, subnormals
SPECIAL = [0.0, -0.0, 1.0, 0.3, -2.7, 0.1234, -0.0137, 5.3e-4, 1.7e-3, 1e-7, 448.0, 449.0, 464.0, 480.0, 500.0,
           57344.0, 61440.0, 1e5, 1e6, -1e6, float("inf"), float("-inf"), float("nan")]


def _values(n: int = 256) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.cat([torch.tensor(SPECIAL), torch.randn(n, generator=g) * 100])


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of an fp8 tensor (NaN compares equal to NaN, -0 apart from +0)."""
    return t.cpu().contiguous().view(torch.uint8)


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_fp8_is_a_card_dtype(dtype):
    assert dtype in hardware.card_dtypes()
    assert str(dtype).removeprefix("torch.") in hardware.dtype_names()
    t = torch.empty(5, dtype=dtype, device="spyre")
    assert t.dtype == dtype and t.device.type == "spyre" and t.element_size() == 1


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_copies_round_trip_bit_exactly(dtype):
    c = _values().to(dtype)
    d = c.to("spyre")
    assert d.dtype == dtype
    assert torch.equal(_bits(d), _bits(c))
    e = d.clone()
    assert torch.equal(_bits(e), _bits(c))
    f = torch.empty_like(d).copy_(d)                 # device -> device
    assert torch.equal(_bits(f), _bits(c))
    if torch.spyre.device_count() > 1:
        assert torch.equal(_bits(d.to("spyre:1")), _bits(c))


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_views(dtype):
    c = _values(256).to(dtype)[:272].reshape(16, 17)
    d = c.to("spyre")
    for view in (lambda t: t.t(), lambda t: t[3:9, 2::3], lambda t: t.reshape(17, 16)[::2],
                 lambda t: t.unsqueeze(0).expand(2, 16, 17), lambda t: t.view(torch.uint8)):
        assert torch.equal(_bits(view(d)), _bits(view(c)))
    d[2:4, :5] = c[8:10, 5:10].to("spyre")           # writes through a view
    c[2:4, :5] = c[8:10, 5:10]
    assert torch.equal(_bits(d), _bits(c))


@pytest.mark.parametrize("src", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_casts_to_fp8_round_saturate_and_keep_nan_like_the_cpu(dtype, src):
    x = _values().to(src)
    ref = x.to(dtype)
    got = x.to("spyre").to(dtype)
    assert got.dtype == dtype and got.device.type == "spyre"
    assert torch.equal(_bits(got), _bits(ref))
    f = got.cpu().float()[:len(SPECIAL)]
    big = torch.tensor(SPECIAL) > 448
    if dtype == torch.float8_e4m3fn:     # PyTorch's e4m3fn cast saturates (the format has no inf)
        assert f[big].eq(448).all() and f[SPECIAL.index(float("-inf"))] == -448
    else:                                # e5m2 keeps 57344, overflows to inf past it
        assert f[SPECIAL.index(57344.0)] == 57344.0 and torch.isinf(f[SPECIAL.index(1e6)])
    assert torch.isnan(f[-1])                # SPECIAL ends with NaN


@pytest.mark.parametrize("dst", [torch.float32, torch.float16, torch.bfloat16, torch.int32], ids=str)
@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_casts_from_fp8_like_the_cpu(dtype, dst):
    c = _values().to(dtype)
    if not dst.is_floating_point:
        c = c[torch.isfinite(c.float())]
    ref = c.to(dst)
    got = c.to("spyre").to(dst)
    assert got.dtype == dst
    torch.testing.assert_close(got.cpu(), ref, rtol=0, atol=0, equal_nan=True)
    # fp8 -> fp8 of the other format, on the card
    other = [d for d in FP8 if d != dtype][0]
    assert torch.equal(_bits(c.to("spyre").to(other)), _bits(c.to(other)))


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_memory_accounting_in_whole_sticks(dtype):
    start = torch.spyre.memory_allocated()
    t = torch.empty(1000, dtype=dtype, device="spyre")      # 1000 bytes -> 8 sticks
    assert torch.spyre.memory_allocated() - start == 1024
    u = torch.empty(129, dtype=dtype, device="spyre")       # 129 bytes -> 2 sticks
    assert torch.spyre.memory_allocated() - start == 1024 + 256
    del t, u
    assert torch.spyre.memory_allocated() == start


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_printing_shows_values_dtype_and_device(dtype):
    c = torch.tensor([1.0, -2.5, 448.0, float("nan")]).to(dtype)
    s = repr(c.to("spyre"))
    flat = lambda r: " ".join(r.split())  # noqa: E731 - the longer line wraps elsewhere
    assert flat(s) == flat(repr(c)).replace("], dtype=", "], device='spyre:0', dtype="), s
    assert str(c.to("spyre")) == s

@pytest.mark.parametrize("dtype", FP8, ids=str)
@pytest.mark.parametrize("where", ["in_program", "at_store"])
def test_casts_to_fp8_inside_a_compiled_program(dtype, where):
    """A cast to fp8 inside a kernel rounds where it is (a quantisation feeding more work), not
    only where the kernel writes memory; the standalone compiler builds the program."""
    x = _values()
    if where == "in_program":
        def fn(x):
            return (x * 3).to(dtype).to(torch.float32) - x
    else:
        def fn(x):
            return (x * 3).to(dtype)
    dynamo_reset()
    try:
        got = torch.compile(fn, backend="spyre_standalone")(x.to("spyre"))
    finally:
        dynamo_reset()
    ref = fn(x)
    if where == "in_program":
        torch.testing.assert_close(got.cpu(), ref, rtol=0, atol=0, equal_nan=True)
    else:
        assert got.dtype == dtype and torch.equal(_bits(got), _bits(ref))
    assert torch.spyre.fallback_stats() == {}


def test_registry_cast_to_fp8_is_pytorchs_cast():
    """The op registry's ``to`` (what every path's programs run) on fp32 register values."""
    from vspyre.ir.ops import _cast_fn
    x = _values()
    for dtype in FP8:
        torch.testing.assert_close(_cast_fn(dtype)(x), x.to(dtype).float(), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(_cast_fn(torch.float16)(x), x, rtol=0, atol=0, equal_nan=True)  # others round at store
