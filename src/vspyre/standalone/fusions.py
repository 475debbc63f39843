"""The standalone compiler's fixed pattern fusions (the hand-fused patterns vendor compilers ship).

Each pattern rewrites a matched ATen subgraph into ONE call of a ``fused_*`` target, which the
op table lowers to ONE tile program:

* ``attention``  - ``bmm(q, k^T) -> [view] -> [* or / scalar] -> [+ mask] -> softmax -> [view] ->
  bmm(., v)``: one program with two systolic contractions and the softmax between them;
* ``linear_act`` - ``mm/addmm/bmm/_int_mm -> [view] -> activation``, the activation being any
  chain of pointwise ops that reads only the matmul result (gelu, GPT-2's tanh-gelu, silu, relu...;
  after ``_int_mm`` a W8A8 linear's dequantisation: to float, the scales, the cast to 16 bits):
  a matmul with an epilogue;
* ``residual_add`` - ``matmul [-> activation] -> + residual`` (same shape): the add joins the
  epilogue;
* ``add_layernorm`` - ``a + b -> native_layer_norm`` (the residual stream feeding a LayerNorm):
  one program storing both the sum and the normalised value;
* ``rmsnorm``    - ``x * rsqrt(mean(x^2, -1) + eps) [* w]`` (Llama, T5): one program;
* ``softmax``    - the decomposed form ``exp(x - amax(x)) / sum(exp(..))``: one program
  (``aten._softmax`` itself is already one program).

A pattern fires only if every intermediate value it absorbs has no other user (otherwise the
value would have to be stored anyway): that is the near-miss rule the tests exercise.
"""

from __future__ import annotations

import math
import operator
import warnings
from collections import Counter
from typing import Any

import torch
import torch.fx as fx

from . import lowerings as L

aten = torch.ops.aten
_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}
_PASS = _VIEWS | {aten.expand.default, aten.clone.default}
_MM = {aten.mm.default, aten.addmm.default, aten.bmm.default}


def _single_user(n: fx.Node) -> fx.Node | None:
    us = list(n.users)
    return us[0] if len(us) == 1 else None


def _shape(n: Any):
    v = n.meta.get("val") if isinstance(n, fx.Node) else None
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def _opn(n: fx.Node) -> str:
    return L._opname(n.target)


# ------------------------------------------------------------------------------ fused targets
def fused_matmul(a, b, *extras, epilogue=None, mm_shape=None, out_shape=None, name="matmul"):
    """Placeholder target: only the standalone compiler runs it (matmul + epilogue)."""
    raise RuntimeError("fused_matmul runs only inside the spyre_standalone compiler")


def fused_attention(q, kt, v, mask=None, scale=None, safe=False, bshape=None):
    raise RuntimeError("fused_attention runs only inside the spyre_standalone compiler")


def fused_norm(x, *extras, kind="rms", weight=None, bias=None, eps=1e-6, prologue=("x",), with_sum=False):
    raise RuntimeError("fused_norm runs only inside the spyre_standalone compiler")


def fused_softmax(x, *extras, dim=-1, prologue=("x",), safe=False, log=False):
    raise RuntimeError("fused_softmax runs only inside the spyre_standalone compiler")


def _reshape(ctx, t, shape):
    v = L._view(t, shape)
    if v is None:
        v = ctx.pointwise("clone", tuple(t.shape), t.dtype, [t], ("in", 0)).view(shape)
    return v


@L.register(fused_matmul, "fused", "matmul with a fused epilogue (bias, activation, residual add)")
def _fused_matmul(node):
    odt = node.meta["val"].dtype

    def run(ctx, a, b, *extras, epilogue, mm_shape, out_shape=None, name="matmul"):
        ex = [(_reshape(ctx, e, mm_shape) if tuple(e.shape) == tuple(out_shape or ()) and out_shape is not None
               and tuple(e.shape) != tuple(mm_shape) else e) for e in extras]
        return L.matmul_run(ctx, a, b, odt, tuple(ex), epilogue, name, out_shape)
    return run


