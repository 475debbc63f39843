"""Builds the device's C++ part (allocator, guard, hooks, core kernels) against the installed torch.

Install with ``pip install --no-build-isolation`` so the build uses the environment's torch. The
module is named for the torch release (``vspyre.device._C_2_15_0``, see ``_extname.py``), and the
C++ standard is the one torch's build helper picks for that release (2.14+ headers need C++20).
"""
import os
import runpy

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")   # do not load a stale vspyre build

import torch  # noqa: E402
from setuptools import setup  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CppExtension  # noqa: E402

_ext = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "src", "vspyre", "device", "_extname.py"))
_ext["check_supported"](torch.__version__)

setup(
    ext_modules=[
        CppExtension(
            "vspyre.device." + _ext["ext_name"](torch.__version__),
            ["src/vspyre/device/csrc/spyre.cpp"],
            extra_compile_args=["-O2"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
