"""The op registry's semantics at the edges, op by op, against torch on the CPU.

Every vector op of ``vspyre.ir.ops.OPS`` runs as a one-op tile program (load, the op, store in the
result dtype the registry's rule gives) over every pair of edge values: nan, +-inf, +-0, +-1,
values that overflow fp32 and fp16 and int32, denormals. The result must have torch's dtype and
torch's value (nan where torch gives nan). A new registry op is covered here without a new test.
"""

import math

import pytest
import torch

from vspyre import runtime
from vspyre.ir import ProgramBuilder
from vspyre.ir.ops import OPS, result_dtype

# what each registry op means in torch's words, where its name is not torch's
REFERENCE = {
    "truediv": torch.true_divide, "div_rn": torch.true_divide,
    "floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "truncdiv": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "mod": torch.remainder, "fmaximum": torch.fmax, "fminimum": torch.fmin,
    "fma": lambda a, b, c: torch.addcmul(c, a, b), "identity": lambda a: a.clone(),
}
NOT_HERE = {"device_assert": "raises by design (tests/ir/test_library.py)", "to": "a cast, its dtype explicit"}

FLOATS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0e38, -3.0e38, 1.0e-40, 65504.0,
          70000.0, 88.8, 1e-7]
INTS = [0, 1, -1, 2, -7, 31, 2**31 - 1, -2**31]
BOOLS = [False, True]

VECTOR_OPS = sorted(n for n, d in OPS.items() if d.unit == "vector" and d.arity and n not in NOT_HERE
                    and n not in ("index",))


def _reference(name):
    return REFERENCE.get(name) or getattr(torch, name, None) or getattr(torch.special, name)


def _grid(values, arity, dtype):
    cols = torch.cartesian_prod(*[torch.arange(len(values))] * arity).reshape(-1, arity)
    v = torch.tensor(values, dtype=torch.float64 if dtype.is_floating_point else torch.int64)
    return [v[cols[:, k]].to(dtype) for k in range(arity)]


def _run(name, args, mode, out_dtype):
    """The op as the card runs it: a tile program computing in the registry's dtype, storing into
    ``out_dtype`` (as the compilers do: the traced graph's dtype)."""
    n = args[0].numel()
    b = ProgramBuilder(f"registry_{name}", source="test")
    ins = [b.input(f"a{k}", a.dtype, (n,)) for k, a in enumerate(args)]
    y = b.output("y", out_dtype, (n,))
    i = b.dim("x0", n)
    b.store(y, i, b.compute(name, *[b.load(t, i) for t in ins]))
    out = torch.empty(n, dtype=out_dtype)
    runtime.launch(b.build(), *args, out, mode=mode)
    return out


def _cases(name):
    arity = OPS[name].arity
    if name == "where":
        c, a, b = _grid(BOOLS, 1, torch.bool)[0], *_grid(FLOATS[:8], 2, torch.float32)
        c = c.repeat_interleave(a.numel())
        return [("float32", [c, a.repeat(2), b.repeat(2)])]
    out = []
    for dname, values, dtype in [("float32", FLOATS, torch.float32), ("float16", FLOATS, torch.float16),
                                 ("int32", INTS, torch.int32), ("bool", BOOLS, torch.bool)]:
        if name.startswith("bitwise") and dtype.is_floating_point:
            continue
        if name in ("bitwise_left_shift", "bitwise_right_shift"):
            if dtype == torch.bool:
                continue
            a, b = _grid(values, 2, dtype)
            out.append((dname, [a, b.abs().clamp(max=30)]))      # shifts past the width are undefined in C
            continue
        out.append((dname, _grid(values if arity < 3 else values[:6], arity, dtype)))
    return out


def _torch_accepts(ref, args):
    try:
        return ref(*args)
    except (RuntimeError, TypeError, NotImplementedError):
        return None


