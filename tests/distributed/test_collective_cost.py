"""The card-to-card link model: each collective's cost formula, in one process."""

import dataclasses

import pytest
import torch

from vspyre import hardware
from vspyre.distributed import collectives


def cfg(**kw):
    return dataclasses.replace(hardware.get_config(), **kw)


def test_ring_all_reduce_is_2_n_minus_1_steps_of_a_chunk_each():
    c = cfg(card_link_bandwidth=50e9, card_link_latency_us=10.0, collective_algorithm="ring")
    b = 64 << 20
    for n in (2, 4):
        got = collectives.cost("all_reduce", b, n, c)
        chunk = b / n
        add = max(chunk / 50e9, 3 * chunk / c.device_memory_bandwidth) * 1e6
        assert got.us == pytest.approx((n - 1) * (10 + add) + (n - 1) * (10 + chunk / 50e9 * 1e6))
        assert got.steps == 2 * (n - 1) and got.link_bytes == int(2 * (n - 1) * chunk) and got.algorithm == "ring"


def test_costs_grow_with_bytes_and_latency_bounds_small_messages():
    c = cfg(collective_algorithm="ring")
    small, large = collectives.cost("all_reduce", 8192, 4, c), collectives.cost("all_reduce", 8 << 20, 4, c)
    assert large.us > small.us >= 6 * c.card_link_latency_us
    assert collectives.cost("all_gather", 1 << 20, 4, c).us > collectives.cost("all_gather", 1 << 20, 2, c).us


def test_one_card_costs_nothing_and_host_routing_uses_the_host_link():
    assert collectives.cost("all_reduce", 1 << 20, 1).us == 0.0
    c = cfg(collective_algorithm="host", host_link_bandwidth=64e9, card_link_latency_us=10.0)
    got = collectives.cost("all_reduce", 64e6, 2, c)
    assert got.algorithm == "host" and got.us == pytest.approx(20 + 2 * 64e6 / 64e9 * 1e6)


def test_unknown_collective_and_algorithm_are_named():
    with pytest.raises(ValueError, match="all_to_all"):
        collectives.cost("all_to_all", 1, 2)
    with pytest.raises(ValueError, match="collective_algorithm.*'mesh'"):
        cfg(collective_algorithm="mesh")


def test_the_link_assumptions_are_documented_fields_of_the_preset():
    fields = {f.name: f for f in dataclasses.fields(hardware.HardwareConfig)}
    for name in ("card_link_bandwidth", "card_link_latency_us", "collective_algorithm"):
        assert "est." in fields[name].metadata["source"], name
