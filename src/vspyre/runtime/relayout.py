"""Re-laid operands kept on the device: restickify once per tensor version, not once per launch.

When the planner reads a transposed matmul operand (the weight of every ``nn.Linear``) through a
re-layout, the re-laid copy stays on the card for as long as the tensor is unchanged, as a real
compiler keeps weights in the layout its matmuls want. An entry is keyed by the tensor's storage,
its offset and span, its dtype and the stride that moves into the stick; it is valid while the
storage lives and the tensor's version counter is unchanged (an in-place update, ``copy_``, an
optimizer step bump it), and the runtime drops the entries of every storage a kernel writes. The
copy occupies device memory (allocated on the tensor's card, so ``torch.spyre.memory_allocated``
counts it) and is freed when its tensor is freed (swept at the next miss or ``empty_cache``).

Values are not moved: the re-laid copy holds the same numbers, so functional execution reads the
original; what the cache changes is what the card is charged: the re-layout appears once, as its
own event in the profile and the trace, and later launches stream the operand at full rate.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
from torch.multiprocessing.reductions import StorageWeakRef

__all__ = ["lookup", "invalidate", "clear", "stats", "active"]

_lock = threading.Lock()


@dataclass
class _Entry:
    ref: StorageWeakRef
    version: int
    nbytes: int
    copy: torch.Tensor | None     # the device memory the re-laid copy occupies (None for CPU tensors)


_cache: dict[tuple, _Entry] = {}
_by_storage: dict[int, set[tuple]] = {}
_counts = {"hits": 0, "misses": 0}


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def lookup(t: torch.Tensor, span: int, stick_stride: int, nbytes: int) -> bool:
    """True if ``t`` (``span`` elements from its first one) is already re-laid with the elements
    ``stick_stride`` apart in one stick; otherwise records that it is now (and returns False)."""
    sk = _storage_key(t)
    key = (sk, t.storage_offset(), span, t.dtype, stick_stride, t.device)
    version = t._version
    with _lock:
        e = _cache.get(key)
        if e is not None and not e.ref.expired() and e.version == version:
            _counts["hits"] += 1
            return True
        _counts["misses"] += 1
        _sweep()
        if e is not None:
            _drop(key)
        copy = None
        if t.device.type != "cpu":
            copy = torch.empty(nbytes, dtype=torch.uint8, device=t.device)
        _cache[key] = _Entry(StorageWeakRef(t.untyped_storage()), version, nbytes, copy)
        _by_storage.setdefault(sk, set()).add(key)
        return False


def active() -> bool:
    """Whether any re-laid copy is held (launches skip invalidation otherwise)."""
    return bool(_cache)


def invalidate(t: torch.Tensor) -> None:
    """A kernel wrote into ``t``'s storage: its re-laid copies are stale."""
    if not _by_storage:
        return
    sk = _storage_key(t)
    with _lock:
        for key in list(_by_storage.get(sk, ())):
            _drop(key)


def _drop(key: tuple) -> None:
    _cache.pop(key, None)
    keys = _by_storage.get(key[0])
    if keys is not None:
        keys.discard(key)
        if not keys:
            del _by_storage[key[0]]


def _sweep() -> None:
    for key in [k for k, e in _cache.items() if e.ref.expired()]:
        _drop(key)


def clear() -> None:
    """Forget every re-laid copy (their device memory is freed)."""
    with _lock:
        _cache.clear()
        _by_storage.clear()


def stats() -> dict:
    """Entries, device bytes held, hits and misses since start."""
    with _lock:
        _sweep()
        return {"entries": len(_cache), "bytes": sum(e.nbytes for e in _cache.values()), **_counts}
