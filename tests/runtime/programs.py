"""Hand-written tile programs the runtime tests use (each with a CPU reference)."""

from __future__ import annotations

import torch

from vspyre.ir import ProgramBuilder


def elementwise(dtype=torch.float16, n="s0", m=256, **sched):
    """y = gelu-ish(x * w + 1): sigmoid(1.702 * t) * t with t = x * w + 1 (w broadcast per column)."""
    b = ProgramBuilder("elementwise", source="test")
    x = b.input("x", dtype, (n, m))
    w = b.input("w", dtype, (m,))
    y = b.output("y", dtype, (n, m))
    i, j = b.dim("x0", n), b.dim("x1", m)
    t = b.add(b.mul(b.load(x, x.index(i, j)), b.load(w, j)), 1.0)
    b.store(y, y.index(i, j), b.mul(b.sigmoid(b.mul(t, 1.702)), t))
    _sched(b, sched)
    return b.build(), lambda x, w: (lambda t: torch.sigmoid(1.702 * t) * t)(x.float() * w.float() + 1)


def row_sum(dtype=torch.float32, n="n", m="m", ring=True, **sched):
    b = ProgramBuilder("row_sum", source="test")
    x = b.input("x", dtype, (n, m))
    y = b.output("y", dtype, (n,))
    i, r = b.dim("x0", n), b.rdim("r0", m)
    s = b.reduce("sum", b.load(x, x.index(i, r)), r)
    b.store(y, i, s)
    _sched(b, sched)
    return b.build(ring=ring), lambda x: x.float().sum(1)


def col_max(dtype=torch.float32, n="n", m="m", **sched):
    """Column reduction: y[j] = max_i x[i, j] (reduction dim is not the stick dim)."""
    b = ProgramBuilder("col_max", source="test")
    x = b.input("x", dtype, (n, m))
    y = b.output("y", dtype, (m,))
    j, r = b.dim("x0", m), b.rdim("r0", n)
    b.store(y, j, b.reduce("max", b.load(x, x.index(r, j)), r))
    _sched(b, sched)
    return b.build(), lambda x: x.float().amax(0)


def matmul_bias_relu(dtype=torch.float16, M="M", N="N", K="K", **sched):
    """y = relu(a @ b + bias) with the matmul on the systolic array and a fused epilogue."""
    bl = ProgramBuilder("mm_bias_relu", source="test")
    a = bl.input("a", dtype, (M, K))
    bb = bl.input("b", dtype, (K, N))
    bias = bl.input("bias", dtype, (N,))
    y = bl.output("y", dtype, (M, N))
    m, n, k = bl.dim("x0", M), bl.dim("x1", N), bl.rdim("r0", K)
    acc = bl.matmul(bl.load(a, a.index(m, k)), bl.load(bb, bb.index(k, n)), k)
    out = bl.relu(bl.add(acc, bl.load(bias, n)))
    bl.store(y, y.index(m, n), out)
    _sched(bl, sched)
    return bl.build(), lambda a, b, bias: torch.relu(a.float() @ b.float() + bias.float())


def splitk_matmul(dtype=torch.float32, M=16, N=64, K=512, parts=4, **sched):
    """y = a @ b with K split over ``parts`` cores; partials summed over the ring."""
    bl = ProgramBuilder("splitk_mm", source="test")
    a = bl.input("a", dtype, (M, K))
    bb = bl.input("b", dtype, (K, N))
    y = bl.output("y", dtype, (M, N))
    m, n, k = bl.dim("x0", M), bl.dim("x1", N), bl.rdim("r0", K)
    part = bl.matmul(bl.load(a, a.index(m, k)), bl.load(bb, bb.index(k, n)), k)
    bl.store(y, y.index(m, n), bl.ring_reduce("sum", part, k))
    bl.divide(("r0", parts))
    _sched(bl, sched)
    return bl.build(), lambda a, b: a.float() @ b.float()


def softmax(dtype=torch.float16, n="n", m=128, **sched):
    b = ProgramBuilder("softmax", source="test")
    x = b.input("x", dtype, (n, m))
    y = b.output("y", dtype, (n, m))
    i, r = b.dim("x0", n), b.rdim("r0", m)
    v = b.load(x, x.index(i, r))
    mx = b.reduce("max", v, r)
    e = b.exp(b.sub(v, mx))
    s = b.reduce("sum", e, r)
    b.store(y, y.index(i, r), b.truediv(e, s))
    _sched(b, sched)
    return b.build(), lambda x: torch.softmax(x.float(), -1)


def layernorm(dtype=torch.float16, n="n", m=192, eps=1e-5, **sched):
    b = ProgramBuilder("layernorm", source="test")
    x = b.input("x", dtype, (n, m))
    w = b.input("w", dtype, (m,))
    bias = b.input("bias", dtype, (m,))
    y = b.output("y", dtype, (n, m))
    i, r = b.dim("x0", n), b.rdim("r0", m)
    v = b.load(x, x.index(i, r))
    mean = b.truediv(b.reduce("sum", v, r), float(m))
    d = b.sub(v, mean)
    var = b.truediv(b.reduce("sum", b.mul(d, d), r), float(m))
    out = b.add(b.mul(b.mul(d, b.rsqrt(b.add(var, eps))), b.load(w, r)), b.load(bias, r))
    b.store(y, y.index(i, r), out)
    _sched(b, sched)
    return b.build(), lambda x, w, bias: torch.nn.functional.layer_norm(x.float(), (m,), w.float(), bias.float(), eps)


def _sched(b: ProgramBuilder, sched: dict) -> None:
    if "divide" in sched:
        b.divide(*sched["divide"])
    if "tile" in sched:
        b.tile(**sched["tile"])
