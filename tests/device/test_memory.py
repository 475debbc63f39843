"""Memory accounting per card, capacity from the hardware config, out-of-memory behaviour."""

import pytest
import torch

from vspyre import hardware


def test_alloc_free_cycles_return_every_byte():
    start = torch.spyre.memory_allocated()
    for i in range(1000):
        t = torch.empty(1 + (i % 97) * 13, dtype=torch.float32, device="spyre")
        del t
    assert torch.spyre.memory_allocated() == start


def test_allocations_are_whole_sticks():
    start = torch.spyre.memory_allocated()
    t = torch.empty(1, dtype=torch.uint8, device="spyre")
    assert torch.spyre.memory_allocated() - start == 128
    assert t.data_ptr() % 128 == 0
    u = torch.empty(150, dtype=torch.float16, device="spyre")   # 300 bytes -> 3 sticks
    assert torch.spyre.memory_allocated() - start == 128 + 384
    del t, u
    assert torch.spyre.memory_allocated() == start


def test_peak_and_reset():
    torch.spyre.reset_peak_memory_stats()
    base = torch.spyre.memory_allocated()
    t = torch.empty(1 << 20, dtype=torch.uint8, device="spyre")
    del t
    assert torch.spyre.max_memory_allocated() >= base + (1 << 20)
    torch.spyre.reset_peak_memory_stats()
    assert torch.spyre.max_memory_allocated() == torch.spyre.memory_allocated()


def test_capacity_from_config_and_mem_get_info():
    free, total = torch.spyre.mem_get_info()
    cfg = hardware.get_config()
    assert total == cfg.device_memory_bytes - cfg.ecc_bytes == 112 * 2**30
    assert free == total - torch.spyre.memory_allocated()
    assert torch.spyre.get_device_properties(0).total_memory == total


def test_out_of_memory_is_clear_and_card_stays_usable():
    # 1 MiB more than what earlier tests left allocated on the card
    with hardware.override(device_memory_bytes=torch.spyre.memory_allocated() + (1 << 20), ecc_bytes=0):
        keep = torch.ones(1024, device="spyre")           # 4 KiB
        with pytest.raises(torch.OutOfMemoryError) as exc:
            torch.empty(2 << 20, dtype=torch.uint8, device="spyre")
        msg = str(exc.value)
        assert "spyre out of memory" in msg and "Tried to allocate 2.00 MiB" in msg
        assert "spyre:0 has a total capacity of" in msg and "is free" in msg
        assert torch.spyre.memory_stats()["num_ooms"] >= 1
        # still usable: allocate, compute, free
        y = keep * 2
        assert y.sum().item() == 2048.0
    assert torch.spyre.mem_get_info()[1] == 112 * 2**30


def test_out_of_memory_inside_a_fallback_op_leaves_card_usable():
    x = torch.ones(64, 64, device="spyre")
    with hardware.override(device_memory_bytes=torch.spyre.memory_allocated() + 4096, ecc_bytes=0):
        with pytest.raises(torch.OutOfMemoryError):
            torch.cat([x] * 8)
    assert torch.cat([x, x]).shape == (128, 64)


def test_cards_account_separately():
    assert torch.spyre.device_count() == 2          # tests/conftest.py sets VSPYRE_NUM_CARDS=2
    before0, before1 = torch.spyre.memory_allocated(0), torch.spyre.memory_allocated(1)
    t = torch.empty(4096, dtype=torch.uint8, device="spyre:1")
    assert t.device == torch.device("spyre", 1)
    assert torch.spyre.memory_allocated(1) == before1 + 4096
    assert torch.spyre.memory_allocated(0) == before0
    del t
    assert torch.spyre.memory_allocated(1) == before1


def test_cross_card_copy():
    x = torch.randn(33, 17)
    a = x.to("spyre:0")
    b = a.to("spyre:1")
    assert b.device == torch.device("spyre", 1)
    assert torch.equal(b.cpu(), x)
    c = torch.empty(33, 17, device="spyre:0")
    c.copy_(b.t().t())
    assert torch.equal(c.cpu(), x)
    # an op's result lands on the card of its inputs
    assert (b + 1).device == torch.device("spyre", 1)


def test_memory_summary_and_stats_keys():
    s = torch.spyre.memory_stats()
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
                "allocation.all.current", "num_ooms"):
        assert key in s
    text = torch.spyre.memory_summary()
    assert "spyre:0 memory summary" in text and "Allocated memory" in text


def test_allocations_round_to_the_configured_stick():
    """The allocator's stick size comes from the hardware config (not a C++ constant)."""
    from vspyre import hardware
    base = torch.spyre.memory_allocated()
    with hardware.override(stick_bytes=256):
        t = torch.empty(3, dtype=torch.uint8, device="spyre")
        assert torch.spyre.memory_allocated() - base == 256
        del t
    t = torch.empty(3, dtype=torch.uint8, device="spyre")
    assert torch.spyre.memory_allocated() - base == hardware.get_config().stick_bytes == 128
