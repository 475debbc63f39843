"""``vspyre demo``: a tiny GPT-2 on the virtual card, checked against the CPU, with its report."""

from __future__ import annotations

import copy
import time

import torch
from rich.console import Console
from rich.table import Table

from .. import hardware
from .accuracy import compare
from .models import tiny_gpt2


def _logits(model: torch.nn.Module, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


def run(console: Console | None = None) -> int:
    """Run the demo; returns a process exit code (0 when the card matches the CPU)."""
    console = console or Console()
    cfg = hardware.get_config()
    props = torch.spyre.get_device_properties(0)
    console.rule("[bold]vspyre demo: tiny GPT-2 on the virtual Spyre card")
    console.print(f"card: {props}")

    case = tiny_gpt2()
    ref = _logits(case.model, case.inputs)

    torch.spyre.reset_fallback_stats()
    torch.spyre.reset_peak_memory_stats()
    base_mem = torch.spyre.memory_allocated()
    dev_case = copy.deepcopy(case).to("spyre")
    weights = torch.spyre.memory_allocated() - base_mem
    _logits(dev_case.model, dev_case.inputs)                     # warm-up: builds the eager kernels
    torch.spyre.reset_fallback_stats()
    torch.spyre.reset_eager_kernel_stats()
    t0 = time.perf_counter()
    out = _logits(dev_case.model, dev_case.inputs)
    wall = time.perf_counter() - t0
    got = out.cpu()
    kernels = torch.spyre.eager_kernel_stats()["calls"]
    with torch.spyre.profile() as eager_prof:
        _logits(dev_case.model, dev_case.inputs)

    max_err = (got - ref).abs().max().item()
    ok = torch.allclose(got, ref, rtol=1e-3, atol=1e-3)

    summary = Table(title="eager forward on spyre:0 vs CPU", show_header=False)
    summary.add_row("model", f"{case.name}: {sum(p.numel() for p in case.model.parameters()):,} parameters, "
                             f"input {tuple(case.inputs['input_ids'].shape)}")
    summary.add_row("output", f"logits {tuple(got.shape)} {got.dtype}")
    summary.add_row("matches CPU fp32", f"{'yes' if ok else 'NO'} (max |diff| = {max_err:.2e}, allclose 1e-3)")
    summary.add_row("host wall time", f"{wall * 1e3:.1f} ms")
    summary.add_row("eager device kernels", f"{sum(kernels.values())} launches of {len(kernels)} ops, "
                                            f"est. {eager_prof.total_est_us:.1f} us on the card")
    summary.add_row("device memory", f"weights {weights / 2**20:.2f} MiB, peak {torch.spyre.max_memory_allocated() / 2**20:.2f} MiB "
                                     f"of {cfg.usable_memory_bytes / 2**30:.0f} GiB")
    console.print(summary)

    stats = torch.spyre.fallback_stats()
    times = torch.spyre.fallback_time_stats()
    fb = Table(title=f"host fallbacks: {sum(stats.values())} calls of {len(stats)} ops "
                     "(ops without a tile form ran on the host)")
    fb.add_column("op")
    fb.add_column("calls", justify="right")
    fb.add_column("host time (ms)", justify="right")
    for op, n in stats.items():
        fb.add_row(op, str(n), f"{times.get(op, 0.0) * 1e3:.2f}")
    console.print(fb)

    # -- the new path: torch.compile with the default backend, kernels as tile programs ----------
    console.rule("[bold]torch.compile (default backend, Inductor + the spyre extension)")
    torch.spyre.reset_fallback_stats()
    t0 = time.perf_counter()
    compiled = torch.compile(dev_case.model)
    first = _logits(compiled, dev_case.inputs)
    compile_s = time.perf_counter() - t0
    with torch.spyre.profile() as prof:          # the first profiled call also plans each kernel
        out_c = _logits(compiled, dev_case.inputs)
    walls = []
    for _ in range(5):
        t0 = time.perf_counter()
        _logits(compiled, dev_case.inputs)
        walls.append(time.perf_counter() - t0)
    wall_c = sorted(walls)[len(walls) // 2]
    verdict = compare(out_c, ref)
    ok_c = verdict.ok and torch.equal(first.cpu(), out_c.cpu())
    summary = Table(title="compiled forward on spyre:0 vs CPU", show_header=False)
    summary.add_row("matches CPU fp32", str(verdict))
    summary.add_row("compile time", f"{compile_s:.1f} s (first call, includes Dynamo + Inductor)")
    summary.add_row("host wall time", f"{wall_c * 1e3:.1f} ms per call, median of 5 (eager: {wall * 1e3:.1f} ms)")
    summary.add_row("est. device time", f"{prof.total_est_us:.1f} us on the card "
                                        f"({len(prof.kernels)} kernel launches, roofline "
                                        f"{sum(k.roofline_us for k in prof.kernels):.1f} us)")
    summary.add_row("host fallbacks", str(sum(torch.spyre.fallback_stats().values())))
    console.print(summary)
    Console(width=max(console.width, 150)).print(prof.rich_table(row_limit=12))
    return 0 if (ok and ok_c) else 1
