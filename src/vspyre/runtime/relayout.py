"""Re-laid operands kept on the device: restickify once per tensor version, not once per launch.

When the planner reads a transposed matmul operand (the weight of every ``nn.Linear``) through a
re-layout, the tensor stays re-laid on the card for as long as it is unchanged, as a real compiler
keeps weights in the layout its matmuls want. An entry is keyed by the tensor's storage, its
offset and span, its dtype and the stride that moves into the stick; it is valid while the
storage lives and the tensor's version counter is unchanged (an in-place update, ``copy_``, an
optimizer step bump it), and the runtime drops the entries of every storage a kernel writes (the
tensor is then in its original layout again).

Where the re-laid layout lives:

* **In place** (the usual case: a weight only ever read as ``x @ W^T``): the re-layout rewrites
  the tensor's own bytes, so it costs no device memory beyond the tensor: the weights are stored
  once, as a stack that stores them pre-transposed does.
* **A copy beside the original**, counted in device memory (allocated on the tensor's card, so
  ``torch.spyre.memory_allocated`` counts it), only where both layouts are needed: the re-laid
  bytes overlap those of another live entry of the same storage (the same bytes re-laid with
  another stick stride, or overlapping slices), or a kernel reads the bytes directly, in their
  original layout (``read``: a tied embedding table that is also the LM head's weight; ``W`` used
  in both ``x @ W.t()`` and ``W @ y``). An entry re-laid in place that is then read directly
  becomes a copy from that launch on (its bytes are allocated then), so memory grows only for
  tensors read both ways. Slices of one storage (a fused QKV weight split by views) re-laid over
  disjoint bytes are each re-laid in place.

A copy is freed when its tensor is freed (swept at the next miss, by ``stats`` and ``sweep``), when a kernel
writes the tensor, or by ``clear``. Reads the runtime does not see (host fallbacks, copies to the
host) do not make a copy.

Values are not moved: the re-laid layout holds the same numbers, so functional execution reads the
original; what the cache changes is what the card is charged: the re-layout appears once, as its
own event in the profile and the trace, later launches stream the operand at full rate, and device
memory holds a second layout only for tensors read both ways.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch.multiprocessing.reductions import StorageWeakRef

__all__ = ["lookup", "read", "invalidate", "sweep", "clear", "stats", "active", "held_in_place"]

_lock = threading.Lock()


@dataclass
class _Entry:
    ref: StorageWeakRef
    version: int
    nbytes: int
    start: int                    # the storage bytes [start, end) the re-laid span covers
    end: int
    copy: torch.Tensor | None     # the device memory a re-laid copy occupies (None in place, or for CPU tensors)
    in_place: bool


_cache: dict[tuple, _Entry] = {}
_by_storage: dict[int, set[tuple]] = {}
_in_place: dict[int, set[tuple]] = {}     # storages with entries re-laid in place: those entries' keys
_counts = {"hits": 0, "misses": 0}


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _range(t: torch.Tensor, span: int) -> tuple[int, int]:
    es = t.element_size()
    start = t.storage_offset() * es
    return start, start + span * es


def lookup(t: torch.Tensor, span: int, stick_stride: int, nbytes: int) -> bool:
    """True if ``t`` (``span`` elements from its first one) is already re-laid with the elements
    ``stick_stride`` apart in one stick; otherwise records that it is now (and returns False):
    in place, or as a copy if those bytes are held in another layout already."""
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
        start, end = _range(t, span)
        # entries of another version are stale (their storage was written since): they hold no layout
        in_place = not any(o.version == version and o.start < end and start < o.end
                           for o in (_cache[k] for k in _by_storage.get(sk, ())))
        copy = None
        if not in_place and t.device.type != "cpu":
            copy = torch.empty(nbytes, dtype=torch.uint8, device=t.device)
        _cache[key] = _Entry(StorageWeakRef(t.untyped_storage()), version, nbytes, start, end, copy, in_place)
        _by_storage.setdefault(sk, set()).add(key)
        if in_place:
            _in_place.setdefault(sk, set()).add(key)
        return False


def read(t: torch.Tensor, span: int) -> None:
    """A kernel reads ``t`` (``span`` elements from its first one) in its original layout: an
    entry re-laid in place over those bytes needs the original kept too, so it becomes a copy."""
    if not _in_place:
        return
    sk = _storage_key(t)
    if sk not in _in_place:
        return
    start, end = _range(t, span)
    with _lock:
        keys = _in_place.get(sk)
        if not keys:
            return
        version = t._version
        for key in list(keys):
            e = _cache.get(key)
            if e is None:
                keys.discard(key)
            elif e.version == version and e.start < end and start < e.end and not e.ref.expired():
                keys.discard(key)
                e.in_place = False
                if key[-1].type != "cpu":
                    e.copy = torch.empty(e.nbytes, dtype=torch.uint8, device=key[-1])
        if not keys:
            del _in_place[sk]


def active() -> bool:
    """Whether any re-laid tensor is held (launches skip invalidation otherwise)."""
    return bool(_cache)


def held_in_place() -> bool:
    """Whether any tensor is held re-laid in place (launches skip ``read`` otherwise)."""
    return bool(_in_place)


def invalidate(t: torch.Tensor) -> None:
    """A kernel wrote into ``t``'s storage: its re-laid layouts are stale."""
    if not _by_storage:
        return
    sk = _storage_key(t)
    with _lock:
        for key in list(_by_storage.get(sk, ())):
            _drop(key)


def _drop(key: tuple) -> None:
    _cache.pop(key, None)
    for index in (_by_storage, _in_place):
        keys = index.get(key[0])
        if keys is not None:
            keys.discard(key)
            if not keys:
                del index[key[0]]


def _sweep() -> None:
    for key in [k for k, e in _cache.items() if e.ref.expired()]:
        _drop(key)


def sweep() -> None:
    """Drop the entries of tensors freed since the last sweep, freeing their copies' device memory
    (done at every miss and by ``stats``; call it before reading ``torch.spyre.memory_allocated``
    after tensors that were re-laid have been replaced, e.g. weights quantised after a pass)."""
    with _lock:
        _sweep()


def clear() -> None:
    """Forget every re-laid tensor (the copies' device memory is freed)."""
    with _lock:
        _cache.clear()
        _by_storage.clear()
        _in_place.clear()


def stats(within: Iterable[torch.Tensor] | None = None) -> dict:
    """Entries; ``bytes`` held by re-laid copies (device memory beyond the tensors themselves) and
    their count ``copies``; tensors re-laid in place (``in_place``, ``in_place_bytes``: no memory
    of their own); hits and misses since start. ``within``: count only the entries of these
    tensors' storages (a model's weights, not the activations a caller still holds)."""
    keys = None if within is None else {_storage_key(t) for t in within}
    with _lock:
        _sweep()
        entries = [e for k, e in _cache.items() if keys is None or k[0] in keys]
        copies = [e.nbytes for e in entries if not e.in_place]
        return {"entries": len(entries), "bytes": sum(copies), "copies": len(copies),
                "in_place": len(entries) - len(copies),
                "in_place_bytes": sum(e.nbytes for e in entries if e.in_place), **_counts}
