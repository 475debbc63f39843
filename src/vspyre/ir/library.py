"""Library programs: kernels every path builds the same way.

Some operations are one hand-written tile program whichever compiler asks for them, because no
fusion of smaller ops gives their form: attention is a *flash* program (the scores, the online
softmax and the product with ``v`` in one kernel; the scores never reach device memory; the keys
walked in tiles, or split over cores and finished over the ring when the queries are few). The
Inductor extension (a lowering of ``_scaled_dot_product_fused_attention_overrideable``) and the
standalone compiler (its SDPA ops and its attention fusion) both call :func:`attention`, so the
program, its plan and its cost are the same on both paths. :func:`conv` is the implicit-GEMM
convolution the standalone compiler launches (the Inductor extension builds the same form in
Inductor's IR, where it fuses with what follows).

The routing ops of mixture-of-experts models are library programs too (eager kernels, the
standalone compiler and, for :func:`topk`, the Inductor extension launch them): :func:`topk` (k
rounds of a max and an argmax, each masking its pick), :func:`gather_rows` (``x[idx]``, an
indirect load), :func:`scatter_fill` (``scatter(dim=-1, idx, value)``, what ``one_hot`` does off
the CPU: an ``any`` over the index's entries per output column), :func:`index_add` (``index_add``
along dim 0 as a masked sum over the source rows: exact with repeated indices, no atomics, at
O(rows x sources) vector work), :func:`sort_ranks` + :func:`sort_select` (a stable sort: each
entry's rank by a masked count, then the entry of each rank; O(n^2)), :func:`histc` (a histogram over fixed edges as one masked count per
bin, in fp32 for every input dtype: the integer ``histc`` the CPU lacks) and :func:`scan` (``cumsum``/``cumprod`` as a masked reduction, the
Inductor extension's form: O(n^2) work, for dims up to ``SCAN_MAX``). The experts' grouped matmul
(:func:`grouped_mm`, launched once per non-empty group by :func:`grouped_mm_launches`, checked by
:func:`grouped_mm_check`) and ``nonzero`` (:func:`nonzero_ranks`, then :func:`nonzero_select`)
need sizes that are values on the card: their callers read them back (a counted sync) or, in
estimate-only mode, take them from the routing assumption (``vspyre.runtime.routing``).

The quantised matmuls (``torch._scaled_mm`` on fp8, ``torch._int_mm`` on int8; every path
launches :func:`scaled_mm`): one systolic matmul at the 8-bit rate with the scales and the bias
in its epilogue, never separate ops.

Paged attention (``spyre::paged_attention``, the vLLM plugin's op; every path launches
:func:`paged_attention_launches`): :func:`kv_write` (the step's keys and values into the paged
KV cache, a store with an indirect index masked where the slot is negative), then
:func:`paged_attention` (one flash program reading K and V through the block table, queries
bounded by :func:`paged_qmax` from shapes; fast mode's host form is :func:`paged_attend`, the
op's reference math).

Shapes and strides in specs may be size symbols (eager kernels build one program per rank); the
paged-attention programs are built per shape.

A tensor is described by a *spec* ``(dtype, shape, strides)``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .builder import ProgramBuilder
from .indexing import FloorDiv, ModularIndexing, sym
from .program import Program

__all__ = ["Spec", "attention", "check", "conv", "gather_rows", "grouped_mm", "grouped_mm_check",
           "grouped_mm_launches", "histc", "index_add", "kv_write",
           "nonzero_ranks", "nonzero_select", "paged_attend",
           "paged_attention", "paged_attention_launches", "paged_positions", "paged_qmax", "scan", "scatter_fill",
           "scaled_mm", "scaled_mm_check", "sort_ranks", "sort_select", "spec_of", "topk"]

Spec = tuple  # (torch.dtype, shape tuple, strides tuple)


def spec_of(t: torch.Tensor) -> Spec:
    return (t.dtype, tuple(t.shape), tuple(t.stride()))


class _Batch:
    """The output's batch dims as program dims. Where a key/value input has ``n`` entries in a
    batch dim and the output ``g * n`` (grouped-query attention), output index ``h * g + j`` is
    walked as two dims, ``h`` (the shared key head) and ``j`` (its query heads), so every index
    stays affine and a key tile can stay resident while its query heads pass."""

    def __init__(self, b: ProgramBuilder, shape: tuple[int, ...], specs: list[Spec | None]):
        self.shape = shape
        self.dims: list[tuple[Any, Any, int]] = []     # (head dim, group dim or None, group size)
        for i, want in enumerate(shape):
            groups = set()
            for sp in specs:
                if sp is None:
                    continue
                j = i - (len(shape) - (len(sp[1]) - 2))
                if j >= 0 and sp[1][j] not in (1, want):
                    if want % sp[1][j]:
                        raise ValueError(f"attention: an input has {sp[1][j]} entries in batch dim {i}, the "
                                         f"output {want} (neither equal, 1, nor a divisor for grouped heads)")
                    groups.add(sp[1][j])
            if len(groups) > 1:
                raise ValueError(f"attention: inputs group batch dim {i} differently ({sorted(groups)})")
            if groups:
                n = groups.pop()
                self.dims.append((b.dim(f"x{i}", n), b.dim(f"x{i}g", want // n), want // n))
            else:
                self.dims.append((b.dim(f"x{i}", want), None, 1))

    def full(self, i: int) -> Any:
        h, g, gs = self.dims[i]
        return h if g is None else h * gs + g

    def offset(self, sp: Spec) -> Any:
        """Offset of the batch part of ``sp`` (right-aligned broadcasting, grouped heads)."""
        _, shape, strides = sp
        nb = len(shape) - 2
        off = len(self.shape) - nb
        if off < 0:
            raise ValueError(f"attention: an input of shape {shape} has more batch dims than {self.shape}")
        e: Any = 0
        for j in range(nb):
            if shape[j] == 1 or strides[j] == 0:
                continue
            i = j + off
            e = e + strides[j] * (self.full(i) if shape[j] == self.shape[i] else self.dims[i][0])
        return e


@functools.lru_cache(maxsize=1024)
def attention(q: Spec, k: Spec, v: Spec | None, out: Spec, mask: Spec | None = None, scale: float | None = None,
              causal: bool | int = False, kt: bool = False, safe: bool = False, name: str = "attention",
              source: str = "library") -> Program:
    """``out[..., m, e] = softmax(scale * q . k + mask)[..., m, n] @ v[..., n, e]`` in ONE program.

    ``q`` is ``[..., M, D]``, ``k`` ``[..., N, D]`` (``[..., D, N]`` with ``kt``: a transposed
    view), ``v`` ``[..., N, E]``, ``out`` ``[..., M, E]``; batch dims broadcast, and ``k``/``v`` may
    have fewer heads than ``q`` (grouped-query attention). A bool ``mask`` selects, a float one
    adds (``[..., M, N]``, broadcast). ``causal``: key ``n`` is visible to query ``m`` when
    ``n <= m + offset`` (``True``: offset 0; an int: the offset, for queries at the end of a KV
    cache). ``safe``: rows with no visible key give 0 instead of NaN. ``scale`` defaults to
    ``1/sqrt(D)``. With ``v=None``, ``out`` is ``[..., M]``: the log-sum-exp of the scores over the
    keys (the statistic attention saves for its backward), by the same online reduction.
    """
    b = ProgramBuilder(name, source=source)
    odt, oshape, ostr = out
    qb = b.input("q", q[0], q[1], q[2])
    kb = b.input("k", k[0], k[1], k[2])
    vb = b.input("v", v[0], v[1], v[2]) if v is not None else None
    mb = b.input("mask", mask[0], mask[1], mask[2]) if mask is not None else None
    ob = b.output("out", odt, oshape, ostr)
    lse = v is None
    nb = len(oshape) - (1 if lse else 2)
    M = oshape[nb]
    D = q[1][-1]
    N = k[1][-1] if kt else k[1][-2]
    E = v[1][-1] if v is not None else None
    if (k[1][-2] if kt else k[1][-1]) != D or q[1][-2] != M or (v is not None and (v[1][-2] != N or oshape[-1] != E)):
        raise ValueError(f"attention: shapes q {q[1]}, k {k[1]}{' (transposed)' if kt else ''}, "
                         f"v {v[1] if v is not None else None}, out {oshape} do not agree")
    bt = _Batch(b, tuple(oshape[:nb]), [k, v])
    m = b.dim(f"x{nb}", M)
    e = b.dim(f"x{nb + 1}", E) if not lse else None
    n = b.rdim("r1", N)         # keys: walked in tiles by the online softmax (outer of the two)
    d = b.rdim("r0", D)         # head dim: the contraction of the scores (inner, whole)
    vq = b.load(qb, bt.offset(q) + q[2][-2] * m + q[2][-1] * d)
    kst = (k[2][-1], k[2][-2]) if kt else (k[2][-2], k[2][-1])        # strides along (n, d)
    vk = b.load(kb, bt.offset(k) + kst[0] * n + kst[1] * d)
    s = b.matmul(vq, vk, d)
    sc = scale if scale is not None else D ** -0.5
    if sc != 1.0:
        s = b.mul(s, float(sc))
    if mb is not None:
        mdt, mshape, mstr = mask
        mi = (bt.offset((mdt, tuple(mshape[:-2]) + (1, 1), tuple(mstr[:-2]) + (0, 0))) if len(mshape) > 2 else 0)
        mi = mi + (mstr[-2] * m if mshape[-2] != 1 else 0) + (mstr[-1] * n if mshape[-1] != 1 else 0)
        mv = b.load(mb, mi)
        s = b.where(mv, s, float("-inf")) if mdt == torch.bool else b.add(s, mv)
    if causal is not False:
        off = 0 if causal is True else int(causal)
        s = b.where(b.le(b.index_value(n), b.index_value(m + off) if off else b.index_value(m)), s, float("-inf"))
    vv = b.load(vb, bt.offset(v) + v[2][-2] * n + v[2][-1] * e) if vb is not None else None
    y = b.softmax_matmul(s, vv, n, zero_empty=safe)
    oidx = sum((st * bt.full(i) for i, st in enumerate(ostr[:nb])), 0) + ostr[nb] * m + (ostr[-1] * e if not lse else 0)
    b.store(ob, oidx, y)
    return b.build()


@functools.lru_cache(maxsize=1024)
def conv(x: Spec, w: Spec, bias: Spec | None, out: Spec, stride: tuple[int, ...], padding: tuple[int, ...],
         dilation: tuple[int, ...], groups: int = 1, name: str = "conv", source: str = "library") -> Program:
    """A 1-D or 2-D convolution (NCL / NCHW, not transposed) as an implicit GEMM on the systolic
    array: ``z`` = batch x groups (a batch dim of the matmul), ``y`` = output channels of a group
    (N), ``x`` = output positions (M), ``r0`` = input channels of a group x kernel window (K). The
    input patch is read through the window's index (masked to 0 in the padding; the sticks it
    touches are counted, not a stick per element); the bias is the matmul's epilogue. The Inductor
    extension lowers ``aten.convolution`` to the same form in Inductor's IR (so it fuses what
    follows); the standalone compiler launches this program."""
    nd = len(x[1]) - 2
    if nd not in (1, 2) or len(w[1]) != nd + 2:
        raise ValueError(f"conv: {nd}-D input {x[1]} / weight {w[1]}: only 1-D and 2-D convolutions")
    (N, C, *sp), (OC, CG, *ks) = x[1], w[1]
    H, W = (1, sp[0]) if nd == 1 else sp
    KH, KW = (1, ks[0]) if nd == 1 else ks
    sh, sw = (1, stride[0]) if nd == 1 else stride
    ph, pw = (0, padding[0]) if nd == 1 else padding
    dh, dw = (1, dilation[0]) if nd == 1 else dilation
    G = groups
    if C != CG * G or OC % G:
        raise ValueError(f"conv: {C} input channels, weight {w[1]} and groups={G} do not agree")
    OH = (H + 2 * ph - dh * (KH - 1) - 1) // sh + 1
    OW = (W + 2 * pw - dw * (KW - 1) - 1) // sw + 1
    OCg = OC // G
    want = (N, OC, OW) if nd == 1 else (N, OC, OH, OW)
    if tuple(out[1]) != want:
        raise ValueError(f"conv: output {out[1]} but input {x[1]} and weight {w[1]} give {want}")
    b = ProgramBuilder(name, source=source)
    xb = b.input("x", x[0], x[1], x[2])
    wb = b.input("w", w[0], w[1], w[2])
    bb = b.input("bias", bias[0], bias[1], bias[2]) if bias is not None else None
    ob = b.output("out", out[0], out[1], out[2])
    z, yo, xo, r = b.dim("x0", N * G), b.dim("x1", OCg), b.dim("x2", OH * OW), b.rdim("r0", CG * KH * KW)
    grp = ModularIndexing(z, 1, G) if G > 1 else 0
    bn = FloorDiv(z, G) if G > 1 else z
    ic = FloorDiv(r, KH * KW) if KH * KW > 1 else r
    ki = ModularIndexing(r, KW, KH) if KH > 1 else 0
    kj = ModularIndexing(r, 1, KW) if KW > 1 else 0
    oh = FloorDiv(xo, OW) if OH > 1 else 0
    ow = ModularIndexing(xo, 1, OW) if OH > 1 else xo
    hi = oh * sh - ph + ki * dh
    wi = ow * sw - pw + kj * dw
    xs = x[2]
    sp_idx = wi * xs[2] if nd == 1 else hi * xs[2] + wi * xs[3]
    idx = bn * xs[0] + (grp * CG + ic) * xs[1] + sp_idx
    mask = None
    if ph or pw:
        conds = []
        for e, n, pad in ((hi, H, ph), (wi, W, pw)):
            if pad:
                v = b.index_value(e)
                conds.append(b.logical_and(b.ge(v, 0), b.lt(v, n)))
        mask = conds[0] if len(conds) == 1 else b.logical_and(*conds)
    a = b.load(xb, idx, mask=mask, other=0.0) if mask is not None else b.load(xb, idx)
    ws = w[2]
    wk = kj * ws[2] if nd == 1 else ki * ws[2] + kj * ws[3]
    oc = grp * OCg + yo
    acc = b.matmul(a, b.load(wb, oc * ws[0] + ic * ws[1] + wk), r)
    if bb is not None:
        acc = b.add(acc, b.load(bb, oc * bias[2][0]))
    os_ = out[2]
    if nd == 1:
        opos = xo * os_[2]
    elif os_[2] == OW * os_[3]:
        opos = xo * os_[3]                    # (oh, ow) walk the output contiguously
    else:
        opos = oh * os_[2] + ow * os_[3]
    b.store(ob, bn * os_[0] + oc * os_[1] + opos, b.to(acc, out[0]))
    return b.build(host=("conv", nd, tuple(stride), tuple(padding), tuple(dilation), G))


def _conv_host(p: Program, hosts: Any) -> None:
    """What ``conv``'s program computes, as torch's own convolution on the host: the input, weight
    and bias as the card holds them (fp32), fp32 accumulation, one rounding where it stores. Fast
    mode runs this instead of the implicit GEMM's gathers (the same value; the card's cost is the
    program's); checked mode runs the program tile by tile."""
    from .. import numerics
    from .ops import host_value

    _, nd, stride, padding, dilation, groups = p.meta["host"]
    x, w, out = hosts[0], hosts[1], hosts[len(p.buffers) - 1]
    bias = host_value(hosts[2]) if len(p.buffers) == 4 else None
    f = torch.nn.functional.conv1d if nd == 1 else torch.nn.functional.conv2d
    y = f(host_value(x), host_value(w), bias, stride, padding, dilation, groups)
    out.copy_(numerics.store_cast(y, out.dtype))


