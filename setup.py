"""Builds the device's C++ part (allocator, guard, hooks, core kernels) against the installed torch.

Install with ``pip install --no-build-isolation`` so the build uses the environment's torch.
"""
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    ext_modules=[
        CppExtension(
            "vspyre.device._C",
            ["src/vspyre/device/csrc/spyre.cpp"],
            extra_compile_args=["-O2", "-std=c++17"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
