"""vspyre's estimates against every published time of the real card.

The cases are data (``data/card-measurements.toml``: shape, dtype, what ran, the card's time, the
source). :func:`run` estimates each on both compilers with each preset (estimate-only mode: kernels
planned and costed, not executed), :func:`summarize` gives the error per case and the mean absolute
and worst error per preset and compiler, :func:`fit` fits a preset's parameters to the kernel cases
(coordinate search in log space minimising the squared log error) and reports leave-one-out error,
and :func:`markdown` writes ``docs/validation.md`` (``benchmarks/bench_validation.py``).

A kernel case is timed as a model runs it: the weight of a matmul is a parameter, re-laid once on
its first call (the stack pre-stores transposed weights); the second call, without that one-time
re-layout, is the estimate. Its *matching compiler* is the one of the stack that ran it on the
card: ``sendnn`` (the old graph compiler) -> vspyre's standalone compiler, the new path ->
Inductor.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from .. import hardware

CASES_FILE = Path(__file__).with_name("data") / "card-measurements.toml"
KINDS = ("matmul", "attention", "softmax", "e2e")
STACKS = ("torch-spyre", "sendnn", "unknown")
COMPILERS = {"inductor": "inductor", "standalone": "spyre_standalone"}
_SHAPE_KEYS = {"matmul": ("m", "k", "n"), "attention": ("batch", "heads", "kv_heads", "queries", "keys", "head_dim"),
               "softmax": ("m", "n"), "e2e": ("model", "batch", "prompt", "phase")}


@dataclass(frozen=True)
class Case:
    id: str
    kind: str
    what: str
    dtype: str
    stack: str
    card_us: float
    source: str
    table_row: str
    fit: bool
    shape: Mapping[str, Any]
    cores: int | None = None          # run on this many cores (the card's own when None)
    note: str = ""

    @property
    def compiler(self) -> str:
        """vspyre's compiler matching the stack that ran the case on the card."""
        return "standalone" if self.stack == "sendnn" else "inductor"

    @property
    def is_kernel(self) -> bool:
        return self.kind != "e2e"

    def label(self) -> str:
        s = self.shape
        if self.kind == "matmul":
            return f"{s['m']}x{s['k']} @ {s['k']}x{s['n']}"
        if self.kind == "attention":
            return f"b{s['batch']} {s['heads']}/{s['kv_heads']}h {s['queries']}q x {s['keys']}kv d{s['head_dim']}"
        if self.kind == "softmax":
            return f"{s['m']}x{s['n']}" + (f" on {self.cores} core(s)" if self.cores else "")
        return f"{s['model']} b{s['batch']} p{s['prompt']} {s['phase']}"