@L.register(fused_attention, "fused", "attention: matmul, softmax, matmul in one program")
def _fused_attention(node):
    odt = node.meta["val"].dtype

    def run(ctx, q, kt, v, mask=None, scale=None, safe=False, bshape=None):
        BH, M, D = q.shape
        N, E = v.shape[-2], v.shape[-1]
        bs = tuple(bshape)
        q4, kt4, v4 = _reshape(ctx, q, bs + (M, D)), _reshape(ctx, kt, bs + (D, N)), _reshape(ctx, v, bs + (N, E))
        out = L.attention_run(ctx, q4, kt4, v4, odt, scale, mask, False, "attention", kt=True, safe=safe)
        return out.view(BH, M, E)
    return run


@L.register(fused_norm, "fused", "layer/RMS norm (optionally fed by the residual add) in one program")
def _fused_norm(node):
    v = node.meta["val"]
    odt = v[0].dtype if isinstance(v, (tuple, list)) else v.dtype
    sdt = v[1].dtype if isinstance(v, (tuple, list)) else None

    def run(ctx, x, *extras, kind="rms", weight=None, bias=None, eps=1e-6, prologue=("x",), with_sum=False):
        outs = L.norm_run(ctx, kind, x, weight, bias, eps, odt, extras=tuple(extras), prologue=prologue,
                          sum_dtype=sdt if with_sum else None, name=("add_layernorm" if with_sum else None))
        return (outs[0], outs[1]) if with_sum else outs[0]
    return run


@L.register(fused_softmax, "fused", "decomposed softmax re-formed into one program")
def _fused_softmax(node):
    odt = node.meta["val"].dtype

    def run(ctx, x, *extras, dim=-1, prologue=("x",), safe=False, log=False):
        return L.softmax_run(ctx, x, dim, odt, tuple(extras), prologue, safe, log,
                             "log_softmax" if log else "softmax")
    return run


# ------------------------------------------------------------------------------ helpers
def _replace(gm: fx.GraphModule, last: fx.Node, target, args, kwargs, val) -> fx.Node:
    with gm.graph.inserting_before(last), warnings.catch_warnings():
        # shapes baked into the arguments may be SymInts (dynamic shapes): the standalone compiler
        # evaluates them at every call (compiler._SymRef), so FX's warning about them is moot
        warnings.filterwarnings("ignore", message="Raw Sym")
        f = gm.graph.call_function(target, tuple(args), kwargs)
    f.meta["val"] = val
    last.replace_all_uses_with(f)
    return f


def _is_cast(n: fx.Node) -> bool:
    """``x.to(dtype)`` (``_to_copy`` changing only the dtype): a pointwise cast."""
    return (n.target is aten._to_copy.default and len(n.args) == 1 and set(n.kwargs) == {"dtype"}
            and isinstance(n.kwargs["dtype"], torch.dtype))


def _broadcasts_to(n: Any, shape: tuple) -> bool:
    s = _shape(n)
    if s is None or len(s) > len(shape):
        return False
    return all(a in (1, b) for a, b in zip(s[::-1], shape[::-1]))


def _pointwise_region(y: fx.Node, side: list[fx.Node] | None = None, before: fx.Node | None = None):
    """Maximal set of pointwise nodes computed from ``y`` alone (and scalars), with one sink.
    With ``side`` (a list to fill), region nodes may also read tensors computed before ``before``
    (so not from ``y``) that broadcast to ``y``'s shape - a W8A8 dequantisation's scales; they are
    appended to ``side`` in the order first read.

    Returns (nodes in graph order, sink) or None.
    """
    yshape = _shape(y)
    region: list[fx.Node] = []
    inset = {y}
    order = {n: i for i, n in enumerate(y.graph.nodes)}

    def readable(a: fx.Node) -> bool:
        if a in inset:
            return True
        if side is None or before is None or order[a] >= order[before] or not _broadcasts_to(a, yshape):
            return False
        return True
    frontier = list(y.users)
    changed = True
    while changed:
        changed = False
        for u in list(frontier):
            if u in inset or u.op != "call_function" or (u.target not in L.POINTWISE and not _is_cast(u)):
                continue
            if u.target in (aten.clone.default, aten.lift_fresh_copy.default):
                continue
            if not all(readable(a) for a in u.all_input_nodes) or _shape(u) != yshape:
                continue
            if side is not None:
                side.extend(a for a in u.all_input_nodes if a not in inset and a not in side)
            region.append(u)
            inset.add(u)
            frontier.extend(u.users)
            changed = True
    if not region:
        return None
    if any(u not in inset for u in y.users):
        return None
    sinks = [n for n in region if any(u not in inset for u in n.users) or not n.users]
    if len(sinks) != 1:
        return None
    region.sort(key=order.get)
    # every region node must feed the sink (no dead branches)
    return region, sinks[0]


