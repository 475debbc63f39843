"""The model runner: takes vLLM's scheduler output for one step, runs the step on the card, returns
the sampled tokens.

What the scheduler decides (which requests run, how many tokens each: a prefill chunk, a decode
token; which KV-cache blocks each owns; prefix-cache hits) arrives in ``SchedulerOutput``; the
runner only keeps each request's token ids and block ids, lays the step out as vLLM's flattened
batch (all scheduled tokens in one row, ``query_start_loc``, ``seq_lens``, a block table, a slot
per token) and runs ONE compiled graph: the model with paged attention, then the logits of each
sequence's last token. Greedy requests pick their token on the card (``argmax``); sampled ones
copy their logits row to the host and use vLLM's own top-k/top-p and sampling functions.

Shapes are padded to buckets so a handful of graphs serve every step: tokens to a power of two
(at least 16, at most the step budget), sequences and block-table width to powers of two (at
least 2, so no size specialises to 1); padding tokens write no cache slot (slot -1) and padding
sequences have no token. The graph is compiled once with those sizes symbolic (``mark_dynamic``),
by Inductor with the card's extension or by the standalone compiler (``VSPYRE_VLLM_BACKEND``).
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from . import backend as _backend
from . import models, static

log = logging.getLogger("vllm.vspyre")   # under vLLM's logger, so vLLM's log set-up prints it

MIN_TOKENS_BUCKET = 16


def _bucket(n: int, lo: int, hi: int | None = None) -> int:
    b = max(lo, 1 << max(0, (n - 1).bit_length()))
    return max(n, min(b, hi)) if hi is not None else b


@dataclass
class _Request:
    req_id: str
    token_ids: list[int]            # prompt, then every token sampled so far
    num_prompt: int
    block_ids: list[int]
    num_computed: int
    params: Any                     # vllm.SamplingParams
    generator: torch.Generator | None = None


class Step(NamedTuple):
    """One engine step as the runner ran it."""
    kind: str            # "prefill", "decode" or "mixed"
    tokens: int
    seqs: int
    wall_s: float        # host wall time
    est_us: float        # the card's estimated device time (kernels + host fallbacks' link traffic)
    fallbacks: int
    kernels: int


def by_kind(steps: list) -> dict[str, dict[str, float]]:
    """Steps summed and averaged per kind: steps, est_us, tokens, wall_s and their means."""
    out: dict[str, dict[str, float]] = {}
    for s in map(Step._make, steps):
        d = out.setdefault(s.kind, {"steps": 0, "est_us": 0.0, "tokens": 0, "wall_s": 0.0})
        d["steps"] += 1
        d["est_us"] += s.est_us
        d["tokens"] += s.tokens
        d["wall_s"] += s.wall_s
    for d in out.values():
        d.update(mean_est_us=d["est_us"] / d["steps"], mean_tokens=d["tokens"] / d["steps"],
                 mean_wall_s=d["wall_s"] / d["steps"])
    return out


@dataclass
class StepStats:
    """What the runner did, for the start-up report, tests and benchmarks."""
    steps: int = 0
    prefill_tokens: int = 0
    prefix_hit_tokens: int = 0      # prompt tokens a new request found in vLLM's prefix cache
    decode_tokens: int = 0
    padded_tokens: int = 0
    wall_s: float = 0.0
    device_est_us: float = 0.0
    host_fallbacks: int = 0
    fallback_ops: collections.Counter = field(default_factory=collections.Counter)
    graphs: int = 0
    compile_s: float = 0.0
    cost_cache_hits: int = 0        # estimate-only steps whose shape was already costed
    preemptions: int = 0            # requests vLLM's scheduler preempted (their KV freed, recomputed later)
    admitted: dict = field(default_factory=dict)   # request id -> index in per_step of its first step
    shapes: set = field(default_factory=set)       # distinct bucketed step shapes (each planned once)
    per_step: list[Step] = field(default_factory=list)


class SpyreModelRunner:
    def __init__(self, vllm_config: Any, device: torch.device):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.cache_config = vllm_config.cache_config
        self.scheduler_config = vllm_config.scheduler_config
        self.device = device
        self.dtype = self.model_config.dtype
        self.block_size = self.cache_config.block_size
        self.max_tokens = self.scheduler_config.max_num_batched_tokens
        self.max_seqs = self.scheduler_config.max_num_seqs
        self.max_blocks = -(-self.model_config.max_model_len // self.block_size)
        self.backend = _backend()
        # static batching (the old stack's way, :mod:`.static`): the warmup shapes, and the shape
        # of the batch now running; each part's query bound (paged attention's max_query_len)
        self.warmup_shapes = static.shapes() if static.batching() == "static" else ()
        self._static_shape: static.WarmupShape | None = None
        self._qmax = (0, 0)
        self.requests: dict[str, _Request] = {}
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.model: torch.nn.Module | None = None
        self.quant: str | None = None
        self.weights_bytes: int | None = None     # the model on the card (after quantising)
        self.stats = StepStats()
        self._compiled: Any = None
        n_layers, self.kv_heads, self.head_dim = models.geometry(self.model_config.hf_config)
        self.num_layers = n_layers
        # Estimate-only mode (VSPYRE_ESTIMATE_ONLY=1, or the engine built inside
        # torch.spyre.estimate_only()): every step is compiled, planned and costed but not run; the
        # sampled token is a stand-in (requests then need ignore_eos: their lengths are the load's).
        self.estimate_only = device.type == "spyre" and torch.spyre.is_estimate_only()
        hf = self.model_config.hf_config
        specials = {getattr(hf, k, None) for k in ("eos_token_id", "bos_token_id", "pad_token_id")}
        self.stand_in_token = next(t for t in range(3, 1 << 20) if t not in specials)
        # estimate-only: a step's cost depends on its (bucketed) input shapes alone, so each shape is
        # compiled, planned and costed once: shapes -> (estimated us, kernels, host fallbacks)
        self.cost_cache: dict[tuple, tuple[float, int, int]] = {}

    # ------------------------------------------------------------------ model and cache
    def load_model(self) -> None:
        t0 = time.perf_counter()
        on_card = self.device.type == "spyre"
        from ..runtime import relayout
        relayout.sweep()                       # copies of an earlier engine's freed weights (one process, several runs)
        m0 = torch.spyre.memory_allocated(self.device) if on_card else 0
        self.model = models.load(self.model_config.model, self.dtype, self.device, self.model_config.revision,
                                 weights=not self.estimate_only)
        from .platform import quant_scheme
        self.quant = quant_scheme(self.vllm_config)
        if self.quant is not None:             # the linears quantised on the card (torchao's layouts)
            from .. import quant
            static_scheme = quant.scheme(self.quant).static
            if static_scheme and not self.estimate_only:
                log.warning("vspyre: %s calibrates its activation scales on random token ids: right for the "
                            "cost, not for accuracy (load a static FP8 checkpoint for its calibrated scales)",
                            self.quant)
            with torch.no_grad():
                quant.quantize(self.model, self.quant, calibration=self._calibration_pass if static_scheme else None)
        self.weights_bytes = torch.spyre.memory_allocated(self.device) - m0 if on_card else None
        log.info("vspyre: loaded %s (%s, %s%s) on %s in %.1f s%s", self.model_config.model,
                 self.model_config.hf_config.model_type, self.dtype,
                 f", linears quantised {self.quant}" if self.quant else "", self.device, time.perf_counter() - t0,
                 " (estimate-only: from its config, memory accounted, no weights)" if self.estimate_only else "")

    def _calibration_pass(self, model: torch.nn.Module) -> None:
        """A static scheme's calibration: the model's own forward over 64 random token ids, with
        plain causal attention for the pass (models.calibration_attention_forward: the paged
        kernel needs an engine step's block tables and KV cache, which do not exist yet at load)."""
        from .. import quant
        ids = quant.calibration_ids(self.model_config.hf_config.vocab_size).to(self.device)
        model.set_attn_implementation(models.CALIBRATION_ATTENTION)
        try:
            model(input_ids=ids, use_cache=False)
        finally:
            model.set_attn_implementation(models.ATTN_IMPLEMENTATION)

    def layer_names(self) -> list[str]:
        return [f"model.layers.{i}.self_attn" for i in range(self.num_layers)]

    def cache_block_bytes(self) -> int:
        """Device bytes of one KV-cache block over all layers (keys and values)."""
        return 2 * self.num_layers * self.block_size * self.kv_heads * self.head_dim * self.dtype.itemsize

    def allocate_kv(self, num_blocks: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the key and value caches of ``num_blocks`` blocks on the device."""
        shape = (num_blocks, self.block_size, self.kv_heads, self.head_dim)
        return [(torch.empty(shape, dtype=self.dtype, device=self.device),
                 torch.empty(shape, dtype=self.dtype, device=self.device)) for _ in range(self.num_layers)]

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.kv_caches = self.allocate_kv(num_blocks)
        self.num_blocks = num_blocks
        log.info("vspyre: KV cache of %d blocks x %d tokens (%d layers, %d kv heads x %d, %s): %.2f GiB on %s",
                 num_blocks, self.block_size, self.num_layers, self.kv_heads, self.head_dim, self.dtype,
                 num_blocks * self.cache_block_bytes() / 2**30, self.device)

    # ------------------------------------------------------------------ the step graph
    def _forward(self, input_ids, positions, logits_indices, slot_d, bt_d, qsl_d, sl_d, slot_p, bt_p, qsl_p, sl_p,
                 kv_caches):
        meta = {"parts": ((slot_d, bt_d, qsl_d, sl_d), (slot_p, bt_p, qsl_p, sl_p)), "kv_caches": kv_caches,
                "max_query_len": self._qmax}
        out = self.model(input_ids=input_ids, position_ids=positions, logits_to_keep=logits_indices,
                         use_cache=False, spyre_paged=meta)
        return out.logits[0]

    def _graph(self) -> Any:
        if self._compiled is None:
            if self.backend in ("eager", "cpu"):
                self._compiled = self._forward
            else:
                kw = {"backend": "spyre_standalone"} if self.backend == "standalone" else {}
                if self.warmup_shapes:         # one graph per warmup shape and phase, never symbolic
                    from .. import compat
                    cfg = compat.get("dynamo_config")
                    cfg.recompile_limit = max(cfg.recompile_limit, 2 * len(self.warmup_shapes) + 2)
                    kw["dynamic"] = False
                self._compiled = torch.compile(self._forward, **kw)
        return self._compiled

    def _run(self, inputs: tuple) -> torch.Tensor:
        from .. import compat

        if self.backend not in ("eager", "cpu"):
            if not self.warmup_shapes:
                for t in inputs:
                    for d in range(t.dim()):
                        if not (t is inputs[0] or t is inputs[1]) or d == 1:     # ids/pos: [1, tokens]
                            compat.mark_dynamic(t, d)
            # the cache's size (blocks) is a deployment setting, not the graph's: a server started with
            # another memory budget reuses the compiled graph (and the compilers' caches) as it is
            for kv in self.kv_caches:
                for t in kv:
                    compat.mark_dynamic(t, 0)
        graphs = compat.get("dynamo_counters")["stats"]
        g0, t0 = graphs["unique_graphs"], time.perf_counter()
        with torch.no_grad(), compat.get("fx_config").patch(use_duck_shape=False):
            out = self._graph()(*inputs, self.kv_caches)
        new = graphs["unique_graphs"] - g0
        if new > 0:
            dt = time.perf_counter() - t0
            self.stats.graphs += new
            self.stats.compile_s += dt
            log.info("vspyre: compiled the step graph for the card with %s (%d graph%s; tokens %d, decode "
                     "sequences %d, prefill sequences %d; %s) in %.1f s", self.backend, new,
                     "s" * (new > 1), inputs[0].shape[1], inputs[4].shape[0], inputs[8].shape[0],
                     f"static shape {self._static_shape}" if self.warmup_shapes else "sizes symbolic", dt)
        return out

    def _part(self, seqs: list, tokens: int, nseq: int, t0: int, ids, pos, li, rows: list, row0: int,
              blocks: int | None = None) -> tuple:
        """One part of a step (decodes, or prefill chunks) as paged-attention metadata; fills the
        step's token ids, positions and logit rows. ``blocks``: the block table's width (default:
        the longest sequence's, bucketed)."""
        need_blocks = max((-(-s[3] // self.block_size) for _, s in seqs), default=1)
        MB = blocks if blocks is not None else _bucket(need_blocks, 2, max(self.max_blocks, 2))
        slot = torch.full((tokens,), -1, dtype=torch.int64)
        bt = torch.zeros(nseq, MB, dtype=torch.int32)
        qsl = torch.zeros(nseq + 1, dtype=torch.int32)
        sl = torch.zeros(nseq, dtype=torch.int32)
        t = 0
        for i, (k, (toks, blocks, start, end)) in enumerate(seqs):
            n = len(toks)
            ids[0, t0 + t:t0 + t + n] = torch.tensor(toks)
            p = torch.arange(start, end)
            pos[0, t0 + t:t0 + t + n] = p
            blk = torch.tensor(blocks, dtype=torch.int64)
            slot[t:t + n] = blk[p // self.block_size] * self.block_size + p % self.block_size
            bt[i, :min(len(blocks), MB)] = blk[:MB].to(torch.int32)
            t += n
            qsl[i + 1] = t
            sl[i] = end
            li[row0 + i] = t0 + t - 1
            rows[k] = row0 + i
        qsl[len(seqs) + 1:] = t
        return slot, bt, qsl, sl

    def _inputs(self, seqs: list[tuple[list[int], list[int], int, int]], reqs: list[_Request] | None = None,
                layout: str | static.WarmupShape | None = None) -> tuple[tuple, list[int]]:
        """Device inputs of a step and each sequence's logits row. ``seqs``: (token ids of the
        step, block ids, tokens before them, tokens after them) per sequence.

        The step is laid out in two parts, each one paged-attention call per layer: the sequences
        with one token (decodes: as many tokens as sequences, so the attention program's query
        bound is 1) then the others (prefill chunks). The attention program bounds a sequence's
        queries from its shapes alone (``T - S + 1``), which is exact for a decode batch and for
        one chunk, so splitting keeps a mixed step's cost what its work is.

        Static batching (:mod:`.static`) lays a step out as its warmup shape's graph instead: see
        :meth:`_static_layout`. ``layout``: ``"continuous"`` forces this layout, a warmup shape that
        shape's (start-up compiles), None the runner's strategy."""
        if layout != "continuous" and (self.warmup_shapes or layout is not None):
            return self._static_layout(seqs, reqs, layout)
        self._qmax = (0, 0)
        dec = [(k, s) for k, s in enumerate(seqs) if len(s[0]) == 1]
        pre = [(k, s) for k, s in enumerate(seqs) if len(s[0]) != 1]
        cap = max(self.max_seqs, 2)
        Sd = _bucket(len(dec), 2, cap)
        Sp = _bucket(len(pre), 2, cap)
        real_p = sum(len(s[0]) for _, s in pre)
        Tp = _bucket(real_p + (Sp - len(pre)), MIN_TOKENS_BUCKET, max(self.max_tokens, MIN_TOKENS_BUCKET))
        while max((len(s[0]) for _, s in pre), default=0) > Tp - Sp + 1:    # the program's query bound
            Tp *= 2
        T = Sd + Tp
        ids = torch.zeros(1, T, dtype=torch.int64)
        pos = torch.zeros(1, T, dtype=torch.int64)
        li = torch.zeros(Sd + Sp, dtype=torch.int64)
        rows = [0] * len(seqs)
        part_d = self._part(dec, Sd, Sd, 0, ids, pos, li, rows, 0)
        part_p = self._part(pre, Tp, Sp, Sd, ids, pos, li, rows, Sd)
        self.stats.padded_tokens += T - len(dec) - real_p
        self.stats.shapes.add((Sd, Tp, Sp, part_d[1].shape[1], part_p[1].shape[1]))
        return self._to_device((ids, pos, li) + part_d + part_p), rows

    def _static_layout(self, seqs: list, reqs: list[_Request] | None,
                       force: static.WarmupShape | None = None) -> tuple[tuple, list[int]]:
        """A step of static batching as its warmup shape's graph. A prefill (a new batch: every
        sequence's whole prompt) is ``batch`` prompts of ``prompt`` tokens each (padding tokens
        after the real ones, padding sequences with none) attending over ``prompt`` tokens of KV; a
        decode is ``batch`` sequences of one token over the static KV length ``prompt +
        new_tokens``. The shape is the smallest holding the batch (the scheduler chose the batch
        for it); a decode uses its batch's."""
        prefill = any(len(s[0]) > 1 or s[2] == 0 for s in seqs)
        if force is not None:
            self._static_shape = force
        elif prefill:
            if any(s[2] != 0 for s in seqs) or any(len(s[0]) == 1 and s[3] > 1 for s in seqs):
                raise RuntimeError("vspyre static batching: a step mixes a new batch's prefill with decodes "
                                   f"(sequences at {[s[2] for s in seqs]}); the static scheduler never does")
            want = max((r.params.max_tokens or 0) for r in reqs) if reqs else 1
            shape = static.fit(self.warmup_shapes, max(len(s[0]) for s in seqs), want, len(seqs))
            if shape is None:
                raise RuntimeError(f"vspyre static batching: no warmup shape holds {len(seqs)} prompts of up to "
                                   f"{max(len(s[0]) for s in seqs)} tokens and {want} new tokens "
                                   f"({', '.join(map(str, self.warmup_shapes))})")
            self._static_shape = shape
        shape = self._static_shape
        if shape is None or len(seqs) > shape.batch:
            raise RuntimeError(f"vspyre static batching: a decode of {len(seqs)} sequences outside a batch "
                               f"({shape})")
        B, P = shape.batch, shape.prompt
        empty = lambda n: torch.zeros(n, dtype=torch.int32)    # noqa: E731 - an absent part
        none = (torch.zeros(0, dtype=torch.int64), torch.zeros(0, 1, dtype=torch.int32), empty(1), empty(0))
        ids = torch.zeros(1, B * P if prefill else B, dtype=torch.int64)
        pos = torch.zeros_like(ids)
        li = torch.zeros(B, dtype=torch.int64)
        rows = [0] * len(seqs)
        part = self._part(list(enumerate(seqs)), ids.shape[1], B, 0, ids, pos, li, rows, 0,
                          blocks=(P if prefill else shape.kv_len) // self.block_size)
        real = sum(len(s[0]) for s in seqs)
        self.stats.padded_tokens += ids.shape[1] - real
        self.stats.shapes.add((str(shape), "prefill" if prefill else "decode"))
        self._qmax = (0, P) if prefill else (0, 0)
        parts = (none + part) if prefill else (part + none)
        return self._to_device((ids, pos, li) + parts), rows

    def _to_device(self, host: tuple) -> tuple:
        if self.estimate_only:          # the card holds no values: inputs of the right shapes only
            return tuple(torch.empty_like(x, device=self.device) for x in host)
        return tuple(x.to(self.device) for x in host)

    # ------------------------------------------------------------------ scheduler output -> step
    def _update_states(self, so: Any) -> None:
        for rid in so.finished_req_ids:
            self.requests.pop(rid, None)
        self.stats.preemptions += len(getattr(so, "preempted_req_ids", None) or ())
        for nr in so.scheduled_new_reqs:
            self.stats.admitted.setdefault(nr.req_id, len(self.stats.per_step))
            gen = None
            sp = nr.sampling_params
            if sp is not None and sp.seed is not None:
                gen = torch.Generator().manual_seed(sp.seed)
            toks = list(nr.prefill_token_ids or nr.prompt_token_ids or [])
            self.stats.prefix_hit_tokens += nr.num_computed_tokens
            self.requests[nr.req_id] = _Request(nr.req_id, toks, len(nr.prompt_token_ids or []),
                                                list(nr.block_ids[0]), nr.num_computed_tokens, sp, gen)
        cr = so.scheduled_cached_reqs
        for i, rid in enumerate(cr.req_ids):
            r = self.requests[rid]
            r.num_computed = cr.num_computed_tokens[i]
            nb = cr.new_block_ids[i]
            if rid in cr.resumed_req_ids:
                r.block_ids = list(nb[0]) if nb is not None else []
                if rid in cr.all_token_ids:
                    r.token_ids = list(cr.all_token_ids[rid])
            elif nb is not None:
                r.block_ids.extend(nb[0])
            n_out = cr.num_output_tokens[i]
            if len(r.token_ids) > r.num_prompt + n_out:           # the scheduler rolled outputs back
                del r.token_ids[r.num_prompt + n_out:]

    def execute_model(self, so: Any) -> Any:
        from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

        self._update_states(so)
        if not so.total_num_scheduled_tokens:
            return EMPTY_MODEL_RUNNER_OUTPUT
        order = list(so.num_scheduled_tokens)
        seqs, sample = [], []
        for rid in order:
            r = self.requests[rid]
            n = so.num_scheduled_tokens[rid]
            start, end = r.num_computed, r.num_computed + n
            if end > len(r.token_ids):
                raise RuntimeError(f"vspyre runner: request {rid} scheduled to token {end} but holds {len(r.token_ids)}")
            seqs.append((r.token_ids[start:end], r.block_ids, start, end))
            sample.append(end == len(r.token_ids))               # a partial prefill samples nothing
        sampled = self._step(seqs, [self.requests[rid] for rid in order], sample)
        out_tokens: list[list[int]] = []
        for rid, tok in zip(order, sampled):
            if tok is None:
                out_tokens.append([])
            else:
                self.requests[rid].token_ids.append(tok)
                out_tokens.append([tok])
        return ModelRunnerOutput(req_ids=order, req_id_to_index={r: i for i, r in enumerate(order)},
                                 sampled_token_ids=out_tokens)

    def _step(self, seqs: list, reqs: list[_Request], sample: list[bool]) -> list[int | None]:
        from ..runtime.profiler import profile

        t0 = time.perf_counter()
        inputs, rows = self._inputs(seqs, reqs)
        key = (tuple(tuple(t.shape) for t in inputs), self._qmax)
        if self.estimate_only and key in self.cost_cache:
            est, nk, fbs = self.cost_cache[key]
            self.stats.cost_cache_hits += 1
            self._account(seqs, reqs, time.perf_counter() - t0, est, fbs, nk, ())
            return [self.stand_in_token if s else None for s in sample]
        with profile(record_segments=False) as prof:
            logits = self._run(inputs)
            greedy = all(r.params is None or r.params.temperature < 1e-5 for r, s in zip(reqs, sample) if s)
            if self.estimate_only:
                torch.argmax(logits, dim=-1)                    # costed like a real step's pick
                ids = [self.stand_in_token] * len(seqs)
            elif greedy:
                top = torch.argmax(logits, dim=-1).cpu().tolist()
                ids = [top[r] for r in rows]
        if not greedy and not self.estimate_only:
            ids = self._sample_host(logits.float().cpu()[rows], reqs, sample)
        est = prof.total_est_us + sum(f.est_us for f in prof.fallbacks)
        if self.estimate_only:
            self.cost_cache[key] = (est, len(prof.kernels), len(prof.fallbacks))
        self._account(seqs, reqs, time.perf_counter() - t0, est, len(prof.fallbacks), len(prof.kernels),
                      [f.op for f in prof.fallbacks])
        return [int(ids[i]) if s else None for i, s in enumerate(sample)]

    def _account(self, seqs: list, reqs: list[_Request], wall: float, est: float, fbs: int, kernels: int,
                 fallback_ops: Any) -> None:
        st = self.stats
        st.steps += 1
        st.wall_s += wall
        st.device_est_us += est
        st.host_fallbacks += fbs
        new_ops = set(fallback_ops) - set(st.fallback_ops)
        st.fallback_ops.update(fallback_ops)
        if new_ops:       # nothing runs on the host silently: the first time per op, say so
            log.warning("vspyre: a %s step ran ops on the host (host fallbacks): %s", self.backend,
                        ", ".join(sorted(new_ops)))
        n_tok = sum(len(s[0]) for s in seqs)
        decode = sum(1 for s, r in zip(seqs, reqs) if s[2] >= r.num_prompt)
        st.decode_tokens += decode
        st.prefill_tokens += n_tok - decode
        kind = "decode" if decode == len(seqs) else ("prefill" if decode == 0 else "mixed")
        st.per_step.append(Step(kind, n_tok, len(seqs), wall, est, fbs, kernels))

    def _sample_host(self, logits: torch.Tensor, reqs: list[_Request], sample: list[bool]) -> list[int]:
        """Temperature, top-k and top-p sampling on the host with vLLM's own functions."""
        from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch, random_sample

        out = logits.argmax(dim=-1).tolist()
        rows = [i for i, (r, s) in enumerate(zip(reqs, sample)) if s and r.params is not None
                and r.params.temperature >= 1e-5]
        if not rows:
            return out
        x = logits[rows] / torch.tensor([reqs[i].params.temperature for i in rows])[:, None]
        k = torch.tensor([reqs[i].params.top_k if reqs[i].params.top_k > 0 else x.shape[-1] for i in rows])
        p = torch.tensor([reqs[i].params.top_p for i in rows], dtype=torch.float32)
        x = apply_top_k_top_p_pytorch(x, k, p, allow_cpu_sync=True)
        gens = {j: reqs[i].generator for j, i in enumerate(rows) if reqs[i].generator is not None}
        picked = random_sample(torch.softmax(x, dim=-1, dtype=torch.float32), gens).tolist()
        for j, i in enumerate(rows):
            out[i] = int(picked[j])
        return out

    # ------------------------------------------------------------------ start-up
    def dummy_inputs(self, tokens: int, seqs: int) -> list:
        """A step of ``seqs`` sequences (one prefill of the remaining tokens, the rest one token
        each) on block 0 (vLLM's null block, never given to a request)."""
        seqs = max(1, min(seqs, tokens))
        first = tokens - (seqs - 1)
        out = [([0] * first, [0] * (-(-first // self.block_size)), 0, first)]
        out += [([0], [0], 0, 1) for _ in range(seqs - 1)]
        return out

    def warm_up(self) -> float:
        """Compile the step graph before serving (a mixed prefill + decode step, then a decode
        batch, which must reuse it); with static batching, every warmup shape's prefill and decode
        graphs. Returns the seconds spent compiling."""
        c0 = self.stats.compile_s
        steps: list[tuple[list, Any]] = [(self.dummy_inputs(min(self.max_tokens, 64), 3), None),
                                         (self.dummy_inputs(4, 4), None)]
        if self.warmup_shapes:
            bs = self.block_size
            steps = [step for s in self.warmup_shapes for step in (
                ([([0] * s.prompt, [0] * (s.prompt // bs), 0, s.prompt)] * s.batch, s),
                ([([0], [0] * (s.kv_len // bs), s.prompt, s.prompt + 1)] * s.batch, s))]
        for seqs, shape in steps:
            top = torch.argmax(self._run(self._inputs(seqs, layout=shape)[0]), dim=-1)
            if not self.estimate_only:
                top.cpu()
        self._static_shape = None
        self.stats.shapes.clear()
        self.stats.padded_tokens = 0
        return self.stats.compile_s - c0