# Library programs whose whole value fast mode computes with one torch call (``meta["host"]``).
HOST_FORMS = {"conv": _conv_host}


SCAN_MAX = 4096         # longest dim a scan is a masked reduction for (quadratic work)
TOPK_MAX = 16           # largest k topk is k rounds of max + argmax for


def _idx(strides: Any, dims: list) -> Any:
    return sum((st * d for st, d in zip(strides, dims)), 0)


def _extreme(dt: torch.dtype, largest: bool) -> Any:
    if dt.is_floating_point:
        return float("-inf") if largest else float("inf")
    if dt == torch.bool:
        return not largest
    info = torch.iinfo(dt)
    return info.min if largest else info.max


def _rows(b: ProgramBuilder, shape: Any, rsize: Any) -> tuple[list, Any, Any]:
    """The dims of a program over the last dim of ``shape``: the leading dims, the last (parallel),
    and a reduction dim of ``rsize`` (the other entries each output entry looks at)."""
    lead = [b.dim(f"x{k}", n) for k, n in enumerate(shape[:-1])]
    return lead, b.dim(f"x{len(lead)}", shape[-1]), b.rdim("r0", rsize)


def _checked_index(b: ProgramBuilder, i: str, n: Any, what: str) -> str:
    """``i``, which must lie in ``[0, n)`` (scatter and index_add take no negative indices): one
    outside stops the kernel, as the CPU's index check raises."""
    ok = b.device_assert(b.logical_and(b.ge(i, 0), b.lt(i, b.index_value(n))),
                         f"{what}: an index is out of bounds for a dimension of that size")
    return b.where(ok, i, 0)


