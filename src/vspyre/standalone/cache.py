"""The standalone compiler's persistent compiled-graph cache.

A first call of ``torch.compile(..., backend="spyre_standalone")`` spends its time in Dynamo, in
AOTAutograd (tracing the Dynamo graph to the ATen forward graph) and in planning every kernel.
Planning is stored by :mod:`vspyre.ir.plan_cache`; this cache stores the AOTAutograd product:
the ATen forward graph (with its fake-tensor metadata, pickled by PyTorch's ``GraphPickler``) and
the shape guards AOTAutograd added while tracing it. A hit in a later process (or after
``torch._dynamo.reset()``) skips AOTAutograd: the stored graph goes through the compiler's passes
and instruction selection again (cheap, and always the current code's), and its guards are
re-established on Dynamo's shape environment (a guard that does not hold makes it a miss).

The key is built like Inductor's FX graph cache key: a hash of the Dynamo graph's code, every
input's metadata (shape, strides, dtype, device, requires_grad; symbolic sizes as expressions with
their value ranges), the grad mode, the compiler's own source (the standalone compiler, the IR and
the runtime it launches through), the hardware preset's every field and the torch version. So a
changed graph, input, compiler or card never sees an old entry.

Only inference graphs whose AOTAutograd wrapping is the identity are stored: no input mutations,
no outputs aliasing inputs or intermediates, no effect tokens, no tensor subclasses, no
functionalised RNG; any other graph compiles as before (counted as ``bypass`` with the reason).

Entries live under ``$VSPYRE_CACHE_DIR/standalone/`` (the cache root the plan cache uses;
``VSPYRE_GRAPH_CACHE_DIR`` overrides it), one file per key; ``VSPYRE_STANDALONE_CACHE=0`` turns the cache off. A file that cannot be read or
written is skipped and counted (``errors``), never used half. Counters: :data:`stats`.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import logging
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from .. import hardware

log = logging.getLogger("vspyre.standalone")

stats: collections.Counter = collections.Counter()     # hits, misses, stores, bypass, errors
bypass_reasons: collections.Counter = collections.Counter()
_FORMAT = 1


def enabled() -> bool:
    return os.environ.get("VSPYRE_STANDALONE_CACHE", "1") not in ("0", "", "off", "false")


def directory() -> Path:
    """``$VSPYRE_GRAPH_CACHE_DIR`` if set (``vspyre estimate`` points it at a fresh directory for a
    cold compile), else ``standalone/`` under the cache root of the plan cache."""
    d = os.environ.get("VSPYRE_GRAPH_CACHE_DIR")
    if d:
        return Path(d)
    from ..ir import plan_cache
    return plan_cache.path().parent / "standalone"


def reset_stats() -> None:
    stats.clear()
    bypass_reasons.clear()


def stats_dict() -> dict[str, Any]:
    return {k: int(stats.get(k, 0)) for k in ("hits", "misses", "stores", "bypass", "errors")} | \
        {"bypass_reasons": dict(bypass_reasons)}


@functools.cache
def _code_version() -> str:
    """The source of the compiler, the IR it builds and the runtime it launches through."""
    h = hashlib.sha256()
    src = Path(__file__).parent.parent
    files = sorted((src / "standalone").glob("*.py")) + sorted((src / "ir").glob("*.py")) + \
        sorted((src / "runtime").glob("*.py")) + [src / "hardware.py", src / "numerics.py", src / "compat.py"]
    for f in files:
        h.update(str(f.relative_to(src)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _sym_text(x: Any, shape_env: Any) -> str:
    """A size or SymInt as text: its expression and, for symbols, their value ranges."""
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        expr = x.node.expr
        rng = ""
        if shape_env is not None:
            rng = ",".join(f"{s}:{shape_env.var_to_range.get(s)}" for s in sorted(expr.free_symbols, key=str))
        return f"sym({expr};{rng})"
    return repr(x)


def _input_meta(x: Any, shape_env: Any) -> str:
    if isinstance(x, torch.Tensor):
        return (f"T({x.dtype},{x.device},{x.requires_grad},[{','.join(_sym_text(s, shape_env) for s in x.shape)}],"
                f"[{','.join(_sym_text(s, shape_env) for s in x.stride())}],{_sym_text(x.storage_offset(), shape_env)})")
    return _sym_text(x, shape_env) if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)) else \
        f"{type(x).__name__}({x!r})"


def key(gm: torch.fx.GraphModule, example_inputs: list, shape_env: Any) -> str:
    h = hashlib.sha256()
    cfg = hardware.get_config()
    parts = [f"format {_FORMAT}", torch.__version__, _code_version(), gm.code,
             ";".join(_input_meta(x, shape_env) for x in example_inputs),
             f"grad {torch.is_grad_enabled()}", repr(sorted(hardware.as_dict(cfg).items())),
             repr([(n, tuple(p.shape), p.dtype) for n, p in gm.named_parameters(remove_duplicate=False)]),
             repr([(n, tuple(b.shape), b.dtype) for n, b in gm.named_buffers(remove_duplicate=False)])]
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


def _file(k: str) -> Path:
    return directory() / k[:2] / f"{k}.pkl"


def lookup(k: str) -> dict | None:
    f = _file(k)
    if not f.exists():
        return None
    try:
        entry = pickle.loads(f.read_bytes())
        if entry.get("format") != _FORMAT or entry.get("key") != k:
            raise ValueError("entry of another format or key")
        return entry
    except Exception as e:  # noqa: BLE001 - a broken entry is a miss, counted
        stats["errors"] += 1
        log.warning("vspyre standalone cache: cannot read %s (%s: %s); compiling", f, type(e).__name__, e)
        return None


def store(k: str, entry: dict) -> None:
    f = _file(k)
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=f.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            pickle.dump({"format": _FORMAT, "key": k, **entry}, fh)
        os.replace(tmp, f)
        stats["stores"] += 1
    except Exception as e:  # noqa: BLE001 - the compile result is used anyway
        stats["errors"] += 1
        log.warning("vspyre standalone cache: cannot write %s (%s: %s)", f, type(e).__name__, e)


def clear() -> None:
    import shutil
    shutil.rmtree(directory(), ignore_errors=True)


# ------------------------------------------------------------------------------ the backend's use
def _simple_wrapping(md: Any) -> str | None:
    """Why AOTAutograd's runtime wrapping of this graph is not the identity (None: it is)."""
    if md is None:
        return "no AOTAutograd metadata"
    if md.tokens:
        return "effect tokens"
    if md.num_mutated_inp_runtime_indices:
        return "input mutation"
    if md.num_intermediate_bases:
        return "outputs aliasing intermediates"
    if any(o.output_type.name != "non_alias" for o in md.output_info):
        return "outputs aliasing inputs"
    if md.is_rng_op_functionalized:
        return "functionalised RNG"
    if any(type(m).__name__ == "SubclassCreationMeta" for m in md.subclass_inp_meta):
        return "tensor subclass inputs"
    return None


