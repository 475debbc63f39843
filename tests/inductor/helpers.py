"""Helpers for compile tests: run compiled on the card, compare with CPU, count kernels."""

from __future__ import annotations

import torch

from vspyre import trace


class Launches:
    """Collect the tile programs launched (and host fallbacks) while active."""

    def __enter__(self) -> "Launches":
        self.kernels: list[trace.KernelEvent] = []
        self.relayouts: list[trace.KernelEvent] = []     # one-time re-layouts of transposed operands
        self.fallbacks: list[trace.FallbackEvent] = []
        trace.subscribe(self._on)
        return self

    def _on(self, e: trace.Event) -> None:
        if isinstance(e, trace.KernelEvent):
            (self.relayouts if e.extra.get("kind") == "relayout" else self.kernels).append(e)
        else:
            self.fallbacks.append(e)

    def __exit__(self, *exc) -> None:
        trace.unsubscribe(self._on)


def on_card(fn, *args, compile_kwargs=None, **kwargs):
    """(result on CPU, Launches) of ``torch.compile(fn)`` run on spyre copies of the args."""
    dargs = [a.to("spyre") if isinstance(a, torch.Tensor) else a for a in args]
    cf = torch.compile(fn, **(compile_kwargs or {}))
    torch.spyre.reset_fallback_stats()
    with Launches() as got:
        out = cf(*dargs, **kwargs)
    return _cpu(out), got


def _cpu(x):
    if isinstance(x, torch.Tensor):
        return x.cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(_cpu(v) for v in x)
    return x