@functools.lru_cache(maxsize=1024)
def topk(x: Spec, k: int, values: Spec | None, indices: Spec | None, largest: bool = True,
         name: str = "topk", source: str = "library") -> Program:
    """The ``k`` largest (smallest) entries along the last dim, sorted, and their positions: k
    rounds of a max and an argmax over the dim, each round masking what it picked (ties: the
    lower index first; NaN counts as the largest, as in ``torch.topk``)."""
    if not 1 <= k <= TOPK_MAX:
        raise ValueError(f"topk: k={k} outside 1..{TOPK_MAX} (k rounds of max + argmax)")
    dt, shape, strides = x
    b = ProgramBuilder(name, source=source)
    xb = b.input("x", dt, shape, strides)
    vb = b.output("values", *values) if values is not None else None
    ib = b.output("indices", *indices) if indices is not None else None
    lead = [b.dim(f"x{i}", n) for i, n in enumerate(shape[:-1])]
    r = b.rdim("r0", shape[-1])
    cur = b.load(xb, _idx(strides, lead + [r]))
    pos = b.index_value(r)
    ext, arg = ("max", "argmax") if largest else ("min", "argmin")
    for j in range(k):
        if vb is not None:
            b.store(vb, _idx(values[2][:-1], lead) + values[2][-1] * j, b.reduce(ext, cur, r))
        a = b.reduce(arg, cur, r)
        if ib is not None:
            b.store(ib, _idx(indices[2][:-1], lead) + indices[2][-1] * j, a)
        if j + 1 < k:
            cur = b.where(b.eq(pos, a), _extreme(dt, largest), cur)
    return b.build()


GROUPED_MM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def grouped_mm_check(op: str, x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor | None,
                     bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> None:
    """The grouped matmul of mixture-of-experts layers (``torch._grouped_mm``, transformers'
    ``grouped_mm_fallback``): ``x`` ``[S, K]`` holds the rows of every group, sorted by group;
    ``w`` ``[G, K, N]`` one matrix per group; ``offs`` ``[G]`` (int32/int64) the cumulative row
    counts, so group ``g`` is rows ``offs[g-1]:offs[g]`` and multiplies ``w[g]``. Raises a
    ``RuntimeError`` naming ``op``, dtypes and shapes for anything else the card does not take
    (the 2-D x 3-D form with offsets is the one mixture-of-experts layers use)."""
    def sh(t: torch.Tensor) -> str:
        return f"{tuple(t.shape)} {t.dtype}"

    if offs is None or x.dim() != 2 or w.dim() != 3:
        raise RuntimeError(f"{op}: the card's grouped matmul takes a 2-D input [S, K], 3-D weights [G, K, N] and "
                           f"offsets [G]; got input {sh(x)}, weights {sh(w)}, offsets "
                           f"{'None' if offs is None else sh(offs)}")
    if offs.dim() != 1 or offs.dtype not in (torch.int32, torch.int64):
        raise RuntimeError(f"{op}: offsets must be a 1-D int32/int64 tensor, got {sh(offs)}")
    if offs.shape[0] != w.shape[0]:
        raise RuntimeError(f"{op}: offsets has {offs.shape[0]} entries but the weights {sh(w)} have "
                           f"{w.shape[0]} groups")
    if x.shape[1] != w.shape[1]:
        raise RuntimeError(f"{op}: input {sh(x)} has K={x.shape[1]}, weights {sh(w)} have K={w.shape[1]}")
    if x.dtype != w.dtype or x.dtype not in GROUPED_MM_DTYPES:
        raise RuntimeError(f"{op}: input and weights must share a floating dtype of "
                           f"{[str(d) for d in GROUPED_MM_DTYPES]}; got input {sh(x)}, weights {sh(w)}")
    if bias is not None or (out_dtype is not None and out_dtype != x.dtype):
        raise RuntimeError(f"{op}: bias and another out_dtype are not supported on the card "
                           f"(bias {None if bias is None else sh(bias)}, out_dtype {out_dtype}, input {sh(x)})")


@functools.lru_cache(maxsize=1024)
def grouped_mm(x: Spec, w: Spec, out: Spec, name: str = "grouped_mm", source: str = "library") -> Program:
    """One group of a grouped matmul: ``out[m, n] = sum_k x[m, k] * w[k, n]`` on the systolic
    array, the group's rows ``m`` a size symbol (``m``) bound at launch, so one program serves
    every group and every routing. :func:`grouped_mm_launches` launches it once per non-empty
    group: its cost is the matmul cost of each group's rows, so device time follows routing."""
    b = ProgramBuilder(name, source=source)
    xb = b.input("x", *x)
    wb = b.input("w", *w)
    ob = b.output("out", *out)
    m, n = b.dim("x0", out[1][0]), b.dim("x1", out[1][1])
    k = b.rdim("r0", x[1][1])
    acc = b.matmul(b.load(xb, _idx(x[2], [m, k])), b.load(wb, _idx(w[2], [k, n])), k)
    b.store(ob, _idx(out[2], [m, n]), acc)
    return b.build()


def grouped_mm_launches(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, bounds: list[tuple[int, int]],
                        source: str = "library") -> list[tuple[Program, tuple[torch.Tensor, ...]]]:
    """The launches of ``out = grouped_mm(x, w, offs)`` with group ``g`` on rows
    ``bounds[g] = (start, end)`` (read back from the offsets, or assumed by the routing policy in
    estimate-only mode: ``vspyre.runtime.routing``): one :func:`grouped_mm` per non-empty group on
    row slices of ``x`` and ``out``. Rows after the last group are not computed (the caller zeroes
    them, as transformers' fallback does)."""
    rows = sym("m")
    launches = []
    for g, (start, end) in enumerate(bounds):
        if end <= start:
            continue
        xs, ws, os_ = spec_of(x), spec_of(w[g]), spec_of(out)
        prog = grouped_mm((xs[0], (rows, xs[1][1]), xs[2]), ws, (os_[0], (rows, os_[1][1]), os_[2]),
                          source=source)
        launches.append((prog, (x[start:end], w[g], out[start:end])))
    return launches


SCALED_MM_OUT = (torch.float16, torch.bfloat16, torch.float32)      # and the fp8 formats (no scale_result)


def _desc(t: Any) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" if isinstance(t, torch.Tensor) else repr(t)


def scaled_mm_check(op: str, a: Any, b: Any, scale_a: Any = None, scale_b: Any = None, bias: Any = None,
                    integer: bool = False) -> None:
    """What the card's quantised matmuls take (``torch._scaled_mm``; ``torch._int_mm`` with
    ``integer``): 2-D ``a`` [M, K] and ``b`` [K, N] of fp8 (int8), per-tensor scales (one element
    each) or per-row ones (``scale_a`` [M, 1], ``scale_b`` [1, N]), fp32; a bias of N elements.
    Raises a ``RuntimeError`` naming ``op`` and every operand's shape and dtype otherwise.
    Tensors or meta tensors (it runs before anything is launched)."""
    from ..hardware import fp8_dtypes
    got = f"self {_desc(a)}, mat2 {_desc(b)}" + ("" if integer else
                                                 f", scale_a {_desc(scale_a)}, scale_b {_desc(scale_b)}"
                                                 f"{'' if bias is None else ', bias ' + _desc(bias)}")

    def fail(why: str) -> None:
        raise RuntimeError(f"{op}: {why}; got {got}")

    want = (torch.int8,) if integer else fp8_dtypes()
    if a.dtype not in want + ((torch.uint8,) if integer else ()) or b.dtype not in want:
        fail(f"the operands must be {' or '.join(str(d).removeprefix('torch.') for d in want)}")
    if a.dim() != 2 or b.dim() != 2:
        fail("the operands must be 2-D matrices")
    m, k = a.shape
    k2, n = b.shape
    if k != k2:
        fail(f"the contraction sizes differ (self has K={k}, mat2 has K={k2})")
    if integer:
        return
    for name, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if not isinstance(s, torch.Tensor) or s.dtype != torch.float32:
            fail(f"{name} must be a float32 tensor")
    tensorwise = scale_a.numel() == 1 and scale_b.numel() == 1
    rowwise = tuple(scale_a.shape) == (m, 1) and tuple(scale_b.shape) == (1, n)
    if not (tensorwise or rowwise):
        fail(f"the scales must be one element each (per tensor) or scale_a [{m}, 1] and scale_b [1, {n}] (per row)")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != n or not bias.dtype.is_floating_point):
        fail(f"bias must be a 1-D float tensor of {n} elements")