def _guards(shape_env: Any, since: int) -> list:
    """The guards added since ``since`` (sympy expressions over Dynamo's size symbols; pickled with
    their symbols' assumptions, which sympy compares them by)."""
    return [g.expr for g in shape_env.guards[since:]]


def _reestablish(shape_env: Any, guards: list) -> bool:
    """Add the stored guards to Dynamo's shape environment; False if one does not hold here."""
    import sympy
    known = set(shape_env.backed_var_to_val if hasattr(shape_env, "backed_var_to_val") else shape_env.var_to_val)
    for expr in guards:
        if expr.free_symbols - known:
            return False
        if shape_env.evaluate_expr(expr) != sympy.true:
            return False
    return True


def compile_cached(gm: torch.fx.GraphModule, example_inputs: list, compile_fw: Callable,
                   aot: Callable) -> Callable:
    """The backend's result for ``gm``: from the cache, or ``aot(gm, inputs, fw_compiler)`` (stored)."""
    from ..compat import GraphPickler, GraphPicklerOptions, TracingContext, detect_fake_mode, unset_fake_temporarily

    if not enabled():
        return aot(gm, example_inputs, compile_fw)
    fake_mode = detect_fake_mode(example_inputs)
    shape_env = getattr(fake_mode, "shape_env", None)
    reason = None
    if torch.is_grad_enabled():
        reason = "grad enabled (training graphs are not stored)"
    elif fake_mode is None or shape_env is None:
        reason = "no fake mode"
    if reason:
        stats["bypass"] += 1
        bypass_reasons[reason] += 1
        return aot(gm, example_inputs, compile_fw)
    k = key(gm, example_inputs, shape_env)
    entry = lookup(k)
    if entry is not None:
        try:
            fw = GraphPickler.loads(entry["graph"], fake_mode)
        except Exception as e:  # noqa: BLE001 - counted, then compiled
            stats["errors"] += 1
            log.warning("vspyre standalone cache: cannot load entry %s (%s: %s)", k[:12], type(e).__name__, e)
            fw = None
        if fw is not None and _reestablish(shape_env, entry["guards"]):
            stats["hits"] += 1
            params = [*gm.parameters(), *gm.buffers()]
            log.info("vspyre standalone cache: hit %s", k[:12])
            run = compile_fw(fw, example_inputs)

            def call(*args: Any) -> Any:
                return run([*params, *args])
            return call
    params = [*gm.parameters(), *gm.buffers()]
    since = len(shape_env.guards)
    seen: dict[str, Any] = {}

    def fw_compiler(g: torch.fx.GraphModule, ex: list) -> Callable:
        ctx = TracingContext.try_get()
        why = _simple_wrapping(getattr(ctx, "fw_metadata", None) if ctx is not None else None)
        nph = sum(1 for n in g.graph.nodes if n.op == "placeholder")
        if why is None and nph != len(params) + len(example_inputs):
            why = "inputs deduplicated or rewritten by AOTAutograd"
        if why is None:
            try:
                with unset_fake_temporarily():     # constants (real tensors) are saved with their values
                    seen["graph"] = GraphPickler.dumps(g, GraphPicklerOptions(ops_filter=None))  # before the passes
            except Exception as e:  # noqa: BLE001 - a graph the pickler cannot hold is compiled, not stored
                why = f"not picklable ({type(e).__name__})"
                log.info("vspyre standalone cache: graph not stored: %s: %s", type(e).__name__, e)
        seen["why"] = why
        return compile_fw(g, ex)

    out = aot(gm, example_inputs, fw_compiler)
    stats["misses"] += 1              # counted once compiled (Dynamo may restart an attempt that raised)
    log.info("vspyre standalone cache: miss %s (%s)", k[:12], seen.get("why") or "stored")
    why = seen.get("why", "no forward graph")
    if why is None:
        store(k, {"graph": seen["graph"], "guards": _guards(shape_env, since)})
    else:
        stats["bypass"] += 1
        bypass_reasons[why] += 1
    return out
