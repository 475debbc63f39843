"""Library programs: kernels every path builds the same way.

Some operations are one hand-written tile program whichever compiler asks for them, because no
fusion of smaller ops gives their form: attention is a *flash* program (the scores, the online
softmax and the product with ``v`` in one kernel; the scores never reach device memory; the keys
walked in tiles, or split over cores and finished over the ring when the queries are few). The
Inductor extension (a lowering of ``_scaled_dot_product_fused_attention_overrideable``) and the
standalone compiler (its SDPA ops and its attention fusion) both call :func:`attention`, so the
program, its plan and its cost are the same on both paths.

A tensor is described by a *spec* ``(dtype, shape, strides)``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .builder import ProgramBuilder
from .program import Program

__all__ = ["Spec", "attention", "spec_of"]

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