def load_cases(path: str | Path = CASES_FILE) -> list[Case]:
    """The cases of a measurements file, checked (unknown kinds, missing shape keys, duplicate ids)."""
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    out: list[Case] = []
    for i, d in enumerate(data.get("case", [])):
        d = dict(d)
        kind = d.get("kind")
        if kind not in KINDS:
            raise ValueError(f"{path}: case {i}: kind must be one of {KINDS}, got {kind!r}")
        keys = _SHAPE_KEYS[kind]
        missing = [k for k in ("id", "what", "dtype", "stack", "card_us", "source", "table_row", *keys) if k not in d]
        if missing:
            raise ValueError(f"{path}: case {d.get('id', i)}: missing {missing}")
        if d["stack"] not in STACKS:
            raise ValueError(f"{path}: case {d['id']}: stack must be one of {STACKS}")
        if not d["card_us"] > 0:
            raise ValueError(f"{path}: case {d['id']}: card_us must be > 0")
        shape = {k: d.pop(k) for k in keys}
        known = {"id", "kind", "what", "dtype", "stack", "card_us", "source", "table_row", "fit", "cores", "note"}
        extra = set(d) - known
        if extra:
            raise ValueError(f"{path}: case {d['id']}: unknown field(s) {sorted(extra)}")
        out.append(Case(id=d["id"], kind=kind, what=d["what"], dtype=d["dtype"], stack=d["stack"],
                        card_us=float(d["card_us"]), source=d["source"], table_row=d["table_row"],
                        fit=bool(d.get("fit", False)), shape=shape, cores=d.get("cores"), note=d.get("note", "")))
    ids = [c.id for c in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate case ids")
    return out


def error(est_us: float, card_us: float) -> float:
    """Signed relative error of an estimate: est / card - 1 (-0.28 = 28% under the card)."""
    return est_us / card_us - 1.0


# -- running a kernel case ----------------------------------------------------------------------

@dataclass
class KernelResult:
    est_us: float
    roofline_us: float
    launches: int
    bottleneck: str
    schedule: str


class KernelRunner:
    """Compiles each (case, compiler) once and estimates it under any config: the runtime plans and
    costs every launch against the active config, so another config re-plans without recompiling
    (what makes fitting affordable)."""

    def __init__(self) -> None:
        self._compiled: dict[tuple[str, str], tuple[Callable, list, Callable]] = {}

    def _make(self, case: Case, compiler: str):
        import torch
        import torch.nn.functional as F

        dt = getattr(torch, case.dtype)
        s = case.shape
        with torch.spyre.estimate_only():
            if case.kind == "matmul":
                x = torch.empty(s["m"], s["k"], dtype=dt, device="spyre")
                w = torch.nn.Parameter(torch.empty(s["n"], s["k"], dtype=dt, device="spyre"), requires_grad=False)
                fn, args, acts = (lambda x, w: F.linear(x, w)), [x, w], [x]
            elif case.kind == "attention":
                q = torch.empty(s["batch"], s["heads"], s["queries"], s["head_dim"], dtype=dt, device="spyre")
                k = torch.empty(s["batch"], s["kv_heads"], s["keys"], s["head_dim"], dtype=dt, device="spyre")
                v = torch.empty(s["batch"], s["kv_heads"], s["keys"], s["head_dim"], dtype=dt, device="spyre")
                gqa = s["heads"] != s["kv_heads"]
                fn, args = (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)), [q, k, v]
                acts = args
            elif case.kind == "softmax":
                x = torch.empty(s["m"], s["n"], dtype=dt, device="spyre")
                fn, args, acts = (lambda x: torch.softmax(x, -1)), [x], [x]
            else:
                raise ValueError(f"case {case.id}: {case.kind} is not a kernel case")
        backend = COMPILERS[compiler]
        c = torch.compile(fn, dynamic=False) if backend == "inductor" else torch.compile(fn, backend=backend, dynamic=False)

        def fresh() -> None:             # activations are new in every call of a model
            for t in acts:
                torch.autograd.graph.increment_version(t)
        return c, args, fresh

    def estimate(self, case: Case, compiler: str, cfg: hardware.HardwareConfig) -> KernelResult:
        """The steady-state estimate of ``case`` on ``compiler`` with ``cfg``: the second call, with
        the re-layouts it pays (an activation's, every call), without a weight's one-time re-layout."""
        import torch

        key = (case.id, compiler)
        if key not in self._compiled:
            self._compiled[key] = self._make(case, compiler)
        c, args, fresh = self._compiled[key]
        if case.cores:
            cfg = dataclasses.replace(cfg, num_cores=case.cores)
        prev = hardware.set_config(dataclasses.replace(cfg, num_cards=prev_cards()))
        try:
            with torch.spyre.estimate_only(), torch.no_grad():
                c(*args)                                   # first call: plans, re-lays weights once
                fresh()
                with torch.spyre.profile(record_segments=False) as p:
                    c(*args)
        finally:
            hardware.set_config(prev)
        # a re-layout in the second call is an activation's (a weight's was kept from the first): paid per call
        ks = [k for k in p.kernels if k.extra.get("kind") != "relayout"]
        big = max(ks, key=lambda k: k.est_us) if ks else None
        return KernelResult(est_us=sum(k.est_us for k in p.kernels), roofline_us=sum(k.roofline_us for k in ks),
                            launches=len(ks), bottleneck=big.bottleneck if big else "-",
                            schedule=big.extra.get("schedule", "") if big else "")


def prev_cards() -> int:
    return hardware.get_config().num_cards


# -- running an end-to-end case -------------------------------------------------------------------

@dataclass
class E2EResult:
    kernel_us: float          # device time of the phase (kernels + host fallbacks' link time)
    launches: int
    host_overhead_us: float   # launches x the preset's per-call host overhead

    @property
    def est_us(self) -> float:
        return self.kernel_us + self.host_overhead_us