@functools.lru_cache(maxsize=1024)
def scaled_mm(a: Spec, b: Spec, out: Spec, scales: tuple[Spec, ...] = (), bias: Spec | None = None,
              name: str = "scaled_mm", source: str = "library") -> Program:
    """The quantised matmuls, one systolic ``Matmul`` each with the dequantisation in its epilogue:
    ``out[m, n] = (sum_k a[m, k] * b[k, n]) * scales[0][m, n] * scales[1][m, n] + bias[m, n]``.

    ``torch._scaled_mm``: ``a``, ``b`` fp8 (read as stored, 1 byte, at the fp8 systolic rate:
    ``HardwareConfig.matmul_speedup``), fp32 accumulation, the two scales (per tensor or per row of
    ``a`` / column of ``b``) and the bias given as views broadcast to ``out``'s shape (stride 0
    along the dims they do not vary in, so each moves only its own bytes), the result rounded
    once to ``out``'s dtype at the store (an e4m3fn result beyond its range is NaN when ``a`` and
    ``b`` share a dtype, as PyTorch's ``_scaled_mm`` gives, where the cast saturates).
    ``torch._int_mm``: int8 operands at the int8 rate, no scales, an exact integer accumulator
    (int64 in registers; an int32 ``out`` keeps its low 32 bits, as int32 accumulation would)."""
    pb = ProgramBuilder(name, source=source)
    ab = pb.input("a", *a)
    bb = pb.input("b", *b)
    sbs = [pb.input(f"scale{i}", *s) for i, s in enumerate(scales)]
    biasb = pb.input("bias", *bias) if bias is not None else None
    ob = pb.output("out", *out)
    m, n = pb.dim("x0", out[1][0]), pb.dim("x1", out[1][1])
    k = pb.rdim("r0", a[1][1])
    integer = not a[0].is_floating_point
    acc = pb.matmul(pb.load(ab, _idx(a[2], [m, k])), pb.load(bb, _idx(b[2], [k, n])), k,
                    dtype=torch.int64 if integer else torch.float32)
    for sb_, s in zip(sbs, scales):
        acc = pb.mul(acc, pb.load(sb_, _idx(s[2], [m, n])))
    if biasb is not None:
        acc = pb.add(acc, pb.load(biasb, _idx(bias[2], [m, n])))
    if out[0] == torch.float8_e4m3fn and a[0] == b[0]:
        # PyTorch's _scaled_mm on operands of one fp8 dtype (its oneDNN kernel) does not saturate
        # an e4m3fn result as the cast does: past the rounding range (|x| > 464) it is NaN; mixed
        # operands saturate (the cast); an e5m2 result overflows to inf either way
        acc = pb.where(pb.gt(pb.abs(acc), pb.const(464.0)), pb.const(float("nan")), acc)
    pb.store(ob, _idx(out[2], [m, n]), acc)
    return pb.build()


@functools.lru_cache(maxsize=1024)
def gather_rows(x: Spec, idx: Spec | tuple, out: Spec, name: str = "gather", source: str = "library") -> Program:
    """``out[i..., c...] = x[idx0[i...], idx1[i...], ..., c...]`` (``x[idx]``, ``x[idx0, idx1]``,
    ``index_select(x, 0, idx)``): one index tensor per leading dim of ``x``, all of one shape;
    negative indices count from the end; an index out of range stops the kernel (the runtime
    checks every indirect load)."""
    idxs = idx if isinstance(idx[0], tuple) else (idx,)
    b = ProgramBuilder(name, source=source)
    xb = b.input("x", *x)
    ibs = [b.input(f"idx{j}", *sp) for j, sp in enumerate(idxs)]
    ob = b.output("out", *out)
    q, n = len(idxs[0][1]), len(idxs)
    dims = [b.dim(f"x{i}", m) for i, m in enumerate(out[1])]
    terms = []
    for j, (ib, sp) in enumerate(zip(ibs, idxs)):
        row = b.load(ib, _idx(sp[2], dims[:q]))
        row = b.where(b.lt(row, 0), b.add(row, b.index_value(x[1][j])), row)
        terms.append(f"{row}*({x[2][j]})")
    rest = _idx(x[2][n:], dims[q:])
    v = b.load(xb, " + ".join(terms) + f" + ({rest})")
    b.store(ob, _idx(out[2], dims), v)
    return b.build()


