"""The backend's post-grad pass hook; its uuid puts the backend's code into the FX cache key."""

from __future__ import annotations

import torch
from ..compat import CustomGraphModulePass


class SpyreGraphPass(CustomGraphModulePass):
    def __call__(self, gm: torch.fx.GraphModule) -> None:
        # custom ops of libraries imported after the card registered (transformers' grouped
        # matmul) get their library lowerings before this graph is lowered
        from .lowering import register_custom_library_ops
        register_custom_library_ops()
        return None

    def uuid(self) -> str:
        from . import backend_version

        return "vspyre-inductor-" + backend_version()
