"""The standalone compiler's graph passes over the ATen FX graph (in this order):

1. ``fold_constants``  - nodes whose inputs are all constants (``get_attr``, literals) and that
   draw no random numbers are evaluated once on the host at compile time and become constants
   (causal masks, position ids, T5's relative-position buckets...);
2. ``remove_noop_clones`` - ``clone`` of a value that is already contiguous (what dropout leaves
   behind in inference graphs) becomes its input: graphs from AOTAutograd are functional;
3. pattern fusions (:mod:`.fusions`), a fixed list, each producing ONE program;
4. ``dce`` - dead-code removal.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

aten = torch.ops.aten
_FOLD_LIMIT = 1 << 22          # elements: bigger constants stay computed on the card
_RANDOM = {"rand", "randn", "randint", "bernoulli", "native_dropout", "dropout", "normal", "uniform", "multinomial",
           "randperm", "rand_like", "randn_like", "empty", "empty_like"}


def run_all(gm: fx.GraphModule, rep: Any) -> None:
    from ..compat import unset_fake_temporarily
    with unset_fake_temporarily():
        _run_all(gm, rep)


def _run_all(gm: fx.GraphModule, rep: Any) -> None:
    rep.folded = fold_constants(gm)
    rep.clones_removed = remove_noop_clones(gm)
    from . import fusions
    rep.dce_removed += dce(gm)
    for name, fn in fusions.PATTERNS:
        fired, absorbed = fn(gm)
        if isinstance(fired, dict):
            rep.fusions.update(fired)
        elif fired:
            rep.fusions[name] += fired
        rep.fused_ops.update(absorbed)
    dce(gm)
    gm.graph.lint()
    gm.recompile()


def dce(gm: fx.GraphModule) -> int:
    before = len(gm.graph.nodes)
    gm.graph.eliminate_dead_code()
    return before - len(gm.graph.nodes)


def _is_const(n: Any, consts: set) -> bool:
    return not isinstance(n, fx.Node) or n in consts


def fold_constants(gm: fx.GraphModule) -> int:
    """Evaluate constant subgraphs on the host; replace them by get_attr constants."""
    consts: set = set()
    values: dict = {}
    folded = 0
    for n in list(gm.graph.nodes):
        if n.op == "get_attr":
            obj: Any = gm
            for part in n.target.split("."):
                obj = getattr(obj, part)
            if isinstance(obj, torch.Tensor):
                consts.add(n)
                values[n] = obj.detach().cpu() if obj.device.type != "cpu" else obj
            continue
        if n.op != "call_function":
            continue
        name = getattr(getattr(n.target, "_schema", None), "name", "")
        if any(name.endswith("::" + r) for r in _RANDOM):
            continue
        if not all(_is_const(a, consts) for a in n.all_input_nodes):
            continue
        if not all(a in consts for a in n.all_input_nodes) and n.all_input_nodes:
            continue
        if n.target is operator.getitem:
            continue
        v = n.meta.get("val")
        if not isinstance(v, torch.Tensor) or v.numel() > _FOLD_LIMIT or \
                not all(isinstance(s, int) for s in v.shape):
            continue

        def host(x):
            if isinstance(x, fx.Node):
                return values[x]
            if isinstance(x, torch.device):
                return torch.device("cpu")
            return x
        args = fx.node.map_aggregate(n.args, host)
        kwargs = {k: fx.node.map_aggregate(v_, host) for k, v_ in n.kwargs.items()}
        try:
            with torch.no_grad():
                r = n.target(*args, **kwargs)
        except Exception:   # noqa: BLE001 - leave it to the card
            continue
        if not isinstance(r, torch.Tensor):
            continue
        attr = f"_spyre_const{len(values)}"
        while hasattr(gm, attr):
            attr += "_"
        gm.register_buffer(attr, r, persistent=False)     # host copy; moved to the card at first call
        with gm.graph.inserting_before(n):
            g = gm.graph.get_attr(attr)
        g.meta["val"] = v
        n.replace_all_uses_with(g)
        gm.graph.erase_node(n)
        consts.add(g)
        values[g] = r
        folded += 1
    dce(gm)
    return folded


def remove_noop_clones(gm: fx.GraphModule) -> int:
    removed = 0
    for n in list(gm.graph.nodes):
        if n.op == "call_function" and n.target in (aten.clone.default, aten.alias.default):
            src = n.args[0]
            mf = n.kwargs.get("memory_format")
            sv = src.meta.get("val") if isinstance(src, fx.Node) else None
            if sv is None or not isinstance(sv, torch.Tensor):
                continue
            if mf in (None, torch.contiguous_format, torch.preserve_format) and sv.is_contiguous():
                n.replace_all_uses_with(src)
                gm.graph.erase_node(n)
                removed += 1
    return removed
