"""The eager device kernels: which ATen ops have one, how each is built, cached and launched.

An entry of :data:`TABLE` names a *functional* ATen op and its kind. Its ``out=`` and in-place
variants (``add.out``, ``add_.Tensor``) run the same kernel into the given tensor. A kernel is a
standalone-compiler lowering (``make(node) -> run(ctx, *args)``, see
``vspyre.standalone.lowerings``): the table's own lowerings, or the symbolic ones below for the
kinds whose programs are built per rank. ``run`` gets an :class:`EagerCtx`, whose ``pointwise``
builds rank-generic programs and whose ``launch`` publishes eager kernels.
"""

from __future__ import annotations

import collections
import contextlib
import operator
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from .. import runtime
from ..device import fallback as dev_fallback
from ..device.fallback import iter_tensors as _tensors
from ..ir.indexing import sym
from ..standalone import kernels as K
from ..standalone import lowerings as L
from ..standalone.compiler import Ctx
from ..trace import op_name

aten = torch.ops.aten
SOURCE = "eager"


class NoTileForm(Exception):
    """Raised by a kernel (before it launches anything) when this call has no tile form; the call
    then runs as a counted host fallback."""


@dataclass(frozen=True)
class EagerOp:
    name: str            # the functional op, as the dispatcher spells it
    kind: str            # pointwise, reduction, matmul, ...
    per: str             # "rank": sizes symbolic, one build serves every shape; "shape": built per shape
    variants: tuple[str, ...] = ()      # the out= / in-place overloads that run the same kernel


TABLE: dict[str, EagerOp] = {}

_enabled = os.environ.get("VSPYRE_EAGER_KERNELS", "1") not in ("0", "")


def is_enabled() -> bool:
    return _enabled


@contextlib.contextmanager
def enabled(on: bool = True) -> Iterator[None]:
    """Turn eager device kernels on or off inside a block (off: every op is a host fallback)."""
    global _enabled
    prev, _enabled = _enabled, on
    try:
        yield
    finally:
        _enabled = prev


# ------------------------------------------------------------------------------------- stats
class _Stats:
    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()     # launches of eager kernels, per op
        self.builds: collections.Counter[str] = collections.Counter()    # programs built, per op
        self.reuses: collections.Counter[str] = collections.Counter()    # a built program run on a new shape
        self.declined: collections.Counter[str] = collections.Counter()  # calls with no tile form (host)


_stats = _Stats()
_programs: dict[Any, Any] = {}
_shapes: dict[Any, set] = {}
_runs: dict[Any, Callable] = {}
_metas: dict[Any, Any] = {}


def stats() -> dict[str, Any]:
    """``calls``/``builds``/``reuses``/``declined`` per op, and ``programs`` (built, cached)."""
    return {"calls": dict(_stats.calls), "builds": dict(_stats.builds), "reuses": dict(_stats.reuses),
            "declined": dict(_stats.declined), "programs": len(_programs)}


def reset_stats(drop_programs: bool = False) -> None:
    """Zero the counters; with ``drop_programs`` also forget every built program (a cold start)."""
    global _stats
    _stats = _Stats()
    if drop_programs:
        _programs.clear()
        _shapes.clear()
        _runs.clear()
        _metas.clear()


def _program(opn: str, key: Any, build: Callable[[], Any]) -> Any:
    p = _programs.get(key)
    if p is None:
        p = _programs[key] = build()
        _stats.builds[opn] += 1
    return p


def _launch(opn: str, prog: Any, tensors: tuple) -> None:
    seen = _shapes.get(id(prog))
    if seen is None:
        seen = _shapes[id(prog)] = set()
    sk = tuple(t.shape for t in tensors)
    if sk not in seen:
        if seen:
            _stats.reuses[opn] += 1
        if len(seen) < 256:
            seen.add(sk)
    runtime.launch(prog, *tensors, source=SOURCE)


# ------------------------------------------------------------------------------------- symbols
def _S(r: int) -> tuple:
    return tuple(sym(f"s{i}") for i in range(r))


