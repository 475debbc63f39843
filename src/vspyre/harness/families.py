"""Every decoder family of the installed transformers, at tiny size, on both compilers.

For each model type of transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` the sweep builds a tiny
config in code (the type's config class with its defaults, the size fields shrunk by
:data:`SHRINK`), then runs it in its own process (bounded by a timeout):

* ``estimate``: ``vspyre estimate``-style in estimate-only mode (no values), prefill and one decode
  step with the KV cache (``estimate.run_backend``), on Inductor and on the standalone compiler;
* ``execute``: functionally in fp32 with random weights: one compiled prefill forward on the card,
  its logits compared with the CPU model's by the harness's rule (``accuracy.compare``: allclose
  1e-3 against CPU fp32 eager), on both compilers.

Each (model type, mode) becomes a row with, per compiler, ok / fail and a one-line named reason
(:func:`reason`), host fallbacks per forward by op, graph breaks and graphs. Rows are appended to a
JSONL file as they finish (a rerun resumes); :func:`markdown` writes the table
(``docs/model-families.md``, by ``benchmarks/model_families.py``).

Types that are not decoder-only text LLMs (encoder-decoder, multimodal wrappers, encoders in
decoder mode, audio) are listed out of scope with the reason (:func:`scope`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

MODES = ("estimate", "execute")
COMPILERS = ("inductor", "standalone")
PROMPT = 16                 # tokens of the prefill; longer than the shrunk sliding window
WINDOW = 8                  # sliding windows shrink to this (SHRINK), so the prompt crosses them

# Size fields and what they shrink to (only fields the config class has; a value already smaller,
# 0 or None is kept). The names are those transformers' config classes use across families.
SHRINK: dict[int, tuple[str, ...]] = {
    64: ("hidden_size", "n_embd", "d_model", "model_dim", "embed_dim", "word_embed_proj_dim",
         "moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size",
         "moe_ffn_hidden_size", "ffn_hidden_size_moe", "expert_hidden_size"),
    128: ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size", "d_ff", "inner_hidden_size",
          "mlp_hidden_size", "dense_intermediate_size"),
    2: ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "decoder_layers",
        "num_experts_per_tok", "moe_topk", "num_experts_per_token", "top_k_experts"),
    4: ("num_attention_heads", "n_head", "n_heads", "num_heads", "decoder_attention_heads",
        "num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"),
    16: ("head_dim", "kv_channels", "qk_nope_head_dim", "v_head_dim", "attention_head_dim"),
    8: ("qk_rope_head_dim", "rotary_dim", "rotary_emb_base_dim", "sliding_window"),
    32: ("kv_lora_rank", "q_lora_rank"),
    1: ("n_shared_experts", "num_shared_experts", "n_group", "topk_group", "first_k_dense_replace"),
    256: ("vocab_size", "vocab_size_per_layer_input", "max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length"),
}
KV_HEADS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num")
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id",
             "decoder_start_token_id", "mask_token_id", "unk_token_id")

# Types no rule below recognises that are still not decoder-only text LLMs.
NOT_TEXT = {
    "musicgen": "audio: decodes EnCodec audio codebooks (several token streams), not text",
    "musicgen_melody": "audio: decodes EnCodec audio codebooks (several token streams), not text",
    "moshi": "audio: a speech-text model over audio codebooks (depth decoder per frame)",
    "trocr": "the text decoder of a vision encoder-decoder (cross-attends to image features)",
    "fuyu": "multimodal: image patches are projected straight into the decoder's input (a vision LM)",
}
NON_TEXT_PARTS = ("vision", "audio", "speech", "image", "video", "vq")
MAX_PARAMS = 20_000_000          # a "tiny" model past this kept a size field SHRINK does not know


# Run first (the goal of issue 22: every Llama-like family, dense and MoE, sliding window, fused QKV,
# biases, parallel attention); the other types follow in transformers' order.
FIRST = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "granite", "granitemoe",
         "phi", "phi3", "gemma", "gemma2", "gemma3_text", "olmo", "olmo2", "stablelm", "gpt_neox", "gptj",
         "falcon", "starcoder2", "cohere", "gpt2", "gpt_bigcode", "opt", "bloom")


class TinyConfigError(Exception):
    """The type's config class could not be shrunk into a buildable tiny model."""


