"""Real sizes, both compilers: estimated device time against the roofline, shape by shape.

    .venv/bin/python benchmarks/bench_shapes.py [--groups llama,granite,bert,vit,resnet]
                                                [--functional sampled|all|none] [--json out.json]

Shapes come from the public configs of Llama-3-8B (hidden 4096, intermediate 14336, 32 heads, 8
KV heads, head dim 128), Granite-3-8B (hidden 4096, intermediate 12800, 32 heads, 8 KV heads),
BERT-large (hidden 1024, 16 heads, seq 512), ViT-B/16 (768, 12 heads, 197 tokens) and ResNet-50's
distinct convolutions at 224x224 (batch 1). For the LLMs: every linear of a layer, attention and
RMSNorm, prefill at seq 128, 512 and 2048, decode at batch 1, 8 and 32 against a KV cache of 2048.

Per shape and compiler (the Inductor path and the standalone compiler), on the card in fp16:

* **est. us**: the latency model's estimate of one steady-state call (``torch.spyre.profile`` of
  the second call; weights are parameters, as in a model, and a weight's one-time re-layout is
  reported apart, under *one-time us*; activations - every attention input, the first input of
  the others - change between the calls, as in a model, so a re-layout of one counts every call);
* **roofline us**: max(FLOPs / peak, compulsory bytes / bandwidth); **eff** = roofline / est.;
* **DMA / compulsory**: bytes the plan moves over bytes the op must move;
* **wall / CPU**: functional wall time of the compiled call over the same torch ops on the CPU.

Estimates do not need the values, so the estimate pass runs the compiled functions with kernel
execution switched off (``_NoExecute``: the runtime plans, costs and reports every launch as
usual; it only skips computing the numbers). The functional pass executes for real, on every shape
(``--functional all``) or on a sample (default: the smallest and largest shape of each kind per
group, which keeps the run within 15 minutes on 2 cores), and checks the result against the CPU.

The summary line gives the geomeans the goals of the "real sizes" issue are checked against.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

import vspyre  # noqa: F401  (the spyre device)

H16 = torch.float16
BACKENDS = ("inductor", "spyre_standalone")


# ------------------------------------------------------------------------------------ the shapes
@dataclass
class Case:
    group: str
    name: str
    kind: str                      # gemm | decode_gemm | attention | decode_attention | norm | conv
    make: Callable[[], tuple[Callable, list[torch.Tensor]]] = field(repr=False)
    dynamic: bool = True           # compile once per kind (sizes are planned per call anyway)
    dtype: str = "fp16"            # fp16 | fp8 | int8 (the quantised GEMMs: --dtypes)
    weights: tuple[int, ...] | None = None   # which inputs are parameters (default: all but the first)
    mkn: tuple[int, int, int] | None = None  # an LLM linear's sizes (its 8-bit variants are built from them)


def _linear(m: int, k: int, n: int) -> Callable:
    def make():
        x, w = torch.randn(m, k, dtype=H16) * 0.1, torch.randn(n, k, dtype=H16) * 0.05
        return (lambda x, w: F.linear(x, w)), [x, w]
    return make


E4M3 = getattr(torch, "float8_e4m3fn", None)


def _qlinear(m: int, k: int, n: int, dt: str) -> Callable:
    """The quantised linear as a W8A8 model runs it, activations already quantised (per token)
    and weights per channel: fp8 ``torch._scaled_mm`` with both scales in its epilogue and a 16-bit
    result; int8 ``torch._int_mm`` (int32 result) then the dequantisation, as torchao writes it."""
    def make():
        g = torch.Generator().manual_seed(0)
        sa, sb = torch.rand(m, 1, generator=g) * 0.01 + 0.01, torch.rand(1, n, generator=g) * 0.01 + 0.01
        if dt == "fp8":
            x, w = (torch.randn(m, k, generator=g) * 2).to(E4M3), (torch.randn(n, k, generator=g) * 2).to(E4M3)
            return (lambda x, w, sa, sb: torch._scaled_mm(x, w.t(), sa, sb, out_dtype=H16)), [x, w, sa, sb]
        x = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
        w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
        return (lambda x, w, sa, sb: (torch._int_mm(x, w.t()).float() * sa * sb).to(H16)), [x, w, sa, sb]
    return make


def _rms(m: int, d: int) -> Callable:
    def make():
        x, w = torch.randn(m, d, dtype=H16), torch.rand(d, dtype=H16) + 0.5

        def f(x, w):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * w
        return f, [x, w]
    return make


def _ln(m: int, d: int) -> Callable:
    def make():
        x, w, b = torch.randn(m, d, dtype=H16), torch.rand(d, dtype=H16) + 0.5, torch.randn(d, dtype=H16) * 0.1
        return (lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b)), [x, w, b]
    return make


def _attn(b: int, h: int, hkv: int, sq: int, skv: int, d: int, causal: bool) -> Callable:
    def make():
        q = torch.randn(b, h, sq, d, dtype=H16)
        k, v = torch.randn(b, hkv, skv, d, dtype=H16), torch.randn(b, hkv, skv, d, dtype=H16)
        gqa = hkv != h
        if sq == skv or not causal:
            return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)), [q, k, v]
        # decode: the queries are the last sq positions of the cache (a bool mask, as models pass it)
        mask = torch.ones(sq, skv, dtype=torch.bool).tril(skv - sq)
        return (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=gqa)), [q, k, v, mask]
    return make


def _conv(c: int, hw: int, oc: int, k: int, stride: int, groups: int = 1) -> Callable:
    def make():
        x = torch.randn(1, c, hw, hw, dtype=H16)
        w = torch.randn(oc, c // groups, k, k, dtype=H16) * (1.0 / math.sqrt(c // groups * k * k))
        return (lambda x, w: F.conv2d(x, w, None, stride, k // 2, 1, groups)), [x, w]
    return make


def llm_cases(group: str, hidden: int, inter: int, heads: int, kv: int, hd: int) -> list[Case]:
    out = []
    lin = [("q_proj", hidden, heads * hd), ("k_proj", hidden, kv * hd), ("v_proj", hidden, kv * hd),
           ("o_proj", heads * hd, hidden), ("gate_proj", hidden, inter), ("up_proj", hidden, inter),
           ("down_proj", inter, hidden)]
    for seq in (128, 512, 2048):
        for name, k, n in lin:
            out.append(Case(group, f"{name} prefill {seq}", "gemm", _linear(seq, k, n), mkn=(seq, k, n)))
        out.append(Case(group, f"attention prefill {seq}", "attention", _attn(1, heads, kv, seq, seq, hd, True)))
        out.append(Case(group, f"rmsnorm prefill {seq}", "norm", _rms(seq, hidden)))
    for batch in (1, 8, 32):
        for name, k, n in lin:
            out.append(Case(group, f"{name} decode b{batch}", "decode_gemm", _linear(batch, k, n),
                            mkn=(batch, k, n)))
        out.append(Case(group, f"attention decode b{batch} kv2048", "decode_attention",
                        _attn(batch, heads, kv, 1, 2048, hd, True)))
    return out


def quant_cases(cases: list[Case], dtypes: list[str]) -> list[Case]:
    """For every LLM GEMM among ``cases`` (prefill and decode), the same shape in each 8-bit dtype
    of ``dtypes``, right after its fp16 row."""
    out = []
    for c in cases:
        out.append(c)
        if c.mkn is None:
            continue
        m, k, n = c.mkn
        for dt in dtypes:
            if dt != "fp16":
                out.append(Case(c.group, c.name, c.kind, _qlinear(m, k, n, dt), dtype=dt, weights=(1, 3)))
    return out


def all_cases() -> dict[str, list[Case]]:
    g = {
        "llama": llm_cases("llama", 4096, 14336, 32, 8, 128),
        "granite": llm_cases("granite", 4096, 12800, 32, 8, 128),
        "bert": [Case("bert", "qkv/o 512x1024x1024", "gemm", _linear(512, 1024, 1024)),
                 Case("bert", "ffn up 512x1024x4096", "gemm", _linear(512, 1024, 4096)),
                 Case("bert", "ffn down 512x4096x1024", "gemm", _linear(512, 4096, 1024)),
                 Case("bert", "attention 16x512x64", "attention", _attn(1, 16, 16, 512, 512, 64, False)),
                 Case("bert", "layernorm 512x1024", "norm", _ln(512, 1024))],
        "vit": [Case("vit", "qkv/o 197x768x768", "gemm", _linear(197, 768, 768)),
                Case("vit", "mlp up 197x768x3072", "gemm", _linear(197, 768, 3072)),
                Case("vit", "mlp down 197x3072x768", "gemm", _linear(197, 3072, 768)),
                Case("vit", "attention 12x197x64", "attention", _attn(1, 12, 12, 197, 197, 64, False)),
                Case("vit", "layernorm 197x768", "norm", _ln(197, 768))],
        "resnet": [Case("resnet", n, "conv", mk, dynamic=False) for n, mk in [
            ("conv1 7x7/2 3->64 @224", _conv(3, 224, 64, 7, 2)),
            ("1x1 64->64 @56", _conv(64, 56, 64, 1, 1)),
            ("3x3 64->64 @56", _conv(64, 56, 64, 3, 1)),
            ("1x1 64->256 @56", _conv(64, 56, 256, 1, 1)),
            ("1x1 256->64 @56", _conv(256, 56, 64, 1, 1)),
            ("1x1 256->128 @56", _conv(256, 56, 128, 1, 1)),
            ("3x3/2 128->128 @56", _conv(128, 56, 128, 3, 2)),
            ("1x1 128->512 @28", _conv(128, 28, 512, 1, 1)),
            ("1x1/2 256->512 @56", _conv(256, 56, 512, 1, 2)),
            ("1x1 512->128 @28", _conv(512, 28, 128, 1, 1)),
            ("3x3 128->128 @28", _conv(128, 28, 128, 3, 1)),
            ("1x1 512->256 @28", _conv(512, 28, 256, 1, 1)),
            ("3x3/2 256->256 @28", _conv(256, 28, 256, 3, 2)),
            ("1x1 256->1024 @14", _conv(256, 14, 1024, 1, 1)),
            ("1x1/2 512->1024 @28", _conv(512, 28, 1024, 1, 2)),
            ("1x1 1024->256 @14", _conv(1024, 14, 256, 1, 1)),
            ("3x3 256->256 @14", _conv(256, 14, 256, 3, 1)),
            ("1x1 1024->512 @14", _conv(1024, 14, 512, 1, 1)),
            ("3x3/2 512->512 @14", _conv(512, 14, 512, 3, 2)),
            ("1x1 512->2048 @7", _conv(512, 7, 2048, 1, 1)),
            ("1x1/2 1024->2048 @14", _conv(1024, 14, 2048, 1, 2)),
            ("1x1 2048->512 @7", _conv(2048, 7, 512, 1, 1)),
            ("3x3 512->512 @7", _conv(512, 7, 512, 3, 1)),
        ]],
    }
    return g


# ------------------------------------------------------------------------------------ measuring
@contextlib.contextmanager
def _no_execute():
    """Plan, cost and report every launch, but skip computing values (estimates only)."""
    from vspyre import runtime

    saved = runtime.run_fast
    runtime.run_fast = lambda bd, hosts: None
    try:
        yield
    finally:
        runtime.run_fast = saved


_compiled: dict = {}


def _compiled_fn(case: Case, fn: Callable, backend: str) -> Callable:
    if not case.dynamic:
        torch._dynamo.reset()
        return torch.compile(fn, backend=backend, dynamic=False) if backend != "inductor" else torch.compile(fn, dynamic=False)
    key = (case.group, case.kind, case.name.split()[0], case.dtype, backend)
    c = _compiled.get(key)
    if c is None:
        c = torch.compile(fn, backend=backend, dynamic=True) if backend != "inductor" else torch.compile(fn, dynamic=True)
        _compiled[key] = c
    return c


@dataclass
class Row:
    group: str
    name: str
    kind: str
    backend: str
    dtype: str = "fp16"
    est_us: float = 0.0
    roofline_us: float = 0.0
    once_us: float = 0.0
    dma_bytes: int = 0
    compulsory_bytes: int = 0
    kernels: int = 0
    fallbacks: int = 0
    wall_ms: float | None = None
    cpu_ms: float | None = None
    max_err: float | None = None
    schedule: str = ""
    error: str = ""

    @property
    def eff(self) -> float:
        return self.roofline_us / self.est_us if self.est_us else 0.0


def _on_card(case: Case, args: list[torch.Tensor]) -> tuple[list[torch.Tensor], Callable[[], None]]:
    """The inputs on the card as a model holds them: weights (every input of a linear, norm or
    convolution but the first) are parameters, which the planner may re-lay once and keep; the
    activations are new in every call of a model, so ``fresh()`` bumps their versions between calls
    (a re-layout of an activation is then paid on every call, as in the model)."""
    dargs = [a.to("spyre") for a in args]
    attention = case.kind in ("attention", "decode_attention")
    weights = set(case.weights) if case.weights is not None else set() if attention else set(range(1, len(args)))
    dargs = [torch.nn.Parameter(t, requires_grad=False) if i in weights else t for i, t in enumerate(dargs)]

    def fresh() -> None:
        for i, t in enumerate(dargs):
            if i not in weights:
                torch.autograd.graph.increment_version(t)
    return dargs, fresh


def estimate(case: Case, backend: str) -> Row:
    row = Row(case.group, case.name, case.kind, backend, case.dtype)
    try:
        fn, args = case.make()
        dargs, fresh = _on_card(case, args)
        c = _compiled_fn(case, fn, backend)
        torch.spyre.reset_fallback_stats()
        with torch.no_grad(), _no_execute():
            with torch.spyre.profile() as first:
                c(*dargs)
            fresh()
            with torch.spyre.profile() as prof:
                c(*dargs)
        ks = [k for k in prof.kernels if k.extra.get("kind") != "relayout"]
        row.est_us = sum(k.est_us for k in ks)
        row.roofline_us = sum(k.roofline_us for k in ks)
        row.dma_bytes = sum(k.bytes_moved for k in ks)
        row.compulsory_bytes = sum(k.extra.get("compulsory_bytes", 0) for k in ks)
        row.kernels = len(ks)
        row.once_us = sum(k.est_us for k in first.kernels if k.extra.get("kind") == "relayout")
        row.fallbacks = sum(torch.spyre.fallback_stats().values())
        big = max(ks, key=lambda k: k.est_us) if ks else None
        row.schedule = big.extra.get("schedule", "") if big else ""
    except Exception as e:  # noqa: BLE001 - a failing shape is a row
        row.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
        traceback.print_exc(file=sys.stderr)
    return row


def _median_ms(f: Callable, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def functional(case: Case, backend: str, row: Row, reps: int) -> None:
    try:
        fn, args = case.make()
        dargs, fresh = _on_card(case, args)
        c = _compiled_fn(case, fn, backend)
        with torch.no_grad():
            out = c(*dargs)                                  # warm (plans, re-lays weights once)
            row.wall_ms = _median_ms(lambda: (fresh(), c(*dargs)), reps)
            ref = fn(*args)
            row.cpu_ms = _median_ms(lambda: fn(*args), reps)
        row.max_err = float((out.cpu().float() - ref.float()).abs().max())
    except Exception as e:  # noqa: BLE001
        row.error = (row.error + " | " if row.error else "") + f"functional: {type(e).__name__}: {e}"[:200]


def _sampled(cases: list[Case]) -> set[str]:
    """The smallest and the largest shape of each kind in each group (by FLOPs of the inputs)."""
    pick: set[str] = set()
    by: dict[tuple, list[Case]] = {}
    for c in cases:
        by.setdefault((c.group, c.kind), []).append(c)
    for lst in by.values():
        sizes = []
        for c in lst:
            _, args = c.make()
            sizes.append((sum(a.numel() for a in args), c.name))
        sizes.sort()
        pick.add(sizes[0][1])
        pick.add(sizes[-1][1])
    return pick


def _markdown(path: str, rows: list[Row], lines: list[str], elapsed: float, args: Any) -> None:
    import platform

    from vspyre import hardware
    cfg = hardware.get_config()
    out = [f"# Real shapes on the card: `benchmarks/bench_shapes.py`"
           + (f" ({args.dtypes})" if args.dtypes != "fp16" else ""), "",
           f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()} with {__import__('os').cpu_count()} "
           f"CPUs, torch {torch.__version__}, hardware preset `{cfg.name}` (8-bit systolic rate: "
           f"{cfg.matmul_speedup(torch.int8):g}x fp16's), dtypes {args.dtypes}, functional runs: {args.functional} "
           f"(the smallest and the largest shape of each kind per group when sampled), {elapsed / 60:.1f} min.",
           "Regenerate with `.venv/bin/python benchmarks/bench_shapes.py "
           + (f"--groups {args.groups} --dtypes {args.dtypes} " if args.dtypes != "fp16" else "")
           + f"--markdown {path}`.", "",
           "## Summary", ""]
    out += [f"- {ln}" for ln in lines]
    out += ["", "## Every shape", "",
            "est./roofline in us for one steady-state call; eff = roofline / est.; one-time = a weight's "
            "re-layout, paid once; DMA/c = bytes moved / compulsory bytes; wall/CPU = functional wall time "
            "of the compiled call / the same torch ops on the CPU (sampled shapes).", "",
            "| group | shape | dtype | compiler | est. us | roofline us | eff | one-time us | DMA/c | kernels | wall/CPU "
            "| schedule of the largest kernel |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r.dma_bytes / r.compulsory_bytes:.2f}" if r.compulsory_bytes else "-"
        wall = f"{r.wall_ms / r.cpu_ms:.2f}" if r.wall_ms and r.cpu_ms else ""
        out.append(f"| {r.group} | {r.name} | {r.dtype} | {'inductor' if r.backend == 'inductor' else 'standalone'} | "
                   f"{r.est_us:.1f} | {r.roofline_us:.1f} | {r.eff:.2f} | {r.once_us:.0f} | {ratio} | {r.kernels} | "
                   f"{wall} | {(r.error or r.schedule).replace('|', '/')} |")
    with open(path, "w") as fh:
        fh.write("\n".join(out) + "\n")


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", default="llama,granite,bert,vit,resnet")
    ap.add_argument("--functional", default="sampled", choices=("sampled", "all", "none"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", default=None, help="write the table and the summary as Markdown (docs/real-shapes.md)")
    ap.add_argument("--hw", default=None, help="hardware preset (default: the active one, VSPYRE_HW)")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--dtypes", default="fp16",
                    help="fp16 and/or the 8-bit GEMMs: fp8 (_scaled_mm), int8 (_int_mm + dequantisation); the 8-bit "
                         "rows are the LLM linears' shapes, each beside its fp16 row")
    args = ap.parse_args()
    # Weights are parameters, and Dynamo keeps a parameter's shape static: one graph per distinct
    # weight shape (~20 here) of the same lambda. Past the recompile limit Dynamo would run the call
    # eagerly (host fallbacks, no kernels): raise it, and fail loudly if it is ever reached.
    torch._dynamo.config.recompile_limit = 256
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    if args.hw:
        from vspyre import hardware
        hardware.set_config(hardware.PRESETS[args.hw])
    groups = all_cases()
    cases = [c for g in args.groups.split(",") for c in groups[g.strip()]]
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in ("fp16", "fp8", "int8")]
    if bad or (("fp8" in dtypes) and E4M3 is None):
        ap.error(f"--dtypes: fp16, fp8, int8 (this torch {'has no fp8' if not bad else 'got ' + ','.join(bad)})")
    if dtypes != ["fp16"]:
        cases = quant_cases(cases, dtypes)
        if "fp16" not in dtypes:
            cases = [c for c in cases if c.dtype != "fp16"]
    backends = [b.strip() for b in args.backends.split(",")]
    sample = set() if args.functional == "none" else (
        {c.name for c in cases} if args.functional == "all" else _sampled(cases))
    rows: list[Row] = []
    t_start = time.time()
    with Progress(transient=True) as prog:
        task = prog.add_task("shapes", total=len(cases) * len(backends))
        for case in cases:
            for be in backends:
                prog.update(task, description=f"{case.group}: {case.name} [{be}]")
                row = estimate(case, be)
                if case.name in sample and not row.error:
                    functional(case, be, row, args.reps)
                rows.append(row)
                prog.advance(task)
    elapsed = time.time() - t_start
    con = Console(width=200)
    t = Table(title=f"real shapes on the card ({', '.join(dtypes)}), {len(cases)} shapes x {len(backends)} compilers, "
                    f"{elapsed / 60:.1f} min")
    for col in ("group", "shape", "dtype", "compiler", "est. us", "roofline us", "eff", "one-time us", "DMA/compulsory",
                "kernels", "fallbacks", "wall/CPU", "max err", "schedule of the largest kernel / error"):
        t.add_column(col, overflow="fold")
    for r in rows:
        short = "inductor" if r.backend == "inductor" else "standalone"
        ratio = f"{r.dma_bytes / r.compulsory_bytes:.2f}" if r.compulsory_bytes else "-"
        wall = f"{r.wall_ms / r.cpu_ms:.2f}" if r.wall_ms and r.cpu_ms else "-"
        t.add_row(r.group, r.name, r.dtype, short, f"{r.est_us:.1f}", f"{r.roofline_us:.1f}", f"{r.eff:.2f}",
                  f"{r.once_us:.0f}" if r.once_us else "", ratio, str(r.kernels), str(r.fallbacks), wall,
                  f"{r.max_err:.3g}" if r.max_err is not None else "", r.error or r.schedule)
    con.print(t)

    allok = [r for r in rows if not r.error]
    ok = [r for r in allok if r.dtype == "fp16"]          # the fp16 summary; the 8-bit lines follow

    def g(kind: str, be: str | None = None, groups_: tuple = ()) -> float:
        return geomean([r.eff for r in ok if r.kind == kind and (be is None or r.backend == be)
                        and (not groups_ or r.group in groups_)])

    lines = []
    for be in backends:
        lines.append(f"{be}: GEMM prefill eff geomean {g('gemm', be):.2f} (min "
                     f"{min([r.eff for r in ok if r.kind == 'gemm' and r.backend == be] or [0]):.2f}); "
                     f"decode GEMM {g('decode_gemm', be):.2f}; attention "
                     f"{geomean([r.eff for r in ok if r.kind == 'attention' and r.backend == be and '2048' in r.name]):.2f}"
                     f" at seq 2048; decode attention {g('decode_attention', be):.2f}; conv {g('conv', be):.2f}; "
                     f"norms {g('norm', be):.2f}")
    pairs = {}
    for r in ok:                      # fp16 rows
        if r.kind in ("gemm", "decode_gemm", "conv") and r.est_us > 0 and not r.fallbacks:
            pairs.setdefault((r.group, r.name), {})[r.backend] = r.est_us
    worse = [(k, v["inductor"] / v["spyre_standalone"]) for k, v in pairs.items()
             if "inductor" in v and "spyre_standalone" in v and v["inductor"] > v["spyre_standalone"] * 1.0001]
    lines.append(f"inductor vs standalone on GEMMs/convs (est. time): geomean "
                 f"{geomean([v['inductor'] / v['spyre_standalone'] for v in pairs.values() if len(v) == 2]):.3f}, "
                 f"worse on {len(worse)} of {len(pairs)}" + (f": {worse[:4]}" if worse else ""))
    walls = [r.wall_ms / r.cpu_ms for r in allok if r.wall_ms and r.cpu_ms]
    lines.append(f"functional wall / CPU: geomean {geomean(walls):.2f}, max {max(walls) if walls else float('nan'):.2f} "
                 f"over {len(walls)} sampled runs ({args.functional})")
    fp16 = {(r.group, r.name, r.backend): r.est_us for r in ok if r.kind in ("gemm", "decode_gemm") and r.est_us}
    for dt in [d for d in dtypes if d != "fp16"]:
        for be in backends:
            parts = []
            for kind, label in (("gemm", "prefill GEMM"), ("decode_gemm", "decode GEMM")):
                rs = [r for r in allok if r.dtype == dt and r.backend == be and r.kind == kind and r.est_us]
                sp = [fp16[(r.group, r.name, be)] / r.est_us for r in rs if (r.group, r.name, be) in fp16]
                parts.append(f"{label} eff geomean {geomean([r.eff for r in rs]):.2f}, speed-up over fp16 geomean "
                             f"{geomean(sp):.2f} (min {min(sp) if sp else float('nan'):.2f}, max "
                             f"{max(sp) if sp else float('nan'):.2f}; goal >= 1.8) over {len(sp)} shapes")
            lines.append(f"{dt} {be}: " + "; ".join(parts))
    ok = allok
    fell = [f"{r.backend}: {r.name}" for r in ok if r.fallbacks]
    lines.append(f"failed: {len(rows) - len(ok)} of {len(rows)}; with host fallbacks: {len(fell)}"
                 + (f" ({', '.join(fell[:6])})" if fell else ""))
    for ln in lines:
        con.print(ln)
    if args.markdown:
        _markdown(args.markdown, rows, lines, elapsed, args)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": [asdict(r) | {"eff": r.eff} for r in rows], "summary": lines,
                       "minutes": elapsed / 60, "torch": torch.__version__}, fh, indent=1)
    return 0 if len(ok) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
