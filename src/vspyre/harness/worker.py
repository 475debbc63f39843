"""One model x backend, in its own process: ``python -m vspyre.harness.worker --job job.json``.

The job file names the model, the backend spec, the phase (``cold``: everything; ``warm``: only
the compile time, in a second process sharing the Inductor cache) and the output file. The row is
rewritten to the output file after every stage, so the parent can tell which stage a crash or hang
interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from . import schema


def _first_lines(e: BaseException, n: int = 6) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return "\n".join(text.splitlines()[:n])


def _write(path: str, row: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    Path(tmp).write_text(json.dumps(row, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _compile_stage_error(e: BaseException) -> bool:
    from ..compat import dynamo_exc as exc

    compile_types = tuple(t for t in (getattr(exc, n, None) for n in (
        "BackendCompilerFailed", "Unsupported", "InternalTorchDynamoError", "TorchRuntimeError",
        "UserError", "RestartAnalysis")) if isinstance(t, type))
    return isinstance(e, compile_types)


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    import torch
    from ..compat import dynamo_counters as counters

    import vspyre

    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    from . import backends as B
    from . import cases
    from .accuracy import compare
    from .models import greedy_generate

    out_path = job["out"]
    be = B.from_spec(job["backend"], job["backend_spec"])
    phase = job.get("phase", "cold")
    repeat = max(1, int(job.get("repeat", 5)))
    row = schema.empty_row(job["model"], be.name, be.spec())
    seconds: dict[str, float] = {}     # per stage; the parent adds 'startup' (process time not in a stage)
    row["seconds"] = seconds
    mark = [time.perf_counter()]

    def took(stage: str) -> None:
        now = time.perf_counter()
        seconds[stage] = round(seconds.get(stage, 0.0) + now - mark[0], 3)
        mark[0] = now
    try:
        import transformers
        tv = transformers.__version__
    except Exception:
        tv = None
    row["versions"] = {"torch": torch.__version__, "torch_git": getattr(torch.version, "git_version", None),
                       "vspyre": vspyre.__version__, "transformers": tv, "python": sys.version.split()[0],
                       "backend": B.backend_version(be)}
    on_spyre = be.device.startswith("spyre")

    def sync() -> None:
        if on_spyre:
            torch.spyre.synchronize()

    def fail(stage: str, e: BaseException, status: str = "error") -> dict[str, Any]:
        took(stage)
        row["stages"][stage] = "error"
        row["error"] = {"stage": stage, "type": type(e).__name__, "message": _first_lines(e),
                        "traceback_tail": "".join(traceback.format_exception(e)[-3:])[-2000:]}
        row["status"] = status
        for s in schema.STAGES[schema.STAGES.index(stage) + 1:]:
            row["stages"][s] = "skipped"
        row["host_peak_rss_bytes"] = _rss_bytes()
        _write(out_path, row)
        return row

    # -- load ------------------------------------------------------------------------------
    _write(out_path, row)
    try:
        case = cases.build(job["model"])
        decode = case.max_new_tokens is not None
        ref_case = case.clone() if phase == "cold" else None     # CPU fp32 eager, run at the accuracy stage
        if on_spyre:
            torch.spyre.reset_peak_memory_stats()
            torch.spyre.reset_fallback_stats()
        dev = case.to(be.device)
        model = dev.model
        if be.compiler is not None:
            if decode:
                model.forward = torch.compile(model.forward, backend=be.compiler, **be.options)
            else:
                model = torch.compile(model, backend=be.compiler, **be.options)

        def call(inputs: dict[str, Any] = dev.inputs) -> torch.Tensor:
            with torch.no_grad():
                if decode:
                    return greedy_generate(dev.model, inputs["input_ids"], dev.max_new_tokens,
                                           attention_mask=inputs.get("attention_mask"))
                return dev.output_fn(model(**inputs))
        row["stages"]["load"] = "ok"
        _write(out_path, row)
    except BaseException as e:
        return fail("load", e)
    took("load")

    # -- compile (the first call) ---------------------------------------------------------
    counters.clear()
    if be.compiler is None:
        row["stages"]["compile"] = "skipped"
        _write(out_path, row)
    try:
        t0 = time.perf_counter()
        out = call()
        sync()
        first = time.perf_counter() - t0
        if be.compiler is None:
            row["stages"]["compile"] = "skipped"
        else:
            row["stages"]["compile"] = "ok"
            gb = counters["graph_break"]
            row["graph_breaks"] = int(sum(gb.values()))
            row["graph_break_reasons"] = [[str(k), int(v)] for k, v in gb.most_common()]
            row["graphs"] = int(counters["stats"]["unique_graphs"])
            if on_spyre and be.compiler == "inductor":
                from vspyre.inductor.wrapper import compiled_fallbacks
                row["compiled_fallbacks"] = dict(compiled_fallbacks())
        _write(out_path, row)
    except BaseException as e:
        if be.compiler is not None and _compile_stage_error(e):
            return fail("compile", e)
        row["stages"]["compile"] = "ok" if be.compiler is not None else "skipped"
        return fail("run", e)

    took("compile")
    if phase == "warm":
        try:
            t0 = time.perf_counter()
            call()
            sync()
            steady = time.perf_counter() - t0
            row["compile_warm_s"] = max(0.0, first - steady)
            row["stages"]["run"] = "ok"
            row["stages"]["accuracy"] = "skipped"
            row["status"] = "ok"
        except BaseException as e:
            return fail("run", e)
        row["host_peak_rss_bytes"] = _rss_bytes()
        _write(out_path, row)
        return row

    # -- run: warm-up, one profiled call, N timed calls -------------------------------------
    try:
        call()
        sync()
        if on_spyre:
            torch.spyre.reset_fallback_stats()
            with torch.spyre.profile() as prof:
                out = call()
                sync()
            row["host_fallbacks"] = dict(torch.spyre.fallback_stats())
            row["device_est_us"] = float(prof.total_est_us)
            row["kernels"] = len(prof.kernels)
        else:
            out = call()
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            call()
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
        row["wall_ms_all"] = times
        row["wall_ms"] = float(statistics.median(times))
        row["first_call_cold_s"] = first
        if be.compiler is not None:
            row["compile_cold_s"] = max(0.0, first - row["wall_ms"] / 1e3)
        if on_spyre:
            row["peak_device_mem_bytes"] = int(torch.spyre.max_memory_allocated())
        row["stages"]["run"] = "ok"
        _write(out_path, row)
    except BaseException as e:
        return fail("run", e)
    took("run")

    # -- accuracy vs CPU fp32 eager ----------------------------------------------------------
    try:
        res = out.detach().cpu()
        ref = ref_case.generate() if decode else ref_case.output()
        ref64 = None
        if res.dtype in (torch.float16, torch.bfloat16):
            c64 = cases.build(job["model"])
            c64.model.double()
            c64.inputs = {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v
                          for k, v in c64.inputs.items()}
            ref64 = c64.output()
        acc = compare(res, ref, ref64)
        row["accuracy"] = {"ok": acc.ok, "rule": acc.rule, "max_abs_err": acc.max_abs_err,
                           "cosine": acc.cosine, "rmse": acc.rmse, "rmse_fp32": acc.rmse_fp32}
        row["stages"]["accuracy"] = "ok" if acc.ok else "fail"
        row["status"] = "ok" if acc.ok else "accuracy_fail"
        if not acc.ok:
            row["error"] = {"stage": "accuracy", "type": "AccuracyError", "message": str(acc)}
        _write(out_path, row)
    except BaseException as e:
        return fail("accuracy", e)
    took("accuracy")

    # -- recompiles when batch / sequence length vary (does not change the verdict) ------------
    if be.compiler is not None and job.get("recompiles", True):
        before = int(counters["stats"]["unique_graphs"])
        n_ok = 0
        shapes = []
        for label, kw in cases.variants(job["model"]):
            try:
                v = cases.build(job["model"], **kw)
                call(v.to(be.device).inputs)
                sync()
                shapes.append(label)
                n_ok += 1
            except BaseException as e:
                shapes.append(f"{label}: {_first_lines(e, 1)}")
                row["notes"].append(f"recompile variant {label} failed: {_first_lines(e, 3)}")
        row["recompile_shapes"] = shapes
        if shapes:
            row["recompiles"] = int(counters["stats"]["unique_graphs"]) - before
        took("recompiles")
    row["host_peak_rss_bytes"] = _rss_bytes()
    if on_spyre:
        row["peak_device_mem_bytes"] = int(torch.spyre.max_memory_allocated())
    _write(out_path, row)
    return row


# Imported once by the fork server of ``vspyre compare`` (see compare.py), so each worker process
# starts without paying for them again. Only imports: nothing is compiled or run in the server.
PRELOAD = ("torch", "vspyre", "vspyre.harness.worker", "vspyre.harness.cases", "torch._dynamo",
           "torch._inductor.compile_fx", "vspyre.standalone.compiler", "transformers",
           "transformers.models.gpt2.modeling_gpt2", "transformers.models.llama.modeling_llama",
           "transformers.models.bert.modeling_bert", "transformers.models.t5.modeling_t5",
           "transformers.models.vit.modeling_vit", "transformers.models.resnet.modeling_resnet",
           "transformers.models.convnext.modeling_convnext",
           "transformers.models.mobilenet_v2.modeling_mobilenet_v2")


def _quiet() -> None:
    import logging
    import warnings
    warnings.simplefilter("ignore")
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)


def forked_main(job_path: str, stdout_path: str, stderr_path: str, env: dict[str, str],
                sys_path: list[str]) -> None:
    """Entry point of a worker forked from the preloaded server: a new session (so a timeout
    kills its compile subprocesses too), its own stdout/stderr files and environment."""
    os.setsid()
    # Our own multiprocessing resource tracker (the server's is shared): what a compile pool
    # leaves behind at os._exit is cleaned up and reported in this worker's stderr file.
    from multiprocessing import resource_tracker
    rt = resource_tracker._resource_tracker
    if getattr(rt, "_fd", None) is not None:
        try:
            os.close(rt._fd)
        except OSError:
            pass
        rt._fd, rt._pid = None, None          # the next semaphore starts a tracker of our own
    for fd, path in ((1, stdout_path), (2, stderr_path)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    os.environ.clear()
    os.environ.update(env)
    sys.path[:0] = [p for p in sys_path if p not in sys.path]
    try:
        _quiet()
        run_job(json.loads(Path(job_path).read_text()))
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vspyre.harness.worker")
    ap.add_argument("--job", required=True, help="job JSON file")
    args = ap.parse_args(argv)
    job = json.loads(Path(args.job).read_text())
    _quiet()
    run_job(job)
    sys.stdout.flush()
    os._exit(0)      # skip interpreter teardown (fast; the row is already written)


if __name__ == "__main__":
    sys.exit(main())