def run_e2e(cases: Sequence[Case], compiler: str, preset: str) -> dict[str, E2EResult]:
    """The end-to-end cases of one model/batch/prompt through ``vspyre estimate``'s path."""
    from .estimate import Options, estimate

    out: dict[str, E2EResult] = {}
    groups: dict[tuple, list[Case]] = {}
    for c in cases:
        groups.setdefault((c.shape["model"], c.shape["batch"], c.shape["prompt"], c.dtype), []).append(c)
    for (model, batch, prompt, dtype), cs in groups.items():
        rep = estimate(Options(name=model, batch=batch, prompt=prompt, new_tokens=1, dtype=dtype,
                               backends=(compiler,), hw=preset, kv=(prompt,)), progress=False)
        r = rep["backends"][compiler]
        for c in cs:
            if c.shape["phase"] == "prefill":
                ph = r["prefill"]
            else:
                ph = min(r["decode"], key=lambda s: abs(s["kv"] - prompt))
            out[c.id] = E2EResult(kernel_us=ph["est_us"], launches=ph["launches"],
                                  host_overhead_us=ph["launches"] * hardware.PRESETS[preset].host_overhead_us)
    return out


# -- results and summaries ----------------------------------------------------------------------

@dataclass
class Row:
    case: Case
    preset: str
    compiler: str
    est_us: float
    roofline_us: float = 0.0
    launches: int = 0
    bottleneck: str = ""
    schedule: str = ""
    kernel_us: float | None = None        # e2e: device time without the host overhead
    error_text: str = ""

    @property
    def err(self) -> float:
        return error(self.est_us, self.case.card_us)


def run(cases: Sequence[Case], presets: Iterable[str], compilers: Iterable[str] = tuple(COMPILERS),
        e2e: bool = True, runner: KernelRunner | None = None, log: Callable[[str], None] = lambda s: None) -> list[Row]:
    runner = runner or KernelRunner()
    rows: list[Row] = []
    presets, compilers = list(presets), list(compilers)
    for c in cases:
        if not c.is_kernel:
            continue
        for comp in compilers:
            for p in presets:
                r = runner.estimate(c, comp, hardware.PRESETS[p])
                rows.append(Row(c, p, comp, r.est_us, r.roofline_us, r.launches, r.bottleneck, r.schedule))
                log(f"{c.id} {comp} {p}: {r.est_us:.1f} us (card {c.card_us})")
    ends = [c for c in cases if not c.is_kernel]
    if e2e and ends:
        for comp in compilers:
            for p in presets:
                got = run_e2e(ends, comp, p)
                for c in ends:
                    g = got[c.id]
                    rows.append(Row(c, p, comp, g.est_us, launches=g.launches, kernel_us=g.kernel_us))
                    log(f"{c.id} {comp} {p}: {g.est_us / 1e3:.1f} ms (card {c.card_us / 1e3:.0f} ms)")
    return rows


@dataclass
class Summary:
    preset: str
    compiler: str           # "matching": each case on the compiler of the stack that ran it
    n: int
    mean_abs: float
    worst: float            # the signed error of largest magnitude
    worst_case: str


def summarize(rows: Sequence[Row], which: Callable[[Case], bool] = lambda c: c.is_kernel) -> list[Summary]:
    """Mean absolute and worst error per preset, per compiler and for the matching compiler."""
    out: list[Summary] = []
    presets = list(dict.fromkeys(r.preset for r in rows))
    compilers = list(dict.fromkeys(r.compiler for r in rows)) + ["matching"]
    for p in presets:
        for comp in compilers:
            sel = [r for r in rows if r.preset == p and which(r.case) and
                   (r.compiler == comp or (comp == "matching" and r.compiler == r.case.compiler))]
            if not sel:
                continue
            w = max(sel, key=lambda r: abs(r.err))
            out.append(Summary(p, comp, len(sel), sum(abs(r.err) for r in sel) / len(sel), w.err, w.case.id))
    return out


# -- fitting ------------------------------------------------------------------------------------

# the parameters `measured` is fitted in, with the box the search stays in (the clock is not: the
# fitted cases do not determine it, see src/vspyre/hardware.py)
FIT_PARAMS: dict[str, tuple[float, float]] = {
    "device_memory_bandwidth": (80e9, 204.8e9),
    "kernel_launch_us": (0.0, 100.0),
}


