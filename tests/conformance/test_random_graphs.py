"""Random small programs (issue #7): pointwise, reduction, view, indexing and matmul ops on random
shapes (odd sizes that do not fill a 128-byte stick included), compiled on the card by both
compilers (the default Inductor backend and the standalone compiler) vs eager on the CPU.

A program is a list of steps ``(op, param)`` applied to a running tensor ``x``; matmul steps take
a weight input. Hypothesis shrinks a failing program to a short list of steps, which is printed
and can be pasted into ``REGRESSIONS`` below.

Tolerance: float32 with rtol=1e-4, atol=1e-5 (assert_close's float32 rtol is 1.3e-6; a compiled
kernel may sum a reduction or a matmul in another order than the CPU, and exp/tanh amplify it).
"""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

RTOL, ATOL = 1e-4, 1e-5
SIZES = [1, 2, 3, 5, 7, 17, 31, 33, 65]       # 32 fp32 values fill a stick: most do not

POINTWISE = ["relu", "sigmoid", "tanh", "neg", "abs", "sin", "affine", "square_tanh"]
REDUCTIONS = ["sum_sub", "amax_sub", "mean", "softmax"]
VIEWS = ["transpose", "flatten_unflatten", "unsqueeze_squeeze"]
INDEXING = ["slice_step2", "narrow", "flip", "index_select"]


def _apply(x: torch.Tensor, step, weights):
    op, p = step
    if op == "relu":
        return torch.relu(x)
    if op == "sigmoid":
        return torch.sigmoid(x)
    if op == "tanh":
        return torch.tanh(x)
    if op == "neg":
        return -x
    if op == "abs":
        return x.abs()
    if op == "sin":
        return torch.sin(x)
    if op == "affine":
        return x * 0.5 + 1.25
    if op == "square_tanh":
        return torch.tanh(x * x)
    if op == "sum_sub":                       # reduction broadcast back (keepdim)
        return x - x.sum(p, keepdim=True) / x.shape[p]
    if op == "amax_sub":
        return x - x.amax(p, keepdim=True)
    if op == "mean":                          # reduces a dimension (rank drops, stays >= 1)
        return x.mean(p)
    if op == "softmax":
        return torch.softmax(x, p)
    if op == "transpose":
        return x.transpose(0, -1)
    if op == "flatten_unflatten":
        return x.flatten().unflatten(0, x.shape).contiguous() * 1.0
    if op == "unsqueeze_squeeze":
        return (x.unsqueeze(0) + 1.0).squeeze(0)
    if op == "slice_step2":
        return x.narrow(p, 0, x.shape[p])[(slice(None),) * p + (slice(None, None, 2),)]
    if op == "narrow":
        return x.narrow(p, 1, x.shape[p] - 1)
    if op == "flip":
        return x.flip(p)
    if op == "index_select":
        idx = weights[p[1]]
        return x.index_select(p[0], idx)
    if op == "matmul":
        w = weights[p]
        return (x @ w) / math.sqrt(w.shape[0])
    raise AssertionError(op)


def run_program(x, weights, steps):
    for s in steps:
        x = _apply(x, s, weights)
    return x


@st.composite
def programs(draw):
    """(shape, steps, weight specs): weight spec ("w", (k, n)) or ("idx", (dim size, count))."""
    rank = draw(st.integers(1, 3))
    shape = [draw(st.sampled_from(SIZES)) for _ in range(rank)]
    start = tuple(shape)
    steps, wspecs = [], []
    for _ in range(draw(st.integers(1, 5))):
        fam = draw(st.sampled_from(["pointwise", "reduction", "view", "indexing", "matmul"]))
        r = len(shape)
        if fam == "pointwise":
            steps.append((draw(st.sampled_from(POINTWISE)), None))
        elif fam == "reduction":
            op = draw(st.sampled_from(REDUCTIONS))
            d = draw(st.integers(0, r - 1))
            if op == "mean":
                if r == 1:
                    continue
                shape.pop(d)
            steps.append((op, d))
        elif fam == "view":
            op = draw(st.sampled_from(VIEWS))
            if op == "transpose":
                shape[0], shape[-1] = shape[-1], shape[0]
            steps.append((op, None))
        elif fam == "indexing":
            op = draw(st.sampled_from(INDEXING))
            d = draw(st.integers(0, r - 1))
            if op == "slice_step2":
                shape[d] = (shape[d] + 1) // 2
                steps.append((op, d))
            elif op == "narrow":
                if shape[d] < 2:
                    continue
                shape[d] -= 1
                steps.append((op, d))
            elif op == "flip":
                steps.append((op, d))
            else:
                count = draw(st.sampled_from(SIZES))
                wspecs.append(("idx", (shape[d], count)))
                shape[d] = count
                steps.append((op, (d, len(wspecs) - 1)))
        else:
            n = draw(st.sampled_from(SIZES))
            wspecs.append(("w", (shape[-1], n)))
            shape[-1] = n
            steps.append(("matmul", len(wspecs) - 1))
    seed = draw(st.integers(0, 2**16))
    return start, steps, wspecs, seed


def _inputs(start, wspecs, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(start, generator=g)
    weights = []
    for kind, (a, b) in wspecs:
        if kind == "w":
            weights.append(torch.randn(a, b, generator=g))
        else:
            weights.append(torch.randint(0, a, (b,), generator=g))
    return x, weights


BACKENDS = ("inductor", "spyre_standalone")


def check_program(start, steps, wspecs, seed, backend="inductor"):
    x, weights = _inputs(start, wspecs, seed)
    expected = run_program(x, weights, steps)
    torch._dynamo.reset()
    fn = torch.compile(lambda x, ws: run_program(x, ws, steps), backend=backend, dynamic=False)
    actual = fn(x.to("spyre"), [w.to("spyre") for w in weights])
    assert actual.device.type == "spyre"
    torch.testing.assert_close(actual.cpu(), expected, rtol=RTOL, atol=ATOL, check_stride=False,
                               msg=lambda m: f"{backend}: {steps} on {start}: {m}")


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(prog=programs())
def test_random_program_compiled_matches_cpu(backend, prog):
    start, steps, wspecs, seed = prog
    check_program(start, steps, wspecs, seed, backend)


# Shrunk failures found by the test above, kept as regression tests. Each entry:
# (start shape, steps, weight specs, seed, xfail reason or None).
REGRESSIONS = [
    # a stick-straddling shape through every family once: passes today, kept as a guard
    ((5, 33), [("amax_sub", 1), ("matmul", 0), ("flip", 0), ("slice_step2", 1), ("tanh", None)],
     [("w", (33, 7))], 0, None),
    # found by the random-graph test (non-derandomized run, 40 examples), shrunk by hypothesis:
    # x[1] @ w[1,1] raised TypeError (_DotOperands) in the executor: a length-1 contraction is a
    # pointwise ops.dot, now the product itself (vspyre.inductor.kernel._SpyreCSEProxy.dot)
    ((1,), [("matmul", 0)], [("w", (1, 1))], 0, None),
]


def _regression_params():
    for start, steps, wspecs, seed, reason in REGRESSIONS:
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        yield pytest.param(start, steps, wspecs, seed, marks=marks)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("start,steps,wspecs,seed", list(_regression_params()))
def test_random_program_regressions(start, steps, wspecs, seed, backend):
    check_program(start, steps, wspecs, seed, backend)
