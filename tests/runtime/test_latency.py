"""The latency model on cases worked by hand, and the roofline invariant over random programs.

Default preset (torch-spyre): 1.5 GHz, 204.8 GB/s over 32 cores = 6.4 GB/s per core = 64/15 bytes
per cycle, 128-byte sticks, 64-cycle DMA setup, 2 x 64 vector lanes per core, 2 x 8x8 PEs x 8
lanes per core, 16 fill cycles, 128 B/cycle ring, 4 cycles per hop, 5 us launch.
"""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from vspyre import hardware
from vspyre.ir import ProgramBuilder, WorkDivision, legal_divisions, resolve
from vspyre.ir.latency import estimate_schedule
from vspyre.runtime.cost import estimate, estimate_sizes

from . import programs as P

CYC = 1 / 1500.0               # us per cycle
BPC = 6.4e9 / 1.5e9            # DMA bytes per cycle per core


# Each active core gets 1/32 of the bus however many are active (the hand-worked numbers below use
# this; the measured share is tested on its own).
FLAT_BUS = tuple((2 ** k, 2 ** k / 32) for k in range(6))


@pytest.fixture(autouse=True)
def default_card():
    with hardware.override(**{f: getattr(hardware.PRESETS["torch-spyre"], f) for f in
                              ("clock_hz", "device_memory_bandwidth", "ring_bandwidth", "num_cores",
                               "scratchpad_bytes", "kernel_launch_us", "numerics")},
                           bus_share=FLAT_BUS):
        yield


def _add_one(n, dtype=torch.float16, double_buffer=True):
    b = ProgramBuilder("add_one", source="test")
    x = b.input("x", dtype, (n,))
    y = b.output("y", dtype, (n,))
    i = b.dim("x0", n)
    b.store(y, i, b.add(b.load(x, i), 1.0))
    b.divide().tile(double_buffer=double_buffer)
    return b.build()


def test_one_stick_elementwise():
    e = estimate_sizes(_add_one(64), {})
    dma = 64 + 128 / BPC                         # setup + one stick
    # double-buffered single step: load, add (1 cycle: 64 lanes-ops <= 128 lanes), store after compute
    core = dma + 1 + dma
    assert e.us == pytest.approx(5.0 + core * CYC)
    assert e.bottleneck == "launch"
    assert e.dma_bytes == 256 and e.flops == 64
    assert e.roofline_us == pytest.approx(256 / 204.8e9 * 1e6)   # compulsory: 128 B read + 128 B written


def test_partial_stick_costs_a_whole_stick():
    e100 = estimate_sizes(_add_one(100), {})
    e128 = estimate_sizes(_add_one(128), {})
    assert e100.dma_bytes == e128.dma_bytes == 2 * 256            # 200 B -> 2 sticks, each way
    assert e100.us == pytest.approx(e128.us)
    assert e100.compulsory_bytes == 400 and e128.compulsory_bytes == 512


def test_transposed_access_costs_a_stick_per_element():
    b = ProgramBuilder("transpose", source="test")
    x = b.input("x", torch.float32, (4, 4))
    y = b.output("y", torch.float32, (4, 4))
    i, j = b.dim("x0", 4), b.dim("x1", 4)
    b.store(y, y.index(i, j), b.load(x, x.index(j, i)))
    b.divide().tile(double_buffer=False)
    e = estimate_sizes(b.build(), {})
    load = 64 + 16 * 128 / BPC                    # 16 elements, 16 sticks
    store = 64 + 4 * 128 / BPC                    # 4 rows of 16 B, one stick each
    assert e.dma_bytes == 16 * 128 + 4 * 128
    assert e.us == pytest.approx(5.0 + (load + store) * CYC)    # no vector op: a pure move
    assert e.bottleneck == "launch"                              # < 5 us of core time
    assert e.dma_us == pytest.approx((load + store) * CYC)


def test_matmul_by_hand():
    prog, _ = P.matmul_bias_relu(torch.float16, M=64, N=64, K=64, divide=[], tile={"double_buffer": False})
    e = estimate_sizes(prog, {})
    tile_dma = 64 + 64 * 128 / BPC                # 64 rows of 64 fp16 = 64 sticks
    bias = 64 + 128 / BPC
    mm = math.ceil(8 * 1 / 2) * 64 + 16          # 8 row-blocks x 1 col-block over 2 corelets, K=64, fill 16
    vec = 2 * math.ceil(64 * 64 / 128)            # add + relu on 4096 elements
    core = 3 * tile_dma + bias + mm + vec
    assert e.us == pytest.approx(5.0 + core * CYC)
    assert e.flops == 2 * 64 ** 3 + 2 * 64 * 64
    assert e.bottleneck == "launch"                  # 4.1 us of core time < 5 us launch
    assert e.dma_us > e.compute_us


def test_double_buffering_overlaps():
    n = 64 * 64 * 8
    seq = estimate_sizes(_tiled(n, False), {})
    dbl = estimate_sizes(_tiled(n, True), {})
    assert dbl.us < seq.us
    # 8 tiles of 64 sticks: sequential = 8 x (in + add + out); pipelined >= total DMA
    dma = 64 + 64 * 128 / BPC
    add = math.ceil(4096 / 128)
    assert seq.us == pytest.approx(5.0 + 8 * (2 * dma + add) * CYC)
    assert dbl.us >= 5.0 + 16 * dma * CYC


