"""vspyre as a vLLM platform: the plugin vLLM loads (entry point group ``vllm.platform_plugins``).

With vspyre and vLLM installed, ``vllm serve DIR`` and ``vllm.LLM(DIR)`` run on the virtual card:
vLLM's own engine, scheduler, KV-cache manager, OpenAI server and benchmark client, with the
plugin's platform (:mod:`.platform`), worker (:mod:`.worker`) and model runner (:mod:`.runner`),
which runs each scheduled step as one graph compiled for the card. The model is transformers'
own implementation of the family (:mod:`.models`) with attention over the paged KV cache
(``torch.ops.spyre.paged_attention``, a tile program on the card).

Settings (environment, read by every vLLM process):

* ``VSPYRE_VLLM_BACKEND`` - ``inductor`` (default: ``torch.compile``'s default backend with the
  card's Inductor extension) or ``standalone`` (the old path: ``backend="spyre_standalone"``);
  ``eager`` runs the model uncompiled (eager device kernels), for debugging; ``cpu`` runs the same
  engine, runner and model on the host CPU in eager PyTorch, not on the card (the baseline the
  serving benchmark measures the card against).
* ``VSPYRE_VLLM=0`` - do not activate the platform (vLLM picks its own).

``docs/serving.md`` has the two commands to serve a model and what the plugin supports.
"""

from __future__ import annotations

import os

BACKENDS = ("inductor", "standalone", "eager", "cpu")


def backend() -> str:
    """The compiler the plugin runs the model with (``VSPYRE_VLLM_BACKEND``)."""
    b = os.environ.get("VSPYRE_VLLM_BACKEND", "inductor").strip().lower() or "inductor"
    if b not in BACKENDS:
        raise ValueError(f"VSPYRE_VLLM_BACKEND={b!r}: one of {', '.join(BACKENDS)}")
    return b


def register() -> str | None:
    """vLLM's platform-plugin hook: the platform class to use, or None to stay out."""
    if os.environ.get("VSPYRE_VLLM", "1") == "0":
        return None
    return "vspyre.vllm_plugin.platform.SpyrePlatform"