def causal_lm_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def scope(model_type: str) -> str | None:
    """None when the type is a decoder-only text LLM the sweep runs, else why it is out of scope."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES

    if model_type in NOT_TEXT:
        return NOT_TEXT[model_type]
    cls = CONFIG_MAPPING[model_type]
    subs = sorted(k for k in (getattr(cls, "sub_configs", None) or {}) if any(p in k for p in NON_TEXT_PARTS))
    if subs:
        return f"multimodal: the causal-LM class ({MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]}) " \
               f"holds non-text parts ({', '.join(subs)})"
    try:
        defaults = cls()
    except Exception as e:  # noqa: BLE001 - a config that needs arguments is reported, not raised
        return None if not isinstance(e, TypeError) else f"config class needs arguments ({_line(e)})"
    if getattr(defaults, "is_encoder_decoder", False):
        return "encoder-decoder: the causal-LM class is the decoder half of a seq2seq model"
    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "encoder architecture (masked LM) in decoder mode, not a decoder-only LLM"
    return None


def tiny_config(model_type: str) -> Any:
    """The type's config at tiny size: class defaults with the size fields of :data:`SHRINK`
    shrunk, KV heads halved (multi-query kept), token ids inside the vocabulary, and a sliding
    window (when the family has one) shorter than the prompt; mixed layer types keep one of each."""
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    try:
        d = cls().to_dict()
    except Exception as e:  # noqa: BLE001
        raise TinyConfigError(f"default config: {_line(e)}") from None
    attr_map = getattr(cls, "attribute_map", {}) or {}
    over: dict[str, Any] = {}
    for value, names in SHRINK.items():
        for n in names:
            key = n if n in d else attr_map.get(n)
            if key is None or key not in d or key in over:
                continue
            cur = d[key]
            if isinstance(cur, bool) or not isinstance(cur, int) or cur <= 0:
                continue
            over[key] = min(cur, value)        # first_k_dense_replace: layer 0 dense, layer 1 experts
    if "qk_rope_head_dim" in over and "head_dim" in over:    # multi-head latent attention: RoPE over head_dim
        over["head_dim"] = over["qk_rope_head_dim"]
    for n in KV_HEADS:
        key = n if n in d else attr_map.get(n)
        if key in d and isinstance(d[key], int) and d[key] > 1:
            over[key] = 4 if "kv_lora_rank" in d else 2     # latent attention expands K/V to every head
    vocab = over.get(attr_map.get("vocab_size", "vocab_size"), d.get("vocab_size", 256))
    for n in TOKEN_IDS:
        v = d.get(n)
        if isinstance(v, int) and not isinstance(v, bool) and v >= vocab:
            over[n] = vocab - 1 - TOKEN_IDS.index(n)
        elif isinstance(v, list):
            over[n] = [x if x < vocab else vocab - 1 for x in v if isinstance(x, int)]
    types = d.get("layer_types")
    if isinstance(types, list) and len(set(types)) > 1:
        first = types[0]
        over["layer_types"] = [first, next(t for t in types if t != first)]
    elif isinstance(types, list) and types:
        over["layer_types"] = types[:2]
    over["use_cache"] = True
    try:
        cfg = cls(**over)
    except Exception as e:  # noqa: BLE001
        raise TinyConfigError(f"{cls.__name__}(tiny sizes): {_line(e)}") from None
    from transformers import AutoModelForCausalLM

    model_cls = AutoModelForCausalLM._model_mapping.get(type(cfg), None)
    # SDPA where the family has it (the attention the card compiles best), else its eager attention
    cfg._attn_implementation = "sdpa" if getattr(model_cls, "_supports_sdpa", False) else "eager"
    import torch

    try:
        with torch.device("meta"):
            n = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())
    except Exception as e:  # noqa: BLE001
        raise TinyConfigError(f"{model_cls.__name__ if model_cls else model_type} from the tiny config: {_line(e)}") from None
    if n > MAX_PARAMS:
        raise TinyConfigError(f"{n / 1e6:.0f}M parameters after shrinking: a size field SHRINK does not know")
    return cfg


def build_cpu(cfg: Any, dtype: Any = None, seed: int = 0) -> Any:
    """The causal-LM model of ``cfg`` on the CPU with random weights (eval mode)."""
    import warnings

    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype or torch.float32).eval()
    # A weight matrix transformers initialises to zeros (some MoE routers: AFMoE) makes every
    # expert score tie, and which of equal scores top-k picks is implementation-defined (the card:
    # the lower index; the CPU: its partial sort's order): random values, as a trained router has.
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and p.is_floating_point() and not p.any():
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32).mul_(0.02).to(p.dtype))
    return model


# -- one-line reasons ------------------------------------------------------------------------

def _line(e: BaseException, n: int = 160) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:n]}{'...' if len(text) > n else ''}"


def _where(tb: Any) -> str:
    """The innermost frame in transformers (where the model asked for it), else in vspyre."""
    frames = traceback.extract_tb(tb)
    for pkg in ("transformers", "vspyre"):
        for f in reversed(frames):
            if f"/{pkg}/" in f.filename:
                rel = f.filename.split(f"/{pkg}/", 1)[1]
                return f"{pkg}/{rel}:{f.lineno} {f.name}"
    return ""


def _user_frame(msg: str) -> str:
    """Dynamo's 'Original traceback' / 'from user code' names the model line that was compiled."""
    lines = [l.strip() for l in msg.splitlines()]
    last = ""
    for l in lines:
        if l.startswith('File "') and "/transformers/" in l:
            file = l.split('"')[1].split("/transformers/", 1)[1]
            lineno = l.split("line ")[1].split(",")[0] if "line " in l else "?"
            fn = l.rsplit(" in ", 1)[1] if " in " in l else ""
            last = f"transformers/{file}:{lineno} {fn}"
    return last