def _expr_of(region, y, leaf_y, leaves_extra=None):
    """Each region node's expression over ``y`` (``leaf_y``) and the nodes of ``leaves_extra``
    (node -> its leaf, e.g. ``("in", i)``)."""
    exprs = {y: leaf_y, **(leaves_extra or {})}

    def conv(a):
        if isinstance(a, fx.Node):
            return exprs[a]
        return ("c", a)
    for n in region:
        if _is_cast(n):
            exprs[n] = ("to", n.kwargs["dtype"], conv(n.args[0]))
            continue
        fn = L.POINTWISE[n.target]
        args = [conv(a) for a in n.args]
        kw = {k: (v if k in ("approximate", "rounding_mode") else conv(v)) for k, v in n.kwargs.items()
              if k not in L._DROP_KW}
        exprs[n] = fn(*args, **kw)
    return exprs


# ------------------------------------------------------------------------------ patterns
def fuse_attention(gm: fx.GraphModule):
    fired, absorbed = 0, Counter()
    for bmm2 in list(gm.graph.nodes):
        if bmm2.op != "call_function" or bmm2.target is not aten.bmm.default:
            continue
        chain = []
        p = bmm2.args[0]
        while isinstance(p, fx.Node) and p.target in _PASS and len(p.users) == 1:
            chain.append(p)
            p = p.args[0]
        sm = p
        if not (isinstance(sm, fx.Node) and sm.target in (aten._softmax.default, aten._safe_softmax.default)
                and len(sm.users) == 1 and sm.args[1] % len(_shape(sm)) == len(_shape(sm)) - 1):
            continue
        if any(c.target is aten.expand.default and math.prod(_shape(c)) != math.prod(_shape(sm)) for c in chain):
            continue
        x = sm.args[0]
        mask = None
        scale = None
        if x.target is aten.add.Tensor and len(x.users) == 1 and not x.kwargs.get("alpha", 1) != 1:
            a0, a1 = x.args
            if isinstance(a0, fx.Node) and isinstance(a1, fx.Node):
                main, m = (a0, a1) if _shape(a0) == _shape(x) and _is_scores(a0) else (a1, a0)
                if _is_scores(main) and len(main.users) == 1:
                    mask, x_add, x = m, x, main
        if x.target in (aten.mul.Tensor, aten.div.Tensor, aten.mul.Scalar, aten.div.Scalar) and len(x.users) == 1 \
                and not isinstance(x.args[1], fx.Node):
            c = float(x.args[1])
            scale = c if x.target in (aten.mul.Tensor, aten.mul.Scalar) else 1.0 / c
            x_scale, x = x, x.args[0]
        views = []
        while x.target in _VIEWS and len(x.users) == 1:
            views.append(x)
            x = x.args[0]
        bmm1 = x
        if bmm1.target is not aten.bmm.default or len(bmm1.users) != 1:
            continue
        BH, M, N = _shape(bmm1)
        sshape = _shape(sm)
        if sshape[-2:] != (M, N) or math.prod(sshape[:-2]) != BH:
            continue
        v = bmm2.args[1]
        if _shape(bmm2) != (BH, M, _shape(v)[-1]):
            continue
        if mask is not None and _shape(mask) is None:
            continue
        q, kt = bmm1.args
        absorbed.update(_opn(n) for n in [bmm1, bmm2, sm] + views + chain)
        if mask is not None:
            absorbed[_opn(x_add)] += 1
        if scale is not None:
            absorbed[_opn(x_scale)] += 1
        _replace(gm, bmm2, fused_attention, (q, kt, v, mask),
                 {"scale": scale, "safe": sm.target is aten._safe_softmax.default, "bshape": tuple(sshape[:-2])},
                 bmm2.meta["val"])
        gm.graph.erase_node(bmm2)
        for n in reversed(chain):
            pass
        fired += 1
        _dce(gm)
    return fired, absorbed