@functools.lru_cache(maxsize=1024)
def scatter_fill(x: Spec, idx: Spec, out: Spec, value: Any, name: str = "scatter", source: str = "library") -> Program:
    """``out = x.scatter(-1, idx, value)``: ``out[..., c] = value`` where some ``idx[..., j] == c``,
    else ``x[..., c]`` (an ``any`` over the index's last dim per output column)."""
    b = ProgramBuilder(name, source=source)
    xb = b.input("x", *x)
    ib = b.input("idx", *idx)
    ob = b.output("out", *out)
    lead, c, j = _rows(b, x[1], idx[1][-1])
    i = _checked_index(b, b.load(ib, _idx(idx[2], lead + [j])), x[1][-1], "scatter")
    hit = b.reduce("any", b.eq(i, b.index_value(c)), j)
    v = b.where(hit, b.to(b.const(value, torch.float32 if isinstance(value, float) else torch.int64), x[0]),
                b.load(xb, _idx(x[2], lead + [c])))
    b.store(ob, _idx(out[2], lead + [c]), b.to(v, out[0]))
    return b.build()


def _by_source_row(name: str, source: str, x: Spec, idx: Spec, src: Spec, out: Spec, what: str,
                   wrap: bool) -> tuple:
    """The frame index_add and index_put share: ``x``, the index, the sources and the output; the
    output's dims, the sources' dim and each source's target row (range-checked on the card;
    negative ones counted from the end with ``wrap``)."""
    b = ProgramBuilder(name, source=source)
    xb, ib, sb, ob = b.input("x", *x), b.input("idx", *idx), b.input("src", *src), b.output("out", *out)
    dims = [b.dim(f"x{i}", n) for i, n in enumerate(x[1])]
    j = b.rdim("r0", idx[1][0])
    k = b.load(ib, idx[2][0] * j)
    if wrap:
        k = b.where(b.lt(k, 0), b.add(k, b.index_value(x[1][0])), k)
    return b, xb, sb, ob, dims, j, _checked_index(b, k, x[1][0], what)


@functools.lru_cache(maxsize=1024)
def index_add(x: Spec, idx: Spec, src: Spec, out: Spec, alpha: Any = 1, name: str = "index_add",
              source: str = "library") -> Program:
    """``out = x.index_add(0, idx, src, alpha=alpha)``: ``out[r, ...] = x[r, ...] + alpha *
    sum_i [idx[i] == r] src[i, ...]``, a masked sum over the source rows (exact with repeated
    indices, no atomics; vector work rows x sources)."""
    b, xb, sb, ob, dims, i, k = _by_source_row(name, source, x, idx, src, out, "index_add", wrap=False)
    v = b.where(b.eq(k, b.index_value(dims[0])), b.load(sb, src[2][0] * i + _idx(src[2][1:], dims[1:])), 0.0)
    acc = b.reduce("sum", v, i)
    if alpha != 1:
        acc = b.mul(acc, alpha)
    b.store(ob, _idx(out[2], dims), b.to(b.add(b.load(xb, _idx(x[2], dims)), acc), out[0]))
    return b.build()


@functools.lru_cache(maxsize=1024)
def index_put(x: Spec, idx: Spec, values: Spec, out: Spec, name: str = "index_put",
              source: str = "library") -> Program:
    """``out = x.index_put((idx,), values)`` (not accumulating): ``out[r, ...] = values[j, ...]``
    for the last ``j`` with ``idx[j] == r`` (negative indices count from the end), ``x[r, ...]``
    where no index is ``r``. A masked max over the sources picks ``j`` (vector work rows x
    sources, no write conflicts; with repeated indices ATen leaves the winner unspecified, and the
    last one is what the CPU gives)."""
    b, xb, vb, ob, dims, j, k = _by_source_row(name, source, x, idx, values, out, "index_put", wrap=True)
    last = b.reduce("max", b.where(b.eq(k, b.index_value(dims[0])), b.index_value(j), -1), j)
    has = b.ge(last, 0)
    row = b.where(has, last, 0)
    v = b.load(vb, f"{row}*({values[2][0]}) + ({_idx(values[2][1:], dims[1:])})", mask=has, other=0)
    b.store(ob, _idx(out[2], dims), b.to(b.where(has, v, b.load(xb, _idx(x[2], dims))), out[0]))
    return b.build()


@functools.lru_cache(maxsize=1024)
def scan(op: str, x: Spec, dim: int, out: Spec, name: str | None = None, source: str = "library") -> Program:
    """``cumsum``/``cumprod`` along ``dim``: ``out[..., i, ...] = op over j <= i of x[..., j, ...]``,
    a masked reduction (the Inductor extension's form)."""
    if op not in ("sum", "prod"):
        raise ValueError(f"scan: {op!r} is not sum or prod")
    b = ProgramBuilder(name or f"cum{op}", source=source)
    xb = b.input("x", *x)
    ob = b.output("out", *out)
    dims = [b.dim(f"x{i}", n) for i, n in enumerate(x[1])]
    j = b.rdim("r0", x[1][dim])
    src = list(dims)
    src[dim] = j
    v = b.load(xb, _idx(x[2], src))
    if out[0] != x[0]:
        v = b.to(v, out[0])
    v = b.where(b.le(b.index_value(j), b.index_value(dims[dim])), v, 0 if op == "sum" else 1)
    b.store(ob, _idx(out[2], dims), b.to(b.reduce(op, v, j), out[0]))
    return b.build()


@functools.lru_cache(maxsize=1024)
def histc(x: Spec, bins: int, lo: float, hi: float, out: Spec, name: str = "histc", source: str = "library") -> Program:
    """``torch.histc`` of a 1-D ``x`` over ``bins`` equal bins of ``[lo, hi]`` (``lo < hi``):
    ``out[c]`` counts the elements in bin ``c`` (the last bin includes ``hi``; elements outside are
    ignored), computed in fp32 whatever ``x``'s dtype."""
    if not lo < hi:
        raise ValueError(f"histc: the range [{lo}, {hi}] is empty (fixed edges only)")
    b = ProgramBuilder(name, source=source)
    xb = b.input("x", *x)
    ob = b.output("out", *out)
    c = b.dim("x0", bins)
    r = b.rdim("r0", x[1][0])
    v = b.to(b.load(xb, x[2][0] * r), torch.float32)
    inside = b.logical_and(b.ge(v, float(lo)), b.le(v, float(hi)))
    k = b.to(b.floor(b.mul(b.sub(v, float(lo)), float(bins) / (float(hi) - float(lo)))), torch.int64)
    k = b.minimum(k, bins - 1)
    hit = b.logical_and(inside, b.eq(k, b.index_value(c)))
    n = b.reduce("sum", b.where(hit, 1.0, 0.0), r)
    b.store(ob, out[2][0] * c, b.to(n, out[0]))
    return b.build()


@functools.lru_cache(maxsize=1024)
def check(cond: Spec, out: Spec, msg: str, name: str = "assert", source: str = "library") -> Program:
    """``_assert_async(cond, msg)`` on the card: every element of ``cond`` must be true, else the
    kernel stops with ``msg`` (an ``any`` of the negation, then ``device_assert``); ``out`` (one
    bool) receives the verdict."""
    b = ProgramBuilder(name, source=source)
    cb = b.input("cond", *cond)
    ob = b.output("ok", *out)
    rs = [b.rdim(f"r{i}", n) for i, n in enumerate(cond[1])]
    bad = b.reduce("any", b.logical_not(b.load(cb, _idx(cond[2], rs))), rs)
    b.store(ob, 0, b.device_assert(b.logical_not(bad), msg))
    return b.build()