def reason(e: BaseException) -> str:
    """A named one-line reason for a failure: its class, the gist of the message and where the
    model's code asked for it (never a traceback)."""
    msg = str(e)
    first = next((l.strip() for l in msg.splitlines() if l.strip()), "")
    inner = first
    if "raised:" in first:                    # BackendCompilerFailed: the compiler's own error next
        rest = msg.split("raised:", 1)[1].strip().splitlines()
        inner = rest[0].strip() if rest else first
    where = _user_frame(msg) or _where(e.__traceback__)
    kind = type(e).__name__
    if "has no values" in msg:
        import re

        m = re.search(r"spyre: (.+?): this \S+ tensor of shape", msg)
        what = m.group(1).strip() if m else "a value read"
        gist = f"estimate-only: {what} of a value never computed"
    elif "EstimateOnlyError" in kind or "EstimateOnlyError" in msg:
        gist = "estimate-only: " + inner.replace("torch.spyre.EstimateOnlyError:", "").strip()
    elif kind == "BackendCompilerFailed":
        gist = f"compile: {inner}"
    elif kind in ("Unsupported", "UserError", "TorchRuntimeError", "InternalTorchDynamoError"):
        gist = f"dynamo {kind}: {inner}"
    else:
        gist = f"{kind}: {inner}"
    gist = " ".join(gist.split())
    if len(gist) > 170:
        gist = gist[:167] + "..."
    return f"{gist} [{where}]" if where else gist


# -- one (model type, mode) in this process ---------------------------------------------------