def _is_scores(n: fx.Node) -> bool:
    while isinstance(n, fx.Node) and (n.target in _VIEWS or n.target in (aten.mul.Tensor, aten.div.Tensor,
                                                                        aten.mul.Scalar, aten.div.Scalar)):
        n = n.args[0]
    return isinstance(n, fx.Node) and n.target is aten.bmm.default


def _dce(gm):
    gm.graph.eliminate_dead_code()


def fuse_matmul_epilogue(gm: fx.GraphModule):
    """linear + bias + activation, and residual add, as matmul epilogues."""
    fired = Counter()
    absorbed = Counter()
    for mm in list(gm.graph.nodes):
        if mm.op != "call_function" or not ((mm.target in _MM and L._float_matmul(mm))
                                            or mm.target is aten._int_mm.default):
            continue
        if mm.target is aten.addmm.default and (mm.kwargs.get("beta", 1) != 1 or mm.kwargs.get("alpha", 1) != 1):
            continue
        y = mm
        mm_shape = _shape(mm)
        view = None
        u = _single_user(mm)
        if u is not None and u.target in _VIEWS:
            view, y = u, u
        if mm.target is aten.addmm.default:
            a, b = mm.args[1], mm.args[2]
            extras = [mm.args[0]]
            acc = ("add", ("acc",), ("in", 0))
        else:
            a, b = mm.args
            extras = []
            acc = ("acc",)
        names = []
        last = y
        epi = acc
        used = [mm] + ([view] if view else [])
        # after _int_mm the epilogue may read the dequantisation's scales (tensors from before the
        # matmul, broadcast to its result); elsewhere the region reads y only (a bias or residual
        # is matched on its own, below)
        side: list[fx.Node] | None = [] if mm.target is aten._int_mm.default else None
        reg = _pointwise_region(y, side, mm)
        if reg is not None:
            region, sink = reg
            base = len(extras)
            extras += side or []
            epi = _expr_of(region, y, acc, {n: ("in", base + i) for i, n in enumerate(side or [])})[sink]
            last = sink
            used += region
            names.append("linear_act")
        r = _single_user(last)
        if r is not None and r.target is aten.add.Tensor and r.kwargs.get("alpha", 1) == 1:
            other = r.args[1] if r.args[0] is last else r.args[0]
            if isinstance(other, fx.Node) and _shape(other) == _shape(last) and other is not last \
                    and _shape(other) is not None:
                extras.append(other)
                epi = ("add", epi, ("in", len(extras) - 1))
                used.append(r)
                last = r
                names.append("residual_add")
        if not names:
            continue
        out_shape = _shape(last) if _shape(last) != mm_shape else None
        _replace(gm, last, fused_matmul, [a, b] + extras,
                 {"epilogue": epi, "mm_shape": mm_shape, "out_shape": out_shape, "name": "_".join(
                     [_opn(mm).split("::")[-1].split(".")[0]] + [{"linear_act": "act", "residual_add": "residual"}[n]
                                                 for n in names])},
                 last.meta["val"])
        for n in names:
            fired[n] += 1
        absorbed.update(_opn(n) for n in used)
        _dce(gm)
    return fired, absorbed


