"""The ``vspyre`` command."""

from __future__ import annotations

import argparse
import os
import sys


def _cmd_demo(args: argparse.Namespace) -> int:
    import torch  # noqa: F401  (autoloads the spyre device)

    from .harness import demo

    return demo.run()


def _cmd_hw(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from . import hardware

    cfg = hardware.PRESETS[args.preset] if args.preset else hardware.get_config()
    table = Table(title=f"hardware config '{cfg.name}'")
    for col in ("field", "value", "meaning", "source"):
        table.add_column(col)
    for name, value, doc, source in cfg.describe():
        table.add_row(name, str(value), doc, source)
    for name in ("usable_memory_bytes", "scratchpad_usable_bytes", "peak_fp16_flops", "core_memory_bandwidth"):
        table.add_row(name, f"{getattr(cfg, name):.6g}", "derived", "")
    Console().print(table)
    return 0


def _cmd_ops(args: argparse.Namespace) -> int:
    import torch  # noqa: F401  (autoloads the spyre device)

    if args.backend != "standalone":
        print(f"vspyre ops: backend {args.backend!r} has no op listing here (known: standalone)")
        return 2
    from . import standalone

    for op, kind, how in standalone.op_table_rows():
        print(f"{op:60s} {kind:7s} {how}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    import time

    from .harness import backends as B
    from .harness import cases
    from .harness import compare as C

    if args.model:
        models = list(args.model)
    else:
        names = [n.strip() for n in args.suite.split(",") if n.strip()]
        models = []
        for n in names:
            if n in cases.SUITES:
                models += cases.SUITES[n]
            elif n in cases.REGISTRY:
                models.append(n)
            else:
                print(f"vspyre compare: unknown suite or model {n!r}; suites: {', '.join(cases.SUITES)}; "
                      f"models: {', '.join(cases.REGISTRY)}", file=sys.stderr)
                return 2
    try:
        backends = B.parse_backends(args.backends)
    except ValueError as e:
        print(f"vspyre compare: {e}", file=sys.stderr)
        return 2
    if args.ray:
        try:
            import ray  # noqa: F401
        except ImportError:
            print("vspyre compare: --ray needs the 'ray' package, which is not installed here "
                  "(pip install ray); use --jobs N for local parallelism", file=sys.stderr)
            return 2
    try:
        jobs = C.parse_jobs(args.jobs)
    except ValueError:
        print(f"vspyre compare: --jobs must be a positive integer or 'auto', got {args.jobs!r}", file=sys.stderr)
        return 2
    opts = C.Options(out_dir=args.out, jobs=jobs, timeout=args.timeout, repeat=args.repeat,
                     warm=not args.no_warm, recompiles=not args.no_recompiles, resume=not args.fresh,
                     retry_failed=args.retry_failed, ray=args.ray, preload=not args.no_preload, threads=args.threads)
    t0 = time.perf_counter()
    rows = C.run(models, backends, opts)
    wanted = {(m, b.name) for m in models for b in backends}
    mine = [r for r in rows if (r["model"], r["backend"]) in wanted]
    ok = sum(r["status"] == "ok" for r in mine)
    print(f"vspyre compare: {ok}/{len(mine)} rows ok in {time.perf_counter() - t0:.1f} s; "
          f"{args.out}/results.jsonl, results.json, report.md, report.html")
    bad = [f"{r['model']} on {r['backend']}: {r['status']}" for r in mine if r["status"] != "ok"]
    if bad and not args.allow_failures:
        print("vspyre compare: rows not ok (exit 1; --allow-failures to exit 0): " + "; ".join(bad), file=sys.stderr)
        return 1
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from .harness import report

    rows = report.load(args.inputs)
    paths = report.write_all(rows, args.out)
    print(f"vspyre report: {len(rows)} rows -> " + ", ".join(str(p) for p in paths.values()))
    return 0


def _cmd_estimate(args: argparse.Namespace) -> int:
    import dataclasses

    import torch  # noqa: F401  (autoloads the spyre device)
    from rich.console import Console
    from rich.markdown import Markdown

    from .harness import estimate as E

    try:
        kv = tuple(int(x) for x in args.kv.split(",") if x.strip())
    except ValueError:
        print(f"vspyre estimate: --kv must be comma-separated integers, got {args.kv!r}", file=sys.stderr)
        return 2
    quants = [q.strip() for q in (args.quant or "").split(",") if q.strip()]
    opts = E.Options(name=args.name, config=args.config, batch=args.batch, prompt=args.prompt,
                     new_tokens=args.new_tokens, dtype=args.dtype,
                     backends=tuple(E.BACKENDS) if args.backend == "both" else (args.backend,),
                     cards=args.cards, hw=args.hw, kv=kv, layers=args.layers, execute=args.execute, top=args.top,
                     routing=args.routing, compile=args.compile, tp=args.tp)
    # --quant A[,B]: the unquantised model first (unless --no-baseline), then each scheme; each gets
    # its report, and with two or more a side-by-side comparison
    variants = ([None] if not quants or not args.no_baseline else []) + quants
    from .quant import SCHEMES
    for q in quants:                       # before the baseline's minutes, not after
        if q not in SCHEMES:
            print(f"vspyre estimate: unknown --quant {q!r}; one of {', '.join(SCHEMES)}", file=sys.stderr)
            return 2
    reports = []
    for q in variants:
        o = dataclasses.replace(opts, quant=q)
        try:
            report = E.estimate(o, progress=not args.no_progress)
        except E.EstimateError as e:
            print(f"vspyre estimate: {e}", file=sys.stderr)
            return 2
        except torch.OutOfMemoryError as e:
            print(f"vspyre estimate: {str(e).splitlines()[0]}", file=sys.stderr)
            return 2
        Console(width=150).print(Markdown(E.markdown(report)))
        paths = E.write(report, args.out)
        print("vspyre estimate: " + ", ".join(paths))
        reports.append(report)
    if len(reports) > 1:
        Console(width=150).print(Markdown(E.quant_comparison(reports)))
        print("vspyre estimate: " + ", ".join(E.write_comparison(reports, args.out)))
    unfit = [r for r in reports if not r["fits"]]
    for r in unfit:
        print(f"vspyre estimate: {E._label(r)} does not fit {E._cards(opts.cards)} (needs {r['cards_needed']})",
              file=sys.stderr)
    return 3 if unfit else 0


def _cmd_serve_estimate(opts: argparse.Namespace) -> int:
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("vspyre serve-estimate drives vLLM's engine: install vLLM beside vspyre (make test-vllm builds "
              ".venv-vllm; or pip install vspyre[vllm])", file=sys.stderr)
        return 2
    if opts.hw:
        from . import hardware
        if opts.hw not in hardware.PRESETS:
            print(f"unknown hardware preset {opts.hw!r}; presets: {', '.join(hardware.PRESETS)}", file=sys.stderr)
            return 2
        import dataclasses
        os.environ["VSPYRE_HW"] = opts.hw
        hardware.set_config(dataclasses.replace(hardware.PRESETS[opts.hw], num_cards=hardware.get_config().num_cards))
    from .vllm_plugin import serve_estimate
    return serve_estimate.main(opts)


def _cmd_make_model(opts: argparse.Namespace) -> int:
    import torch

    from .harness import checkpoints

    path = checkpoints.write(opts.dir, opts.family, seed=opts.seed, dtype=getattr(torch, opts.dtype))
    print(f"wrote a tiny {opts.family} model (random weights, byte tokenizer) to {path}: "
          f"vllm serve {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vspyre", description="A virtual Spyre-class AI accelerator for PyTorch")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("demo", help="run a tiny GPT-2 on the virtual card and print its report")
    p.set_defaults(fn=_cmd_demo)
    p = sub.add_parser("hw", help="print the hardware config (active, or a preset)")
    p.add_argument("--preset", choices=None, help="a preset name instead of the active config")
    p.set_defaults(fn=_cmd_hw)
    p = sub.add_parser("ops", help="list the ATen ops a compiler lowers natively")
    p.add_argument("--backend", default="standalone", help="which compiler (standalone)")
    p.set_defaults(fn=_cmd_ops)
    p = sub.add_parser("compare", help="run models x backends, each in its own process; write JSONL/JSON/MD/HTML")
    p.add_argument("--suite", default="default", help="suite name(s) or model names, comma-separated "
                   "(default, forward, decode, smoke; or gpt2,llama-decode,...)")
    p.add_argument("--model", action="append", help="a user model 'pkg.module:function' or 'file.py:function' "
                   "(repeatable; replaces --suite)")
    p.add_argument("--backends", default="eager-cpu,inductor-cpu,inductor-spyre,standalone-spyre",
                   help="comma-separated: built-in names or COMPILER@DEVICE[?opt=val&...]")
    p.add_argument("--out", default="vspyre-compare", help="output directory (results.jsonl is resumed)")
    p.add_argument("--jobs", default="auto",
                   help="rows run in parallel (local processes); 'auto' = the CPUs this process may use, "
                        "at most 8. Use 1 for the least noisy wall times")
    p.add_argument("--ray", metavar="ADDRESS", help="run rows as Ray tasks on this cluster (needs 'ray')")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per worker process")
    p.add_argument("--repeat", type=int, default=5, help="timed calls after warm-up (median reported)")
    p.add_argument("--no-warm", action="store_true", help="skip the warm-cache compile process")
    p.add_argument("--no-recompiles", action="store_true", help="skip the batch/sequence-length variants")
    p.add_argument("--fresh", action="store_true", help="discard OUT/results.jsonl instead of resuming")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads per worker (default: the CPUs divided among the parallel rows)")
    p.add_argument("--no-preload", action="store_true",
                   help="start every worker as a new interpreter instead of forking it from a server "
                        "that has imported torch and transformers once (slower; for debugging)")
    p.add_argument("--retry-failed", action="store_true", help="when resuming, run rows that did not pass again")
    p.add_argument("--allow-failures", action="store_true",
                   help="exit 0 even when rows are not ok (by default a failed, crashed or timed-out row exits 1)")
    p.set_defaults(fn=_cmd_compare)
    p = sub.add_parser("estimate", help="time to first token, tokens/s, memory and compile time of a full-size "
                       "LLM on the card, without its weights (estimate-only: kernels planned and costed, not run)")
    p.add_argument("name", nargs="?", help="a built-in config: llama-3-8b, granite-3-8b, llama-3-70b, mixtral-8x7b")
    p.add_argument("--config", help="a transformers config.json instead of a built-in name")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens (prefill)")
    p.add_argument("--new-tokens", type=int, default=128, help="generated tokens (decode)")
    p.add_argument("--dtype", default="float16", help="float16, bfloat16 or float32")
    p.add_argument("--backend", default="inductor", choices=["inductor", "standalone", "both"])
    p.add_argument("--cards", type=int, default=1, help="cards whose device memory the model may use, pooled (times are one card's)")
    p.add_argument("--tp", type=int, default=1,
                   help="tensor parallel over N cards (one rank each; estimate-only simulates the N identical ranks "
                        "in one process); per-card memory and times with the collectives shown apart")
    p.add_argument("--hw", default=None, help="hardware preset (torch-spyre, ktir-cpu, card-limit, measured, torch-spyre-2026)")
    p.add_argument("--kv", default="128,2048,8192", help="KV-cache lengths to time a decode step at")
    p.add_argument("--layers", type=int, default=None, help="override the number of layers (a shallower model)")
    p.add_argument("--execute", action="store_true",
                   help="run the kernels functionally with random weights instead of estimate-only (small configs)")
    p.add_argument("--top", type=int, default=10, help="kernels listed per backend")
    p.add_argument("--routing", default="balanced",
                   help="mixture-of-experts models in estimate-only mode (no router values): 'balanced' (routed "
                        "tokens spread evenly over the experts) or 'skewed:F' (fraction F of them to one expert)")
    p.add_argument("--compile", default="regional", choices=["regional", "whole"],
                   help="regional: the decoder layer compiled once and reused for every layer (default); "
                        "whole: the model as one graph")
    p.add_argument("--quant", default=None,
                   help="fp8, fp8-static, w8a8 or w4a16 (comma-separated for several): the linears quantised with "
                        "torchao (fp8-static: activation scales calibrated on random token ids, right for cost, not "
                        "accuracy); estimated beside the unquantised model, side by side (estimate-<model>-quant.md)")
    p.add_argument("--no-baseline", action="store_true", help="with --quant: skip the unquantised estimate")
    p.add_argument("--out", default="vspyre-estimate", help="directory for estimate-<model>.json and .md")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(fn=_cmd_estimate)
    p = sub.add_parser("serve-estimate", help="throughput and latency of a full-size LLM served by vLLM on the card "
                       "at a given load, on a virtual clock (estimate-only: no weights, steps costed not run)")
    p.add_argument("name", nargs="?", help="a built-in config: llama-3-8b, granite-3-8b, llama-3-70b, mixtral-8x7b")
    p.add_argument("--config", help="a transformers config.json instead of a built-in name")
    p.add_argument("--layers", type=int, default=None, help="override the number of layers")
    p.add_argument("--qps", default="inf", help="request rates, comma-separated (inf: all at once); Poisson arrivals")
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--prompt", default="512", help="prompt tokens: N or LO:HI (uniform)")
    p.add_argument("--output", default="128", help="output tokens: N or LO:HI (uniform); outputs run to their length")
    p.add_argument("--trace", default=None, help="CSV of arrival_s,prompt_tokens,output_tokens instead of --qps/--prompt/--output")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--prefix-caching", action="store_true")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--backend", default="inductor", choices=["inductor", "standalone", "both"])
    p.add_argument("--batching", default="native", choices=["native", "continuous", "static", "both"],
                   help="continuous (vLLM's scheduler, chunked prefill, symbolic shapes) or static (warmup shapes "
                        "compiled at start-up, one padded batch at a time); native: standalone static, inductor "
                        "continuous, as each stack served")
    p.add_argument("--warmup-shapes", default=None,
                   help="static batching's shapes, PROMPTxNEWxBATCH comma-separated (default: the load's longest "
                        "prompt in 64-token blocks x its longest output x --static-batch)")
    p.add_argument("--static-batch", type=int, default=4, help="batch size of the default warmup shape")
    p.add_argument("--startup-warm", action="store_true",
                   help="also start a second engine with the compiler's caches warm and report its compile time")
    p.add_argument("--quant", default=None,
                   help="fp8, w8a8 or w4a16 (comma-separated for several): the linears quantised with torchao on the "
                        "card (vLLM's --additional-config vspyre_quant); served beside the unquantised model")
    p.add_argument("--no-baseline", action="store_true", help="with --quant: skip the unquantised runs")
    p.add_argument("--hw", default=None, help="hardware preset (torch-spyre, ktir-cpu, card-limit, measured, torch-spyre-2026)")
    p.add_argument("--out", default="vspyre-serve-estimate")
    p.add_argument("--no-plot", action="store_true", help="no latency-throughput PNG")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(fn=_cmd_serve_estimate)
    p = sub.add_parser("make-model", help="write a tiny decoder checkpoint (config.json, safetensors, tokenizer) "
                       "to serve with vLLM (random weights; nothing downloaded)")
    p.add_argument("dir")
    p.add_argument("--family", default="llama", choices=["llama", "granite", "mistral", "qwen2", "qwen3"])
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=_cmd_make_model)
    p = sub.add_parser("report", help="merge compare results (JSONL/JSON) and render JSON, Markdown, HTML")
    p.add_argument("inputs", nargs="+", help="results.jsonl / results.json files (later ones win)")
    p.add_argument("--out", default="vspyre-report", help="output directory")
    p.set_defaults(fn=_cmd_report)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