@pytest.mark.parametrize("mode", ["fast", "checked"])
@pytest.mark.parametrize("name", VECTOR_OPS)
def test_registry_op_matches_torch_at_the_edges(name, mode):
    ref_fn = _reference(name)
    prev = torch.spyre.set_numerics("ieee")      # fp16 stores round to nearest, as torch's do
    try:
        checked = 0
        for dname, args in _cases(name):
            want = _torch_accepts(ref_fn, args)
            if want is None:                     # torch has no such kernel for this dtype (erf of bool...)
                continue
            # the registry's result kind is torch's: the same float dtype, or bool, or an integer
            # (integers compute in int64 registers; the store narrows to the graph's dtype)
            typed = result_dtype(name, [a.dtype for a in args])
            assert (typed == want.dtype if want.is_floating_point() or want.dtype == torch.bool else
                    typed == torch.int64), f"{name}({dname}): the registry types it {typed}, torch {want.dtype}"
            got = _run(name, args, mode, want.dtype)
            if want.dtype == torch.float16 and not OPS[name].exact_width:
                # the card computes in fp32 and rounds once, at the store (torch's CPU fp16 kernels
                # may round in between, or flush fp16 subnormals)
                want = ref_fn(*[a.float() if a.is_floating_point() else a for a in args]).to(want.dtype)
            if want.is_floating_point():
                # transcendentals: the card's fp32 against torch's kernel for this dtype
                tol = 0 if not OPS[name].transcendental else (2e-6 if want.dtype == torch.float32 else 1e-3)
                close = torch.isclose(got.double(), want.double(), rtol=tol, atol=0, equal_nan=True)
                # fp16 transcendentals: torch computes some in fp16 steps; 1 ulp either way
                if want.dtype == torch.float16 and OPS[name].transcendental:
                    ulp = torch.finfo(torch.float16).eps * want.double().abs().clamp(min=6.1e-5)
                    close |= (got.double() - want.double()).abs() <= ulp
                bad = ~close
            else:
                bad = got != want
            if bad.any():
                k = int(bad.nonzero()[0])
                where = ", ".join(str(a[k].item()) for a in args)
                raise AssertionError(f"{name}({where}) [{dname}]: card {got[k].item()}, torch {want[k].item()} "
                                     f"({int(bad.sum())} of {bad.numel()} differ)")
            checked += 1
        assert checked, f"{name}: torch accepted none of the dtypes tried"
    finally:
        torch.spyre.set_numerics(prev)


REDUCTION_REFERENCE = {
    "sum": lambda x: x.sum(1), "prod": lambda x: x.prod(1), "max": lambda x: x.amax(1), "min": lambda x: x.amin(1),
    "any": lambda x: x.any(1), "argmax": lambda x: x.argmax(1), "argmin": lambda x: x.argmin(1),
    # max ignoring NaN: NaN only where the whole row is
    "fmax": lambda x: torch.where(x.isnan().all(1), torch.nan, x.nan_to_num(nan=-math.inf, posinf=math.inf, neginf=-math.inf).amax(1)
                                  ) if x.is_floating_point() else x.amax(1),
}


def _rows(values, dtype, cols=24):
    """Rows of edge values: random draws, then each value alone in a row of ones and a row of it."""
    g = torch.Generator().manual_seed(0)
    v = torch.tensor(values, dtype=torch.float64 if dtype.is_floating_point else torch.int64)
    draws = v[torch.randint(len(values), (12, cols), generator=g)]
    alone = torch.ones(len(values), cols, dtype=v.dtype)
    alone[:, 5] = v
    return torch.cat([draws, alone, v[:, None].expand(-1, cols)]).to(dtype)


@pytest.mark.parametrize("mode", ["fast", "checked"])
@pytest.mark.parametrize("name", sorted(REDUCTION_REFERENCE))
def test_registry_reduction_matches_torch_at_the_edges(name, mode):
    """Each reduction of ``REDUCTIONS`` over rows of edge values, split across cores by the planner
    (checked mode proves the ring combine), against torch's reduction of the same dtype."""
    from vspyre.ir.program import REDUCTIONS
    assert set(REDUCTIONS) == set(REDUCTION_REFERENCE)
    prev = torch.spyre.set_numerics("ieee")
    try:
        for dtype, values in [(torch.float32, FLOATS), (torch.float16, FLOATS), (torch.int32, INTS[:6]),
                              (torch.bool, BOOLS)]:
            x = _rows(values, dtype)
            want = _torch_accepts(REDUCTION_REFERENCE[name], [x])
            if want is None:
                continue
            if dtype == torch.float16 and name in ("sum", "prod"):   # the card accumulates in fp32
                want = REDUCTION_REFERENCE[name](x.float()).to(want.dtype)
            b = ProgramBuilder(f"reduce_{name}", source="test")
            xi = b.input("x", dtype, tuple(x.shape))
            y = b.output("y", want.dtype, (x.shape[0],))
            i, r = b.dim("x0", x.shape[0]), b.rdim("r0", x.shape[1])
            b.store(y, i, b.reduce(name, b.load(xi, xi.index(i, r)), r))
            got = torch.empty_like(want)
            runtime.launch(b.build(), x, got, mode=mode)
            if name in ("argmax", "argmin") and dtype.is_floating_point:
                # ties (several maxima) may pick any of them: the chosen element must be an extreme
                got, want = x.gather(1, got[:, None])[:, 0], x.gather(1, want[:, None])[:, 0]
            same = torch.isclose(got.double(), want.double(), rtol=1e-6, atol=0, equal_nan=True) \
                if want.is_floating_point() else got == want
            assert bool(same.all()), f"{name} [{dtype}] rows {same.logical_not().nonzero()[:, 0].tolist()}: " \
                                     f"card {got[~same].tolist()} torch {want[~same].tolist()}"
    finally:
        torch.spyre.set_numerics(prev)


def test_every_vector_op_is_covered_or_excused():
    vector = {n for n, d in OPS.items() if d.unit == "vector"}
    reductions = {"reduce." + n for n in REDUCTION_REFERENCE}
    assert vector - set(VECTOR_OPS) - set(NOT_HERE) - reductions == {"index"}, "an op without an edge-value test"
