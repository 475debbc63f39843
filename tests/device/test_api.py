"""``torch.spyre`` behaves like ``torch.cuda`` where code written for accelerators expects it."""

import subprocess
import sys
import time

import torch

from vspyre import hardware


def test_availability_and_devices():
    assert torch.spyre.is_available() and torch.spyre.is_initialized()
    assert torch.spyre.device_count() == 2
    assert torch.spyre.current_device() == 0
    assert torch.ones(1).spyre().device == torch.device("spyre", 0)
    assert torch.ones(1, device="spyre").is_spyre


def test_device_context_and_set_device():
    with torch.spyre.device(1):
        assert torch.spyre.current_device() == 1
        assert torch.ones(2, device="spyre").device == torch.device("spyre", 1)
    assert torch.spyre.current_device() == 0
    torch.spyre.set_device("spyre:1")
    try:
        assert torch.empty(1, device="spyre").device.index == 1
    finally:
        torch.spyre.set_device(0)


def test_properties_come_from_the_hardware_config():
    p = torch.spyre.get_device_properties(0)
    cfg = hardware.get_config()
    assert p.num_cores == p.multi_processor_count == 32
    assert p.scratchpad_per_core == 2 * 2**20
    assert p.clock_rate_mhz == 1500
    assert abs(p.memory_bandwidth_gbps - 204.8) < 1e-9
    assert abs(p.peak_fp16_tflops - 98.304) < 1e-9
    assert p.total_memory == cfg.usable_memory_bytes
    with hardware.override(num_cores=16, clock_hz=1.0e9):
        q = torch.spyre.get_device_properties(0)
        assert q.num_cores == 16 and abs(q.peak_fp16_tflops - 98.304 * 16 / 32 / 1.5) < 1e-9
    assert "num_cores=32" in str(p)


def test_streams_and_events_are_synchronous():
    s = torch.spyre.current_stream()
    assert isinstance(s, torch.spyre.Stream) and s.query()
    s.synchronize()
    torch.spyre.synchronize()
    e1 = torch.spyre.Event(enable_timing=True)
    e2 = torch.spyre.Event(enable_timing=True)
    e1.record()
    time.sleep(0.005)
    e2.record()
    e2.synchronize()
    assert e1.query() and isinstance(e1, torch.spyre.Event)
    assert e1.elapsed_time(e2) >= 4.0
    other = torch.spyre.Stream()
    other.wait_stream(s)
    other.wait_event(e1)
    with torch.spyre.stream(other):
        assert torch.ones(1, device="spyre").device.type == "spyre"


def test_manual_seed_all_and_rng_state():
    torch.spyre.manual_seed_all(7)
    state = torch.spyre.get_rng_state()
    a = torch.rand(4, device="spyre").cpu()
    torch.spyre.set_rng_state(state)
    assert torch.equal(torch.rand(4, device="spyre").cpu(), a)
    torch.manual_seed(7)   # torch.manual_seed seeds every registered accelerator too
    assert torch.equal(torch.rand(4, device="spyre").cpu(), a)


def test_import_torch_is_enough(tmp_path):
    code = ("import torch; x = torch.ones(3).to('spyre'); print(x.device, torch.spyre.device_count())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "spyre:0 1"     # default: one card