def _st(prefix: str, r: int) -> tuple:
    """Stride symbols of a buffer (named apart from the programs' dim names x0.., r0..)."""
    return tuple(sym(f"st_{prefix}{i}") for i in range(r))


def _operand(t: torch.Tensor, shape: tuple) -> torch.Tensor:
    """``t`` broadcast to ``shape`` (a view); a host 0-d tensor (a wrapped Python number) in the
    card's compute dtype (the launch reads host tensors like device memory)."""
    if t.device.type == "cpu":
        t = t.to(K._KIND_DTYPE[K._kind(t.dtype)])      # the card's compute dtype (fp32, int64, bool)
    return t.expand(shape) if tuple(t.shape) != shape else t


class EagerCtx(Ctx):
    """What a lowering's ``run`` gets in eager mode: results go into ``target`` (an ``out=`` or
    in-place tensor) when it fits, pointwise programs are rank-generic, launches are eager kernels."""

    def __init__(self, device: torch.device, opn: str, target: torch.Tensor | None = None) -> None:
        super().__init__(device)
        self.opn = opn
        self.target = target

    def alloc(self, shape: tuple, dtype: torch.dtype, fresh: bool = False,
              strides: tuple | None = None) -> torch.Tensor:
        t = self.target
        if t is not None and not fresh and t.dtype == dtype and tuple(t.shape) == tuple(int(s) for s in shape):
            self.target = None
            return t
        return super().alloc(shape, dtype, fresh, strides)

    def memo(self, key: Any, build: Callable) -> Any:
        return _program(self.opn, ("shape",) + tuple(key), build)

    def spec(self, t: torch.Tensor, name: str, sizes: tuple | None = None) -> tuple:
        if sizes is None:
            sizes = tuple(sym(f"s{name}{i}") for i in range(t.dim()))
        return (t.dtype, tuple(sizes), _st(name, t.dim()))

    def stride_spec(self, t: torch.Tensor, name: str) -> tuple:
        return _st(name, t.dim())

    def operand(self, t: torch.Tensor, shape: tuple) -> torch.Tensor:
        return _operand(t, tuple(shape))

    def key(self, t: torch.Tensor) -> tuple:
        return (t.dtype, t.dim())

    def launch(self, prog: Any, *tensors: torch.Tensor) -> None:
        _launch(self.opn, prog, tensors)

    def pointwise(self, name: str, shape: tuple, odt: torch.dtype, tensors: list, expr: Any,
                  out: torch.Tensor | None = None) -> torch.Tensor:
        shape = tuple(int(s) for s in shape)
        if out is None:
            st = self.strides if self.strides is not None and len(self.strides) == len(shape) else None
            out = self.alloc(shape, odt, strides=st)
        ins = [_operand(t, shape) for t in tensors]
        r = len(shape)
        key = ("pw", name, r, odt, tuple(t.dtype for t in ins), expr)
        prog = _program(self.opn, key, lambda: K.pointwise(
            name, (odt, _S(r), _st("o", r)), tuple((t.dtype, _S(r), _st(f"i{j}_", r)) for j, t in enumerate(ins)),
            expr))
        self.launch(prog, *ins, out)
        return out

    def host_fallback(self, op: Any, *args: Any, **kwargs: Any) -> Any:
        raise NoTileForm(op_name(op))


# ------------------------------------------------------------------------------------- the table
# ops whose tensor work is native in the device layer (copies, fills, allocation, dtype casts
# through copy_) or which move data between devices: no eager kernel
_NATIVE = {aten.copy.default, aten.fill.Scalar, aten.fill.Tensor, aten.empty.memory_format, aten._to_copy.default,
           aten.zeros_like.default, aten.ones_like.default, aten.full_like.default, aten.empty_like.default,
           aten.full.default, aten.zeros.default, aten.ones.default, aten.scalar_tensor.default,
           aten.clone.default, aten.lift_fresh_copy.default, aten.alias_copy.default, aten.embedding.default,
           aten.arange.default, aten.arange.start}