@dataclass
class FitResult:
    params: dict[str, float]
    errors: dict[str, float]             # case id -> signed error with the fitted params
    loo: dict[str, float]                # case id -> signed error when the case was left out of the fit
    loss: float
    evaluations: int

    @property
    def mean_abs(self) -> float:
        return sum(abs(e) for e in self.errors.values()) / len(self.errors)

    @property
    def worst(self) -> float:
        return max(self.errors.values(), key=abs)

    @property
    def loo_mean_abs(self) -> float:
        return sum(abs(e) for e in self.loo.values()) / len(self.loo) if self.loo else float("nan")

    @property
    def loo_worst(self) -> float:
        return max(self.loo.values(), key=abs) if self.loo else float("nan")


def _loss(cases: Sequence[Case], params: Mapping[str, float], evaluate: Callable[[Case, Mapping[str, float]], float]) -> float:
    return sum(math.log(evaluate(c, params) / c.card_us) ** 2 for c in cases) / len(cases)


def fit_params(cases: Sequence[Case], evaluate: Callable[[Case, Mapping[str, float]], float],
               start: Mapping[str, float], bounds: Mapping[str, tuple[float, float]],
               rounds: int = 8, step: float = 0.25, min_step: float = 0.005) -> tuple[dict[str, float], float, int]:
    """Coordinate search minimising the mean squared log error ``log(est / card)`` over ``cases``.

    ``evaluate(case, params)`` gives the estimate (us) with ``params`` (a dict of the fitted fields).
    Each parameter moves by a relative step (additively in units of its upper bound for one whose
    lower bound is 0, so it can reach 0); the step halves when no move improves. Returns (params,
    loss, evaluations)."""
    p = {k: float(start[k]) for k in bounds}
    best = _loss(cases, p, evaluate)
    n = 1
    s = step
    while s >= min_step:
        improved = False
        for _ in range(rounds):
            moved = False
            for k, (lo, hi) in bounds.items():
                for direction in (+1, -1):
                    q = dict(p)
                    q[k] = p[k] + direction * s * hi if lo == 0 else p[k] * math.exp(direction * s)
                    q[k] = min(hi, max(lo, q[k]))
                    if q[k] == p[k]:
                        continue
                    v = _loss(cases, q, evaluate)
                    n += 1
                    if v < best - 1e-12:
                        p, best, moved, improved = q, v, True, True
                        break
            if not moved:
                break
        if not improved:
            s /= 2
    return p, best, n


def fit(cases: Sequence[Case], evaluate: Callable[[Case, Mapping[str, float]], float],
        start: Mapping[str, float], bounds: Mapping[str, tuple[float, float]] = FIT_PARAMS,
        leave_one_out: bool = True, **kw: Any) -> FitResult:
    """Fit ``bounds``' parameters to ``cases``; with ``leave_one_out`` also refit without each case
    (from the full fit's optimum) and report that case's error under the refit."""
    params, loss, n = fit_params(cases, evaluate, start, bounds, **kw)
    errors = {c.id: error(evaluate(c, params), c.card_us) for c in cases}
    loo: dict[str, float] = {}
    if leave_one_out and len(cases) > 1:
        for c in cases:
            rest = [d for d in cases if d.id != c.id]
            q, _, m = fit_params(rest, evaluate, params, bounds, **kw)
            n += m
            loo[c.id] = error(evaluate(c, q), c.card_us)
    return FitResult(params, errors, loo, loss, n)


def vspyre_evaluator(runner: KernelRunner, base: hardware.HardwareConfig) -> Callable[[Case, Mapping[str, float]], float]:
    """``evaluate(case, params)`` for :func:`fit`: vspyre's estimate on the case's matching compiler
    with ``base`` and the fitted fields replaced (memoised: the search revisits points)."""
    memo: dict[tuple, float] = {}

    def evaluate(case: Case, params: Mapping[str, float]) -> float:
        key = (case.id, tuple(sorted(params.items())))
        if key not in memo:
            memo[key] = runner.estimate(case, case.compiler, dataclasses.replace(base, **params)).est_us
        return memo[key]
    return evaluate


# -- the report ---------------------------------------------------------------------------------

def _pct(e: float) -> str:
    return f"{e:+.0%}"


def _us(us: float) -> str:
    return f"{us / 1e3:.1f} ms" if abs(us) >= 10000 else f"{us:.1f} us"


def case_table(cases: Sequence[Case]) -> list[str]:
    out = ["| case | kind | what ran | shape | dtype | stack | card | source | fitted |", "|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        out.append(f"| `{c.id}` | {c.kind} | {c.what} | {c.label()} | {c.dtype} | {c.stack} | {_us(c.card_us)} | "
                   f"{c.source} | {'yes' if c.fit else 'no'} |")
    return out


