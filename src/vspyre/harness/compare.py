"""``vspyre compare``: every model x backend in its own subprocess, rows appended as they arrive.

For each row a *cold* process runs everything (load, compile, run, accuracy, graph breaks,
fallbacks, latency, memory, recompiles) with a fresh, empty ``TORCHINDUCTOR_CACHE_DIR``; then a
*warm* process sharing that cache measures the compile time again. A process that crashes or
exceeds ``timeout`` becomes a row (``crash`` / ``timeout``, at the stage it was in). Results are
appended to ``OUT/results.jsonl``; a second run with the same ``OUT`` skips the rows already there
(``--retry-failed`` runs the failed ones again). At the end ``results.json``, ``report.md`` and
``report.html`` are written from every row of ``results.jsonl``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from . import schema
from .backends import Backend, from_spec


@dataclass
class Options:
    out_dir: str = "vspyre-compare"
    jobs: int = 1
    timeout: float = 600.0          # seconds, per process (cold and warm each)
    repeat: int = 5                 # timed calls after warm-up
    warm: bool = True               # also run the warm-cache compile process
    recompiles: bool = True
    resume: bool = True
    retry_failed: bool = False
    ray: str | None = None
    python: str = sys.executable
    extra_env: dict[str, str] = field(default_factory=dict)
    preload: bool = True            # fork workers from a server with torch/transformers imported
    threads: int | None = None      # torch intra-op threads per worker; None = CPUs // jobs


def parse_jobs(value: str | int) -> int:
    """``--jobs``: a positive int, or 'auto' = the CPUs this process may run on (at most 8; each
    row's compile is mostly one busy core, and more rows than cores only stretch every row)."""
    if str(value) == "auto":
        return max(1, min(8, _cpus()))
    n = int(value)
    if n < 1:
        raise ValueError(f"--jobs must be >= 1 or 'auto', got {value!r}")
    return n


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def intra_op_threads(opts: Options) -> int:
    """Threads each worker's torch may use: the CPUs shared out among the rows running at once,
    so parallel rows do not oversubscribe the cores (OpenMP threads spinning against another
    process's threads make small ops 10-30x slower and wall times meaningless)."""
    if opts.threads:
        return opts.threads
    parallel = opts.jobs if not opts.ray else 1
    return max(1, _cpus() // max(1, parallel))


def torch_version() -> str:
    """``torch.__version__`` as the workers record it (``2.15.0+cu132``, not the package
    metadata's ``2.15.0``: resuming matches rows on it), read without importing torch."""
    import importlib.util
    import re
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return "?"
    try:
        text = (Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text()
    except OSError:
        text = ""
    m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    if m:
        return m.group(1)
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "?"


def _tail(path: Path, n: int = 8) -> str:
    try:
        lines = [l for l in path.read_text(errors="replace").splitlines() if l.strip()]
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def _spawn_worker(python: str, job_path: Path, stdout: Path, stderr: Path, env: dict[str, str],
                  timeout: float) -> tuple[int, bool]:
    """A fresh interpreter: ``python -m vspyre.harness.worker`` (returns exit code, timed out)."""
    with open(stderr, "wb") as err, open(stdout, "wb") as so:
        proc = subprocess.Popen([python, "-m", "vspyre.harness.worker", "--job", str(job_path)],
                                stdout=so, stderr=err, env=env, start_new_session=True)
        try:
            return proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            _killpg(proc.pid)                        # the worker's own session: it and its children
            return proc.wait(), True


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


_FORK_CTX = None
_FORK_LOCK = threading.Lock()


def _fork_worker(job_path: Path, stdout: Path, stderr: Path, env: dict[str, str],
                 timeout: float) -> tuple[int, bool]:
    """A worker forked from a server that has imported torch, transformers and the suite's model
    code once (``worker.PRELOAD``; nothing is compiled or run there), so each worker skips those
    imports. Dynamo, Inductor and the device start empty in every worker, as in a new interpreter.
    The worker gets its own session, environment and stdout/stderr files."""
    global _FORK_CTX
    import multiprocessing

    from . import worker
    with _FORK_LOCK:
        if _FORK_CTX is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(list(worker.PRELOAD))
            _FORK_CTX = ctx
    proc = _FORK_CTX.Process(target=worker.forked_main,
                             args=(str(job_path), str(stdout), str(stderr), env, _extra_sys_path(env)))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        _killpg(proc.pid)
        proc.join()
        return proc.exitcode if proc.exitcode is not None else -9, True
    return proc.exitcode, False


def _extra_sys_path(env: dict[str, str]) -> list[str]:
    return [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


def _run_phase(model: str, backend: Backend, phase: str, workdir: Path, cache_dir: Path,
               opts: Options) -> dict[str, Any]:
    out = workdir / f"{phase}.json"
    job = {"model": model, "backend": backend.name, "backend_spec": backend.spec(), "phase": phase,
           "out": str(out), "repeat": opts.repeat, "recompiles": opts.recompiles,
           "threads": intra_op_threads(opts)}
    job_path = workdir / f"{phase}-job.json"
    job_path.write_text(json.dumps(job))
    env = dict(os.environ)
    env.update(opts.extra_env)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    env["VSPYRE_CACHE_DIR"] = str(cache_dir / "vspyre")     # the planner's plans: cold, then warm, too
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH", "")]))
    stderr_path = workdir / f"{phase}.stderr"
    t0 = time.perf_counter()
    if opts.preload and opts.python == sys.executable:
        rc, timed_out = _fork_worker(job_path, workdir / f"{phase}.stdout", stderr_path, env, opts.timeout)
    else:
        rc, timed_out = _spawn_worker(opts.python, job_path, workdir / f"{phase}.stdout", stderr_path, env,
                                      opts.timeout)
    elapsed = time.perf_counter() - t0
    try:
        row = json.loads(out.read_text())
    except (OSError, json.JSONDecodeError):
        row = schema.empty_row(model, backend.name, backend.spec())
    finished = all(v != "not_run" for v in row["stages"].values())
    if timed_out or rc != 0 or not finished:
        kind = "timeout" if timed_out else "crash"
        stage = next((s for s in schema.STAGES if row["stages"].get(s) == "not_run"), "accuracy")
        if timed_out:
            msg = f"timed out after {opts.timeout:g} s in stage {stage!r} ({phase} process)"
        else:
            how = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
            msg = f"process died ({how}) in stage {stage!r} ({phase} process)"
        tail = _tail(stderr_path)
        row["stages"][stage] = kind
        for s in schema.STAGES[schema.STAGES.index(stage) + 1:]:
            row["stages"][s] = "skipped"
        row["status"] = kind
        row["error"] = {"stage": stage, "type": kind, "message": msg + ("\n" + tail if tail else "")}
    row["_elapsed"] = elapsed
    secs = row.get("seconds") or {}
    secs["startup"] = round(max(0.0, elapsed - sum(secs.values())), 3)
    row["seconds"] = secs
    return row


def run_row(model: str, backend_name: str, backend_spec: dict[str, Any], opts: Options) -> dict[str, Any]:
    """Run one model x backend (cold process, then warm process); returns the finished row."""
    backend = from_spec(backend_name, backend_spec)
    t0 = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="vspyre-cmp-"))
    try:
        cache = workdir / "inductor-cache"
        cache.mkdir()
        row = _run_phase(model, backend, "cold", workdir, cache, opts)
        if (opts.warm and backend.compiler is not None and row["stages"].get("compile") == "ok"
                and row["status"] not in ("crash", "timeout")):
            warm = _run_phase(model, backend, "warm", workdir, cache, opts)
            row["compile_warm_s"] = warm.get("compile_warm_s")
            row["seconds"]["warm_process"] = round(warm["_elapsed"], 3)
            if warm["status"] in ("crash", "timeout", "error"):
                row.setdefault("notes", []).append(f"warm process: {warm['status']}: "
                                                   f"{(warm.get('error') or {}).get('message', '')[:300]}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    row.pop("_elapsed", None)
    if not row.get("versions"):
        row["versions"] = {"torch": torch_version(), "python": sys.version.split()[0]}
    row["env"] = {"hostname": socket.gethostname(), "cpus": os.cpu_count(), "repeat": opts.repeat,
                  "timeout_s": opts.timeout, "jobs": opts.jobs, "threads": intra_op_threads(opts),
                  "preload": opts.preload,
                  "ray": opts.ray}
    row["duration_s"] = time.perf_counter() - t0
    row["timestamp"] = schema.now()
    return row


def plan(models: list[str], backends: list[Backend], opts: Options) -> tuple[list[tuple[str, Backend]], list[dict]]:
    """(rows still to run, rows already in OUT/results.jsonl)."""
    path = Path(opts.out_dir) / "results.jsonl"
    existing = schema.read_rows(path) if path.exists() and opts.resume else []
    tv = torch_version()
    done = {schema.row_key(r) for r in existing
            if not (opts.retry_failed and r.get("status") != "ok")}
    todo = [(m, b) for m in models for b in backends if (m, b.name, tv) not in done]
    return todo, existing


def run(models: list[str], backends: list[Backend], opts: Options,
        on_row: Callable[[dict], None] | None = None, progress: bool = True) -> list[dict[str, Any]]:
    """Run the matrix; returns every row of OUT/results.jsonl (merged) and writes the reports."""
    out_dir = Path(opts.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    jsonl = out_dir / "results.jsonl"
    if not opts.resume and jsonl.exists():
        jsonl.unlink()
    todo, existing = plan(models, backends, opts)
    lock = threading.Lock()

    prog = None
    task = None
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        prog = Progress(TextColumn("[bold]compare"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("{task.description}"))
        prog.start()
        task = prog.add_task(f"{len(existing)} rows resumed" if existing else "", total=len(todo))

    def arrived(row: dict[str, Any]) -> None:
        with lock:
            schema.append_jsonl(jsonl, row)
            if prog is not None:
                err = (row.get("error") or {}).get("message", "").splitlines()
                prog.console.print(f"{row['model']:>22s} x {row['backend']:<18s} {row['status']:<13s} "
                                   f"{row.get('duration_s', 0):6.1f}s {err[0][:70] if err else ''}",
                                   markup=False, highlight=False)
                prog.update(task, advance=1, description=f"{row['model']} x {row['backend']}")
            if on_row:
                on_row(row)

    try:
        if opts.ray:
            _run_ray(todo, opts, arrived)
        elif opts.jobs <= 1:
            for m, b in todo:
                arrived(run_row(m, b.name, b.spec(), opts))
        else:
            with ThreadPoolExecutor(max_workers=opts.jobs) as pool:
                futs = [pool.submit(run_row, m, b.name, b.spec(), opts) for m, b in todo]
                for f in as_completed(futs):
                    arrived(f.result())
    finally:
        if prog is not None:
            prog.stop()
    rows = schema.merge([schema.read_rows(jsonl)])
    # Rows arrive in completion order; report them in the order asked for (others after).
    order = {(m, b.name): i for i, (m, b) in enumerate((m, b) for m in models for b in backends)}
    rows.sort(key=lambda r: order.get((r["model"], r["backend"]), len(order)))
    from . import report
    report.write_all(rows, out_dir)
    return rows


def _run_ray(todo: list[tuple[str, Backend]], opts: Options, arrived: Callable[[dict], None]) -> None:
    try:
        import ray
    except ImportError:
        raise RuntimeError("--ray needs the 'ray' package, which is not installed in this environment "
                           "(pip install ray); without it use --jobs N for local parallelism") from None
    ray.init(address=opts.ray, ignore_reinit_error=True)
    remote = ray.remote(num_cpus=1)(run_row)
    refs = [remote.remote(m, b.name, b.spec(), opts) for m, b in todo]
    while refs:
        done, refs = ray.wait(refs, num_returns=1)
        arrived(ray.get(done[0]))