_PER_SHAPE = {aten.convolution.default, aten.arange.start_step,
              aten._scaled_dot_product_fused_attention_overrideable.default,
              torch.ops.spyre.paged_attention.default}      # defined by vspyre.runtime.paged (standalone's table)
# device-layer Python kernels this layer supplies the device kernel of (fallback.set_device_kernel)
_HOOKED = {aten.native_layer_norm.default: aten.native_layer_norm.default,
           aten.convolution_overrideable.default: aten.convolution.default,
           aten._scaled_dot_product_fused_attention_overrideable.default:
               aten._scaled_dot_product_fused_attention_overrideable.default}


def _composite(op: torch._ops.OpOverload) -> bool:
    """A CompositeImplicitAutograd op never reaches a backend eagerly (it decomposes above it), and
    a backend kernel for it would stop traces from decomposing it (scaled_dot_product_attention)."""
    from ..compat import dispatch_has_kernel_for_dispatch_key as has_kernel
    return has_kernel(op.name(), "CompositeImplicitAutograd")


def _entries() -> dict[Any, tuple[str, Callable, Callable | None]]:
    """functional op -> (kind, make, applies)."""
    out: dict[Any, tuple[str, Callable, Callable | None]] = {}
    for op, lw in L.TABLE.items():
        if lw.kind != "kernel" or not isinstance(op, torch._ops.OpOverload) or op in _NATIVE or op in _DEDICATED \
                or _composite(op):
            continue
        kind = "pointwise" if lw.doc == "pointwise" else {
            "copy (broadcast, cast)": "copy", "iota": "iota", "triangular mask": "pointwise"}.get(lw.doc, lw.doc)
        out[op] = (kind, lw.make, lw.applies)
    return out


_OPTIONS = ("dtype", "layout", "device", "pin_memory")     # a factory's out= variant takes them from out


def _variants(op: torch._ops.OpOverload) -> list[tuple[torch._ops.OpOverload, str]]:
    """The out= and in-place overloads of ``op`` whose schema is ``op``'s plus the written tensor."""
    packet = op.overloadpacket
    base = op._schema.arguments
    names = [a.name for a in base]
    found = []
    ov = op._overloadname
    for cand in (f"{ov}_out", "out", "IntList_out", "all_out", "int_out", "start_out"):
        o = getattr(packet, cand, None)
        if o is None or o in [f for f, _ in found]:
            continue
        args = o._schema.arguments
        outs = [a for a in args if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]
        if len(outs) == 1 and [a.name for a in args if a is not outs[0]] == [n for n in names if n not in _OPTIONS]:
            found.append((o, "out"))
            break
    inplace = getattr(getattr(aten, packet.__name__ + "_", None), ov, None)
    if inplace is not None and [a.name for a in inplace._schema.arguments] == names:
        found.append((inplace, "inplace"))
    return found