def fuse_rmsnorm(gm: fx.GraphModule):
    fired, absorbed = 0, Counter()
    for rs in list(gm.graph.nodes):
        if rs.op != "call_function" or rs.target is not aten.rsqrt.default:
            continue
        add = rs.args[0]
        if add.target is not aten.add.Tensor or isinstance(add.args[1], fx.Node) or len(add.users) != 1:
            continue
        eps = float(add.args[1])
        mean = add.args[0]
        if mean.target is not aten.mean.dim or len(mean.users) != 1 or list(mean.args[1]) not in ([-1],
                                                                                                  [len(_shape(mean)) - 1]):
            continue
        if not (mean.args[2] if len(mean.args) > 2 else mean.kwargs.get("keepdim", False)):
            continue
        sq = mean.args[0]
        if sq.target is aten.pow.Tensor_Scalar and sq.args[1] == 2:
            x = sq.args[0]
        elif sq.target is aten.mul.Tensor and sq.args[0] is sq.args[1]:
            x = sq.args[0]
        else:
            continue
        if len(sq.users) != 1:
            continue
        mul = _single_user(rs)
        if mul is None or mul.target is not aten.mul.Tensor or set(mul.args) != {x, rs}:
            continue
        used = [sq, mean, add, rs, mul]
        last = mul
        nxt = _single_user(mul)
        if nxt is not None and nxt.target is aten._to_copy.default and set(nxt.kwargs) <= {"dtype"}:
            used.append(nxt)
            last = nxt
            nxt = _single_user(nxt)
        weight = None
        if nxt is not None and nxt.target is aten.mul.Tensor:
            w = nxt.args[0] if nxt.args[1] is last else nxt.args[1]
            if isinstance(w, fx.Node) and _shape(w) == (_shape(x)[-1],):
                weight = w
                used.append(nxt)
                last = nxt
        _replace(gm, last, fused_norm, (x,), {"kind": "rms", "weight": weight, "eps": eps}, last.meta["val"])
        fired += 1
        absorbed.update(_opn(n) for n in used)
        _dce(gm)
    return fired, absorbed


def fuse_add_layernorm(gm: fx.GraphModule):
    fired, absorbed = 0, Counter()
    for ln in list(gm.graph.nodes):
        if ln.op != "call_function" or ln.target is not aten.native_layer_norm.default:
            continue
        add = ln.args[0]
        if not (isinstance(add, fx.Node) and add.target is aten.add.Tensor and add.kwargs.get("alpha", 1) == 1):
            continue
        a, b = add.args
        if not (isinstance(a, fx.Node) and isinstance(b, fx.Node) and _shape(a) == _shape(b) == _shape(add)):
            continue
        if len(ln.args[1]) != 1:
            continue
        gets = list(ln.users)
        if any(g.target is not operator.getitem or g.args[1] != 0 for g in gets):
            continue
        weight, bias, eps = ln.args[2], ln.args[3], ln.args[4]
        val = (ln.meta["val"][0], add.meta["val"])
        with gm.graph.inserting_before(ln):
            f = gm.graph.call_function(fused_norm, (a, b), {"kind": "layer", "weight": weight, "bias": bias,
                                                           "eps": eps, "prologue": ("add", ("x",), ("in", 0)),
                                                           "with_sum": True})
            f.meta["val"] = val
            y = gm.graph.call_function(operator.getitem, (f, 0))
            y.meta["val"] = val[0]
            s = gm.graph.call_function(operator.getitem, (f, 1))
            s.meta["val"] = val[1]
        for g in gets:
            g.replace_all_uses_with(y)
        add.replace_all_uses_with(s)
        fired += 1
        absorbed.update([_opn(add), _opn(ln)])
        _dce(gm)
    return fired, absorbed


def fuse_softmax(gm: fx.GraphModule):
    fired, absorbed = 0, Counter()
    for div in list(gm.graph.nodes):
        if div.op != "call_function" or div.target is not aten.div.Tensor:
            continue
        e, s = div.args
        if not (isinstance(e, fx.Node) and isinstance(s, fx.Node) and e.target is aten.exp.default
                and s.target is aten.sum.dim_IntList and s.args[0] is e):
            continue
        sub = e.args[0]
        if sub.target is not aten.sub.Tensor or not isinstance(sub.args[1], fx.Node):
            continue
        x, mx = sub.args
        if mx.target is not aten.amax.default or mx.args[0] is not x:
            continue
        dims = list(s.args[1])
        if list(mx.args[1]) != dims or len(dims) != 1:
            continue
        if len(e.users) != 2 or len(s.users) != 1 or len(sub.users) != 1 or len(mx.users) != 1:
            continue
        _replace(gm, div, fused_softmax, (x,), {"dim": dims[0]}, div.meta["val"])
        fired += 1
        absorbed.update(_opn(n) for n in (mx, sub, e, s, div))
        _dce(gm)
    return fired, absorbed


