"""The re-layout cache: a tensor read only re-laid is re-laid in place; a second layout (a copy
in device memory) is held only for bytes that are read both ways."""

import torch

from vspyre.runtime import relayout


def _fresh():
    relayout.clear()
    return relayout.stats()


def test_a_tensor_read_only_relaid_is_relaid_in_place_until_read_as_stored():
    s0 = _fresh()
    w = torch.zeros(64, 32, dtype=torch.float16)
    assert not relayout.lookup(w, w.numel(), 32, w.numel() * 2)     # a miss: re-laid now, in place
    assert relayout.lookup(w, w.numel(), 32, w.numel() * 2)         # then a hit
    s = relayout.stats()
    assert (s["entries"], s["in_place"], s["in_place_bytes"], s["copies"], s["bytes"]) == (1, 1, 4096, 0, 0)
    assert (s["misses"] - s0["misses"], s["hits"] - s0["hits"]) == (1, 1)
    assert relayout.held_in_place()
    relayout.read(torch.zeros(64, 32, dtype=torch.float16), 64 * 32)   # another storage: no effect
    relayout.read(w[1:], 63 * 32)                                       # its own bytes, as stored
    s = relayout.stats()
    assert (s["in_place"], s["copies"], s["bytes"]) == (0, 1, 4096)     # both layouts held now
    assert relayout.lookup(w, w.numel(), 32, w.numel() * 2)         # still a hit: no second re-layout
    assert not relayout.held_in_place()
    relayout.invalidate(w)                                          # a kernel writes it: stale, dropped
    assert relayout.stats()["entries"] == 0


def test_slices_over_disjoint_bytes_are_each_relaid_in_place():
    _fresh()
    qkv = torch.zeros(3 * 64, 32, dtype=torch.float16)              # a fused weight split by views
    for i in range(3):
        v = qkv[i * 64:(i + 1) * 64]
        assert not relayout.lookup(v, v.numel(), 32, v.numel() * 2)
    s = relayout.stats()
    assert (s["in_place"], s["copies"]) == (3, 0)
    relayout.read(qkv[64:128], 64 * 32)                             # one slice also read as stored
    s = relayout.stats()
    assert (s["in_place"], s["copies"], s["bytes"]) == (2, 1, 64 * 32 * 2)


def test_bytes_held_in_another_layout_already_get_a_copy():
    _fresh()
    w = torch.zeros(64, 64, dtype=torch.float16)
    assert not relayout.lookup(w, w.numel(), 64, w.numel() * 2)
    assert not relayout.lookup(w, w.numel(), 1, w.numel() * 2)      # the same bytes, another stick stride
    assert not relayout.lookup(w[:, :32], 63 * 64 + 32, 64, 64 * 32 * 2)   # overlapping columns
    s = relayout.stats()
    assert (s["entries"], s["in_place"], s["copies"]) == (3, 1, 2)


def test_an_entry_of_an_older_version_holds_no_layout():
    _fresh()
    w = torch.zeros(64, 32, dtype=torch.float16)
    assert not relayout.lookup(w, w.numel(), 32, w.numel() * 2)
    w.add_(1)                                                       # written on the host: the entry is stale
    relayout.read(w, w.numel())                                     # the original layout again: no copy
    assert relayout.stats()["copies"] == 0
    assert not relayout.lookup(w, w.numel(), 1, w.numel() * 2)      # re-laid anew, in place
    assert not relayout.lookup(w, w.numel(), 32, w.numel() * 2)     # its old key: stale, replaced
    s = relayout.stats()
    assert (s["entries"], s["copies"], s["in_place"]) == (2, 1, 1)


def test_the_copy_is_device_memory_allocated_at_the_first_read_as_stored():
    _fresh()
    w = torch.zeros(256, 128, dtype=torch.float16, device="spyre")
    nbytes = w.numel() * w.element_size()
    before = torch.spyre.memory_allocated()
    assert not relayout.lookup(w, w.numel(), 128, nbytes)
    assert torch.spyre.memory_allocated() == before                 # re-laid in place: no memory of its own
    relayout.read(w, w.numel())
    assert torch.spyre.memory_allocated() == before + nbytes        # the second layout
    del w
    assert relayout.stats()["entries"] == 0                         # swept with its tensor
    assert torch.spyre.memory_allocated() == before - nbytes


def test_stats_within_counts_only_the_given_tensors_storages():
    _fresh()
    w = torch.zeros(64, 32, dtype=torch.float16)                    # a weight
    k = torch.zeros(1, 2, 16, 64, dtype=torch.float16)              # an activation a caller still holds
    qkv = torch.zeros(3 * 64, 32, dtype=torch.float16)
    for t, stick in ((w, 32), (k, 128), (qkv[64:128], 32)):
        assert not relayout.lookup(t, t.numel(), stick, t.numel() * 2)
    relayout.read(qkv[64:128], 64 * 32)                             # given its copy
    s = relayout.stats(within=[w, qkv])                             # a view's entry belongs to its storage
    assert (s["entries"], s["in_place_bytes"], s["copies"], s["bytes"]) == (2, 4096, 1, 4096)
    assert relayout.stats()["in_place_bytes"] == 2 * 4096
    assert relayout.stats(within=[])["entries"] == 0


def test_sweep_frees_the_copies_of_freed_tensors():
    _fresh()
    w = torch.zeros(256, 128, dtype=torch.float16, device="spyre")
    before = torch.spyre.memory_allocated()
    relayout.lookup(w, w.numel(), 128, w.numel() * 2)
    relayout.read(w, w.numel())                                     # given its copy
    assert torch.spyre.memory_allocated() == before + w.numel() * 2
    del w                                                           # the copy stays until a sweep
    relayout.sweep()
    assert torch.spyre.memory_allocated() == before - 256 * 128 * 2 and not relayout.active()
