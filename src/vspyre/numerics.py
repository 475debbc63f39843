"""Numerics of the card: IBM DLFloat16 emulation and the ``dl16`` / ``ieee`` setting.

The real card computes fp16 as DLFloat16 (1 sign bit, 6 exponent bits with bias 31, 9 mantissa
bits, no subnormals). vspyre stores fp16 tensors in IEEE fp16 containers (torch.float16), so the
emulation is applied *where a device kernel writes fp16 values to device memory*:

* the value is computed in fp32 (kernels accumulate in fp32),
* its mantissa is rounded to 9 bits, round-to-nearest-even (this is DL16's precision),
* values below DL16's smallest normal (2**-31) flush to signed zero (DL16 has no subnormals),
* the result is stored as IEEE fp16. A 9-bit mantissa fits a 10-bit one exactly, so the store
  adds no second rounding for values in fp16's normal range.

What this leaves out, on purpose: DL16's exponent range (about 2**-31 .. 2**33) is wider than IEEE
fp16's (6.1e-5 .. 65504); the container limits it, so an fp16 value that would overflow to inf in
IEEE fp16 also does here, while the real card would keep it. Values in fp16's subnormal range keep
the container's (coarser) precision.

With ``numerics = "ieee"`` the rounding is skipped: fp16 is plain IEEE fp16 (round to nearest).
"""

from __future__ import annotations

import torch

from . import hardware

_DL16_DROPPED_BITS = 23 - 9          # fp32 has 23 mantissa bits, DL16 keeps 9
_DL16_MIN_NORMAL = 2.0 ** -31
_ROUND_HALF = (1 << (_DL16_DROPPED_BITS - 1)) - 1
_KEEP_MASK = ~((1 << _DL16_DROPPED_BITS) - 1)


def _round_mantissa_(f: torch.Tensor) -> torch.Tensor:
    """Round an fp32 tensor (owned by the caller) to 9 mantissa bits in place, RNE.

    Integer arithmetic on the bit pattern: add half an ulp of the kept precision (plus the kept
    lsb, for ties to even), then clear the dropped bits. A carry into the exponent is the correct
    rounding up. NaNs are restored afterwards (a NaN payload could carry into the sign bit).
    """
    nan = torch.isnan(f)
    bits = f.view(torch.int32)
    lsb = bits >> _DL16_DROPPED_BITS
    lsb &= 1
    bits += lsb
    bits += _ROUND_HALF
    bits &= _KEEP_MASK
    return f.masked_fill_(nan, float("nan"))


def round_to_dl16(x: torch.Tensor) -> torch.Tensor:
    """Round float values to DLFloat16 precision; returns fp32 (exactly representable in DL16)."""
    out = _round_mantissa_(x.detach().to(torch.float32, copy=True))
    tiny = out.abs() < _DL16_MIN_NORMAL
    return out.masked_fill_(tiny & (out != 0), 0.0).copysign_(x.detach().to(torch.float32))


def current() -> str:
    """The active numerics setting: ``"dl16"`` or ``"ieee"``."""
    return hardware.get_config().numerics


def store_cast(value: torch.Tensor, dtype: torch.dtype, numerics: str | None = None) -> torch.Tensor:
    """Convert a kernel's (fp32) result to the dtype of the device buffer it is written to.

    This is *the* hook: every device kernel passes the values it writes to device memory
    through here, so the numerics setting is honoured in one place.
    """
    mode = numerics or current()
    if dtype == torch.float16 and mode == "dl16":
        # DL16's smallest normal (2**-31) lies below fp16's smallest subnormal (2**-24), so the
        # flush to zero of round_to_dl16 is implied by the fp16 container: skip it here.
        return _round_mantissa_(value.detach().to(torch.float32, copy=True)).to(torch.float16)
    return value.to(dtype)
