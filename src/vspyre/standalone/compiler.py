"""The standalone graph compiler: ATen FX graph -> passes -> op table -> a runner of tile programs.

Pipeline (``compile_graph``), per forward graph AOTAutograd hands over:

1. graph passes (:mod:`.passes`): constant folding, no-op clone removal, the fixed pattern
   fusions, dead-code removal;
2. instruction selection: every ``call_function`` node is looked up in the op table
   (:data:`.lowerings.TABLE`): a *kernel* (one tile program), a *view* (metadata, no kernel), a
   *fused* pattern (one program for several ATen ops), or - not in the table - a **host fallback
   node**;
3. buffer planning: intermediates with static shapes get slots of a per-graph arena, reused by
   liveness (best fit), allocated once and kept across calls; graph outputs (and anything a view
   of them aliases) are always fresh allocations;
4. a runner that walks the instructions, launching programs through ``vspyre.runtime.launch``
   (``source="standalone"``, so ``torch.spyre.profile()`` and the Chrome trace see them).

Fallback policy: an op without a lowering runs as a host fallback node *inside* the compiled
graph: the ATen op is called on the device tensors, which the device's counted host fallback
runs on the host (labelled ``compiled`` in the trace). Such ops are recorded per graph
(:func:`vspyre.standalone.report`) and at run time (``fallback_calls``). In strict mode
(``torch.spyre.set_fallback_mode("strict")``) a fallback node raises
``HostFallbackError`` naming the op instead.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import operator
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx

from .. import hardware, runtime
from ..device import fallback as dev_fallback
from . import lowerings as L
from . import passes

log = logging.getLogger("vspyre.standalone")
_ids = itertools.count()


# ------------------------------------------------------------------------------ report
@dataclass
class GraphReport:
    name: str
    native: collections.Counter = field(default_factory=collections.Counter)     # ATen op -> nodes lowered to kernels
    views: collections.Counter = field(default_factory=collections.Counter)      # metadata-only nodes
    fallback: collections.Counter = field(default_factory=collections.Counter)   # ATen op -> host fallback nodes
    fusions: collections.Counter = field(default_factory=collections.Counter)    # pattern -> times fired
    collectives: collections.Counter = field(default_factory=collections.Counter)  # functional collective -> nodes
    fused_ops: collections.Counter = field(default_factory=collections.Counter)  # ATen ops absorbed by fusions
    folded: int = 0
    dce_removed: int = 0
    clones_removed: int = 0
    kernels: int = 0                  # launching nodes per call
    arena_bytes: int = 0
    unplanned_bytes: int = 0          # what the same intermediates take without reuse
    compile_s: float = 0.0

    @property
    def native_ops(self) -> int:
        """ATen op nodes run natively on the card (kernels, views and those inside fusions)."""
        return sum(self.native.values()) + sum(self.views.values()) + sum(self.fused_ops.values())

    @property
    def fallback_ops(self) -> int:
        return sum(self.fallback.values())

    def text(self) -> str:
        lines = [f"graph {self.name}: {self.kernels} kernel nodes, {self.native_ops} ATen ops native, "
                 f"{self.fallback_ops} host-fallback nodes; folded {self.folded}, DCE removed {self.dce_removed}, "
                 f"no-op clones removed {self.clones_removed}; arena {self.arena_bytes} B "
                 f"(vs {self.unplanned_bytes} B unplanned); compiled in {self.compile_s * 1e3:.1f} ms"]
        if self.fusions:
            lines.append("  fusions: " + ", ".join(f"{k} x{v}" for k, v in sorted(self.fusions.items())))
        if self.collectives:
            lines.append("  collectives (spyre c10d backend): "
                         + ", ".join(f"{k} x{v}" for k, v in self.collectives.most_common()))
        if self.fallback:
            lines.append("  host fallback: " + ", ".join(f"{k} x{v}" for k, v in self.fallback.most_common()))
        return "\n".join(lines)


_graphs: list[GraphReport] = []
_calls: collections.Counter = collections.Counter()     # runtime: fallback op -> calls


def report() -> dict:
    """What the standalone compiler did since the last reset: per graph and in total."""
    tot = {k: collections.Counter() for k in ("native", "views", "fallback", "fusions", "fused_ops", "collectives")}
    for g in _graphs:
        for k in tot:
            tot[k].update(getattr(g, k))
    return {"graphs": list(_graphs), **{k: dict(v.most_common()) for k, v in tot.items()},
            "native_ops": sum(g.native_ops for g in _graphs), "fallback_ops": sum(g.fallback_ops for g in _graphs),
            "fallback_calls": dict(_calls.most_common())}


def report_text() -> str:
    r = report()
    head = (f"spyre_standalone: {len(r['graphs'])} graph(s), {r['native_ops']} ATen ops native, "
            f"{r['fallback_ops']} host-fallback nodes ({r['fallback_calls'] or 'no calls'})")
    return "\n".join([head] + [g.text() for g in r["graphs"]])


def reset_report() -> None:
    _graphs.clear()
    _calls.clear()


# ------------------------------------------------------------------------------ runtime context
class Ctx:
    """What a lowering's ``run`` gets: allocation (through the buffer plan), program memo, launch."""

    def __init__(self, device: torch.device, mode: str | None = None) -> None:
        self.device = device
        self.mode = mode
        self.slot: tuple | None = None        # (arena tensor) planned for the current node
        self.strides: tuple | None = None     # the strides eager gives the current node's result
        self._memo: dict = {}

    def alloc(self, shape: tuple, dtype: torch.dtype, fresh: bool = False,
              strides: tuple | None = None) -> torch.Tensor:
        """The current node's result buffer: its planned arena slot, or a new tensor; contiguous,
        or with ``strides`` (a dense permutation, as eager lays out a pointwise op's result)."""
        shape = tuple(int(s) for s in shape)
        slot, self.slot = self.slot, None
        if slot is not None and not fresh:
            n = 1
            for s in shape:
                n *= s
            nbytes = n * dtype.itemsize
            if nbytes <= slot.numel() and nbytes % dtype.itemsize == 0:
                t = slot[:nbytes].view(dtype)
                return t.as_strided(shape, strides) if strides else t.view(shape)
        if strides:
            return torch.empty_strided(shape, strides, dtype=dtype, device=self.device)
        return torch.empty(shape, dtype=dtype, device=self.device)

    def memo(self, key: Any, build: Callable) -> Any:
        p = self._memo.get(key)
        if p is None:
            p = self._memo[key] = build()
        return p

    # Lowerings written with these three build programs from specs this context chooses: concrete
    # here (a program per shape), size symbols in eager mode (``vspyre.eager``: one per rank).
    def spec(self, t: torch.Tensor, name: str, sizes: tuple | None = None) -> tuple:
        """``t``'s spec (dtype, shape, strides); ``name`` keeps its symbols apart in eager mode, where
        ``sizes`` (built from other specs' sizes) says how its sizes relate to theirs. Here sizes are
        the actual ones."""
        return (t.dtype, tuple(t.shape), tuple(t.stride()))

    def stride_spec(self, t: torch.Tensor, name: str) -> tuple:
        return tuple(t.stride())

    def operand(self, t: torch.Tensor, shape: tuple) -> torch.Tensor:
        """An operand a program reads at ``shape`` (eager mode: broadcast to it, as a view)."""
        return t

    def key(self, t: torch.Tensor) -> tuple:
        """What of ``t`` a program built from :meth:`spec` depends on."""
        return (t.dtype, tuple(t.shape), tuple(t.stride()))

    def launch(self, prog, *tensors: torch.Tensor) -> None:
        runtime.launch(prog, *tensors, mode=self.mode, source="standalone")

    def pointwise(self, name: str, shape: tuple, odt: torch.dtype, tensors: list, expr: Any,
                  out: torch.Tensor | None = None) -> torch.Tensor:
        from . import kernels as K
        from .kernels import spec
        if out is None:
            st = self.strides if self.strides is not None and len(self.strides) == len(shape) else None
            out = self.alloc(shape, odt, strides=st)
        key = ("pw", name, spec(out), tuple(spec(t) for t in tensors), expr)
        prog = self.memo(key, lambda: K.pointwise(name, spec(out), tuple(spec(t) for t in tensors), expr))
        self.launch(prog, *tensors, out)
        return out

    def host_fallback(self, op: Any, *args: Any, **kwargs: Any) -> Any:
        name = L._opname(op)
        if dev_fallback.get_mode() == "strict":
            raise dev_fallback.HostFallbackError(
                f"spyre_standalone: {name} has no lowering in the standalone compiler and would run as a host "
                f"fallback; strict fallback mode forbids that (torch.spyre.set_fallback_mode('allow') permits it)")
        _calls[name] += 1
        with dev_fallback.context("compiled"):
            return op(*args, **kwargs)


