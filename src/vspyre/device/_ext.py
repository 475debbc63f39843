"""The device's C++ extension built for the installed torch release (see ``_extname``)."""

from __future__ import annotations

import importlib

import torch

from ._extname import check_supported, ext_name

check_supported(torch.__version__)
try:
    _C = importlib.import_module(f"{__package__}.{ext_name(torch.__version__)}")
except ImportError as e:
    raise ImportError(
        f"vspyre: the device's C++ part is not built for torch {torch.__version__} "
        f"(no module vspyre.device.{ext_name(torch.__version__)}); reinstall vspyre in this environment: "
        f"pip install --no-build-isolation -e . (or make install TORCH=...)") from e