# ------------------------------------------------------------------------------------- calling
class _Node:
    """The part of an FX node a lowering's ``make`` reads: target, meta value, args' meta values,
    and whether the second result is used (attention's log-sum-exp)."""

    class _Use:
        target = operator.getitem

        def __init__(self, node: Any, i: int) -> None:
            self.args = (node, i)

    @staticmethod
    def _wrap(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return _Node(None, a)
        if isinstance(a, (list, tuple)):
            return type(a)(_Node._wrap(v) for v in a)
        return a

    def __init__(self, target: Any, val: Any, args: tuple = (), kwargs: dict | None = None,
                 used: tuple[int, ...] = ()) -> None:
        self.target, self.meta = target, {"val": val}
        self.args = tuple(_Node._wrap(a) for a in args)
        self.kwargs = kwargs or {}
        self.users = {_Node._Use(self, i): None for i in used}


def _sig(x: Any, full: bool) -> Any:
    if isinstance(x, torch.Tensor):
        return ((x.dtype, tuple(x.shape), tuple(x.stride()), x.device.type) if full
                else (x.dtype, x.dim(), x.device.type))
    if isinstance(x, (list, tuple)):
        return tuple(_sig(v, full) for v in x)
    if isinstance(x, float) and not full:
        return float
    if isinstance(x, (bool, int, float)):      # 0, 0.0 and False are equal keys: keep their types apart
        return (type(x), x)
    return x if x is None or isinstance(x, (str, torch.dtype)) else type(x)


def _meta(t: Any) -> Any:
    if isinstance(t, torch.Tensor):
        return dev_fallback.meta_like(t)
    if isinstance(t, (list, tuple)):
        return type(t)(_meta(v) for v in t)
    return t


def _eligible(args: tuple, kwargs: dict, target: torch.Tensor | None, skip_empty: bool = False) -> torch.device | None:
    """The card all tensor operands are on (0-dim CPU scalars aside), else None. ``skip_empty``:
    empty operands are ignored if some operand is not empty (``cat`` drops them: the legacy
    ``torch.empty(0)`` a KV cache starts from is concatenated with the first keys)."""
    dev = None
    ts = list(_tensors(list(args) + list(kwargs.values()) + [target]))
    if skip_empty and any(t.numel() for t in ts if t is not target):
        ts = [t for t in ts if t.numel() or t is target]
    for t in ts:
        if t.numel() == 0 and t is not target:   # empty operands (an empty contraction sums to zeros): the host's
            return None                          # edge cases; an empty out= is resized
        if t.device.type == "spyre":
            if dev is not None and t.device != dev:
                return None
            dev = t.device
        elif not (t.device.type == "cpu" and t.dim() == 0):
            return None
    return dev


def _overlaps(target: torch.Tensor, args: tuple, kwargs: dict) -> bool:
    """``target`` shares memory with an input it is not exactly (an exact alias is safe for the
    element-wise read-then-write of a pointwise kernel, nothing else)."""
    ptr = target.untyped_storage().data_ptr()
    for t in _tensors(list(args) + list(kwargs.values())):
        if t is target or t.device.type != "spyre" or t.untyped_storage().data_ptr() != ptr:
            continue
        if (t.shape, t.stride(), t.storage_offset()) != (target.shape, target.stride(), target.storage_offset()):
            return True
    return False


def _call(fop: Any, opn: str, kind: str, make: Callable, applies: Callable | None, per_shape: bool,
          args: tuple, kwargs: dict, target: torch.Tensor | None, form: str) -> Any:
    dev = _eligible(args, kwargs, target, skip_empty=fop is aten.cat.default)
    if dev is None:
        raise NoTileForm("operands not all on one card, or empty")
    # a factory's out= variant (arange(..., out=t)) takes its dtype from the target, so the target's
    # dtype is part of both keys: arange(0, 12) into int64 and into float32 are different kernels
    factory = target.dtype if target is not None and not any(True for _ in _tensors(args)) else None
    mkey = (fop, factory, _sig(args, True), _sig(tuple(sorted(kwargs.items())), True) if kwargs else ())
    hit = _metas.get(mkey)
    val, run = hit if hit is not None else (None, None)
    if val is None:
        mkw = {k: _meta(v) for k, v in kwargs.items()}
        if factory is not None:
            mkw.update(device="meta", dtype=factory)
        try:
            val = fop(*_meta(args), **mkw)
        except RuntimeError as e:
            low = L.TABLE.get(fop)
            if low is None or low.check is None:
                raise
            low.check(opn, *args, **kwargs)        # the op's own check: names the op, dtypes and shapes
            raise type(e)(f"{opn}: {e}") from e
    res_val = val[0] if isinstance(val, (tuple, list)) else val
    if target is not None:
        if form == "inplace" and tuple(res_val.shape) != tuple(target.shape):
            raise RuntimeError(f"{op_name(fop)}: output with shape {list(target.shape)} doesn't match the broadcast "
                               f"shape {list(res_val.shape)}")
        if not torch.can_cast(res_val.dtype, target.dtype):
            raise RuntimeError(f"{op_name(fop)}: result type {res_val.dtype} can't be cast to the desired output "
                               f"type {target.dtype}")
        if form == "out" and tuple(target.shape) != tuple(res_val.shape):
            target.resize_(res_val.shape)
    if run is None:
        rkey = (fop, factory, _sig(args, per_shape), _sig(tuple(sorted(kwargs.items())), per_shape))
        run = _runs.get(rkey)
    if run is None:
        used = (0, 1, 2) if fop is aten.native_layer_norm.default else (
            (0, 1) if torch.is_grad_enabled() and any(t.requires_grad for t in _tensors(args)) else (0,))
        node = _Node(fop, val, _meta(args), {k: _meta(v) for k, v in kwargs.items()}, used)   # cached: no
        # device tensors (it would keep them alive)
        if applies is not None and not applies(node):
            raise NoTileForm("no tile form for these operands")
        run = _runs[rkey] = make(node)
    if hit is None:                       # this call's shapes: its meta value and kernel, looked up once
        if len(_metas) > 8192:
            _metas.clear()
        _metas[mkey] = (val, run)
    direct = target if target is not None and not _overlaps(target, args, kwargs) else None
    ctx = EagerCtx(dev, opn, direct)
    if isinstance(res_val, torch.Tensor) and not isinstance(val, (tuple, list)):
        ctx.strides = tuple(res_val.stride())
    res = run(ctx, *args, **kwargs)
    if fop is aten._scaled_dot_product_fused_attention_overrideable.default:
        res = _sdpa_results(res, val, dev)
    if target is None:
        return res
    first = res[0] if isinstance(res, (tuple, list)) else res
    if first is not target:            # computed elsewhere (overlap, or another dtype): copy in, casting
        ctx.target = None
        ctx.pointwise("copy", tuple(target.shape), target.dtype, [first], ("to", target.dtype, ("in", 0)),
                      out=target)
    return target


def _sdpa_results(res: tuple, val: tuple, dev: torch.device) -> tuple:
    """The lowering leaves unused results ``None``; the op returns tensors (and the two lengths)."""
    out, lse, *_ = res
    q_len, k_len = res[4], res[5]
    empty = torch.empty(0, dtype=out.dtype, device=dev)
    if lse is None:
        lse = torch.empty(0, dtype=torch.float32, device=dev)     # not needed without a backward
    seed = torch.zeros((), dtype=torch.int64, device=dev)
    return out, lse, empty, empty, q_len, k_len, seed, seed.clone(), empty


def _kernel(fop: Any, called: Any, kind: str, make: Callable, applies: Callable | None, form: str,
            hooked: bool = False) -> Callable:
    opn = op_name(called)
    per_shape = fop in _PER_SHAPE

    # Dynamo never traces a device kernel: it is called by the dispatcher, also from the eager
    # regions of a partly compiled model, and runs generated code (the executor's steps) that
    # Dynamo's per-frame skip rules cannot name
    @torch.compiler.disable
    def kernel(*args: Any, **kwargs: Any) -> Any:
        # inside a compiled graph an op the compiler left as a fallback stays a counted host
        # fallback, as the compiler's report says
        if _enabled and dev_fallback.current_context() == "eager":
            target = None
            fargs, fkw = args, kwargs
            if form == "out":
                fkw = dict(kwargs)
                target = fkw.pop("out")
            elif form == "inplace":
                target = args[0]
            try:
                out = _call(fop, opn, kind, make, applies, per_shape, fargs, fkw, target, form)
                _stats.calls[opn] += 1
                return out
            except (NoTileForm, NotImplementedError):   # raised before anything was launched
                _stats.declined[opn] += 1
        if hooked:
            return NotImplemented
        return dev_fallback.host_fallback(called, *args, **kwargs)
    return kernel


# ------------------------------------------------------------------------------------- grouped matmul
def _grouped_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch._grouped_mm`` on the card (the experts of mixture-of-experts layers): the standalone
    lowering's ``grouped_mm_run`` (offsets read back, a counted sync; one systolic matmul per
    non-empty group). Its own kernel, not the table's generic call: ATen's meta function takes
    bf16 only, the card (and the CPU) all its float dtypes. Forms other than 2-D x 3-D with
    offsets run as a counted host fallback."""
    op = aten._grouped_mm.default
    opn = op_name(op)
    ts = [t for t in (x, w, offs, bias) if t is not None]
    dev = x.device
    if (_enabled and dev_fallback.current_context() == "eager" and offs is not None and bias is None
            and x.dim() == 2 and w.dim() == 3 and all(t.device == dev for t in ts) and x.numel() and w.numel()):
        from ..ir import library
        library.grouped_mm_check(opn, x, w, offs, bias, out_dtype)
        out = L.grouped_mm_run(EagerCtx(dev, opn), opn, x, w, offs, out_dtype)
        _stats.calls[opn] += 1
        return out
    if _enabled:
        _stats.declined[opn] += 1
    return dev_fallback.host_fallback(op, x, w, offs, bias, out_dtype)


def _nonzero(x: torch.Tensor) -> torch.Tensor:
    """``nonzero`` on the card (the standalone lowerings' ``nonzero_run``): two programs and the
    count read back between them (a counted sync, as CUDA's ``nonzero`` syncs). Its own kernel:
    the result's size is data, which the table's generic call (a meta function first) cannot
    give. Past ``SCAN_MAX`` entries a counted host fallback."""
    op = aten.nonzero.default
    opn = op_name(op)
    from ..runtime.memory import estimate_only, has_values
    if estimate_only() and not has_values(x):
        # no values, so no size to read back and no assumption that fits every use: the host
        # fallback raises EstimateOnlyError naming the op (routing assumptions cover the experts'
        # grouped matmul, not arbitrary masks)
        return dev_fallback.host_fallback(op, x)
    if _enabled and dev_fallback.current_context() == "eager" and x.device.type == "spyre":
        out = L.nonzero_run(EagerCtx(x.device, opn), x)
        if out is not None:
            _stats.calls[opn] += 1
            return out
    if _enabled:
        _stats.declined[opn] += 1
    return dev_fallback.host_fallback(op, x)


_DEDICATED = {aten._grouped_mm.default: _grouped_mm, aten.nonzero.default: _nonzero}


_libs: dict[str, torch.library.Library] | None = None


def _impl_name(op: torch._ops.OpOverload) -> str:
    return op._schema.name.split("::")[-1] + (f".{op._overloadname}" if op._overloadname != "default" else "")


def register() -> None:
    """Install the eager device kernels (idempotent)."""
    global _libs
    if _libs is not None:
        return
    libs: dict[str, torch.library.Library] = {}

    def lib(op: torch._ops.OpOverload) -> torch.library.Library:
        """The IMPL library of the op's namespace (aten; spyre for the card's own ops)."""
        ns = op._schema.name.split("::")[0]
        if ns not in libs:
            libs[ns] = torch.library.Library(ns, "IMPL")  # noqa: TOR901 - kernels for the card's dispatch key
        return libs[ns]

    hooked_by = {v: k for k, v in _HOOKED.items()}
    for fop, fn in _DEDICATED.items():
        kind = L.TABLE[fop].doc if fop in L.TABLE else "nonzero: ranks, count read back, coordinates"
        TABLE[op_name(fop)] = EagerOp(op_name(fop), kind, "shape")
        lib(fop).impl(_impl_name(fop), torch.compiler.disable(fn), "PrivateUse1")
    for fop, (kind, make, applies) in _entries().items():
        variants = _variants(fop)
        per = "shape" if fop in _PER_SHAPE else "rank"
        TABLE[op_name(fop)] = EagerOp(op_name(fop), kind, per, tuple(op_name(v) for v, _ in variants))
        if fop in hooked_by:
            called = hooked_by[fop]
            dev_fallback.set_device_kernel(op_name(called), _kernel(fop, called, kind, make, applies, "functional",
                                                                    hooked=True))
            continue
        lib(fop).impl(_impl_name(fop), _kernel(fop, fop, kind, make, applies, "functional"), "PrivateUse1")
        for v, form in variants:
            if _composite(v):
                continue
            lib(v).impl(_impl_name(v), _kernel(fop, v, kind, make, applies, form), "PrivateUse1")
    _libs = libs