# ------------------------------------------------------------------------------ buffer planning
def _base(node: fx.Node, kinds: dict) -> fx.Node:
    """The node whose memory ``node``'s value lives in (views alias their first input)."""
    while kinds.get(node) == "view" and node.args and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def plan_buffers(graph: fx.Graph, kinds: dict) -> tuple[dict, list[int], int]:
    """Greedy best-fit slot assignment by liveness over the node order.

    Returns ({node: slot index}, slot sizes in bytes, bytes the same values take unplanned).
    Only single-tensor results of kernel/fused nodes with static shapes are planned; values that
    reach the graph output (through views) are never planned.
    """
    nodes = list(graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    out_node = nodes[-1]
    escaping = set()
    for a in out_node.all_input_nodes:
        escaping.add(_base(a, kinds))
    last = {}
    for n in nodes:
        for a in n.all_input_nodes:
            b = _base(a, kinds)
            last[b] = max(last.get(b, -1), pos[n])
    # tuple-valued nodes: their getitems are views of their outputs: outputs escape if getitems do
    for n in nodes:
        if n.target is operator.getitem and _base(n, kinds) in escaping:
            escaping.add(n)
    free: list[int] = []
    sizes: list[int] = []
    assign: dict = {}
    unplanned = 0
    dying: dict[int, list] = collections.defaultdict(list)
    for n in nodes:
        i = pos[n]
        v = n.meta.get("val")
        if (kinds.get(n) in ("kernel", "fused") and isinstance(v, torch.Tensor) and n not in escaping
                and all(isinstance(s, int) for s in v.shape) and n in last):
            nbytes = max(1, v.numel()) * v.dtype.itemsize
            nbytes = (nbytes + 127) // 128 * 128
            unplanned += nbytes
            best = None
            for s in free:
                if sizes[s] >= nbytes and (best is None or sizes[s] < sizes[best]):
                    best = s
            if best is None and free:      # grow the largest free slot instead of adding one
                best = max(free, key=lambda s: sizes[s])
                sizes[best] = nbytes
            if best is None:
                sizes.append(nbytes)
                best = len(sizes) - 1
            else:
                free.remove(best)
            assign[n] = best
            dying[last[n]].append(best)
        for s in dying.pop(i, []):
            free.append(s)
    return assign, sizes, unplanned


# ------------------------------------------------------------------------------ compile
def _node_kind(n: fx.Node) -> str:
    if n.op != "call_function":
        return n.op
    low = L.lookup(n.target)
    if low is None or (low.applies is not None and not low.applies(n)):
        return "fallback"
    return low.kind




def check_dtypes(gm: fx.GraphModule) -> None:
    """Refuse a graph with a value the card cannot hold (e.g. irfft's complex64 intermediate).

    Kernels write into arena slots (device bytes viewed as any dtype) and a host fallback node
    would run its ATen op on such a value, so without this check an unsupported dtype is not
    refused by the device but silently gives wrong values.
    """
    for n in gm.graph.nodes:
        if n.op not in ("placeholder", "call_function", "get_attr"):
            continue
        v = n.meta.get("val")
        for t in (v if isinstance(v, (list, tuple)) else (v,)):
            if isinstance(t, torch.Tensor) and t.device.type == "spyre" and t.dtype not in hardware.card_dtypes():
                what = L._opname(n.target) if n.op == "call_function" else f"input {n.target}"
                raise TypeError(
                    f"spyre_standalone: unsupported: {what} produces a {str(t.dtype).removeprefix('torch.')} "
                    f"tensor of shape {list(t.shape)}, a dtype the card does not support (supported: "
                    f"{hardware.dtype_names()})")


def compile_graph(gm: fx.GraphModule, example_inputs: list, name: str | None = None) -> Callable:
    """Compile an ATen-level FX graph (from AOTAutograd) into a boxed callable running on the card."""
    t0 = time.perf_counter()
    check_dtypes(gm)
    rep = GraphReport(name or f"graph{next(_ids)}")
    passes.run_all(gm, rep)
    kinds = {n: _node_kind(n) for n in gm.graph.nodes}
    for n, k in kinds.items():
        if n.op != "call_function":
            continue
        opname = L._opname(n.target)
        if k == "kernel":
            rep.native[opname] += 1
            rep.kernels += 1
        elif k == "fused":
            rep.kernels += 1
        elif k == "view":
            if n.target is not operator.getitem:
                rep.views[opname] += 1
        elif k == "collective":
            rep.collectives[opname] += 1
        else:
            rep.fallback[opname] += 1
    assign, sizes, unplanned = plan_buffers(gm.graph, kinds)
    rep.arena_bytes, rep.unplanned_bytes = sum(sizes), unplanned

    device = None
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type == "spyre":
            device = x.device
            break
    device = device or torch.device("spyre", torch.spyre.current_device())

    nodes = list(gm.graph.nodes)
    idx = {n: i for i, n in enumerate(nodes)}
    last_use: dict[int, int] = {}
    for n in nodes:
        for a in n.all_input_nodes:
            last_use[idx[a]] = idx[n]
    syms = _symbol_sources(nodes, idx)
    keep = {i for i, _ in syms.values()}       # inputs symbolic sizes are read from at any node
    frees: dict[int, list[int]] = collections.defaultdict(list)
    for j, i in last_use.items():
        if j not in keep:
            frees[i].append(j)

    def leaf(x):
        return _Ref(idx[x]) if isinstance(x, fx.Node) else _symbolic_leaf(x, syms)

    def ref(a):
        return fx.node.map_aggregate(a, leaf)

    instrs = []
    placeholders = []
    consts = {}
    host_consts: set[int] = set()
    for n in nodes:
        i = idx[n]
        if n.op == "placeholder":
            placeholders.append(i)
            continue
        if n.op == "get_attr":
            consts[i] = _fetch_attr(gm, n.target)
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor) and v.device.type == "cpu":
                host_consts.add(i)     # a host scalar in the graph (Dynamo's float arithmetic, float64): stays there
            continue
        if n.op == "output":
            out_spec = ref(n.args[0])
            continue
        k = kinds[n]
        if k == "fallback":
            op = n.target
            fn = (lambda op: (lambda ctx, *a, **kw: ctx.host_fallback(op, *a, **kw)))(op)
        else:
            fn = L.lookup(n.target).make(n)
        instrs.append((i, fn, ref(tuple(n.args)), ref(dict(n.kwargs)), (assign.get(n), _eager_strides(n)),
                       tuple(frees.get(i, ()))))

    arena: list[torch.Tensor | None] = [None] * len(sizes)
    dev_consts: dict[int, Any] = {}
    ctx = Ctx(device)
    nvals = len(nodes)

    def run(args: list) -> Any:
        env: list[Any] = [None] * nvals
        for i, a in zip(placeholders, args):
            env[i] = a
        args.clear()
        if not dev_consts and consts:
            for i, c in consts.items():
                dev_consts[i] = c.to(device) if isinstance(c, torch.Tensor) and c.device != device and \
                    i not in host_consts else c
        for i, c in dev_consts.items():
            env[i] = c

        def get(x):
            return env[x.i]
        with dev_fallback.context("compiled"):
            for i, fn, a, kw, (slot, strides), free in instrs:
                if slot is not None:
                    if arena[slot] is None:
                        arena[slot] = torch.empty(sizes[slot], dtype=torch.uint8, device=device)
                    ctx.slot = arena[slot]
                ctx.strides = strides
                env[i] = fn(ctx, *_resolve(a, get), **_resolve(kw, get))
                ctx.slot = ctx.strides = None
                for j in free:
                    if j not in dev_consts:
                        env[j] = None
            return _resolve(out_spec, get)

    run._boxed_call = True
    rep.compile_s = time.perf_counter() - t0
    _graphs.append(rep)
    log.info("%s", rep.text())
    d = os.environ.get("VSPYRE_DUMP_DIR")
    if d:
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"standalone.{rep.name}.graph.txt"), "w") as fh:
            fh.write(rep.text() + "\n\n" + gm.print_readable(print_output=False))
    run.report = rep
    run.graph_module = gm
    return run


