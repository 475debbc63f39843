"""Accuracy against CPU fp32 eager, by the rules of PyTorch's dynamo benchmark runner.

The rules are PyTorch's own (``torch._dynamo.utils.same``), not a reimplementation:

* fp32 on the card: ``allclose`` with ``rtol = atol = 1e-3``;
* fp16/bf16 on the card: cosine similarity >= 0.999 (``same(..., cos_similarity=True)``) **and**
  the RMSE rule against an fp64 reference (``same(..., fp64_ref=...)``: the result's RMSE to
  the fp64 reference may be at most a multiplier times the fp32 eager result's RMSE to it).

:func:`compare` returns the verdict with the numbers, so a report can show why it failed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from ..compat import dynamo_same as same

_quiet = logging.getLogger("vspyre.accuracy.quiet")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


@dataclass
class Accuracy:
    ok: bool
    rule: str
    max_abs_err: float
    cosine: float
    rmse: float | None = None
    rmse_fp32: float | None = None

    def __str__(self) -> str:
        s = f"{'pass' if self.ok else 'FAIL'} ({self.rule}: max|err| {self.max_abs_err:.2e}, cosine {self.cosine:.6f}"
        if self.rmse is not None:
            s += f", rmse {self.rmse:.2e} vs fp32 {self.rmse_fp32:.2e}"
        return s + ")"


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.sqrt(torch.mean(torch.square(a.double() - b.double()))).item()


def compare(result: torch.Tensor, ref_fp32: torch.Tensor, ref_fp64: torch.Tensor | None = None,
            rtol: float = 1e-3) -> Accuracy:
    """Judge a card result (any dtype) against CPU fp32 eager (and fp64, for low precision)."""
    res = result.detach().cpu()
    ref = ref_fp32.detach().cpu()
    resf = res.float()
    err = (resf - ref.float()).abs().max().item() if res.numel() else 0.0
    cos = torch.nn.functional.cosine_similarity(resf.flatten().double(), ref.flatten().double(), dim=0,
                                                eps=1e-12).item() if res.numel() else 1.0
    if res.dtype in (torch.float16, torch.bfloat16):
        if ref_fp64 is None:
            raise ValueError("compare: a low-precision result needs the fp64 reference for the RMSE rule")
        cos_ok = same(ref.to(res.dtype), res, cos_similarity=True, log_error=_quiet.error)
        rmse_ok = same(ref.to(res.dtype), res, fp64_ref=ref_fp64.cpu(), tol=rtol, log_error=_quiet.error)
        return Accuracy(bool(cos_ok and rmse_ok), "cosine>=0.999 + RMSE vs fp64", err, cos,
                        _rmse(resf, ref_fp64.cpu()), _rmse(ref.float(), ref_fp64.cpu()))
    ok = torch.allclose(resf, ref.float(), rtol=rtol, atol=rtol) if res.dtype.is_floating_point else torch.equal(res, ref)
    return Accuracy(bool(ok), f"allclose {rtol:g}" if res.dtype.is_floating_point else "exact", err, cos)