def error_table(rows: Sequence[Row], presets: Sequence[str], compilers: Sequence[str]) -> list[str]:
    head = "| case | card | " + " | ".join(f"{comp} `{p}`" for comp in compilers for p in presets) + " |"
    out = [head, "|---|---|" + "---|" * (len(presets) * len(compilers))]
    by = {(r.case.id, r.preset, r.compiler): r for r in rows}
    for cid in dict.fromkeys(r.case.id for r in rows):
        case = next(r.case for r in rows if r.case.id == cid)
        cells = []
        for comp in compilers:
            for p in presets:
                r = by.get((cid, p, comp))
                if r is None:
                    cells.append("-")
                    continue
                mark = "**" if comp == case.compiler else ""
                cells.append(f"{mark}{_us(r.est_us)} ({_pct(r.err)}){mark}")
        out.append(f"| `{cid}` | {_us(case.card_us)} | " + " | ".join(cells) + " |")
    return out


def summary_table(summ: Sequence[Summary]) -> list[str]:
    out = ["| preset | compiler | cases | mean abs error | worst error (case) |", "|---|---|---|---|---|"]
    for s in summ:
        out.append(f"| `{s.preset}` | {s.compiler} | {s.n} | {s.mean_abs:.1%} | {_pct(s.worst)} (`{s.worst_case}`) |")
    return out


# -- the document ---------------------------------------------------------------------------------

NOT_MODELLED = """\
- **Host time.** Python, dispatch, graph preparation and launch on the host are not device time. The
  only host term is a preset's `host_overhead_us` per kernel call (`torch-spyre-2026`: 3 ms, what
  the early stack paid when synchronising after each call), reported apart by `vspyre estimate`.
  Host fallbacks cost only their bytes over the host link.
- **Stack versions.** The cases come from different stacks and dates (the contributor's diagnostics,
  the granite e2e suite, the cost model's docs); vspyre has one schedule per shape and compiler, so
  two stacks timing the same shape differently (QO prefill: 321 vs 358 us) meet one estimate.
- **Schedule choices of the real compilers.** vspyre plans each kernel with its own planner
  (work division, tiles, double buffering); it does not reproduce sendnn's or torch-spyre's
  schedules, their weaknesses (attention as the new path runs it) or their kernel boundaries.
- **DRAM and bus details.** No banks, pages or refresh, no contention beyond the bus share; a
  kernel's DMA runs at the preset's bandwidth shared by its active cores.
- **Unspilled intermediates.** The scratchpad is always planned: vspyre has no schedule that spills
  fused intermediates to device memory (the softmax case without planning).
- **Causal and masked tiles** are computed, never skipped; fp32 vector ops cost what fp16 ones do;
  int8/fp8 use the fp16 matmul rate (see docs/latency-model.md, "What it leaves out").
"""


COMPILERS_WHY = """\
**What in vspyre's schedules explains it.** vspyre's two compilers meet in one tile-program IR, one
planner and one latency model. `F.linear` becomes one systolic `Matmul` program on both (the
standalone compiler's op table and Inductor's native-matmul form give the same program), planned
the same way: the same work division, tiles and double buffering, so the same estimate (the
schedules above; "same schedule" is checked when this page is generated). SDPA becomes the same
library flash-attention program on both (`vspyre.ir.library.attention`: online softmax, the scores
never written to device memory). So vspyre predicts no difference between the old and the new
compiler on these kernels, where the card shows the new path 10-15% faster on the two matmuls
(same bytes and FLOPs: a difference in the real compilers' work division, DMA or synchronisation
that is not published) and 4.3x slower on attention (the new path's known weakness: how it now
runs attention is not published in enough detail to model; vspyre's Inductor path gets the fused
program). The attention times themselves are below the stated shape's compute bound at the
datasheet peak (notes on cases), so they can be compared as a ratio only. To show the new path's
attention weakness vspyre would need a lowering of SDPA that reproduces it (for instance unfused
score, softmax and value kernels), which would be a model of that stack's schedule, not of the
card."""