def _eager_strides(n: fx.Node) -> tuple | None:
    """The strides eager gives ``n``'s result when they are static, dense and not contiguous (a
    pointwise op on a transposed input keeps its layout); None otherwise (contiguous)."""
    v = n.meta.get("val")
    if not isinstance(v, torch.Tensor) or v.dim() < 2:
        return None
    shape, strides = list(v.shape), list(v.stride())
    if not all(type(x) is int for x in shape + strides):     # symbolic: contiguous (no guard added)
        return None
    if strides == list(torch.empty(shape, device="meta").stride()):
        return None
    expect = 1
    for d in sorted(range(len(shape)), key=lambda d: (strides[d], shape[d])):   # dense permutation
        if shape[d] != 1 and strides[d] != expect:
            return None
        expect *= shape[d]
    return tuple(strides)


class _Ref:
    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i


class _SymRef:
    """A symbolic size baked into a node's arguments at compile time (a fusion's ``bshape`` or
    ``mm_shape`` taken from meta shapes, a SymInt literal): evaluated at every call from the
    graph inputs it comes from (a SymInt placeholder, or a size of an input tensor)."""
    __slots__ = ("expr", "sources", "cast", "_last")

    def __init__(self, expr: Any, sources: list, cast: type) -> None:
        self.expr, self.sources, self.cast = expr, sources, cast
        self._last: tuple | None = None            # (symbol values, result) of the previous call

    def value(self, get: Callable) -> Any:
        vals = tuple(int(v.shape[d] if d is not None else v) for v, d in
                     ((get(_Ref(i)), d) for _, i, d in self.sources))
        if self._last is not None and self._last[0] == vals:
            return self._last[1]
        import sympy
        r = self.expr.xreplace({sym: sympy.Integer(x) for (sym, _, _), x in zip(self.sources, vals)})
        r = self.cast(bool(r) if self.cast is bool else r)
        self._last = (vals, r)
        return r


