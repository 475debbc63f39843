"""Regional compilation: the repeated decoder layer compiled once and reused for every layer.

PyTorch's regional-compilation recipe compiles each repeated block instead of the whole model:
``torch.compile`` of a block's call, where Dynamo lifts the block's parameters to graph inputs
(``inline_inbuilt_nn_modules``), so identical layers share one compiled graph and compile time
does not grow with depth. What stands between a transformers decoder layer and that reuse is
per-layer Python state the layer reads while it runs:

* ``self_attn.layer_idx``, an int on the module, which Dynamo would bake in as a constant (one
  graph per layer, and the recompile limit hit past 8 layers). ``torch.compiler.config.
  dynamic_sources`` names it: a graph input, dynamic from the first call. (Not
  ``allow_unspec_int_on_nn_module``: it makes every int and float attribute symbolic - head dims,
  norm epsilons - which costs symbolic reasoning and, for the floats, a restarted trace);
* the KV cache, indexed by that int (``cache.layers[layer_idx]``): an index into a Python list
  would specialise again. Each layer is therefore called with :class:`LayerCache`, a view of the
  cache holding only its own layer's entry; every ``layer_idx`` the layer passes to it means that
  entry. The view is made outside the compiled region, where the index is a plain int.

What runs outside the layers (embedding, rotary tables, mask building, final norm, LM head) runs
as the card's eager device kernels (``vspyre.eager``), not compiled; it costs a handful of
kernels per forward (reported by ``torch.spyre.profile()`` with ``source="eager"``).

    handle = regional.compile_model(model, backend="inductor", mode="regional")
    handle(input_ids=ids)               # the model, its layers compiled
    handle.compiled_blocks              # how many layer calls went through the compiled function
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

MODES = ("regional", "whole")

# the layer index attribute names transformers' attention modules use
_IDX_SOURCE = "L['block']._modules['self_attn'].layer_idx"


class RegionalError(Exception):
    """The model has no repeated block regional compilation can use (said in one line)."""


def find_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks: the longest ``nn.ModuleList`` whose members are all of one class (a
    transformers model's decoder layers; ``_no_split_modules`` names them, and is preferred)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    best: list[torch.nn.Module] = []
    best_named = False
    for m in model.modules():
        if not isinstance(m, torch.nn.ModuleList) or len(m) == 0:
            continue
        kinds = {type(x) for x in m}
        if len(kinds) != 1:
            continue
        named = next(iter(kinds)).__name__ in names
        if (named, len(m)) > (best_named, len(best)):
            best, best_named = list(m), named
    if not best:
        raise RegionalError(f"{type(model).__name__}: no repeated block (an nn.ModuleList of one layer class) "
                            "to compile regionally; use --compile whole")
    return best


class LayerCache:
    """One layer's view of a transformers ``Cache``: every layer index it is given means that layer.

    ``update``/``get_seq_length``/``get_mask_sizes``/``get_max_length`` go to the layer's own
    cache entry (as ``Cache`` does for that index); anything else is read from the whole cache.
    """

    def __init__(self, cache: Any, idx: int) -> None:
        if getattr(cache, "layer_class_to_replicate", None) is not None:
            while len(cache.layers) <= idx:            # as Cache.update does for a lazily grown cache
                cache.layers.append(cache.layer_class_to_replicate())
        self._cache = cache
        self._layer = cache.layers[idx]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: Any = None, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self._layer.update(key_states, value_states, *args, **kwargs)

    def get_seq_length(self, layer_idx: Any = 0) -> int:
        return self._layer.get_seq_length()

    def get_mask_sizes(self, query_length: int, layer_idx: Any = None) -> tuple[int, int]:
        return self._layer.get_mask_sizes(query_length)

    def get_max_length(self, layer_idx: Any = None) -> int:
        return self._layer.get_max_length()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cache, name)


def _viewable(cache: Any) -> bool:
    layers = getattr(cache, "layers", None)
    return isinstance(layers, list) and not getattr(cache, "offloading", False) and hasattr(cache, "update")


def _run_block(block: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
    from .compat import module_call_impl
    return module_call_impl(block)(*args, **kwargs)


class Regional:
    """A model whose repeated blocks call one compiled function (the handle is callable as the model)."""

    def __init__(self, model: torch.nn.Module, backend: Any, dynamic: bool | None, options: dict | None) -> None:
        self.model = model
        self.blocks = find_blocks(model)
        self.compiled_blocks = 0
        self.dynamic = dynamic
        self._fn = torch.compile(_run_block, backend=backend, dynamic=dynamic, options=options)
        from .compat import set_module_compiled_call
        for i, b in enumerate(self.blocks):
            set_module_compiled_call(b, self._caller(b, i))

    def _caller(self, block: torch.nn.Module, idx: int):
        def call(*args: Any, **kwargs: Any) -> Any:
            for key in ("cache", "past_key_values", "past_key_value"):
                c = kwargs.get(key)
                if c is not None and _viewable(c):
                    kwargs[key] = view = LayerCache(c, idx)
                    if self.dynamic:
                        _static_heads(view._layer)
            self.compiled_blocks += 1
            if self.dynamic:
                _static_features(args, kwargs)
            with _unspec_layer_idx():
                return self._fn(block, args, kwargs)
        return call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    def undo(self) -> None:
        """The blocks called plainly again."""
        from .compat import set_module_compiled_call
        for b in self.blocks:
            set_module_compiled_call(b, None)


def _static_features(args: tuple, kwargs: dict) -> None:
    """With ``dynamic=True`` every size of a layer's inputs would be symbolic, also the feature
    sizes a whole-model graph gets from the weights (the hidden size of the hidden states, the head
    dim of the rotary tables): Dynamo then reasons about (and guards) every matmul's shapes
    symbolically, several times slower. Their last dim is marked static; batch and sequence (and
    the KV length, marked dynamic on the cache) stay symbolic."""
    from .compat import mark_static

    feats = [args[0] if args else kwargs.get("hidden_states"), *(kwargs.get("position_embeddings") or ())]
    for t in feats:
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            mark_static(t, t.dim() - 1)


def _static_heads(layer: Any) -> None:
    """A cache entry's (batch, heads, length, head dim) tensors: heads and head dim static (the
    weights fix them), length and batch symbolic."""
    from .compat import mark_static

    for name in ("keys", "values"):
        t = getattr(layer, name, None)
        if isinstance(t, torch.Tensor) and t.dim() == 4:
            mark_static(t, 1)
            mark_static(t, 3)


@contextlib.contextmanager
def _unspec_layer_idx() -> Iterator[None]:
    """The layer index is a graph input, dynamic from the first compile (see the module doc)."""
    cfg = torch.compiler.config
    prev = cfg.dynamic_sources
    srcs = [s for s in prev.split(",") if s]
    if _IDX_SOURCE not in srcs:
        srcs.append(_IDX_SOURCE)
    cfg.dynamic_sources = ",".join(srcs)
    from .compat import dynamo_config
    try:
        with dynamo_config.patch(specialize_float=True):     # norm epsilons, Granite's multipliers: constants
            yield
    finally:
        cfg.dynamic_sources = prev


def compile_model(model: torch.nn.Module, backend: Any, mode: str = "regional", dynamic: bool | None = None,
                  options: dict | None = None) -> Any:
    """``model`` compiled whole (``torch.compile(model)``) or regionally (its repeated blocks)."""
    if mode == "whole":
        return torch.compile(model, backend=backend, dynamic=dynamic, options=options)
    if mode != "regional":
        raise ValueError(f"compile mode {mode!r}: one of {', '.join(MODES)}")
    return Regional(model, backend, dynamic, options)