def _counters() -> tuple[int, int, list[str]]:
    from ..compat import dynamo_counters as counters

    gb = counters["graph_break"]
    reasons = [f"{k} (x{v})" for k, v in sorted(gb.items(), key=lambda kv: -kv[1])[:3]]
    return int(sum(gb.values())), int(counters["stats"]["unique_graphs"]), reasons


def _estimate(cfg: Any, compiler: str) -> dict[str, Any]:
    from . import estimate as E

    opts = E.Options(prompt=PROMPT, new_tokens=0, kv=(), dtype="float16", top=3, warm=False)
    r = E.run_backend(cfg, opts, compiler)
    fb: dict[str, int] = {}
    for ph in (r["prefill"], r["decode"][0]):
        for op, n in ph["fallbacks"].items():
            fb[op] = fb.get(op, 0) + n
    gb, graphs, why = _counters()
    return {"fallbacks": fb, "fallbacks_prefill": sum(r["prefill"]["fallbacks"].values()),
            "fallbacks_decode": sum(r["decode"][0]["fallbacks"].values()), "graph_breaks": r["graph_breaks"],
            "graph_break_reasons": why, "prefill_us": round(r["prefill"]["est_us"], 1),
            "decode_us": round(r["decode"][0]["est_us"], 1), "launches": r["prefill"]["launches"]}