def _symbol_sources(nodes: list, idx: dict) -> dict:
    """sympy symbol -> (placeholder index, dim or None): where each size symbol's value comes from."""
    import sympy
    found: dict = {}
    for n in nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("val")
        if isinstance(v, torch.SymInt):
            if isinstance(v.node.expr, sympy.Symbol):
                found.setdefault(v.node.expr, (idx[n], None))
        elif isinstance(v, torch.Tensor):
            for d, sz in enumerate(v.shape):
                if isinstance(sz, torch.SymInt) and isinstance(sz.node.expr, sympy.Symbol):
                    found.setdefault(sz.node.expr, (idx[n], d))
    return found


def _symbolic_leaf(a: Any, syms: dict) -> Any:
    """A SymInt/SymFloat/SymBool literal of a node's arguments as a :class:`_SymRef` (other
    values unchanged); a ``torch.SymInt`` reaching an ATen op (or a kernel generator) at run time
    is an error."""
    if not isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return a
    expr = a.node.expr
    missing = [s for s in expr.free_symbols if s not in syms]
    if missing:
        raise RuntimeError(f"spyre_standalone: the symbolic value {expr} depends on {missing}, which no graph "
                           f"input provides")
    cast = int if isinstance(a, torch.SymInt) else float if isinstance(a, torch.SymFloat) else bool
    return _SymRef(expr, [(s, *syms[s]) for s in expr.free_symbols], cast)


