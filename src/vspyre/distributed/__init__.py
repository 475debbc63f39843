"""Several cards: the ``spyre`` torch.distributed backend and tensor parallelism on it.

* ``backend`` - the c10d backend (``init_process_group("spyre")``), one card per rank, gloo moving the
  values through the host aliases, each collective costed on the link model;
* ``collectives`` - each collective's cost on the card-to-card link model (``docs/multi-card.md``);
* ``tp`` - tensor parallelism with ``torch.distributed.tensor.parallel`` and the plan transformers
  ships in the model's config.

This layer sits above the runtime (it publishes ``trace`` events, reads the hardware config) and
below the harness; the compilers need nothing of it: collectives reach them as PyTorch's
functional collectives and run through this backend when the compiled graph calls them.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from .backend import BACKEND, SpyreDistributedError, SpyreProcessGroup, register  # noqa: F401
from .collectives import cost  # noqa: F401


@contextmanager
def simulate(world_size: int) -> Iterator[object]:
    """This process as rank 0 of ``world_size`` identical ranks (tensor parallel is symmetric): the
    default group is a spyre group whose collectives are costed and not exchanged. For
    estimate-only runs (``torch.spyre.estimate_only()``)."""
    import torch.distributed as dist

    from . import backend

    if world_size < 1:
        raise ValueError(f"simulate: world size must be >= 1, got {world_size}")
    if dist.is_initialized():
        raise SpyreDistributedError("simulate: a default process group exists already in this process")
    register()
    backend._simulated.append(world_size)
    try:
        dist.init_process_group(BACKEND, store=dist.HashStore(), rank=0, world_size=world_size)
        yield dist.group.WORLD
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        backend._simulated.pop()