def _tiled(n, db):
    b = ProgramBuilder("add_one_tiled", source="test")
    x = b.input("x", torch.float16, (n,))
    y = b.output("y", torch.float16, (n,))
    i = b.dim("x0", n)
    b.store(y, i, b.add(b.load(x, i), 1.0))
    b.divide().tile(double_buffer=db, x0=4096)
    return b.build()


def test_ring_cost_by_hand():
    prog, _ = P.splitk_matmul(parts=4)
    e = estimate_sizes(prog, {})
    transfer = 1 * 4 + 16 * 64 * 4 / 128 + math.ceil(1024 / 128)   # hop + 4 KiB at 128 B/cycle + combine
    # the partials flow down the chain pipelined: the owner has the total one transfer and two more
    # hops (4 cycles each) after the last core starts sending
    assert e.ring_us == pytest.approx((transfer + 2 * 4) * CYC)
    assert e.ring_bytes == 3 * 4096                                   # each of the 3 links carries it once


def test_transcendental_factor():
    def prog(op):
        b = ProgramBuilder(op, source="test")
        x = b.input("x", torch.float16, (4096,))
        y = b.output("y", torch.float16, (4096,))
        i = b.dim("x0", 4096)
        b.store(y, i, b.compute(op, b.load(x, i)))
        b.divide().tile(double_buffer=False)
        return b.build()
    ea, ee = estimate_sizes(prog("neg"), {}), estimate_sizes(prog("exp"), {})
    assert (ee.us - ea.us) == pytest.approx((4 - 1) * 32 * CYC)


def test_launch_cost_and_kernel_time_is_slowest_core():
    prog, _ = P.elementwise(torch.float16, n=100, m=256, divide=[("x0", 3)])   # 34, 34, 32 rows
    e = estimate_sizes(prog, {})
    assert e.us == pytest.approx(5.0 + max(e.core_us))
    assert e.core_us[0] >= e.core_us[2]


def test_estimate_from_tensors_matches_sizes():
    prog, _ = P.row_sum()
    x, y = torch.randn(64, 300), torch.empty(64)
    assert estimate(prog, x, y).us == pytest.approx(estimate_sizes(prog, {"n": 64, "m": 300}).us)


def test_planner_prefers_more_cores_for_big_work():
    prog, _ = P.elementwise(torch.float16, n=4096, m=1024)
    s = resolve(prog, {})
    assert s.num_cores == hardware.get_config().num_cores


# ---------------------------------------------------------------------------- roofline invariant
KINDS = ["elementwise", "row_sum", "col_max", "matmul", "softmax", "layernorm", "splitk", "transpose"]


def _random_program(kind, a, b, c, dtype):
    if kind == "elementwise":
        return P.elementwise(dtype, n=a, m=b)[0]
    if kind == "row_sum":
        return P.row_sum(dtype, n=a, m=b)[0]
    if kind == "col_max":
        return P.col_max(dtype, n=a, m=b)[0]
    if kind == "matmul":
        return P.matmul_bias_relu(dtype, M=a, N=b, K=c)[0]
    if kind == "softmax":
        return P.softmax(dtype, n=a, m=b)[0]
    if kind == "layernorm":
        return P.layernorm(dtype, n=a, m=b)[0]
    if kind == "splitk":
        return P.splitk_matmul(dtype, M=a, N=b, K=c * 4, parts=4)[0]
    bl = ProgramBuilder("transpose", source="test")
    x = bl.input("x", dtype, (b, a))
    y = bl.output("y", dtype, (a, b))
    i, j = bl.dim("x0", a), bl.dim("x1", b)
    bl.store(y, y.index(i, j), bl.exp(bl.load(x, x.index(j, i))))
    return bl.build()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS), a=st.integers(1, 300), b=st.integers(1, 700), c=st.integers(1, 300),
       dtype=st.sampled_from([torch.float16, torch.float32]), pick=st.integers(0, 10 ** 6),
       db=st.sampled_from([None, True, False]), tile_frac=st.integers(1, 8),
       scratch=st.sampled_from([2 << 20, 256 << 10, 64 << 10]))
def test_no_estimate_below_its_roofline(kind, a, b, c, dtype, pick, db, tile_frac, scratch):
    prog = _random_program(kind, a, b, c, dtype)
    with hardware.override(scratchpad_bytes=scratch):
        cfg = hardware.get_config()
        divs = legal_divisions(prog, {}, cfg)
        w = divs[pick % len(divs)]
        from vspyre.ir import TilePlan
        from vspyre.ir.planning import persistent_dims
        pers = persistent_dims(prog)
        tiles = TilePlan(tuple((d.name, max(1, int(d.size) // tile_frac)) for d in prog.dims if d.name not in pers), db)
        try:
            s = resolve(prog, {}, cfg, division=w, tiles=tiles)
        except Exception:
            s = resolve(prog, {}, cfg, division=w)
        e = estimate_schedule(s, segments=False)
    assert e.us >= e.roofline_us > 0
    assert e.us >= e.launch_us
    assert e.flops >= 0 and e.dma_bytes >= e.compulsory_bytes
    assert e.bottleneck in ("memory", "compute", "ring", "launch")
