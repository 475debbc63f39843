"""Checked mode proves schedules: it catches overlaps, gaps, overflows, out-of-bounds accesses."""

import pytest
import torch

from vspyre import hardware, runtime
from vspyre.ir import ProgramBuilder, ProgramError, ScheduleError, resolve
from vspyre.ir.planning import live_bytes

from . import programs as P


def _copy(n=100, offset=0, **sched):
    b = ProgramBuilder("copy", source="test")
    x = b.input("x", torch.float32, ("n",))
    y = b.output("y", torch.float32, ("n",))
    i = b.dim("x0", "n")
    b.store(y, i, b.load(x, i + offset))
    if "divide" in sched:
        b.divide(*sched["divide"])
    if "tile" in sched:
        b.tile(**sched["tile"])
    return b.build()


def test_good_explicit_schedule_passes():
    p = _copy(divide=[("x0", 4, 32)], tile={"x0": 8})
    x = torch.randn(100)
    y = torch.empty(100)
    facts = runtime.launch(p, x, y, mode="checked")
    assert torch.equal(x, y) and facts["cores"] == 4


def test_overlap_is_caught():
    p = _copy(divide=[("x0", 2, 64, (0, 32))])      # core 1 starts inside core 0's chunk
    with pytest.raises(ScheduleError, match=r"copy: core 1: tile x0\[32:.*buffer y: element 32 written 2 times"):
        runtime.launch(p, torch.randn(100), torch.empty(100), mode="checked")


def test_gap_is_caught():
    p = _copy(divide=[("x0", 2, 32)])               # 2 x 32 < 100
    with pytest.raises(ScheduleError, match=r"gap: 36 element\(s\) of output buffer y never written \(first at \(64,\)\)"):
        runtime.launch(p, torch.randn(100), torch.empty(100), mode="checked")


def test_tile_gap_from_bad_tile_plan_is_caught():
    # the store only covers even rows: a bug a compiler could make in an index expression
    b = ProgramBuilder("evens", source="test")
    x = b.input("x", torch.float32, (8, 4))
    y = b.output("y", torch.float32, (8, 4))
    i, j = b.dim("x0", 4), b.dim("x1", 4)
    b.store(y, y.index(2 * i, j), b.load(x, x.index(2 * i, j)))
    p = b.build()
    with pytest.raises(ScheduleError, match="gap: 16 element"):
        runtime.launch(p, torch.randn(8, 4), torch.empty(8, 4), mode="checked")


def test_scratchpad_overflow_is_caught():
    prog, _ = P.elementwise(torch.float32, tile={"x0": 256, "x1": 256}, divide=[("x0", 1)])
    x, w, y = torch.randn(256, 256), torch.randn(256), torch.empty(256, 256)
    with hardware.override(scratchpad_bytes=256 * 1024):
        with pytest.raises(ScheduleError, match=r"elementwise: core 0: tile .*scratchpad overflow: \d+ live bytes > 209715 usable"):
            runtime.launch(prog, x, w, y, mode="checked")
        # the planner's own tiles fit the same budget, and checked mode agrees
        prog2, _ = P.elementwise(torch.float32)
        facts = runtime.launch(prog2, x, w, y, mode="checked")
        assert facts["peak_scratchpad_bytes"] <= hardware.get_config().scratchpad_usable_bytes


def test_out_of_bounds_read_is_caught():
    p = _copy(offset=1)
    with pytest.raises(ScheduleError, match=r"load %ld1 from buffer x: element 100 out of bounds \[0, 100\)"):
        runtime.launch(p, torch.randn(100), torch.empty(100), mode="checked")
    with pytest.raises(RuntimeError, match="copy"):
        runtime.launch(p, torch.randn(100), torch.empty(100), mode="fast")


def test_split_reduction_without_ring_is_rejected():
    prog, _ = P.row_sum(divide=[("r0", 4)], ring=False)
    with pytest.raises(ScheduleError, match="not combined by a RingReduce"):
        runtime.launch(prog, torch.randn(8, 256), torch.empty(8), mode="checked")


def test_softmax_reduction_must_be_persistent():
    prog, _ = P.softmax(tile={"x0": 4, "r0": 64})
    with pytest.raises(ScheduleError, match="must be one tile"):
        runtime.launch(prog, torch.randn(8, 128).half(), torch.empty(8, 128).half(), mode="checked")


def test_ring_reduction_counts_transfers_and_same_result_as_fast():
    prog, ref = P.splitk_matmul(parts=8, K=1024, tile={"x0": 16, "x1": 64})    # one output tile per core
    a, b = torch.randn(16, 1024), torch.randn(1024, 64)
    y1, y2 = torch.empty(16, 64), torch.empty(16, 64)
    runtime.launch(prog, a, b, y1, mode="fast")
    facts = runtime.launch(prog, a, b, y2, mode="checked")
    assert facts["ring_transfers"] == 7                                       # 7 partials to the owner
    torch.testing.assert_close(y1, y2, atol=1e-3, rtol=1e-4)


def test_malformed_programs_name_program_and_op():
    b = ProgramBuilder("bad", source="test")
    x = b.input("x", torch.float32, (4, 4))
    y = b.output("y", torch.float32, (4,))
    i, j = b.dim("x0", 4), b.dim("x1", 4)
    b.store(y, i, b.load(x, x.index(i, j)))       # value varies along x1, index does not
    with pytest.raises(ProgramError, match=r"program bad: op 1 \(store\): value %ld1 varies along \['x1'\]"):
        b.build()
    with pytest.raises(runtime.LaunchError, match="program copy: buffer x wants"):
        runtime.launch(_copy(), torch.randn(100).half(), torch.empty(100))


def test_planner_schedules_are_proven_by_checked_mode():
    """Auto-planned schedules for several programs and a small scratchpad pass checked mode."""
    cases = [
        (P.elementwise(torch.float16), (torch.randn(130, 256).half(), torch.randn(256).half()), (130, 256), torch.float16),
        (P.row_sum(), (torch.randn(33, 700),), (33,), torch.float32),
        (P.col_max(), (torch.randn(300, 70),), (70,), torch.float32),
        (P.matmul_bias_relu(torch.float32), (torch.randn(70, 300), torch.randn(300, 90), torch.randn(90)), (70, 90),
         torch.float32),
    ]
    with hardware.override(scratchpad_bytes=96 * 1024):
        for (prog, ref), ins, shape, dt in cases:
            out = torch.empty(shape, dtype=dt)
            facts = runtime.launch(prog, *ins, out, mode="checked")
            assert facts["peak_scratchpad_bytes"] <= hardware.get_config().scratchpad_usable_bytes
            torch.testing.assert_close(out.float(), ref(*ins).to(dt).float(), atol=2e-2, rtol=2e-2)


def test_chunks_and_tiles_are_whole_sticks():
    prog, _ = P.elementwise(torch.float16, n=8, m=1000)
    cfg = hardware.get_config()
    from vspyre.ir import legal_divisions
    for w in legal_divisions(prog, {}, cfg):
        s = resolve(prog, {}, cfg, division=w)
        for d, parts, chunk, starts in s.splits:
            if d == "x1":
                assert chunk % cfg.stick_elems(2) == 0
        j = prog.dim_names.index("x1")
        assert s.tiles[j] % cfg.stick_elems(2) == 0 or s.tiles[j] >= 1000
        assert live_bytes(prog, dict(zip(prog.dim_names, s.tiles)), s.double_buffer, cfg) <= cfg.scratchpad_usable_bytes
