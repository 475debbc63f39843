"""The matmul family on the systolic array, and a few lowerings that keep work on the card.

Inductor already knows how to lower ``mm``/``bmm``/``addmm``/``baddbmm`` as a *native matmul*:
``ops.dot`` followed by ``reduction("dot")``, with pointwise epilogues fused into the same kernel
(bias, activation, residual, scaling). Upstream enables that form only for Triton on GPUs; this
module enables it for ``spyre`` tensors, and the card's kernel turns the pair into one systolic
``Matmul``.

For ``spyre`` tensors only (every other device keeps Inductor's own lowering) it also registers:

* ``aten.convolution`` (1-D and 2-D, not transposed, any ``groups``) as an *implicit GEMM* in the same
  native-matmul form: a ``reduction("dot")`` with ranges ``[N*G, OC/G, OH*OW]`` (the kernel's
  ``z``, ``y``, ``x``) over one reduction range ``r = (ic, kh, kw)`` of size ``C/G*KH*KW``. Operand
  ``a`` is the input patch ``x[n, g*C/G + ic, oh*s-p+kh*d, ow*s-p+kw*d]`` (masked to 0 in the
  padding), varying along ``(z, x, r)``; operand ``b`` is ``w[g*OC/G + oc, ic, kh, kw]``, varying
  along ``(y, r)`` (and ``z`` when grouped). ``z`` is then a batch dim, ``x`` is M, ``y`` is N, and
  the output ``[N*G, OC/G, OH*OW]`` is the contiguous NCHW output, viewed as ``[N, OC, OH, OW]``.
  The bias is a pointwise add Inductor fuses as the Matmul's epilogue. Inductor's channels-last
  layout optimisation is turned off for graphs whose convolutions run on the card.
* ``aten.cumsum`` / ``aten.cumprod`` along a dim of size <= ``SCAN_MAX`` as a masked reduction:
  ``out[..., i] = sum_j where(j <= i, x[..., j], 0)`` (product with 1 for ``cumprod``); the card
  has no scan, so without this they run on the host.
* host fallbacks for what a tile program cannot express (special functions, random numbers,
  accumulating scatter stores): those aten ops become Inductor fallback kernels, i.e. counted
  host fallbacks, instead of kernels that would fail to compile (see ``_register_host_fallbacks``).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import sympy
import torch

from .. import compat

_MATMUL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.uint8)
_CONV_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SCAN_MAX = 4096  # longest dim cumsum/cumprod lower as a masked reduction (quadratic work)


def _on_spyre(x: Any) -> bool:
    try:
        d = x.get_device()
    except Exception:  # noqa: BLE001 - not an IR node
        return False
    return d is not None and d.type == "spyre"


def _static_ints(values: Any) -> list[int] | None:
    out = []
    for v in values:
        try:
            out.append(int(v))
        except TypeError:
            return None
    return out


# -- convolution ---------------------------------------------------------------------------------
def _conv_as_gemm(x: Any, weight: Any, bias: Any, stride: Any, padding: Any, dilation: Any,
                  transposed: bool, output_padding: Any, groups: int) -> Any | None:
    """conv1d/conv2d as a native matmul, or None (the caller then uses Inductor's own lowering)."""
    from ..compat import inductor_ir as ir, inductor_lowering, ops
    L, range_mask = inductor_lowering.lowerings, inductor_lowering.range_mask
    from torch.utils._sympy.functions import FloorDiv, ModularIndexing

    aten = torch.ops.aten
    if transposed or not (_on_spyre(x) and _on_spyre(weight)) or (bias is not None and not _on_spyre(bias)):
        return None
    if x.get_dtype() not in _CONV_DTYPES or weight.get_dtype() != x.get_dtype():
        return None
    nd = len(x.get_size()) - 2
    if nd not in (1, 2) or len(weight.get_size()) != nd + 2:
        return None  # conv3d and unbatched inputs: upstream
    sizes = _static_ints(list(x.get_size()) + list(weight.get_size()))
    params = _static_ints(list(stride) + list(padding) + list(dilation) + [groups])
    if sizes is None or params is None or len(params) != 3 * nd + 1:
        return None
    if nd == 1:     # a conv1d is a conv2d with one row: h = kh = 1
        n, c, w, oc, cg, kw = sizes
        h, kh = 1, 1
        (sw, pw, dw, g), (sh, ph, dh) = params, (1, 0, 1)
    else:
        n, c, h, w, oc, cg, kh, kw = sizes
        sh, sw, ph, pw, dh, dw, g = params
    if g < 1 or c != cg * g or oc % g:
        return None
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if min(n, oh, ow, oc) <= 0 or cg * kh * kw <= 1:
        return None  # empty, or a 1-element reduction (Inductor would make it pointwise)
    ocg = oc // g
    rk = cg * kh * kw
    dtype = x.get_dtype()
    x_load = x.make_loader()
    w_load = weight.make_loader()

    def inner_fn(idx: Any, ridx: Any) -> Any:
        z, yo, xo = idx
        (r,) = ridx
        grp = ModularIndexing(z, 1, g) if g > 1 else sympy.Integer(0)
        bn = FloorDiv(z, g) if g > 1 else z
        ic = FloorDiv(r, kh * kw)
        ki = ModularIndexing(r, kw, kh)
        kj = ModularIndexing(r, 1, kw)
        hi = FloorDiv(xo, ow) * sh - ph + ki * dh
        wi = ModularIndexing(xo, 1, ow) * sw - pw + kj * dw
        cin = grp * cg + ic

        def patch() -> Any:
            return x_load([bn, cin, wi] if nd == 1 else [bn, cin, hi, wi])

        if ph or pw:
            masks = []
            if ph:
                masks.append(range_mask(hi, h, 0))
            if pw:
                masks.append(range_mask(wi, w, 0))
            a = ops.masked(functools.reduce(ops.and_, masks), patch, 0.0)
        else:
            a = patch()
        b = w_load([grp * ocg + yo, ic, kj] if nd == 1 else [grp * ocg + yo, ic, ki, kj])
        return ops.dot(a, b)

    out = ir.Reduction.create(device=x.get_device(), dst_dtype=dtype, src_dtype=dtype, inner_fn=inner_fn,
                              ranges=[n * g, ocg, oh * ow], reduction_ranges=[rk], reduction_type="dot")
    out.realize()
    out = L[aten.view.default](out, [n, oc, ow] if nd == 1 else [n, oc, oh, ow])
    if bias is not None:
        out = L[aten.add.Tensor](out, L[aten.view.default](bias, [oc, 1] if nd == 1 else [oc, 1, 1]))
    return out


def _register_convolution() -> None:
    lowerings = compat.get("inductor_lowering").lowerings

    aten = torch.ops.aten
    for key in (aten.convolution, aten.convolution.default):
        upstream = lowerings.get(key)
        if upstream is None or getattr(upstream, "_vspyre", False):
            continue

        def convolution(x: Any, weight: Any, bias: Any, stride: Any, padding: Any, dilation: Any,
                        transposed: Any, output_padding: Any, groups: Any, _upstream: Callable = upstream) -> Any:
            out = _conv_as_gemm(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
            if out is None:
                return _upstream(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
            return out

        convolution._vspyre = True  # type: ignore[attr-defined]
        lowerings[key] = convolution

    # Channels-last layout optimisation would put copies around every conv of the card.
    from ..compat import GraphLowering

    upstream_opt = GraphLowering.__dict__["decide_layout_opt"].__func__
    if getattr(upstream_opt, "_vspyre", False):
        return

    def decide_layout_opt(gm: Any, *, is_inference: bool) -> bool:
        for node in gm.graph.nodes:
            if node.target is aten.convolution.default:
                val = getattr(node.args[0], "meta", {}).get("val")
                if isinstance(val, torch.Tensor) and val.device.type == "spyre":
                    return False
        return upstream_opt(gm, is_inference=is_inference)

    decide_layout_opt._vspyre = True  # type: ignore[attr-defined]
    GraphLowering.decide_layout_opt = staticmethod(decide_layout_opt)


# -- cumsum / cumprod ----------------------------------------------------------------------------
def _scan_as_reduction(x: Any, axis: Any, dtype: Any, kind: str) -> Any | None:
    """cumsum/cumprod along ``axis`` as a masked sum/prod reduction, or None (upstream)."""
    from ..compat import inductor_ir as ir, inductor_lowering, ops
    to_dtype = inductor_lowering.to_dtype

    if not _on_spyre(x):
        return None
    size = list(x.get_size())
    if not size:
        return None
    if dtype is None and (not x.get_dtype().is_floating_point and not x.get_dtype().is_complex):
        dtype = torch.int64
    if dtype is not None:
        x = to_dtype(x, dtype)
    dt = x.get_dtype()
    if dt.is_complex or dt == torch.float64:
        return None
    axis = int(axis)
    if axis < 0:
        axis += len(size)
    if not 0 <= axis < len(size):
        return None
    try:
        length = int(size[axis])
    except TypeError:
        return None
    if length > SCAN_MAX or length <= 1:
        return None
    loader = x.make_loader()
    identity = 0 if kind == "sum" else 1

    def inner_fn(idx: Any, ridx: Any) -> Any:
        (j,) = ridx
        src = list(idx)
        i = src[axis]
        src[axis] = j
        keep = ops.le(ops.index_expr(j, torch.int64), ops.index_expr(i, torch.int64))
        return ops.where(keep, loader(src), ops.constant(identity, dt))

    out = ir.Reduction.create(device=x.get_device(), dst_dtype=dt, src_dtype=dt, inner_fn=inner_fn,
                              ranges=size, reduction_ranges=[length], reduction_type=kind)
    out.realize()
    return out


def _register_scans() -> None:
    lowerings = compat.get("inductor_lowering").lowerings

    aten = torch.ops.aten
    for packet, kind in ((aten.cumsum, "sum"), (aten.cumprod, "prod")):
        for key in (packet, packet.default):
            upstream = lowerings.get(key)
            if upstream is None or getattr(upstream, "_vspyre", False):
                continue

            def scan(x: Any, axis: Any = None, dtype: Any = None, _upstream: Callable = upstream,
                     _kind: str = kind) -> Any:
                out = _scan_as_reduction(x, axis, dtype, _kind) if axis is not None else None
                if out is None:
                    return _upstream(x, axis, dtype=dtype)
                return out

            scan._vspyre = True  # type: ignore[attr-defined]
            lowerings[key] = scan


# -- host fallbacks for what the card's kernels cannot express ---------------------------------
# A per-device decision at lowering time: an aten op whose Inductor lowering would put an op with
# no tile-program form into a fused kernel (kernel.has_tile_form: special functions, random
# numbers, atomic/scatter stores) runs as an Inductor fallback kernel when its tensors are on the
# card, i.e. a counted host fallback (wrapper.compiled_fallbacks, a compile error in strict
# fallback mode). Other devices keep Inductor's lowering. The table says what each lowering needs;
# the kernel says what it can emit, so giving an op a tile form moves its aten ops back on the card.

_ATOMIC_ADD = "store:atomic_add"


def _bound(op: Any, args: tuple, kwargs: dict, name: str, default: Any = None) -> Any:
    """The value of argument ``name`` of ``op`` in a lowering call (positional or keyword)."""
    if name in kwargs:
        return kwargs[name]
    for i, a in enumerate(op._schema.arguments):
        if a.name == name:
            if i < len(args) and not a.kwarg_only:
                return args[i]
            break
    return default


def _accumulate_needs(op: Any, args: tuple, kwargs: dict) -> set[str]:
    return {_ATOMIC_ADD} if _bound(op, args, kwargs, "accumulate", False) else set()


def _scatter_reduce_needs(op: Any, args: tuple, kwargs: dict) -> set[str]:
    # scatter_reduce(reduce="sum") and scatter(reduce="add") lower to atomic-add scatter stores
    return {_ATOMIC_ADD} if _bound(op, args, kwargs, "reduce") in ("sum", "add") else set()


def _ldexp_needs(op: Any, args: tuple, kwargs: dict) -> set[str]:
    # Inductor emits ops.ldexp for a float x and an integer exponent, else x * 2**n
    x, n = _bound(op, args, kwargs, "self"), _bound(op, args, kwargs, "other")
    try:
        native = x.get_dtype().is_floating_point and not n.get_dtype().is_floating_point \
            and n.get_dtype() != torch.bool
    except AttributeError:   # a Python number
        native = False
    return {"ldexp"} if native else set()


def _random_needs() -> dict[Any, frozenset[str]]:
    """The factories Inductor turns into in-kernel random numbers (fx_passes/replace_random.py);
    every other random op decomposes into these (fast_random_decomps)."""
    aten = torch.ops.aten
    return {aten.rand: frozenset({"load_seed", "rand"}), aten.randn: frozenset({"load_seed", "randn"}),
            aten.randint: frozenset({"load_seed", "randint64"})}


def _kernel_needs() -> dict[Any, Any]:
    """aten/prims op (overload packet) -> the ops its Inductor lowering emits into a kernel: a set
    of ops.* names (``"store:<mode>"`` for a store mode), or a function of the call's arguments."""
    from ..compat import inductor_prims, pointwise_overrides_data

    aten, prims = torch.ops.aten, torch.ops.prims
    needs: dict[Any, Any] = {}
    # Pointwise ops Inductor lowers to one ops.<name> each (special functions, igamma, i0, ...).
    for name, data in pointwise_overrides_data.items():
        for ns in (aten, prims):
            packet = getattr(ns, data.name, None)
            if packet is not None:
                needs[packet] = frozenset({name})
    needs[aten.frexp] = frozenset({"frexp"})
    needs[aten.ldexp] = _ldexp_needs
    needs.update(_random_needs())
    # Scatter stores with accumulation.
    for packet in (aten.scatter_add, aten.scatter_add_, aten._unsafe_masked_index_put_accumulate):
        needs[packet] = frozenset({_ATOMIC_ADD})
    for packet in (aten.index_put, aten.index_put_, aten._unsafe_index_put, inductor_prims._unsafe_index_put_):
        needs[packet] = _accumulate_needs
    for packet in (aten.scatter_reduce, aten.scatter_reduce_, aten.scatter, aten.scatter_):
        needs[packet] = _scatter_reduce_needs
    return needs


def _call_on_spyre(args: tuple, kwargs: dict) -> bool:
    from torch.utils._pytree import tree_leaves

    for leaf in tree_leaves((args, kwargs)):
        if _on_spyre(leaf):
            return True
    dev = kwargs.get("device")
    return dev is not None and torch.device(dev).type == "spyre"


def _overloads(packet: Any) -> list[Any]:
    if isinstance(packet, torch._ops.OpOverload):
        return [packet]
    return [getattr(packet, name) for name in packet.overloads()]


def _fallback(op: Any, args: tuple, kwargs: dict) -> Any:
    from ..compat import V, inductor_lowering
    fallback_handler = inductor_lowering.fallback_handler

    if not compat.get("library_utils").mutates_and_returns_first_arg(op):
        return fallback_handler(op, add_to_fallback_set=False)(*args, **kwargs)
    # An in-place op (index_put_ after Inductor's re-inplacing), handled as Inductor's own in-place
    # fallbacks (IndexPutFallback): the input is realized and marked mutated before the kernel
    # (earlier reads are realized first, later ones load the buffer instead of inlining what it
    # held), and the result is the mutated input itself (the kernel's returned alias would be a
    # separate buffer to the memory planner, which could reuse the input's storage under it).
    args[0].realize()
    V.graph.mark_buffer_mutated(args[0].get_name())
    fallback_handler(op, add_to_fallback_set=False)(*args, **kwargs)
    return args[0]


def _register_host_fallbacks() -> None:
    lowerings = compat.get("inductor_lowering").lowerings

    from .kernel import has_tile_form

    for packet, need in _kernel_needs().items():
        for op in _overloads(packet):
            upstream = lowerings.get(op)
            if upstream is None or getattr(upstream, "_vspyre", False):
                continue

            def lowering(*args: Any, _op: Any = op, _need: Any = need, _upstream: Callable = upstream,
                         **kwargs: Any) -> Any:
                if _call_on_spyre(args, kwargs):
                    wanted = _need(_op, args, kwargs) if callable(_need) else _need
                    if not all(has_tile_form(n) for n in wanted):
                        return _fallback(_op, args, kwargs)
                return _upstream(*args, **kwargs)

            lowering._vspyre = True  # type: ignore[attr-defined]
            lowerings[op] = lowering

    # Inductor rewrites rand/randn/randint into in-kernel random numbers before lowering
    # (joint-graph pass replace_random): not for the card's tensors, which keep the aten factory
    # (and so reach the fallback above, drawing from the card's generator).
    from ..compat import replace_random

    random_needs = _random_needs()
    for (kind, target), entries in replace_random.patterns.patterns.items():
        need = random_needs.get(getattr(target, "overloadpacket", None))
        if kind != "call_function" or need is None:
            continue
        for entry in entries:
            upstream_check = entry.extra_check
            if getattr(upstream_check, "_vspyre", False):
                continue

            def extra_check(match: Any, _need: frozenset = need, _upstream: Callable = upstream_check) -> bool:
                val = match.output_node().meta.get("val")
                if (isinstance(val, torch.Tensor) and val.device.type == "spyre"
                        and not all(has_tile_form(n) for n in _need)):
                    return False
                return _upstream(match)

            extra_check._vspyre = True  # type: ignore[attr-defined]
            entry.extra_check = extra_check


# -- attention: the card's flash program as one node ------------------------------------------
def _library_node(kind: str, params: dict, inputs: list, size: list, dtype: torch.dtype, device: Any) -> Any:
    """A node of Inductor's graph that the wrapper runs as one library program of the card."""
    from ..compat import inductor_ir as ir

    class SpyreLibraryKernel(ir.ExternKernelOut):
        """Inductor sees an extern kernel (inputs realized, an output buffer it plans); the wrapper
        launches a tile program on the card (``vspyre.inductor.launcher.LibraryKernel``) instead of
        calling a host function, so it is not a host fallback."""

        def codegen(self, wrapper: Any) -> None:
            wrapper.add_import_once("from vspyre.inductor.launcher import LibraryKernel")
            name = f"spyre_{kind}_{self.get_name()}"
            wrapper.header.writeline(f"{name} = LibraryKernel({kind!r}, {params!r})")
            args = [x.codegen_reference() for x in self.inputs] + [self.codegen_reference()]
            wrapper.writeline(f"{name}.run({', '.join(args)})")

    layout = ir.FixedLayout(device, dtype, size, ir.FlexibleLayout.contiguous_strides(size))
    node = SpyreLibraryKernel(layout, [ir.ExternKernel.realize_input(x) for x in inputs],
                              python_kernel_name=f"spyre_{kind}")
    return ir.TensorBox.create(node)


def _sdpa_overrideable(query: Any, key: Any, value: Any, attn_bias: Any = None, dropout_p: float = 0.0,
                       is_causal: bool = False, return_debug_mask: bool = False, scale: Any = None) -> Any | None:
    """``_scaled_dot_product_fused_attention_overrideable`` (what SDPA calls on the card) as the
    card's flash program (``vspyre.ir.library.attention``), and its log-sum-exp as a second one that
    Inductor drops when nothing reads it (inference). None: not for the card (upstream fallback)."""
    if not (_on_spyre(query) and _on_spyre(key) and _on_spyre(value)) or dropout_p or return_debug_mask:
        return None
    if attn_bias is not None and not _on_spyre(attn_bias):
        return None
    b, h, m = query.get_size()[:3]
    e = value.get_size()[-1]
    n = key.get_size()[2]
    params = {"scale": None if scale is None else float(scale), "causal": bool(is_causal),
              "mask": attn_bias is not None}
    ins = [query, key, value] + ([attn_bias] if attn_bias is not None else [])
    device = query.get_device()
    out = _library_node("attention", {**params, "name": "attention"}, ins, [b, h, m, e], query.get_dtype(), device)
    lse = _library_node("attention", {**params, "value": False, "name": "attention_lse"},
                        [query, key] + ([attn_bias] if attn_bias is not None else []), [b, h, m], torch.float32,
                        device)
    return out, lse, None, None, m, n, None, None, None


def _register_attention() -> None:
    lowerings = compat.get("inductor_lowering").lowerings

    op = torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default
    upstream = lowerings.get(op)
    if upstream is None or getattr(upstream, "_vspyre", False):
        return

    def sdpa(*args: Any, _upstream: Callable = upstream, **kwargs: Any) -> Any:
        out = _sdpa_overrideable(*args, **kwargs)
        return _upstream(*args, **kwargs) if out is None else out

    sdpa._vspyre = True  # type: ignore[attr-defined]
    lowerings[op] = sdpa


def _topk(x: Any, k: Any, dim: int = -1, largest: bool = True, sorted: bool = True) -> Any | None:
    """``topk`` along the last dim as the card's library program (``vspyre.ir.library.topk``): one
    node for the values, one for the indices (Inductor drops the one nothing reads). None: not
    for the card (upstream: a fallback)."""
    from ..ir.library import TOPK_MAX

    if not _on_spyre(x):
        return None
    size = list(x.get_size())
    if not size or int(dim) % len(size) != len(size) - 1 or not isinstance(k, int) or not 1 <= k <= TOPK_MAX:
        return None
    shape = size[:-1] + [k]
    params = {"k": k, "largest": bool(largest)}
    device = x.get_device()
    values = _library_node("topk", {**params, "want": "values"}, [x], shape, x.get_dtype(), device)
    indices = _library_node("topk", {**params, "want": "indices"}, [x], shape, torch.int64, device)
    return values, indices


def _histc(x: Any, bins: int = 100, min: Any = 0, max: Any = 0) -> Any | None:
    """``histc`` over fixed edges as the card's library program (``vspyre.ir.library.histc``:
    fp32 counts for every dtype, so integer inputs work). None: upstream (a fallback)."""
    if not _on_spyre(x) or not float(min) < float(max) or len(x.get_size()) != 1:
        return None
    return _library_node("histc", {"bins": int(bins), "lo": float(min), "hi": float(max)}, [x], [int(bins)],
                         x.get_dtype(), x.get_device())


def _sort(x: Any, stable: Any = None, dim: int = -1, descending: bool = False) -> Any | None:
    """A stable sort along the last dim (up to ``SCAN_MAX``) as the card's two library programs:
    the ranks (``vspyre.ir.library.sort_ranks``), then one node for the values and one for the
    indices (``sort_select``; Inductor drops the one nothing reads). None: upstream (a fallback)."""
    from ..ir.library import SCAN_MAX

    if not _on_spyre(x):
        return None
    size = list(x.get_size())
    static = bool(size) and (isinstance(size[-1], int) or getattr(size[-1], "is_number", False))
    if not static or int(dim) % len(size) != len(size) - 1 or int(size[-1]) > SCAN_MAX:
        return None
    device = x.get_device()
    ranks = _library_node("sort_ranks", {"descending": bool(descending)}, [x], size, torch.int64, device)
    values = _library_node("sort_select", {"want": "values"}, [x, ranks], size, x.get_dtype(), device)
    indices = _library_node("sort_select", {"want": "indices"}, [x, ranks], size, torch.int64, device)
    return values, indices


def _sort_default(x: Any, dim: int = -1, descending: bool = False) -> Any | None:
    return _sort(x, None, dim, descending)


def _paged_attention(q: Any, k: Any, v: Any, k_cache: Any, v_cache: Any, slot_mapping: Any, block_table: Any,
                     query_start_loc: Any, seq_lens: Any, scale: float, sliding_window: int = 0,
                     max_query_len: int = 0) -> Any | None:
    """``spyre::paged_attention`` (vLLM's batch over a paged KV cache, ``vspyre.runtime.paged``) as
    one node that launches the card's programs (``vspyre.ir.library.paged_attention_launches``: the
    cache write, then the flash program through the block table). Inductor sees a functional op
    reading the caches; the write is the op's undeclared side effect, as the schema says. None:
    not for the card (upstream: a fallback)."""
    ins = [q, k, v, k_cache, v_cache, slot_mapping, block_table, query_start_loc, seq_lens]
    if not all(_on_spyre(x) for x in ins):
        return None
    return _library_node("paged_attention", {"scale": float(scale), "sliding_window": int(sliding_window),
                                             "max_query_len": int(max_query_len)}, ins,
                         list(q.get_size()), q.get_dtype(), q.get_device())


def _grouped_mm(op: str) -> Callable:
    """The experts' grouped matmul (``aten._grouped_mm``; transformers' ``grouped_mm_fallback``,
    which transformers calls instead in compiled graphs of non-bf16 models) as one node that
    launches the card's per-group matmuls (``vspyre.ir.library.grouped_mm_launches``; the group
    sizes read back, a counted sync, or assumed by the routing policy in estimate-only mode).
    None: not the 2-D x 3-D form with offsets on the card (upstream)."""
    def lower(x: Any, w: Any, offs: Any = None, bias: Any = None, out_dtype: Any = None) -> Any | None:
        if offs is None or bias is not None or not all(_on_spyre(t) for t in (x, w, offs)):
            return None
        if len(x.get_size()) != 2 or len(w.get_size()) != 3 or (out_dtype is not None and out_dtype != x.get_dtype()):
            return None
        return _library_node("grouped_mm", {"op": op}, [x, w, offs], [x.get_size()[0], w.get_size()[2]],
                             x.get_dtype(), x.get_device())
    return lower


def _scaled_mm(a: Any, b: Any, scale_a: Any, scale_b: Any, bias: Any = None, scale_result: Any = None,
               out_dtype: Any = None, use_fast_accum: bool = False) -> Any | None:
    """``torch._scaled_mm`` (fp8) as the card's library program (``vspyre.ir.library.scaled_mm``:
    one systolic matmul at the fp8 rate, the scales and the bias in its epilogue) instead of
    Inductor's extern ``aten._scaled_mm.out`` (a host fallback here). None: not for the card
    (upstream), or a ``scale_result`` (a host fallback)."""
    from ..hardware import fp8_dtypes
    from ..ir import library
    ins = [a, b, scale_a, scale_b] + ([bias] if bias is not None else [])
    odt = out_dtype or a.get_dtype()
    if scale_result is not None or not all(_on_spyre(t) for t in ins) or not (
            odt in library.SCALED_MM_OUT or odt in fp8_dtypes()):
        return None
    if odt in fp8_dtypes():    # an fp8 result: the library program (one rounding to fp8 at the store)
        return _library_node("scaled_mm", {"bias": bias is not None}, ins, [a.get_size()[0], b.get_size()[1]], odt,
                             a.get_device())
    # a 16/32-bit result: a native matmul (ops.dot of the fp8 operands as stored, an fp32 result at
    # the fp8 rate) whose scales, bias and cast are pointwise ops Inductor fuses into its epilogue,
    # planned like every other matmul (and the activations' quantisation may fuse as its prologue)
    from ..compat import inductor_ir as ir, inductor_lowering, ops
    L = inductor_lowering.lowerings
    aten = torch.ops.aten
    (m, k), (_, n) = a.get_size(), b.get_size()
    a_load, b_load = a.make_loader(), b.make_loader()

    def inner_fn(idx: Any, ridx: Any) -> Any:
        (i, j), (r,) = idx, ridx
        return ops.dot(a_load([i, r]), b_load([r, j]))

    acc = ir.Reduction.create(device=a.get_device(), dst_dtype=torch.float32, src_dtype=a.get_dtype(),
                              inner_fn=inner_fn, ranges=[m, n], reduction_ranges=[k], reduction_type="dot")
    acc.realize()
    y = L[aten.mul.Tensor](L[aten.mul.Tensor](acc, scale_a), scale_b)
    if bias is not None:
        y = L[aten.add.Tensor](y, inductor_lowering.to_dtype(bias, torch.float32))
    return inductor_lowering.to_dtype(y, odt)


def _int_mm(a: Any, b: Any) -> Any | None:
    """``torch._int_mm`` (int8 x int8 -> int32) as a native matmul (``ops.dot`` + ``reduction("dot")``
    with an int32 result: one systolic ``Matmul`` at the int8 rate, exact integer accumulation), so
    Inductor fuses what follows it - the dequantisation a W8A8 linear applies (``* scale_a *
    scale_b``, the cast to 16 bits) - into the matmul's epilogue, and the int32 product is never
    stored. None: not for the card (upstream)."""
    from ..compat import inductor_ir as ir, ops
    if not (_on_spyre(a) and _on_spyre(b)) or a.get_dtype() != torch.int8 or b.get_dtype() != torch.int8:
        return None
    (m, k), (_, n) = a.get_size(), b.get_size()
    a_load, b_load = a.make_loader(), b.make_loader()

    def inner_fn(idx: Any, ridx: Any) -> Any:
        (i, j), (r,) = idx, ridx
        return ops.dot(a_load([i, r]), b_load([r, j]))

    out = ir.Reduction.create(device=a.get_device(), dst_dtype=torch.int32, src_dtype=torch.int8,
                              inner_fn=inner_fn, ranges=[m, n], reduction_ranges=[k], reduction_type="dot")
    out.realize()          # a buffer of the graph; its pointwise users still fuse as the epilogue
    return out


def register_custom_library_ops() -> None:
    """Library lowerings of other libraries' custom ops (they exist once that library is imported:
    called at registration and before each compilation for the card, idempotent)."""
    lowerings = compat.get("inductor_lowering").lowerings
    ns = getattr(torch.ops, "transformers", None)
    op = getattr(getattr(ns, "grouped_mm_fallback", None), "default", None) if ns is not None else None
    if op is None or getattr(lowerings.get(op), "_vspyre", False):
        return
    ours = _grouped_mm("transformers::grouped_mm_fallback")

    def lowering(*args: Any, **kwargs: Any) -> Any:
        out = ours(*args, **kwargs)
        if out is None:
            return compat.get("inductor_lowering").fallback_handler(op, add_to_fallback_set=False)(*args, **kwargs)
        return out

    lowering._vspyre = True  # type: ignore[attr-defined]
    lowerings[op] = lowering


def _register_library_ops() -> None:
    """Ops Inductor leaves as fallbacks that the card has a library program for (the routing ops
    of mixture-of-experts models, the vLLM plugin's paged attention)."""
    from ..runtime import paged  # noqa: F401 - defines torch.ops.spyre.paged_attention

    inductor_lowering = compat.get("inductor_lowering")
    lowerings = inductor_lowering.lowerings
    paged_op = torch.ops.spyre.paged_attention.default
    for op, ours in ((torch.ops.aten.topk.default, _topk), (torch.ops.aten.histc.default, _histc),
                     (torch.ops.aten.sort.stable, _sort), (torch.ops.aten.sort.default, _sort_default),
                     (paged_op, _paged_attention),
                     (torch.ops.aten._grouped_mm.default, _grouped_mm("aten::_grouped_mm")),
                     (torch.ops.aten._scaled_mm.default, _scaled_mm), (torch.ops.aten._int_mm.default, _int_mm)):
        upstream = lowerings.get(op)
        if upstream is None and op in (paged_op, torch.ops.aten._grouped_mm.default):   # elsewhere Inductor's fallback
            upstream = inductor_lowering.fallback_handler(op, add_to_fallback_set=False)
        if upstream is None or getattr(upstream, "_vspyre", False):
            continue

        def lowering(*args: Any, _upstream: Callable = upstream, _ours: Callable = ours, **kwargs: Any) -> Any:
            out = _ours(*args, **kwargs)
            return _upstream(*args, **kwargs) if out is None else out

        lowering._vspyre = True  # type: ignore[attr-defined]
        lowerings[op] = lowering


def register() -> None:
    from ..compat import bmm_kernel as bmm_mod, mm_kernel as mm_mod

    for mod in (mm_mod, bmm_mod):
        upstream = mod.use_native_matmul
        if getattr(upstream, "_vspyre", False):
            continue

        def use_native_matmul(mat1: Any, mat2: Any, _upstream: Any = upstream) -> bool:
            if _on_spyre(mat1) and _on_spyre(mat2):
                # K == 0: Inductor cannot make a reduction("dot") over nothing (it asserts); the
                # regular mm path gives the zeros.
                from ..compat import V
                if V.graph.sizevars.statically_known_equals(mat1.get_size()[-1], 0):
                    return False
                return mat1.get_dtype() in _MATMUL_DTYPES and mat1.get_dtype() == mat2.get_dtype()
            return _upstream(mat1, mat2)

        use_native_matmul._vspyre = True  # type: ignore[attr-defined]
        mod.use_native_matmul = use_native_matmul

    _register_convolution()
    _register_scans()
    _register_attention()
    _register_library_ops()
    register_custom_library_ops()
    _register_host_fallbacks()