def _before(b: ProgramBuilder, a: str, c: str, descending: bool) -> str:
    """``a`` sorts before ``c`` (NaN is the largest value, as in ``torch.sort``)."""
    an, cn = b.isnan(a), b.isnan(c)
    if descending:
        return b.logical_or(b.gt(a, c), b.logical_and(an, b.logical_not(cn)))
    return b.logical_or(b.lt(a, c), b.logical_and(cn, b.logical_not(an)))


@functools.lru_cache(maxsize=1024)
def sort_ranks(x: Spec, ranks: Spec, descending: bool = False, name: str = "sort_rank",
               source: str = "library") -> Program:
    """The first half of a stable sort along the last dim: ``ranks[..., i]`` = how many entries
    sort before entry ``i`` (smaller, or equal at a lower index): a masked count, O(n^2) work."""
    b = ProgramBuilder(name, source=source)
    xb = b.input("x", *x)
    rb = b.output("ranks", *ranks)
    lead, i, j = _rows(b, x[1], x[1][-1])
    xi = b.load(xb, _idx(x[2], lead + [i]))
    xj = b.load(xb, _idx(x[2], lead + [j]))
    tie = b.logical_and(b.logical_or(b.eq(xj, xi), b.logical_and(b.isnan(xj), b.isnan(xi))),
                        b.lt(b.index_value(j), b.index_value(i)))
    first = b.logical_or(_before(b, xj, xi, descending), tie)
    b.store(rb, _idx(ranks[2], lead + [i]), b.reduce("sum", b.where(first, 1, 0), j))
    return b.build()


@functools.lru_cache(maxsize=1024)
def sort_select(x: Spec, ranks: Spec, values: Spec | None, indices: Spec | None, name: str = "sort_select",
                source: str = "library") -> Program:
    """The second half: ``values[..., p]`` / ``indices[..., p]`` = the entry whose rank is ``p``
    (exactly one per ``p``; a masked sum that adds only zeros besides it). Either output may be
    left out (Inductor makes one node per result)."""
    b = ProgramBuilder(name, source=source)
    xb = b.input("x", *x)
    rb = b.input("ranks", *ranks)
    vb = b.output("values", *values) if values is not None else None
    ib = b.output("indices", *indices) if indices is not None else None
    lead, p, i = _rows(b, x[1], x[1][-1])
    hit = b.eq(b.load(rb, _idx(ranks[2], lead + [i])), b.index_value(p))
    if vb is not None:
        zero = False if x[0] == torch.bool else 0
        v = b.reduce("sum", b.where(hit, b.load(xb, _idx(x[2], lead + [i])), zero), i)
        b.store(vb, _idx(values[2], lead + [p]), b.to(v, x[0]))
    if ib is not None:
        b.store(ib, _idx(indices[2], lead + [p]), b.reduce("sum", b.where(hit, b.index_value(i), 0), i))
    return b.build()


@functools.lru_cache(maxsize=1024)
def nonzero_ranks(x: Spec, ranks: Spec, name: str = "nonzero_rank", source: str = "library") -> Program:
    """The first half of ``nonzero`` over a flat ``x`` of ``n`` entries: ``ranks[i]`` = how many
    entries at positions ``<= i`` are nonzero (a masked count, O(n^2) work, ``n`` up to
    ``SCAN_MAX``). ``ranks[n - 1]`` is the result's length: the host reads it back (a sync, as
    CUDA's ``nonzero`` does) to size the result."""
    b = ProgramBuilder(name, source=source)
    xb = b.input("x", *x)
    rb = b.output("ranks", *ranks)
    i, j = b.dim("x0", x[1][0]), b.rdim("r0", x[1][0])
    hit = b.logical_and(b.ne(b.load(xb, _idx(x[2], [j])), 0), b.le(b.index_value(j), b.index_value(i)))
    b.store(rb, _idx(ranks[2], [i]), b.reduce("sum", b.where(hit, 1, 0), j))
    return b.build()


@functools.lru_cache(maxsize=1024)
def nonzero_select(x: Spec, ranks: Spec, out: Spec, shape: tuple, name: str = "nonzero_select",
                   source: str = "library") -> Program:
    """The second half: ``out[p, :]`` = the coordinates in ``shape`` (row-major) of the nonzero
    entry of rank ``p + 1`` (exactly one per ``p``: a masked sum of its flat position, then one
    floor-division and modulo per dim). ``out``'s rows (the count read back) may be a symbol."""
    b = ProgramBuilder(name, source=source)
    xb = b.input("x", *x)
    rb = b.input("ranks", *ranks)
    ob = b.output("out", *out)
    p, i = b.dim("x0", out[1][0]), b.rdim("r0", x[1][0])
    hit = b.logical_and(b.ne(b.load(xb, _idx(x[2], [i])), 0),
                        b.eq(b.load(rb, _idx(ranks[2], [i])), b.add(b.index_value(p), 1)))
    pos = b.reduce("sum", b.where(hit, b.index_value(i), 0), i)
    stride = 1
    for d in reversed(range(len(shape))):
        b.store(ob, _idx(out[2], [p]) + out[2][1] * d, b.mod(b.floordiv(pos, stride), shape[d]))
        stride *= shape[d]
    return b.build()


# ------------------------------------------------------------------------------ paged attention
# ``spyre::paged_attention`` (vspyre.runtime.paged): a step of vLLM's flattened batch attending over
# a paged KV cache. Two programs per call: ``kv_write`` (the step's keys and values into the cache),
# then ``paged_attention`` (the flash program reading the cache through the block table).

def paged_positions(query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                    tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequence, position) of every token of the step; padding tokens get sequence -1."""
    qsl = query_start_loc.to(torch.int64)
    t = torch.arange(tokens, device=qsl.device)
    seq = torch.searchsorted(qsl[1:], t, right=True)
    valid = t < qsl[-1]
    seq = torch.where(valid, seq, -1)
    s = seq.clamp(min=0).clamp(max=max(seq_lens.shape[0] - 1, 0))
    qlen = qsl[1:] - qsl[:-1]
    pos = seq_lens.to(torch.int64)[s] - qlen[s] + (t - qsl[:-1][s])
    return seq, torch.where(valid, pos, -1)


def paged_attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                 query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                 sliding_window: int = 0) -> torch.Tensor:
    """The attention half of ``spyre::paged_attention`` in plain torch, fp32: every token's query
    over its sequence's cached keys up to its own position (with ``sliding_window > 0`` only the
    last ``sliding_window``), the keys read through the block table; ``[tokens, heads, head_dim]``,
    0 for padding tokens. The op's CPU kernel (``vspyre.runtime.paged.reference``) is the cache
    write and this; fast mode runs it as the attention program's host form."""
    nb, bs, hkv, d = k_cache.shape
    T, hq, _ = q.shape
    g = hq // hkv
    out = torch.zeros(T, hq, v_cache.shape[-1], dtype=torch.float32, device=q.device)
    seq, pos = paged_positions(query_start_loc, seq_lens, T)
    kflat, vflat = k_cache.reshape(nb * bs, hkv, d), v_cache.reshape(nb * bs, hkv, v_cache.shape[-1])
    for s in range(block_table.shape[0]):
        toks = (seq == s).nonzero().flatten()
        n = int(seq_lens[s])
        if toks.numel() == 0 or n == 0:
            continue
        ks = torch.arange(n, device=q.device)
        rows = block_table[s].to(torch.int64)[ks // bs] * bs + ks % bs
        kk = kflat[rows].float().repeat_interleave(g, dim=1)            # [n, hq, d]
        vv = vflat[rows].float().repeat_interleave(g, dim=1)
        for part in toks.split(PAGED_HOST_ROWS):                       # the scores of a few query rows at a time
            qq = q[part].float()                                       # [m, hq, d]
            scores = torch.einsum("mhd,nhd->hmn", qq, kk) * scale
            p = pos[part][:, None]
            visible = ks[None, :] <= p
            if sliding_window > 0:
                visible &= ks[None, :] > p - sliding_window
            scores = scores.masked_fill(~visible[None], float("-inf"))
            out[part] = torch.einsum("hmn,nhd->mhd", torch.softmax(scores, dim=-1), vv)
    return out


PAGED_HOST_ROWS = 256    # query rows paged_attend scores at once (a long prefill's scores stay ~100 MB)


def paged_qmax(tokens: int, seqs: int, max_query_len: int = 0) -> int:
    """The query dim of the paged-attention program: the most tokens one sequence can have in a
    step of ``tokens`` tokens (padding included) and ``seqs`` sequences each with at least one,
    ``tokens - seqs + 1``: 1 for a decode batch, ``tokens`` for a single prefill, the chunk's
    length for one prefill chunk among decodes; or the caller's ``max_query_len`` if smaller (a
    static batch of prompts padded to one length). From shapes only (a program is built without
    reading values); the program checks on the card that no sequence has more."""
    q = max(1, tokens - seqs + 1)
    return min(q, max_query_len) if max_query_len > 0 else q


def _concrete(what: str, *sizes: Any) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in sizes)
    except TypeError:
        raise ValueError(f"{what}: built per shape; got symbolic sizes {sizes}") from None


