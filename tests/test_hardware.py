"""The hardware config: presets, TOML and environment, derived numbers; DLFloat16 numerics."""

import pytest
import torch

from vspyre import hardware, numerics


def test_default_preset_numbers():
    c = hardware.PRESETS["torch-spyre"]
    assert c.num_cores == 32 and c.scratchpad_bytes == 2 * 2**20
    assert c.usable_memory_bytes == 112 * 2**30
    assert c.peak_fp16_flops == pytest.approx(98.304e12)
    assert c.scratchpad_usable_bytes == int(2 * 2**20 * 0.8)
    assert c.stick_elems(2) == 64 and c.stick_elems(4) == 32 and c.stick_elems(1) == 128


def test_ktir_preset():
    k = hardware.PRESETS["ktir-cpu"]
    assert k.clock_hz == 1.0e9 and k.device_memory_bandwidth == 128e9 and k.ring_bandwidth == 64e9
    assert k.peak_fp16_flops < hardware.PRESETS["torch-spyre"].peak_fp16_flops


def test_from_env_and_toml(tmp_path):
    assert hardware.from_env({"VSPYRE_HW": "ktir-cpu"}).name == "ktir-cpu"
    cfg = hardware.from_env({"VSPYRE_NUM_CARDS": "3", "VSPYRE_NUMERICS": "ieee"})
    assert cfg.num_cards == 3 and cfg.numerics == "ieee"
    p = tmp_path / "card.toml"
    p.write_text('preset = "ktir-cpu"\ndevice_memory_bytes = 1073741824\necc_bytes = 0\n')
    t = hardware.from_env({"VSPYRE_HW": str(p)})
    assert t.name == "ktir-cpu" and t.usable_memory_bytes == 2**30
    p.write_text("no_such_field = 1\n")
    with pytest.raises(ValueError, match="no_such_field"):
        hardware.from_toml(p)
    with pytest.raises(ValueError, match="neither a preset"):
        hardware.from_env({"VSPYRE_HW": "nope"})


def test_validation():
    with pytest.raises(ValueError, match="numerics"):
        hardware.HardwareConfig(numerics="fp8")
    with pytest.raises(ValueError, match="stick_bytes"):
        hardware.HardwareConfig(stick_bytes=100)
    with pytest.raises(RuntimeError, match="num_cards cannot change"):
        hardware.configure(num_cards=5)


def test_every_field_is_documented():
    for name, _, doc, source in hardware.get_config().describe():
        assert doc and source, name


def test_dl16_rounding():
    x = torch.tensor([1.0, 1 + 2**-9, 1 + 2**-10, 1 + 3 * 2**-10, 2.0**-32, -2.5, float("inf")])
    r = numerics.round_to_dl16(x)
    assert r.tolist()[:6] == [1.0, 1 + 2**-9, 1.0, 1 + 2**-8, 0.0, -2.5]   # RNE to 9 bits; flush
    assert r[6] == float("inf")
    assert torch.isnan(numerics.round_to_dl16(torch.tensor([float("nan")])))[0]
    # every DL16 value is exactly an fp16 value in fp16's normal range
    v = torch.randn(10000, generator=torch.Generator().manual_seed(0)) * 100
    v = v[v.abs() >= 2.0**-14]          # fp16's normal range (below it fp16 is subnormal, DL16 is not)
    d = numerics.round_to_dl16(v)
    assert torch.equal(d.half().float(), d)


def test_store_cast_honours_the_setting():
    v = torch.tensor([1 + 2**-10])       # representable in IEEE fp16, not in DL16
    assert numerics.store_cast(v, torch.float16, "ieee").item() == 1 + 2**-10
    assert numerics.store_cast(v, torch.float16, "dl16").item() == 1.0
    assert numerics.store_cast(v, torch.float32, "dl16").item() == 1 + 2**-10
    with hardware.override(numerics="ieee"):
        assert torch.spyre.get_numerics() == "ieee"
        assert numerics.store_cast(v, torch.float16).item() == 1 + 2**-10


def test_measured_preset_is_the_published_measurements():
    """The published rates, with the bandwidth and the per-kernel cost fitted to the card's measured
    kernels (benchmarks/bench_validation.py --fit): the fit stays close to the cost model's 150 GB/s."""
    from vspyre import hardware
    m = hardware.PRESETS["measured"]
    assert m.clock_hz == 1.1e9 and m.dma_setup_cycles == 0 and m.relayout_bandwidth == 116e9
    assert abs(m.device_memory_bandwidth - 150e9) / 150e9 < 0.05 and 0 < m.kernel_launch_us < 100
    per_core_mac_per_ns = m.peak_fp16_flops / 2 / m.num_cores / 1e9
    assert abs(per_core_mac_per_ns - 1140) / 1140 < 0.02
    balanced = 2 / (2 / m.device_memory_bandwidth + m.rw_turnaround_ns_per_byte * 1e-9)   # B read + B written
    assert abs(balanced - 105e9) / 105e9 < 0.03
    assert m.core_bandwidth(1) == 0.11 * m.device_memory_bandwidth
