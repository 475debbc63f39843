"""Start N ranks on this machine, one card each, and collect what each returns.

``torchrun`` is the usual way (it sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` and the rendezvous);
:func:`run` is the same for a Python function, on ``torch.multiprocessing``'s spawn: each rank gets
``VSPYRE_NUM_CARDS`` = the world size (unless ``env`` says otherwise), its ``LOCAL_RANK``, a fresh rendezvous port, and the default
``spyre`` process group before ``fn(rank, *args)`` is called. Bounded: ranks that are still running
after ``timeout`` seconds are killed and the error names them (nothing hangs), and a rank's exception
is raised in the caller with its rank.
"""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch.multiprocessing as mp

from .backend import BACKEND, SpyreDistributedError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, fn: Callable[..., Any], world: int, port: int, out_dir: str, collective_timeout: float,
               env: dict[str, str], args: tuple) -> None:
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    import torch.distributed as dist

    out = Path(out_dir) / f"rank{rank}.pkl"
    try:
        dist.init_process_group(BACKEND, rank=rank, world_size=world, timeout=timedelta(seconds=collective_timeout))
        try:
            result = fn(rank, *args)
        finally:
            dist.destroy_process_group()
        out.write_bytes(pickle.dumps(("ok", result)))
    except BaseException as e:  # noqa: BLE001 - reported to the caller with the rank
        out.write_bytes(pickle.dumps(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")))
        raise SystemExit(1)


def run(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 300.0,
        collective_timeout: float = 60.0, env: dict[str, str] | None = None) -> list[Any]:
    """Run ``fn(rank, *args)`` on ``world_size`` ranks (processes), each with the default ``spyre``
    group initialised and card ``spyre:rank`` bound; return the ranks' results in rank order.

    ``fn`` must be importable by name (a module-level function). ``collective_timeout`` is the
    group's timeout (a collective some rank never joins fails after it, naming that rank);
    ``timeout`` bounds the whole run."""
    if world_size < 1:
        raise ValueError(f"launch.run: world size must be >= 1, got {world_size}")
    with tempfile.TemporaryDirectory(prefix="vspyre-ranks-") as out_dir:
        rank_env = {"VSPYRE_NUM_CARDS": str(world_size), **(env or {})}
        saved = {k: os.environ.get(k) for k in rank_env}
        os.environ.update(rank_env)         # the ranks inherit it: torch reads it when it starts, at import
        try:
            ctx = mp.start_processes(_rank_main, args=(fn, world_size, free_port(), out_dir, collective_timeout,
                                                       rank_env, args),
                                     nprocs=world_size, join=False, start_method="spawn")
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        deadline = time.monotonic() + timeout
        failure: Exception | None = None
        try:
            while not ctx.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
                if time.monotonic() > deadline:
                    alive = [r for r, p in enumerate(ctx.processes) if p.is_alive()]
                    failure = SpyreDistributedError(
                        f"launch.run: rank(s) {alive} of {world_size} still running after {timeout:.0f} s; killed")
                    break
        except mp.ProcessRaisedException as e:
            failure = e
        except mp.ProcessExitedException as e:
            failure = e
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                p.join(5)
        results, errors = [], []
        for r in range(world_size):
            f = Path(out_dir) / f"rank{r}.pkl"
            if not f.exists():
                results.append(None)
                continue
            status, value = pickle.loads(f.read_bytes())
            (errors.append(f"rank {r}: {value}") if status == "error" else None)
            results.append(value if status == "ok" else None)
        if errors:
            raise SpyreDistributedError("launch.run: " + "\n".join(errors))
        if failure is not None:
            raise SpyreDistributedError(f"launch.run: {failure}") from failure
        return results
