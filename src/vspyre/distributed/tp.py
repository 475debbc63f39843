"""Tensor parallelism on the cards with PyTorch's own engine: DTensor and
``torch.distributed.tensor.parallel``, driven by the plan transformers ships in each model's config.

transformers describes how a decoder splits over ranks (``config.base_model_tp_plan``: the attention
projections and the MLP's input projections column-wise, the attention output and the MLP's output
projection row-wise, Megatron's layout). :func:`plan` turns it into ``ColwiseParallel`` /
``RowwiseParallel`` styles on the model's module names and :func:`parallelize` applies them with
``parallelize_module`` on a one-dimensional ``spyre`` device mesh: each rank keeps its slice of every
split weight (stored once, as a DTensor's local shard on its card), and each decoder layer costs two
all_reduces (after the attention output and the MLP output projections), which arrive as functional
collectives: eagerly through the ``spyre`` backend, and compiled as ``_c10d_functional`` nodes that
both compilers keep as calls to it. Embeddings, norms and the LM head stay replicated.

Sizes that do not divide by the TP degree (heads, KV heads, MLP width) are refused with the sizes
named, before anything is split.
"""

from __future__ import annotations

import fnmatch
from typing import Any

import torch

from .backend import SpyreDistributedError

# transformers' style names -> the torch.distributed.tensor.parallel style that does the same
_STYLES = {"colwise": "ColwiseParallel", "rowwise": "RowwiseParallel"}


def check_divisible(config: Any, tp: int) -> None:
    """Refuse a TP degree that does not divide the attention heads, the KV heads or the MLP width."""
    if tp < 1:
        raise SpyreDistributedError(f"tensor parallel: degree must be >= 1, got {tp}")
    sizes = {"num_attention_heads": getattr(config, "num_attention_heads", None),
             "num_key_value_heads": getattr(config, "num_key_value_heads", None)
             or getattr(config, "num_attention_heads", None),
             "intermediate_size": getattr(config, "intermediate_size", None)}
    bad = {k: v for k, v in sizes.items() if v is not None and v % tp}
    if bad:
        raise SpyreDistributedError(
            f"tensor parallel {tp}: {', '.join(f'{k}={v}' for k, v in bad.items())} "
            f"{'does' if len(bad) == 1 else 'do'} not divide by {tp} (each rank holds 1/{tp} of the heads and of "
            f"the MLP); pick a degree that divides "
            f"{', '.join(f'{k}={v}' for k, v in sizes.items() if v is not None)}")


def plan(model: torch.nn.Module) -> dict[str, Any]:
    """The model's tensor-parallel plan as ``{module name: ParallelStyle}``, from transformers'
    ``config.base_model_tp_plan`` (its wildcards expanded over the model's modules)."""
    from torch.distributed.tensor import parallel as tpar

    config = getattr(model, "config", None)
    tp_plan = dict(getattr(config, "base_model_tp_plan", None) or {})
    if not tp_plan:
        raise SpyreDistributedError(f"tensor parallel: {type(model).__name__} has no tensor-parallel plan "
                                    "(transformers' config.base_model_tp_plan is empty)")
    unknown = sorted({s for s in tp_plan.values() if s not in _STYLES})
    names = [n for n, _ in model.named_modules()]
    prefix = getattr(model, "base_model_prefix", "")
    out: dict[str, Any] = {}
    for pattern, style in tp_plan.items():
        full = [f"{prefix}.{pattern}" if prefix else pattern, pattern]
        hits = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in full)]
        if style not in _STYLES:
            if hits:
                raise SpyreDistributedError(f"tensor parallel: {type(model).__name__}'s plan uses style(s) "
                                            f"{unknown} (at {pattern}); supported: {', '.join(_STYLES)}")
            continue
        for n in hits:
            out[n] = getattr(tpar, _STYLES[style])()
    if not out:
        raise SpyreDistributedError(f"tensor parallel: {type(model).__name__}'s plan matches none of its modules "
                                    f"({', '.join(tp_plan)})")
    return out


def mesh(tp: int | None = None) -> Any:
    """A one-dimensional ``spyre`` device mesh over the default group's ranks."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        raise SpyreDistributedError("tensor parallel: no process group (torch.distributed.init_process_group"
                                    "('spyre'), torchrun, vspyre.distributed.launch.run or simulate())")
    world = dist.get_world_size()
    if tp is not None and tp != world:
        raise SpyreDistributedError(f"tensor parallel: degree {tp} but the group has {world} ranks")
    return init_device_mesh("spyre", (world,), mesh_dim_names=("tp",))


def parallelize(model: torch.nn.Module, device_mesh: Any = None, src_data_rank: int | None = 0) -> torch.nn.Module:
    """Split ``model`` (on this rank's card, on the host, or on the meta device) over the mesh's ranks in
    place with ``parallelize_module`` and the model's plan; returns the model. ``src_data_rank=0``:
    rank 0's weights are scattered to the others (as loaded on one rank); ``None``: each rank keeps
    its own slice of the weights it has (every rank loaded the same checkpoint, or a meta model)."""
    from torch.distributed.tensor.parallel import parallelize_module

    device_mesh = device_mesh or mesh()
    tp = device_mesh.size()
    check_divisible(model.config, tp)
    if tp == 1:
        return model
    parallelize_module(model, device_mesh, plan(model), src_data_rank=src_data_rank)
    return model


def local_heads(config: Any, tp: int) -> tuple[int, int]:
    """(query heads, KV heads) one rank holds at TP ``tp``."""
    check_divisible(config, tp)
    h = config.num_attention_heads
    return h // tp, (getattr(config, "num_key_value_heads", None) or h) // tp


def per_rank_bytes(model: torch.nn.Module, degree: int) -> int:
    """Bytes of parameters and buffers one rank holds at TP ``degree`` (the plan's modules split,
    the rest replicated); the model may be on the meta device."""
    if degree == 1:
        return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    check_divisible(model.config, degree)
    split = set(plan(model))
    total = 0
    for name, mod in model.named_modules():
        own = [*mod.parameters(recurse=False), *mod.buffers(recurse=False)]
        b = sum(t.numel() * t.element_size() for t in own)
        total += b // degree if name in split else b
    return total