E2E_READING = """\
Reading it: the device time is what vspyre's planned kernels take on the `measured` card; the
early stack's figure is several times larger, and the published ~3 ms per synchronised call
explains that gap only if the stack paid it on fewer calls than vspyre launches kernels (the last
column: the host time per vspyre launch the card's figure leaves after the device time). A
negative remainder means launches x 3 ms over-counts: the early stack did not synchronise after
every kernel vspyre launches (it ran fewer, larger calls, or queued some); a positive one is host
work beyond the per-call overhead (CPU-side eager ops, transposed matmuls re-laid per call,
unfused elementwise kernels), which vspyre does not model."""


def _fit_section(fr: FitResult, start: Mapping[str, float], start_errors: Mapping[str, float]) -> list[str]:
    def v(k: str, x: float) -> str:
        return {"clock_hz": f"{x / 1e9:.3f} GHz", "device_memory_bandwidth": f"{x / 1e9:.1f} GB/s",
                "kernel_launch_us": f"{x:.1f} us"}.get(k, f"{x:.4g}")
    out = ["| parameter | published (start) | fitted | box |", "|---|---|---|---|"]
    for k, x in fr.params.items():
        lo, hi = FIT_PARAMS.get(k, (float("nan"), float("nan")))
        at = " (at its bound)" if x in (lo, hi) else ""
        out.append(f"| `{k}` | {v(k, start[k])} | {v(k, x)}{at} | {v(k, lo)} - {v(k, hi)} |")
    out += ["", "| case | card | published: error | fitted: error | left out of the fit: error |", "|---|---|---|---|---|"]
    for cid, e in fr.errors.items():
        out.append(f"| `{cid}` | | {_pct(start_errors[cid])} | {_pct(e)} | {_pct(fr.loo[cid]) if cid in fr.loo else '-'} |")
    sm = sum(abs(x) for x in start_errors.values()) / len(start_errors)
    sw = max(start_errors.values(), key=abs)
    out += ["", f"Mean absolute error: published {sm:.1%} (worst {_pct(sw)}), fitted {fr.mean_abs:.1%} (worst "
            f"{_pct(fr.worst)}), leave-one-out {fr.loo_mean_abs:.1%} (worst {_pct(fr.loo_worst)}); "
            f"{fr.evaluations} estimates of the fitted cases."]
    return out


def _compilers_section(rows: Sequence[Row], preset: str) -> list[str]:
    """Old compiler against the new on the cases measured with both stacks."""
    pairs: dict[str, dict[str, Case]] = {}
    for r in rows:
        if r.case.stack in ("sendnn", "torch-spyre") and r.case.is_kernel and r.case.kind != "softmax":
            key = r.case.id.rsplit("-", 1)[0] if r.case.id.endswith(("-sendnn", "-torch-spyre")) else r.case.id
            key = key.removesuffix("-torch")
            pairs.setdefault(key, {})[r.case.stack] = r.case
    by = {(r.case.id, r.preset, r.compiler): r for r in rows}
    out = [f"| kernel | sendnn (card) | torch-spyre (card) | new / old on the card | vspyre standalone `{preset}` | "
           f"vspyre Inductor `{preset}` | Inductor / standalone | same schedule |", "|---|---|---|---|---|---|---|---|"]
    notes = []
    for key, d in pairs.items():
        if set(d) != {"sendnn", "torch-spyre"}:
            continue
        old, new = d["sendnn"], d["torch-spyre"]
        s, i = by.get((old.id, preset, "standalone")), by.get((new.id, preset, "inductor"))
        if s is None or i is None:
            continue
        same = s.schedule == i.schedule
        out.append(f"| {new.label()} ({key}) | {_us(old.card_us)} | {_us(new.card_us)} | {new.card_us / old.card_us:.2f}x | "
                   f"{_us(s.est_us)} | {_us(i.est_us)} | {i.est_us / s.est_us:.2f}x | {'yes' if same else 'no'} |")
        notes.append(f"- `{key}`: standalone `{s.schedule or '-'}`; Inductor `{i.schedule or '-'}`"
                     f" (bottleneck {s.bottleneck} / {i.bottleneck}, roofline {_us(i.roofline_us)})")
    return out + ["", "Schedules of the largest kernel (standalone; Inductor):", ""] + notes + ["", COMPILERS_WHY]


