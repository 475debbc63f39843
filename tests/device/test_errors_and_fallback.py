"""Clear errors for bad input; host fallbacks counted, warned once, or forbidden."""

import warnings

import pytest
import torch

from vspyre.device.fallback import HostFallbackError


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex64, torch.complex128], ids=str)
def test_unsupported_dtypes_are_named(dtype):
    x = torch.zeros(3, dtype=dtype)
    with pytest.raises(TypeError) as exc:
        x.to("spyre")
    assert f"dtype {dtype} is not supported by the card" in str(exc.value)
    with pytest.raises(TypeError, match="not supported by the card"):
        torch.empty(2, dtype=dtype, device="spyre")
    assert torch.ones(2, device="spyre").sum().item() == 2.0   # still usable


def test_mixing_cpu_and_spyre_fails_like_cuda():
    a = torch.ones(3, device="spyre")
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device, but found "
                                           r"at least two devices, spyre:0 and cpu!"):
        a + torch.ones(3)
    b = torch.ones(3, device="spyre:1")
    with pytest.raises(RuntimeError, match="spyre:0 and spyre:1"):
        a + b
    # as on CUDA: a 0-dim CPU tensor is a scalar, CPU index tensors are accepted
    assert torch.equal((a + torch.tensor(2.0)).cpu(), torch.full((3,), 3.0))
    assert torch.equal(a[torch.tensor([0, 2])].cpu(), torch.ones(2))


def test_fallback_counted_per_op():
    a = torch.ones(4, device="spyre")
    for _ in range(3):
        torch.special.bessel_j0(a)                     # ops without a tile form
    torch.median(a)
    stats = torch.spyre.fallback_stats()
    assert stats["aten::special_bessel_j0.out"] == 3
    assert stats["aten::median"] == 1
    assert torch.spyre.fallback_time_stats()["aten::special_bessel_j0.out"] > 0
    torch.spyre.reset_fallback_stats()
    assert torch.spyre.fallback_stats() == {}


def test_warn_mode_warns_once_per_op():
    a = torch.ones(4, device="spyre")
    with torch.spyre.fallback_mode("warn"), warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        torch.special.bessel_j0(a)
        torch.special.bessel_j0(a)
        torch.median(a)
        torch.exp(a)                    # a device kernel: no warning
    msgs = [str(w.message) for w in rec]
    assert sum("aten::special_bessel_j0.out" in m for m in msgs) == 1
    assert sum("aten::median" in m for m in msgs) == 1
    assert not any("exp" in m for m in msgs)


def test_strict_mode_names_the_op_and_card_stays_usable():
    a = torch.ones(4, device="spyre")
    with torch.spyre.fallback_mode("strict"):
        with pytest.raises(HostFallbackError, match=r"aten::special_bessel_j0\.out has no device kernel"):
            torch.special.bessel_j0(a)
        assert torch.tanh(a).cpu().allclose(torch.tanh(torch.ones(4)))    # a device kernel
        # native ops still work in strict mode
        b = a.clone() if False else a.to("spyre:1")
        assert b.cpu().sum().item() == 4.0
    assert torch.special.bessel_j0(a).cpu().allclose(torch.special.bessel_j0(torch.ones(4)))
    assert torch.spyre.fallback_stats() == {"aten::special_bessel_j0.out": 1}


def test_invalid_device_index_is_clear():
    with pytest.raises(RuntimeError, match="invalid device index 7"):
        torch.ones(2).to("spyre:7")
    with pytest.raises(ValueError, match="invalid device index 9"):
        torch.spyre.set_device(9)


def test_bad_fallback_mode():
    with pytest.raises(ValueError, match="fallback mode"):
        torch.spyre.set_fallback_mode("sometimes")


def test_wrapped_scalar_arguments_reach_the_host_op():
    # remainder(t, 4) reaches the fallback as remainder.Tensor_out with a Python number for a
    # Tensor argument (a wrapped number); it must run like on the CPU.
    a = torch.arange(7)
    assert torch.equal(torch.remainder(a.to("spyre"), 4).cpu(), torch.remainder(a, 4))
    assert torch.equal(torch.remainder(a.float().to("spyre"), 1.5).cpu(), torch.remainder(a.float(), 1.5))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8, torch.int64], ids=str)
def test_integer_histc_bridges_the_cpus_dtype_gap(dtype):
    """Accelerators have an integer histc (transformers' MoE routing counts tokens with it on
    non-CPU devices); the CPU has none. The fallback computes in float64 and casts back, exactly."""
    x = torch.randint(0, 10, (300,), dtype=torch.int32).to(dtype)
    out = torch.histc(x.to("spyre"), bins=5, min=0, max=10)
    assert out.dtype == dtype
    assert torch.equal(out.cpu(), torch.histc(x.double(), bins=5, min=0, max=10).to(dtype))


def test_dtype_bridge_refuses_an_inexact_result():
    from types import SimpleNamespace
    from vspyre.device.fallback import _bridge_dtype

    def third(x):
        if not x.is_floating_point():
            raise NotImplementedError("\"third\" not implemented for 'Int'")
        return x / 3
    x = torch.tensor([3, 6, 9], dtype=torch.int32)
    err = NotImplementedError("\"third\" not implemented for 'Int'")
    assert torch.equal(_bridge_dtype(third, SimpleNamespace(mutable=[], out_args=set(), arg_names=["x"]), "third", [x], {}, err),
                       torch.tensor([1, 2, 3], dtype=torch.int32))
    with pytest.raises(TypeError, match="third.*not exactly representable in torch.int32"):
        _bridge_dtype(third, SimpleNamespace(mutable=[], out_args=set(), arg_names=["x"]), "third", [x + 1], {}, err)