def _execute(cfg: Any, compiler: str) -> dict[str, Any]:
    import copy

    import torch

    from . import estimate as E
    from ..compat import dynamo_counters as counters
    from ..compat import dynamo_reset
    from .accuracy import compare

    dynamo_reset()
    counters.clear()
    ref = build_cpu(cfg)
    ids = torch.randint(0, cfg.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = ref(input_ids=ids, use_cache=True).logits
        model = copy.deepcopy(ref).to("spyre")
        model.tie_weights()
        fn = torch.compile(model, backend=E.BACKENDS[compiler])
        dev = ids.to("spyre")
        fn(input_ids=dev, use_cache=True)                       # compile
        torch.spyre.reset_fallback_stats()
        got = fn(input_ids=dev, use_cache=True).logits          # one steady forward
        fb = dict(torch.spyre.fallback_stats())
    acc = compare(got, want)
    gb, graphs, why = _counters()
    out = {"fallbacks": fb, "graph_breaks": gb, "graph_break_reasons": why, "graphs": graphs,
           "max_abs_err": acc.max_abs_err, "accuracy": str(acc)}
    if not acc.ok:
        out["accuracy_fail"] = f"accuracy: {acc}"
    return out


def _write(path: str, row: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    Path(tmp).write_text(json.dumps(row, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def run_one(model_type: str, mode: str, out: str | None = None,
            compilers: tuple[str, ...] = COMPILERS) -> dict[str, Any]:
    """One row: ``model_type`` in ``mode`` on both compilers, here; written to ``out`` after each
    compiler (so a parent that kills a hung process still has what finished)."""
    import torch

    import vspyre  # noqa: F401  (the device)

    row: dict[str, Any] = {"model_type": model_type, "mode": mode, "status": "ok", "backends": {}}
    write = (lambda: _write(out, row)) if out else (lambda: None)
    try:
        cfg = tiny_config(model_type)
        model = build_cpu(cfg)
        row["params"] = sum(p.numel() for p in model.parameters())
        row["class"] = type(model).__name__
    except Exception as e:  # noqa: BLE001 - the row says why
        row["status"] = "config"
        row["reason"] = f"tiny config: {_line(e)}" if not isinstance(e, TinyConfigError) else f"tiny config: {e}"
        write()
        return row
    try:                      # the tiny model must run on the CPU, else the sizes are at fault, not the card
        with torch.no_grad():
            model(input_ids=torch.randint(0, cfg.vocab_size, (1, PROMPT)), use_cache=True)
    except Exception as e:  # noqa: BLE001
        row["status"] = "config"
        row["reason"] = f"tiny config: fails on the CPU too: {reason(e)}"
        write()
        return row
    del model
    write()
    from .estimate import fresh_compile_caches

    for compiler in compilers:
        t0 = time.perf_counter()
        row["backends"][compiler] = {"status": "running"}
        write()
        try:
            with fresh_compile_caches():
                res = _estimate(cfg, compiler) if mode == "estimate" else _execute(cfg, compiler)
            res["status"] = "fail" if res.get("accuracy_fail") else "ok"
            if res.get("accuracy_fail"):
                res["reason"] = res["accuracy_fail"]
        except Exception as e:  # noqa: BLE001 - every failure becomes a named one-line reason
            res = {"status": "fail", "reason": reason(e)}
        res["wall_s"] = round(time.perf_counter() - t0, 2)
        row["backends"][compiler] = res
        write()
        torch.spyre.reset_fallback_stats()
    if any(b["status"] != "ok" for b in row["backends"].values()):
        row["status"] = "fail"
    write()
    return row


# -- the sweep --------------------------------------------------------------------------------

@dataclass
class Options:
    out: str = "model-families.jsonl"
    only: tuple[str, ...] = ()
    modes: tuple[str, ...] = MODES
    timeout: float = 120.0           # seconds per (model type, mode) process
    compilers: tuple[str, ...] = COMPILERS
    jobs: int = 1
    fresh: bool = False
    retry_failed: bool = False
    python: str = sys.executable


def rows(path: str) -> list[dict[str, Any]]:
    """Rows of a JSONL file, the last per (model type, mode) (a torn last line is ignored)."""
    keep: dict[tuple[str, str], dict] = {}
    if os.path.exists(path):
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            keep[(r["model_type"], r["mode"])] = r
    return list(keep.values())


def _spawn(model_type: str, mode: str, opts: Options, workdir: str) -> dict[str, Any]:
    out = os.path.join(workdir, f"{model_type}.{mode}.json")
    err = os.path.join(workdir, f"{model_type}.{mode}.stderr")
    env = dict(os.environ)
    env.setdefault("PYTHONWARNINGS", "ignore")
    env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, opts.jobs)))
    t0 = time.perf_counter()
    with open(err, "wb") as fh:
        p = subprocess.Popen([opts.python, "-m", "vspyre.harness.families", "--worker", model_type, mode, out,
                              ",".join(opts.compilers)],
                             stdout=subprocess.DEVNULL, stderr=fh, env=env, start_new_session=True)
        try:
            code, timed_out = p.wait(timeout=opts.timeout), False
        except subprocess.TimeoutExpired:
            import signal
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            code, timed_out = p.wait(), True
    try:
        row = json.loads(Path(out).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        row = {"model_type": model_type, "mode": mode, "backends": {}}
    for c in COMPILERS:
        b = row["backends"].get(c)
        if b is not None and b.get("status") == "running":
            row["backends"][c] = ({"status": "timeout", "reason": f"timeout: past {opts.timeout:.0f} s per model"}
                                  if timed_out else
                                  {"status": "crash", "reason": f"crash: exit {code}: {_tail(err)}"})
    if timed_out and row.get("status") not in ("fail", "config"):
        row["status"] = "timeout"
        row.setdefault("reason", f"timeout: past {opts.timeout:.0f} s per model")
    elif code != 0 and "status" not in row:
        row["status"] = "crash"
        row["reason"] = f"crash: exit {code}: {_tail(err)}"
    elif timed_out or code != 0:
        row["status"] = "fail"
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    return row


def _tail(path: str) -> str:
    try:
        lines = [l.strip() for l in Path(path).read_text(errors="replace").splitlines() if l.strip()]
    except OSError:
        return ""
    return lines[-1][:160] if lines else ""


def sweep(opts: Options, progress: bool = True, on_row: Callable[[dict], None] | None = None) -> list[dict]:
    """Run every in-scope type x mode not yet in ``opts.out`` (each in its own process, at most
    ``opts.timeout`` s), append the rows, and return all rows of the file."""
    import tempfile
    from concurrent.futures import ThreadPoolExecutor, as_completed

    types = causal_lm_types()
    if opts.only:
        unknown = [t for t in opts.only if t not in types]
        if unknown:
            raise ValueError(f"not a causal-LM model type of this transformers: {', '.join(unknown)}")
        types = [t for t in types if t in opts.only]
    if opts.fresh and os.path.exists(opts.out):
        os.remove(opts.out)
    done = {(r["model_type"], r["mode"]): r for r in rows(opts.out)}
    todo: list[tuple[str, str]] = []
    retry: list[tuple[str, str]] = []
    new_rows: list[dict] = []
    types = [t for t in FIRST if t in types] + [t for t in types if t not in FIRST]
    for t in types:
        why = scope(t)
        if why is not None:
            if (t, "scope") not in done:
                new_rows.append({"model_type": t, "mode": "scope", "status": "out_of_scope", "reason": why,
                                 "backends": {}})
            continue
        for m in opts.modes:
            r = done.get((t, m))
            if r is None:
                todo.append((t, m))
            elif opts.retry_failed and r.get("status") != "ok":
                retry.append((t, m))            # after the rows never run
    todo += retry
    os.makedirs(os.path.dirname(os.path.abspath(opts.out)), exist_ok=True)

    def append(r: dict) -> None:
        with open(opts.out, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(r, sort_keys=True) + "\n")
        if on_row:
            on_row(r)

    for r in new_rows:
        append(r)
    workdir = tempfile.mkdtemp(prefix="vspyre-families-")
    bar = _bar(progress, len(todo))
    with bar as advance, ThreadPoolExecutor(max(1, opts.jobs)) as pool:
        futs = {pool.submit(_spawn, t, m, opts, workdir): (t, m) for t, m in todo}
        for f in as_completed(futs):
            t, m = futs[f]
            r = f.result()
            append(r)
            advance(f"{t} {m}: {r.get('status')}")
    return rows(opts.out)


class _bar:
    def __init__(self, show: bool, total: int):
        self.show, self.total = show, total

    def __enter__(self) -> Callable[[str], None]:
        if not self.show:
            return lambda label: None
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.p = Progress(TextColumn("{task.description:<40}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                          TimeElapsedColumn(), TimeRemainingColumn())
        self.p.__enter__()
        task = self.p.add_task("model families", total=self.total)
        return lambda label: self.p.update(task, advance=1, description=label)

    def __exit__(self, *exc: Any) -> None:
        if self.show:
            self.p.__exit__(*exc)


# -- the table --------------------------------------------------------------------------------

def _cell(b: dict | None) -> str:
    if b is None:
        return "-"
    if b.get("status") == "ok":
        n = sum(b.get("fallbacks", {}).values())
        s = "ok"
        extra = []
        if n:
            extra.append(f"{n} fb")
        if b.get("graph_breaks"):
            extra.append(f"{b['graph_breaks']} gb")
        return s + (f" ({', '.join(extra)})" if extra else "")
    return b.get("status", "?")


def _family_status(rs: list[dict]) -> str:
    cells = [b for r in rs for b in r.get("backends", {}).values()]
    if any(r.get("status") == "config" for r in rs):
        return "fails"
    if len(cells) == len(MODES) * len(COMPILERS) and all(b.get("status") == "ok" for b in cells):
        return "runs"
    return "fails" if cells else "not run"


def _reason_key(text: str) -> str:
    """The reason without its location and numbers: failures grouped by cause."""
    import re

    base, _, where = text.partition(" [")
    base = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", base)[:110]
    fn = where.rstrip("]").rsplit(" ", 1)[-1] if where else ""
    return f"{base} (in `{fn}`)" if fn and fn not in ("wrapper", "wrapped_func", "forward") else base


# What the recurring reasons mean (matched on the reason's text); each was traced by hand.
EXPLAIN: tuple[tuple[str, str], ...] = (
    ("_grouped_mm_fallback", "Mixture of experts, estimate-only: transformers' default expert path "
     "(`grouped_mm`, which on this device falls back to `_grouped_mm_fallback`) reads the expert offsets "
     "with `offs.tolist()`, values estimate-only mode never computes. Functionally the same path runs one "
     "host `mm.out` per expert hit per layer (the `mm.out` fallbacks). Issue 22 item 1 (branch i22-moe: "
     "`torch._grouped_mm` on the card, routing resolved by a stated assumption) removes both; re-run this "
     "sweep after it merges."),
    ("float64", "The model computes in float64 (CTRL's sinusoidal positions, Ergo), which the card does not "
     "hold: refused by name, as every float64 tensor on the card is."),
    ("get_mask_sizes", "Hybrid state-space model whose first two layers are both linear-attention (Mamba) layers "
     "at this depth: transformers cannot build the attention mask without an attention layer."),
    ("num_attention_heads", "State-space model (no attention heads): `vspyre estimate`'s decode step builds "
     "a KV cache from the config's heads, which such a model does not have."),
    ("per-layer attribute", "Per-layer head dims (Gemma 4): `vspyre estimate` sizes the KV cache from one "
     "`head_dim`, which this config does not have."),
    ("tiny config", "The sweep could not shrink this type's config into a model that builds and runs on the "
     "CPU (a validator or a size relation SHRINK does not know): a limit of the sweep, not of the card."),
    ("timeout", "Past the per-(type, mode) timeout: hybrid models whose scan loops unroll into many "
     "kernels compile slowly at this size."),
    ("making fake tensor call", "Dynamo could not trace the model's own cache update (its fake-tensor "
     "shapes disagree): a transformers/Dynamo limit, the same on both compilers."),
)


def _explain(reason_text: str) -> str:
    return next((e for k, e in EXPLAIN if k in reason_text), "")


def markdown(all_rows: list[dict], versions: dict[str, str] | None = None, wall_s: float | None = None) -> str:
    import torch
    import transformers

    versions = versions or {"transformers": transformers.__version__, "torch": torch.__version__}
    by_type: dict[str, list[dict]] = {}
    for r in all_rows:
        by_type.setdefault(r["model_type"], []).append(r)
    order = [t for t in causal_lm_types() if t in by_type] + sorted(t for t in by_type if t not in causal_lm_types())
    scoped = [t for t in order if any(r["mode"] == "scope" for r in by_type[t])]
    ran = [t for t in order if t not in scoped]
    runs = [t for t in ran if _family_status(by_type[t]) == "runs"]
    reasons: dict[str, list[str]] = {}
    full: dict[str, str] = {}                  # a grouped reason -> one full text (for EXPLAIN)
    for t in ran:
        for r in by_type[t]:
            if r.get("status") == "config" or (r.get("reason") and not r.get("backends")):
                text = r.get("reason", "?")
                reasons.setdefault(_reason_key(text), []).append(f"{t} ({r['mode']})")
                full.setdefault(_reason_key(text), text)
            for c, b in r.get("backends", {}).items():
                if b.get("status") != "ok":
                    text = b.get("reason", b.get("status", "?"))
                    reasons.setdefault(_reason_key(text), []).append(f"{t} ({r['mode']}, {c})")
                    full.setdefault(_reason_key(text), text)
    lines = [
        "# Decoder families on the card",
        "",
        f"Every causal-LM model type of transformers {versions['transformers']} "
        f"(`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`, {len(order)} types), at tiny size, on torch {versions['torch']}. "
        "Generated by `benchmarks/model_families.py` (`--only TYPE,...` for a few); do not edit by hand.",
        "",
        "Each type's config class with its defaults, the size fields shrunk (hidden 64, 2 layers, 4 heads / 2 KV "
        f"heads, head dim 16, MLP 128, 4 experts top-2, vocabulary 256, sliding window {WINDOW} under a "
        f"{PROMPT}-token prompt; `vspyre.harness.families.SHRINK`), random weights. Per compiler:",
        "",
        "* **estimate**: estimate-only mode (no values), fp16: prefill and one decode step with the KV cache, "
        "as `vspyre estimate` runs them (`estimate.run_backend`);",
        "* **execute**: functional, fp32: one compiled prefill forward on the card, logits against the CPU "
        "model's by the harness's rule (allclose 1e-3 vs CPU fp32 eager).",
        "",
        "A cell is `ok`, with host fallbacks per forward (`fb`: estimate = prefill + decode step, execute = "
        "prefill) and graph breaks (`gb`) when there are any, or the failure (reason below). Each "
        "(type, mode) ran in its own process, at most the sweep's timeout.",
        "",
        f"**{len(ran)} types in scope: {len(runs)} run everywhere, {len(ran) - len(runs)} fail somewhere; "
        f"{len(scoped)} out of scope.**" + (f" Sweep wall time {wall_s / 60:.1f} min." if wall_s else ""),
        "",
        "| type | class | params | estimate inductor | estimate standalone | execute inductor | "
        "execute standalone | host fallbacks (op: calls) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in ran:
        rs = {r["mode"]: r for r in by_type[t]}
        any_r = next(iter(rs.values()))
        cls = any_r.get("class", "")
        params = f"{any_r['params'] / 1e6:.2f}M" if any_r.get("params") else ""
        cells = []
        fbs: dict[str, int] = {}
        for m in MODES:
            r = rs.get(m)
            for c in COMPILERS:
                if r is None:
                    cells.append("-")
                elif r.get("status") in ("config", "timeout", "crash") and not r.get("backends"):
                    cells.append(r["status"])
                else:
                    b = r.get("backends", {}).get(c)
                    cells.append(_cell(b))
                    for op, n in (b or {}).get("fallbacks", {}).items():
                        key = op.split("aten::")[-1].replace("aten.", "")
                        fbs[f"{key} ({m[:3]} {c[:3]})"] = n
        fb = ", ".join(f"{k}: {v}" for k, v in sorted(fbs.items())) or "0"
        lines.append(f"| {t} | {cls} | {params} | " + " | ".join(cells) + f" | {fb} |")
    lines += ["", "## Failures by reason", "",
              "Grouped by cause (numbers in the message replaced by N); the first location the model's code asked "
              "for it is in the per-type list below.", "",
              "| reason | count | where | what it means |", "|---|---|---|---|"]
    for k, ws in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
        shown = ", ".join(ws[:8]) + (f", ... ({len(ws) - 8} more)" if len(ws) > 8 else "")
        lines.append(f"| {k.replace('|', '/')} | {len(ws)} | {shown} | {_explain(full[k])} |")
    lines += ["", "## Each failure", "", "| type | mode | compiler | reason |", "|---|---|---|---|"]
    for t in ran:
        for r in sorted(by_type[t], key=lambda r: r["mode"]):
            if r.get("status") == "config" or (r.get("reason") and not r.get("backends")):
                lines.append(f"| {t} | {r['mode']} | - | {r.get('reason', '?').replace('|', '/')} |")
            for c, b in r.get("backends", {}).items():
                if b.get("status") != "ok":
                    lines.append(f"| {t} | {r['mode']} | {c} | {b.get('reason', b.get('status')).replace('|', '/')} |")
    lines += ["", "## Out of scope", "", "| type | why |", "|---|---|"]
    for t in scoped:
        r = next(r for r in by_type[t] if r["mode"] == "scope")
        lines.append(f"| {t} | {r['reason']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m vspyre.harness.families")
    ap.add_argument("--worker", nargs="+", metavar="TYPE MODE OUT [COMPILERS]", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        t, m, out = args.worker[:3]
        compilers = tuple(args.worker[3].split(",")) if len(args.worker) > 3 else COMPILERS
        run_one(t, m, out, compilers)
        return 0
    ap.error("run benchmarks/model_families.py for the sweep")
    return 2


if __name__ == "__main__":
    sys.exit(main())