_SOFTMAXES = {aten._softmax.default: {}, aten._safe_softmax.default: {"safe": True},
              aten._log_softmax.default: {"log": True}}


def fuse_softmax_prologue(gm: fx.GraphModule):
    """``pointwise chain -> softmax`` (softmin's ``neg``, a mask's ``where``, a scale): the chain
    becomes the softmax program's prologue, so its value is never stored. A stored fp16
    intermediate is rounded to DL16 (9 mantissa bits): softmin(x) = softmax(-x) then differs from
    the CPU by several fp16 ulps, as the exponent amplifies the rounding of -x."""
    fired, absorbed = 0, Counter()
    for sm in list(gm.graph.nodes):
        if sm.op != "call_function":
            continue
        if sm.target in _SOFTMAXES:
            flags = dict(_SOFTMAXES[sm.target])
            dim = sm.args[1]
            src = sm.args[0]
        elif sm.target is fused_softmax and sm.kwargs.get("prologue", ("x",)) == ("x",) and len(sm.args) == 1:
            flags = {k: sm.kwargs[k] for k in ("safe", "log") if sm.kwargs.get(k)}
            dim = sm.kwargs.get("dim", -1)
            src = sm.args[0]
        else:
            continue
        shape = _shape(sm)
        sv = src.meta.get("val") if isinstance(src, fx.Node) else None
        if not shape or not isinstance(sv, torch.Tensor) or not sv.is_floating_point():
            continue
        # grow the region backwards: a pointwise node of the softmax's shape joins when all its
        # users are already in (or are the softmax)
        region: set = set()
        cand = [src]
        changed = True
        while changed:
            changed = False
            for n in list(cand):
                if n in region or not isinstance(n, fx.Node) or n.op != "call_function" \
                        or n.target not in L.POINTWISE or n.target in _NO_PROLOGUE or _shape(n) != shape:
                    continue
                if not all(u in region or u is sm for u in n.users):
                    continue
                region.add(n)
                cand.extend(n.all_input_nodes)
                changed = True
        if not region:
            continue
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        nodes = sorted(region, key=order.get)
        ext = []
        for n in nodes:
            for a in n.all_input_nodes:
                if a not in region and a not in ext:
                    ext.append(a)
        full = [a for a in ext if _shape(a) == shape]
        main = next((a for a in full if a.meta["val"].is_floating_point()), full[0] if full else None)
        if main is None:
            continue
        extras = [a for a in ext if a is not main]
        ok = True
        for a in extras:
            sh = _shape(a)
            try:
                ok = ok and sh is not None and tuple(torch.broadcast_shapes(sh, shape)) == shape
            except RuntimeError:
                ok = False
        if not ok:
            continue
        exprs = {main: ("x",)}
        for i, a in enumerate(extras):
            exprs[a] = ("in", i)

        def conv(a):
            return exprs[a] if isinstance(a, fx.Node) else ("c", a)
        for n in nodes:
            kw = {k: (v if k in L._STATIC_KW else conv(v)) for k, v in n.kwargs.items() if k not in L._DROP_KW}
            exprs[n] = L.POINTWISE[n.target](*[conv(a) for a in n.args], **kw)
        _replace(gm, sm, fused_softmax, [main] + extras,
                 {"dim": dim, "prologue": exprs[src], **flags}, sm.meta["val"])
        fired += 1
        absorbed.update(_opn(n) for n in nodes)
        if sm.target in _SOFTMAXES:
            absorbed[_opn(sm)] += 1
        _dce(gm)
    return fired, absorbed


# identity-like entries (nothing to compute)
_NO_PROLOGUE = {aten.clone.default, aten.lift_fresh_copy.default, aten.alias_copy.default}


PATTERNS: list = [
    ("attention", fuse_attention),
    ("softmax", fuse_softmax),
    ("softmax_prologue", fuse_softmax_prologue),
    ("rmsnorm", fuse_rmsnorm),
    ("add_layernorm", fuse_add_layernorm),
    ("matmul_epilogue", fuse_matmul_epilogue),   # reports linear_act / residual_add
]