def _e2e_section(rows: Sequence[Row]) -> list[str]:
    out = ["| case | compiler | preset | card | kernel (device) time | launches | launches x host overhead | "
           "estimate with overhead | remainder (card - estimate) | host time per launch the card's figure implies | "
           "calls at the preset's overhead the card's figure leaves room for |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.case.is_kernel or r.kernel_us is None:
            continue
        over = r.est_us - r.kernel_us
        per = over / r.launches if r.launches else 0.0
        gap = r.case.card_us - r.kernel_us
        implied = _us(gap / r.launches) if r.launches else "-"
        calls = f"{gap / per:.0f}" if per else "-"
        out.append(f"| `{r.case.id}` | {r.compiler} | `{r.preset}` | {_us(r.case.card_us)} | {_us(r.kernel_us)} | "
                   f"{r.launches} | {_us(over)} | {_us(r.est_us)} ({_pct(r.err)}) | {_us(r.case.card_us - r.est_us)} | "
                   f"{implied} | {calls} |")
    return out


def markdown(cases: Sequence[Case], rows: Sequence[Row], presets: Sequence[str], compilers: Sequence[str],
             fit_result: FitResult | None = None, fit_start: Mapping[str, float] | None = None,
             fit_start_errors: Mapping[str, float] | None = None, header: Sequence[str] = ()) -> str:
    out = ["# vspyre's estimates against the real card", "", *header, "",
           "Every kernel or end-to-end time published for the card (`../shared/spyre-hardware.md`, \"Measured on the "
           "real card\") is a case in `src/vspyre/harness/data/card-measurements.toml`; "
           "`benchmarks/bench_validation.py` (logic: `vspyre.harness.validation`) estimates each on both of "
           "vspyre's compilers with each preset, in estimate-only mode, and writes this page. Error = estimate / card "
           "- 1 (negative: vspyre is faster than the card). Every figure names its preset. A kernel case's "
           "*matching compiler* (in **bold** below) is the one of the stack that ran it: sendnn -> standalone, "
           "the new path (or unknown) -> Inductor.", "",
           "## Presets", "",
           "| preset | what it is |", "|---|---|"]
    for p in presets:
        cfg = hardware.PRESETS[p]
        out.append(f"| `{p}` | {cfg.peak_fp16_flops / 1e12:.1f} TFLOP/s fp16 ({cfg.clock_hz / 1e9:.3f} GHz), "
                   f"{cfg.device_memory_bandwidth / 1e9:.1f} GB/s, {cfg.kernel_launch_us:.1f} us per kernel, "
                   f"host {cfg.host_overhead_us / 1e3:.1f} ms per call; sources: `vspyre hw --preset {p}` |")
    out += ["", "## Summary: kernel cases", "",
            "The cases `measured` is fitted to (`fit = true`: the new path's matmuls), then every matmul (the old "
            "compiler's too), then every kernel case (attention and the one-core softmax included: see the notes "
            "on cases for why vspyre cannot meet them).", "",
            *summary_table(summarize(rows, lambda c: c.is_kernel and c.fit)), "", "Every matmul case:", "",
            *summary_table(summarize(rows, lambda c: c.kind == "matmul")), "", "Every kernel case:", "",
            *summary_table(summarize(rows)), "",
            "## Every case", "", *error_table([r for r in rows if r.case.is_kernel], presets, compilers), "",
            "Notes on cases:", ""]
    out += [f"- `{c.id}`: {c.note}" for c in cases if c.note]
    if fit_result is not None and fit_start is not None and fit_start_errors is not None:
        out += ["", "## The fit of `measured`", "",
                "`vspyre.harness.validation.fit`: a coordinate search in log space minimising the mean squared "
                "log error over the fitted cases, each estimated by vspyre itself on its matching compiler "
                "(the planner re-plans for every candidate). It starts from the published constants (the cost "
                "model's 150 GB/s, the contributor's 1.1 GHz, no fixed cost per kernel). Leave-one-out: the fit "
                "is repeated without each case, and that case is estimated with the parameters fitted without it.",
                "", *_fit_section(fit_result, fit_start, fit_start_errors)]
    if "measured" in presets:
        out += ["", "## The old compiler against the new", "", *_compilers_section(rows, "measured")]
    e2e = [r for r in rows if not r.case.is_kernel]
    if e2e:
        out += ["", "## End to end: Granite 3.3 8B, batch 1, prompt 128", "",
                "The early stack's figures beside vspyre's, the gap decomposed: the device time of the kernels "
                "(vspyre's estimate), the host's per-call overhead (launches x the preset's `host_overhead_us`), "
                "and what remains.", "", *_e2e_section(e2e), "", E2E_READING]
    out += ["", "## What vspyre does not model", "", NOT_MODELLED]
    return "\n".join(out) + "\n"