def _paged_messages(qmax: int) -> dict[str, str]:
    """The device-side checks of the paged-attention program (its host form raises the same)."""
    op = "spyre::paged_attention"
    return {
        "ends": f"{op}: query_start_loc must start at 0 and end at most at the number of tokens",
        "order": f"{op}: query_start_loc must not decrease",
        "bound": f"{op}: a sequence has more tokens this step than T - S + 1 = {qmax} (the program's query bound "
                 "for T tokens and S sequences: give every padding sequence a padding token)",
        "len": f"{op}: a sequence's seq_len must be at least its tokens this step and at most the block "
               "table's max_blocks * block_size",
        "block": f"{op}: block_table names a block outside the cache",
    }


@functools.lru_cache(maxsize=1024)
def kv_write(new: Spec, slots: Spec, cache: Spec, new2: Spec | None = None, cache2: Spec | None = None,
             name: str = "kv_write", source: str = "library") -> Program:
    """``cache[slot[t], h, d] = new[t, h, d]`` for every token ``t`` with ``slot[t] >= 0`` (and the
    same from ``new2`` into ``cache2``: keys and values in one program). ``new`` is ``[T, H, D]``,
    ``cache`` ``[num_blocks, block_size, H, D]`` (slot = block * block_size + offset); a store with
    an indirect index, masked where the slot is negative (a padding token). A slot past the cache
    stops the kernel; two tokens with one slot are a race (checked mode reports the double write)."""
    pairs = [(new, cache)] + ([(new2, cache2)] if new2 is not None else [])
    T, H, D = _concrete(name, *new[1])
    NB, BS, Hc, Dc = _concrete(name, *cache[1])
    for nw, c in pairs:
        if tuple(nw[1]) != (T, H, D) or tuple(c[1]) != (NB, BS, H, D):
            raise ValueError(f"{name}: new {nw[1]} and cache {c[1]} must be [T, H, D] and [blocks, block_size, H, D] "
                             f"with T={T}, H={H}, D={D}, blocks={NB}, block_size={BS}")
    if len(slots[1]) != 1 or slots[1][0] != T or slots[0].is_floating_point or slots[0] == torch.bool:
        raise ValueError(f"{name}: slots must be [T={T}] integers, got {slots[1]} {slots[0]}")
    b = ProgramBuilder(name, source=source)
    refs = []
    for j, (nw, c) in enumerate(pairs):
        refs.append((b.input(f"new{j or ''}", *nw), nw))
    sb = b.input("slots", *slots)
    crefs = [(b.inout(f"cache{j or ''}", *c), c) for j, (_, c) in enumerate(pairs)]
    t, h, d = b.dim("x0", T), b.dim("x1", H), b.dim("x2", D)
    slot = b.load(sb, slots[2][0] * t)
    keep = b.ge(slot, 0)
    row = _checked_index(b, b.where(keep, slot, 0), NB * BS, "spyre::paged_attention: slot_mapping")
    for (nref, nw), (cref, c) in zip(refs, crefs):
        cs = c[2]
        if cs[0] == BS * cs[1]:               # blocks of whole rows: the slot is the row
            base = sym(row) * cs[1]
        else:
            base = sym(b.floordiv(row, BS)) * cs[0] + sym(b.mod(row, BS)) * cs[1]
        v = b.load(nref, _idx(nw[2], [t, h, d]))
        if nw[0] != c[0]:
            v = b.to(v, c[0])
        b.store(cref, base + cs[2] * h + cs[3] * d, v, mask=keep)
    return b.build()


