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

A tensor is described by a *spec* ``(dtype, shape, strides)``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .builder import ProgramBuilder
from .program import Program

__all__ = ["Spec", "attention", "conv", "spec_of"]

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
    from .indexing import FloorDiv, ModularIndexing

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
    return b.build()
