"""Which build of the device's C++ part belongs to the installed torch.

The C++ part links against one torch release's ABI. Each release gets its own module name
(``_C_2_13_0``, ``_C_2_15_0``), so environments with different torch releases can share one
editable source tree without loading each other's build. ``setup.py`` reads this file directly
(it must not import vspyre, which needs the build).
"""

from __future__ import annotations

SUPPORTED = ((2, 13), (2, 16))          # torch >= 2.13, < 2.16 (also in pyproject.toml)


def torch_release(version: str) -> tuple[int, int, int]:
    """``2.15.0+cu132`` -> (2, 15, 0): the release, without the local build tag."""
    parts = version.split("+")[0].split(".")
    nums = []
    for p in parts[:3]:
        digits = "".join(ch for ch in p if ch.isdigit()) or "0"
        nums.append(int(digits))
    while len(nums) < 3:
        nums.append(0)
    return tuple(nums)  # type: ignore[return-value]


def ext_name(version: str) -> str:
    return "_C_{}_{}_{}".format(*torch_release(version))


def check_supported(version: str) -> None:
    lo, hi = SUPPORTED
    if not (lo <= torch_release(version)[:2] < hi):
        raise ImportError(
            f"vspyre supports torch >={lo[0]}.{lo[1]},<{hi[0]}.{hi[1]}; the installed torch is {version}. "
            f"Install a supported release (e.g. pip install torch==2.13.0) or a vspyre that supports {version}.")
