"""Ops accelerators run in a dtype the CPU has no kernel for (OpInfo: the CUDA dtypes minus the CPU
dtypes, among the card's) run on the card: through a device kernel, or through the host fallback's
bridge (computed in a dtype the CPU has, cast back to the dtype the op gives). Found by this list:
half-precision avg_pool3d, anti-aliased upsampling, margin losses and rrelu (an in-place noise
argument), abs/softsign/trace of bools, integer histc."""

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

from vspyre.hardware import card_dtypes

# complex results (fft, stft) and sparse layouts: the card holds neither (a clear error on every path);
# the fused attention kernels: CUDA's own
SKIP = ("fft.", "stft", "istft", "sparse.", "to_sparse", "torch.ops.aten._flash_attention_forward",
        "torch.ops.aten._efficient_attention_forward")


def _gaps():
    out = []
    card = set(card_dtypes())
    for op in op_db:
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        if name.startswith(SKIP):
            continue
        for d in sorted((set(op.supported_dtypes("cuda")) - set(op.supported_dtypes("cpu"))) & card, key=str):
            out.append(pytest.param(op, d, id=f"{name}-{str(d).removeprefix('torch.')}"))
    return out


def _to(x, dev):
    if isinstance(x, torch.Tensor):
        return x.to(dev)
    if isinstance(x, (list, tuple)):
        return type(x)(_to(y, dev) for y in x)
    return x


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


@pytest.mark.parametrize("op,dtype", _gaps())
def test_an_accelerator_dtype_the_cpu_lacks_runs_on_the_card(op, dtype):
    wide = torch.float32 if dtype.is_floating_point else (torch.int64 if dtype == torch.bool else torch.float64)

    def widen(x):
        return x.to(wide) if isinstance(x, torch.Tensor) and x.dtype == dtype else x
    ran = 0
    for s in list(op.sample_inputs("cpu", dtype))[:3]:
        torch.manual_seed(0)
        got = _first(op(_to(s.input, "spyre"), *_to(s.args, "spyre"), **{k: _to(v, "spyre") for k, v in s.kwargs.items()}))
        torch.manual_seed(0)
        try:
            ref = _first(op(widen(s.input), *[widen(a) for a in s.args], **{k: widen(v) for k, v in s.kwargs.items()}))
        except NotImplementedError:       # no CPU kernel even in the wide dtype (integer histc): checked below
            assert got.device.type == "spyre"
            ran += 1
            continue
        ref = ref.to(got.dtype)
        tol = {torch.float16: 1e-2, torch.bfloat16: 1e-2, torch.float32: 1e-5}.get(dtype, 0)
        tol = {"rtol": tol, "atol": tol}
        torch.testing.assert_close(got.cpu(), ref, equal_nan=True, **tol)
        ran += 1
    assert ran


def test_independent_references_for_the_bool_gaps():
    b = torch.tensor([[True, False, True], [False, True, True], [True, True, False]])
    assert torch.equal(torch.abs(b.to("spyre")).cpu(), b)                  # a bool is its own |b|
    t = torch.trace(b.to("spyre"))
    assert t.dtype == torch.int64 and int(t) == 2                          # as on accelerators
    x = torch.randn(1, 2, 4, 4, 4, dtype=torch.float16)
    got = torch.nn.functional.avg_pool3d(x.to("spyre"), 2).cpu()
    assert got.dtype == torch.float16
    torch.testing.assert_close(got, torch.nn.functional.avg_pool3d(x.float(), 2).half())