@functools.lru_cache(maxsize=1024)
def paged_attention(q: Spec, k_cache: Spec, v_cache: Spec, block_table: Spec, query_start_loc: Spec,
                    seq_lens: Spec, out: Spec, scale: float, sliding_window: int = 0, max_query_len: int = 0,
                    name: str = "paged_attention",
                    source: str = "library") -> Program:
    """Attention of a step's tokens over a paged KV cache in ONE flash program (the caches already
    hold the step's keys and values: :func:`kv_write` runs first).

    ``q``/``out`` are ``[T, HQ, D]`` (tokens of all sequences, flattened), the caches ``[blocks,
    block_size, H, D]``, ``block_table`` ``[S, max_blocks]``, ``query_start_loc`` ``[S + 1]``,
    ``seq_lens`` ``[S]``. Iteration space: sequence ``s``, kv head ``h``, group ``g`` (query head
    ``h * G + g``, grouped-query attention as in :class:`_Batch`), query ``i`` of the sequence (up
    to ``paged_qmax(T, S)``), value dim ``e``; reductions: keys ``n`` (``N = max_blocks *
    block_size``, walked by the online softmax) and the head dim ``d``. Query ``i`` of sequence
    ``s`` is token ``query_start_loc[s] + i`` at position ``seq_lens[s] - q_len[s] + i``; key
    ``n`` is row ``block_table[s, n // block_size] * block_size + n % block_size`` of the cache (an
    indirect load that depends on ``(s, h, n, d)`` only: a sequence's keys are read once per kv
    head, shared by its queries and its query heads). Masked: query slots ``i >= q_len[s]``, keys
    past ``seq_lens[s]`` (not read), keys after the position or (``sliding_window > 0``) at or
    before ``position - sliding_window``.

    The output is written exactly once by construction: a query slot holds its token's result; the
    free slots (``i >= q_len[s]``), taken in order, write 0 to the padding tokens
    ``query_start_loc[S] ..`` (there are ``S * Qmax >= T`` slots). The program checks on the card
    that the batch fits that form (``query_start_loc`` from 0, not decreasing, ending within the
    tokens; ``q_len <= Qmax``, ``q_len <= seq_len <= N``; the block ids it reads inside the
    cache). Fast mode computes the same value with :func:`paged_attend` (``HOST_FORMS``)."""
    T, HQ, D = _concrete(name, *q[1])
    NB, BS, H, Dk = _concrete(name, *k_cache[1])
    E = _concrete(name, *v_cache[1])[3]
    S, MB = _concrete(name, *block_table[1])
    if Dk != D or tuple(v_cache[1][:3]) != (NB, BS, H) or HQ % H or tuple(out[1]) != (T, HQ, E):
        raise ValueError(f"{name}: shapes q {q[1]}, k_cache {k_cache[1]}, v_cache {v_cache[1]}, out {out[1]} do not "
                         "agree ([T, HQ, D], [blocks, block_size, H, D], [blocks, block_size, H, E], [T, HQ, E]; "
                         "HQ a multiple of H)")
    if tuple(query_start_loc[1]) != (S + 1,) or tuple(seq_lens[1]) != (S,) or S < 1:
        raise ValueError(f"{name}: block_table {block_table[1]}, query_start_loc {query_start_loc[1]}, seq_lens "
                         f"{seq_lens[1]}: one row, S + 1 starts and one length per sequence (S >= 1)")
    G, N, Q = HQ // H, MB * BS, paged_qmax(T, S, max_query_len)
    msg = _paged_messages(Q)
    b = ProgramBuilder(name, source=source)
    qb, kb, vb = b.input("q", *q), b.input("k_cache", *k_cache), b.input("v_cache", *v_cache)
    btb, qlb, slb = b.input("block_table", *block_table), b.input("query_start_loc", *query_start_loc), \
        b.input("seq_lens", *seq_lens)
    ob = b.output("out", *out)
    s, h, g, i, e = b.dim("x0", S), b.dim("x1", H), b.dim("x2", G), b.dim("x3", Q), b.dim("x4", E)
    n = b.rdim("r1", N)         # keys: walked in tiles by the online softmax (outer of the two)
    d = b.rdim("r0", D)         # head dim: the contraction of the scores (inner, whole)
    (ls,), (ss,) = query_start_loc[2], seq_lens[2]
    # the batch layout, checked on the card
    first, total = b.load(qlb, 0), b.load(qlb, ls * S)
    ends = b.device_assert(b.logical_and(b.eq(first, 0), b.le(total, T)), msg["ends"])
    total = b.where(ends, total, 0)
    start, end, seq_len = b.load(qlb, ls * s), b.load(qlb, ls * (s + 1)), b.load(slb, ss * s)
    qlen = b.sub(end, start)
    ok = b.logical_and(b.device_assert(b.ge(qlen, 0), msg["order"]), b.device_assert(b.le(qlen, Q), msg["bound"]))
    ok = b.logical_and(ok, b.device_assert(b.logical_and(b.le(qlen, seq_len), b.le(seq_len, N)), msg["len"]))
    qlen = b.where(ok, qlen, 0)
    iv = b.index_value(i)
    qmask = b.lt(iv, qlen)                                                   # (s, i): a real query
    head = h * G + g
    vq = b.load(qb, sym(start) * q[2][0] + i * q[2][0] + head * q[2][1] + d * q[2][2], mask=qmask, other=0.0)
    # the keys through the block table: row block_table[s, n // BS] * BS + n % BS
    nv = b.index_value(n)
    kvalid = b.lt(nv, seq_len)                                               # (s, n)
    blk = b.load(btb, block_table[2][0] * s + block_table[2][1] * FloorDiv(n, BS))
    inside = b.logical_and(b.ge(blk, 0), b.lt(blk, NB))
    bok = b.device_assert(b.logical_or(b.logical_not(kvalid), inside), msg["block"])
    blk = b.where(b.logical_and(bok, kvalid), blk, 0)
    off = ModularIndexing(n, 1, BS)
    ks, vs = k_cache[2], v_cache[2]
    vk = b.load(kb, sym(blk) * ks[0] + off * ks[1] + h * ks[2] + d * ks[3], mask=kvalid, other=0.0)
    sc = b.matmul(vq, vk, d)
    if scale != 1.0:
        sc = b.mul(sc, float(scale))
    pos = b.add(b.sub(seq_len, qlen), iv)                                    # (s, i)
    visible = b.le(nv, pos)
    if sliding_window > 0:
        visible = b.logical_and(visible, b.gt(nv, b.sub(pos, int(sliding_window))))
    sc = b.where(visible, sc, float("-inf"))
    vv = b.load(vb, sym(blk) * vs[0] + off * vs[1] + h * vs[2] + e * vs[3], mask=kvalid, other=0.0)
    y = b.softmax_matmul(sc, vv, n, zero_empty=True)
    # every slot writes one token: its query's result, or (a free slot) 0 to the next padding token
    tok = b.where(qmask, b.add(start, iv),
                  b.add(b.sub(total, end), b.index_value(s * Q + i)))
    os_ = out[2]
    b.store(ob, sym(tok) * os_[0] + head * os_[1] + e * os_[2], b.to(b.where(qmask, y, 0.0), out[0]),
            mask=b.lt(tok, T))
    return b.build(host=("paged_attention", float(scale), int(sliding_window), Q))


def _paged_host(p: Program, hosts: Any) -> None:
    """What ``paged_attention``'s program computes, with :func:`paged_attend` on the host (fp32, one
    rounding where it stores), after the same checks of the batch layout the program makes on the
    card. Fast mode runs this; checked mode runs the program tile by tile."""
    from .. import numerics
    from .ops import DeviceAssertError, host_value

    _, scale, window, qmax = p.meta["host"]
    q, kc, vc, bt, qsl, sl, out = hosts
    T, NB, BS = q.shape[0], kc.shape[0], kc.shape[1]
    msg = _paged_messages(qmax)
    qsl, sl, bt = host_value(qsl), host_value(sl), host_value(bt)
    qlen = qsl[1:] - qsl[:-1]

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise DeviceAssertError(f"program {p.name}: device-side assertion failed: {msg[what]}")

    need(int(qsl[0]) == 0 and int(qsl[-1]) <= T, "ends")
    need(bool((qlen >= 0).all()), "order")
    need(bool((qlen <= qmax).all()), "bound")
    need(bool(((qlen <= sl) & (sl <= bt.shape[1] * BS)).all()), "len")
    used = torch.arange(bt.shape[1] * BS)[None, :] < sl[:, None]
    blocks = bt.repeat_interleave(BS, dim=1)
    need(bool(((blocks >= 0) & (blocks < NB) | ~used).all()), "block")
    y = paged_attend(q, kc, vc, bt, qsl, sl, scale, window)
    out.copy_(numerics.store_cast(y, out.dtype))


HOST_FORMS["paged_attention"] = _paged_host


@functools.lru_cache(maxsize=1024)
def paged_attention_launches(q: Spec, k: Spec, v: Spec, k_cache: Spec, v_cache: Spec, slot_mapping: Spec,
                             block_table: Spec, query_start_loc: Spec, seq_lens: Spec, out: Spec, scale: float,
                             sliding_window: int = 0, max_query_len: int = 0,
                             source: str = "library") -> tuple[tuple[Program, tuple[int, ...]], ...]:
    """The programs of one ``spyre::paged_attention`` call in launch order, each with the positions
    of its tensors among ``(q, k, v, k_cache, v_cache, slot_mapping, block_table, query_start_loc,
    seq_lens, out)``: :func:`kv_write` (keys and values), then :func:`paged_attention`. Every path
    (eager kernels, the standalone compiler, the Inductor extension) launches these. A step
    without tokens launches nothing."""
    if _concrete("paged_attention", q[1][0])[0] == 0:
        return ()
    write = kv_write(k, slot_mapping, k_cache, v, v_cache, source=source)
    attend = paged_attention(q, k_cache, v_cache, block_table, query_start_loc, seq_lens, out, float(scale),
                             int(sliding_window), int(max_query_len), source=source)
    return (write, (1, 2, 5, 3, 4)), (attend, (0, 3, 4, 6, 7, 8, 9))