def _resolve(a: Any, get: Callable) -> Any:
    if isinstance(a, _Ref):
        return get(a)
    if isinstance(a, _SymRef):
        return a.value(get)
    if isinstance(a, tuple):
        return tuple(_resolve(x, get) for x in a)
    if isinstance(a, list):
        return [_resolve(x, get) for x in a]
    if isinstance(a, dict):
        return {k: _resolve(v, get) for k, v in a.items()}
    return a


def _fetch_attr(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


# ------------------------------------------------------------------------------ the Dynamo backend
def _decompositions() -> dict:
    """The decompositions the standalone compiler asks AOTAutograd for: a short hand-picked list
    (ops it would rather see as simpler ATen ops); everything else reaches the op table as is."""
    from ..compat import get_decompositions
    from ..device import out_dtype
    aten = torch.ops.aten
    return out_dtype.decompositions() | get_decompositions([
        aten.var_mean.correction, aten.var.correction, aten.std.correction, aten.addcmul, aten.addcdiv,
        aten.native_dropout, aten.dropout, aten.hardswish, aten.hardsigmoid, aten.softplus, aten.mish,
        aten.glu, aten.elu, aten.linspace, aten.logsumexp, aten.native_group_norm,
        aten.stack,       # unsqueeze + cat (interleaved RoPE: Cohere, ERNIE 4.5 stack the rotated halves)
    ])


def _bw_eager(gm: fx.GraphModule, example_inputs: list) -> Callable:
    """Backward graphs are not compiled: they run eagerly on the device (eager device kernels, and
    counted host fallbacks for ops without a tile form)."""
    from ..compat import make_boxed_func
    return make_boxed_func(gm.forward)


def spyre_standalone(gm: fx.GraphModule, example_inputs: list, **kwargs: Any) -> Callable:
    """``torch.compile(model, backend="spyre_standalone")``."""
    from ..compat import aot_module_simplified

    from . import cache

    def fw(g, ex):
        return compile_graph(g, ex)

    def aot(g, ex, fw_compiler):
        return aot_module_simplified(g, ex, fw_compiler=fw_compiler, bw_compiler=_bw_eager,
                                     decompositions=_decompositions())
    return cache.compile_cached(gm, example_inputs, fw, aot)
