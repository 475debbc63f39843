"""Every private PyTorch API vspyre uses, in one table: a new PyTorch release touches this file.

vspyre plugs into PyTorch through public extension points where they exist (PrivateUse1,
``torch.library``, ``torch.utils.rename_privateuse1_backend``, Dynamo backends, Inductor's
``register_backend_for_device``). What is left - Inductor's codegen classes, its lowering table,
Dynamo's device interface and trace rules, AOTAutograd for the standalone compiler - is private,
and changes between releases. Modules import such names from here, never from ``torch._*``
(``tests/test_compat.py`` enforces it):

    from ..compat import SIMDKernel, V, inductor_ir

Each entry says where the name lives, since which release vspyre uses it (the oldest supported is
2.13) and what for; ``docs/inductor.md`` lists them. Names resolve lazily (the device layer does
not import Inductor). A name the installed torch lacks raises :class:`MissingHook`, naming the hook
and the torch version, instead of an AttributeError deep inside a compile.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Hook:
    module: str
    attr: str | None         # None: the module itself
    since: str               # the first release vspyre uses it on
    purpose: str
    renamed: tuple[tuple[str, str | None], ...] = ()   # (module, attr) in other releases, tried in order


class MissingHook(ImportError):
    """A private PyTorch API vspyre needs is not in the installed torch."""


_H = Hook
HOOKS: dict[str, Hook] = {
    # -- the device -------------------------------------------------------------------------------
    "register_device_module": _H("torch", "_register_device_module", "2.13",
                                 "torch.spyre: the device module, as torch.cuda is registered"),
    "tensor_str": _H("torch._tensor_str", None, "2.13",
                     "printing a spyre tensor formats it on the host (the formatter upcasts to float64)"),
    "register_log": _H("torch._logging._internal", "register_log", "2.13",
                       "TORCH_LOGS=vspyre names the extension's logger"),
    "dispatch_has_kernel_for_dispatch_key": _H("torch._C", "_dispatch_has_kernel_for_dispatch_key", "2.13",
                                               "eager kernels skip CompositeImplicitAutograd ops (a backend kernel "
                                               "would stop traces from decomposing them)"),
    # -- Dynamo -----------------------------------------------------------------------------------
    "DeviceInterface": _H("torch._dynamo.device_interface", "DeviceInterface", "2.13",
                          "the card's device interface for Dynamo and Inductor (streams, properties, dtypes)"),
    "register_interface_for_device": _H("torch._dynamo.device_interface", "register_interface_for_device",
                                        "2.13", "registers that interface for 'spyre'"),
    "trace_rules": _H("torch._dynamo.trace_rules", None, "2.13",
                      "torch.spyre's host-side functions are not traced (skip files)"),
    "dynamo_exc": _H("torch._dynamo.exc", None, "2.13", "the harness classifies compile errors"),
    "dynamo_counters": _H("torch._dynamo.utils", "counters", "2.13",
                          "the harness counts graph breaks and recompiles"),
    "dynamo_same": _H("torch._dynamo.utils", "same", "2.13",
                      "the harness's accuracy check, the dynamo benchmark runner's rule"),
    "dynamo_config": _H("torch._dynamo.config", None, "2.13", "recompile limits in the harness and tools"),
    "dynamo_callback_handler": _H("torch._dynamo.callback", "callback_handler", "2.13",
                                  "estimate-only mode is suspended while Dynamo compiles: compile-time "
                                  "evaluation of graph constants (Inductor's constant folding) has values"),
    "dynamo_reset": _H("torch._dynamo", "reset", "2.13", "a fresh compile between harness rows and sweeps"),
    "mark_dynamic": _H("torch._dynamo", "mark_dynamic", "2.13",
                       "vspyre estimate: the KV-cache length is symbolic from the first decode step; the vLLM "
                       "plugin's step sizes"),
    "mark_static": _H("torch._dynamo", "mark_static", "2.13",
                      "regional compilation with dynamic=True: a layer's feature dims stay static (hidden size, "
                      "head dim), as in a whole-model graph where they come from the weights"),
    "fx_config": _H("torch.fx.experimental._config", None, "2.13",
                    "the vLLM plugin compiles its step graph without duck sizing (sizes equal at the first "
                    "trace stay independent symbols)"),
    # -- torch.distributed ------------------------------------------------------------------------
    "resolve_process_group": _H("torch._C._distributed_c10d", "_resolve_process_group", "2.13",
                                "the spyre backend's kernels for functional collectives find their group by name"),
    "AllgatherOptions": _H("torch._C._distributed_c10d", "AllgatherOptions", "2.13",
                           "all_gather's options (torch.distributed exports the others' but not this one)"),
    "FakeProcessGroup": _H("torch._C._distributed_c10d", "FakeProcessGroup", "2.13",
                           "a simulated spyre group (one process for all ranks) names itself through it"),
    # -- AOTAutograd, decompositions (the standalone compiler) --------------------------------------
    "aot_module_simplified": _H("torch._functorch.aot_autograd", "aot_module_simplified", "2.13",
                                "the standalone compiler takes the ATen graph from AOTAutograd"),
    "make_boxed_func": _H("torch._functorch.aot_autograd", "make_boxed_func", "2.13",
                          "the standalone compiler's compiled graph as AOTAutograd's boxed callable"),
    "get_decompositions": _H("torch._decomp", "get_decompositions", "2.13",
                             "the standalone compiler's decomposition table"),
    "out_dtype_hop": _H("torch._higher_order_ops.out_dtype", "out_dtype", "2.13",
                        "the out_dtype higher-order op (torchao's int8 matmul): the card's kernel and decomposition "
                        "make its int8 x int8 -> int32 mm the card's _int_mm"),
    "out_dtype_dense": _H("torch._higher_order_ops.out_dtype", "out_dtype_dense", "2.13",
                          "PyTorch's own out_dtype kernel, for every other out_dtype call"),
    "inductor_decompositions": _H("torch._inductor.decomposition", "decompositions", "2.13",
                                  "Inductor's decomposition table: out_dtype's int8 mm on the card decomposes to _int_mm"),
    "GraphPickler": _H("torch.fx._graph_pickler", "GraphPickler", "2.13",
                       "the standalone compiler's graph cache pickles the ATen graph with its fake-tensor metadata"),
    "GraphPicklerOptions": _H("torch.fx._graph_pickler", "Options", "2.13",
                              "its options (every op allowed: the cache keys on the compiler's source)"),
    "detect_fake_mode": _H("torch._guards", "detect_fake_mode", "2.13",
                           "the standalone graph cache loads a graph into Dynamo's fake mode and shape environment"),
    "TracingContext": _H("torch._guards", "TracingContext", "2.13",
                         "the standalone graph cache reads AOTAutograd's input/output metadata (fw_metadata)"),
    "unset_fake_temporarily": _H("torch._subclasses.fake_tensor", "unset_fake_temporarily", "2.13",
                                 "constant folding in the standalone compiler runs on real tensors"),
    # -- Inductor ---------------------------------------------------------------------------------
    "register_backend_for_device": _H("torch._inductor.codegen.common", "register_backend_for_device", "2.13",
                                      "the card's scheduling and wrapper codegen for device 'spyre'"),
    "register_device_op_overrides": _H("torch._inductor.codegen.common", "register_device_op_overrides", "2.13",
                                       "the card's device op overrides for the wrapper"),
    "DeviceOpOverrides": _H("torch._inductor.codegen.common", "DeviceOpOverrides", "2.13",
                            "device guard and stream code in the generated wrapper"),
    "BackendFeature": _H("torch._inductor.codegen.common", "BackendFeature", "2.13",
                         "what the card's scheduling supports (reductions, no Triton templates)"),
    "IndentedBuffer": _H("torch._inductor.codegen.common", "IndentedBuffer", "2.13", "generated code"),
    "CSEProxy": _H("torch._inductor.codegen.common", "CSEProxy", "2.13", "the kernel's ops handler"),
    "CSEVariable": _H("torch._inductor.codegen.common", "CSEVariable", "2.13", "values in a kernel body"),
    "DeferredLine": _H("torch._inductor.codegen.common", "DeferredLine", "2.13", "stores emitted late"),
    "Kernel": _H("torch._inductor.codegen.common", "Kernel", "2.13", "the kernel base"),
    "OpOverrides": _H("torch._inductor.codegen.common", "OpOverrides", "2.13",
                      "vector ops generated from the op registry"),
    "pointwise_overrides_data": _H("torch._inductor.codegen.common", "pointwise_overrides_data", "2.13",
                                   "which Inductor pointwise ops have registry entries"),
    "SIMDKernel": _H("torch._inductor.codegen.simd", "SIMDKernel", "2.13",
                     "the shared SIMD kernel base the card's kernel builds on"),
    "SIMDScheduling": _H("torch._inductor.codegen.simd", "SIMDScheduling", "2.13",
                         "fusion and tiling decisions, kept from Inductor"),
    "IterationRangesEntry": _H("torch._inductor.codegen.simd", "IterationRangesEntry", "2.13",
                               "a kernel's iteration dims become the program's dims"),
    "PythonWrapperCodegen": _H("torch._inductor.codegen.wrapper", "PythonWrapperCodegen", "2.13",
                               "the wrapper that launches tile programs"),
    "SubgraphPythonWrapperCodegen": _H("torch._inductor.codegen.wrapper", "SubgraphPythonWrapperCodegen", "2.13",
                                       "the same for subgraphs"),
    "V": _H("torch._inductor.virtualized", "V", "2.13", "Inductor's current graph, kernel and ops handler"),
    "ops": _H("torch._inductor.virtualized", "ops", "2.13", "building Inductor IR in lowerings"),
    "OpsWrapper": _H("torch._inductor.virtualized", "OpsWrapper", "2.13", "wrapping values in the kernel"),
    "OpsHandler": _H("torch._inductor.ops_handler", "OpsHandler", "2.13", "the list of Inductor ops"),
    "inductor_ir": _H("torch._inductor.ir", None, "2.13", "IR nodes the card's lowerings build"),
    "inductor_lowering": _H("torch._inductor.lowering", None, "2.13",
                            "the lowering table the card's lowerings join (lowerings, fallback_handler, to_dtype)"),
    "inductor_prims": _H("torch._inductor.inductor_prims", None, "2.13", "random ops' prims"),
    "GraphLowering": _H("torch._inductor.graph", "GraphLowering", "2.13", "the graph being lowered"),
    "replace_random": _H("torch._inductor.fx_passes.replace_random", None, "2.13",
                         "random ops decompose to the card's generator"),
    "mm_kernel": _H("torch._inductor.kernel.mm", None, "2.13", "matmuls as native ops.dot for the card"),
    "bmm_kernel": _H("torch._inductor.kernel.bmm", None, "2.13", "batched matmuls likewise"),
    "CustomGraphModulePass": _H("torch._inductor.custom_graph_pass", "CustomGraphModulePass", "2.13",
                                "the extension's FX pass, with a cache key"),
    "SchedulerNode": _H("torch._inductor.scheduler", "SchedulerNode", "2.13", "fused nodes to codegen"),
    "OrderedSet": _H("torch._inductor.utils", "OrderedSet", "2.13", "Inductor's ordered set"),
    "get_kernel_metadata": _H("torch._inductor.utils", "get_kernel_metadata", "2.13",
                              "source comments above each kernel"),
    "get_fused_kernel_name": _H("torch._inductor.utils", "get_fused_kernel_name", "2.13",
                                "readable kernel names: the ATen ops a kernel fuses"),
    "sympy_subs": _H("torch._inductor.utils", "sympy_subs", "2.13", "index rewriting"),
    "inductor_config": _H("torch._inductor.config", None, "2.13", "Inductor settings the extension needs"),
    "library_utils": _H("torch._library.utils", None, "2.13",
                        "whether a fallback op mutates and returns its first argument (in-place ops)"),
}


def torch_version() -> str:
    import torch
    return torch.__version__


def get(name: str) -> Any:
    """The private PyTorch object ``name`` of the table, for the installed torch."""
    try:
        h = HOOKS[name]
    except KeyError:
        raise MissingHook(f"vspyre.compat: no hook named {name!r} (add it to HOOKS)") from None
    errors = []
    for module, attr in ((h.module, h.attr),) + h.renamed:
        try:
            mod = importlib.import_module(module)
            return mod if attr is None else getattr(mod, attr)
        except (ImportError, AttributeError) as e:
            errors.append(f"{module}{'.' + attr if attr else ''}: {e}")
    raise MissingHook(
        f"vspyre needs PyTorch's private {name!r} ({h.purpose}; used since torch {h.since}), which torch "
        f"{torch_version()} does not have ({'; '.join(errors)}). Update vspyre.compat.HOOKS for this release.")


def __getattr__(name: str) -> Any:            # ``from vspyre.compat import SIMDKernel``
    if name in HOOKS:
        return get(name)
    raise AttributeError(f"module 'vspyre.compat' has no attribute {name!r}")


# -- nn.Module's compiled-call slot --------------------------------------------------------------
# ``nn.Module.compile()`` (public) stores its compiled callable in the private ``_compiled_call_impl``
# and ``Module.__call__`` calls it instead of ``_call_impl`` (forward with hooks). Regional
# compilation (vspyre.regional) puts its per-layer adapter there and compiles ``_call_impl`` itself,
# as ``Module.compile`` does. Both names exist unchanged in torch 2.13-2.15.
def module_call_impl(module: Any) -> Any:
    """``module``'s forward with its hooks (what ``Module.compile`` compiles)."""
    return module._call_impl


def set_module_compiled_call(module: Any, fn: Any) -> None:
    """Make ``module(...)`` call ``fn`` (None: back to the plain call), as ``Module.compile`` does."""
    if not hasattr(module, "_compiled_call_impl"):
        raise MissingHook(f"vspyre needs nn.Module._compiled_call_impl (regional compilation), which torch "
                          f"{torch_version()} does not have")
    module._compiled_call_impl = fn
