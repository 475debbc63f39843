"""Weights stored once: a weight read only transposed (every ``nn.Linear`` weight, read as
``x @ W^T``) is re-laid in place on the card, on both compilers; a weight read both ways (a tied
embedding and LM head, ``x @ W.t()`` beside ``W @ y``) holds its re-laid copy beside the original."""

import gc

import pytest
import torch
import torch.nn.functional as F

from vspyre.runtime import relayout

from .helpers import Launches

BACKENDS = ["inductor", "spyre_standalone"]


def _compile(f, backend):
    torch._dynamo.reset()
    return torch.compile(f) if backend == "inductor" else torch.compile(f, backend=backend)


def _start():
    relayout.clear()
    gc.collect()             # earlier tests' garbage must not be freed inside the measured window
    return torch.spyre.memory_allocated(), relayout.stats()


class TiedLM(torch.nn.Module):
    def __init__(self, vocab=1000, dim=256):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight                 # tied: gathered as stored, read transposed by the head

    def forward(self, ids):
        return self.head(torch.relu(self.emb(ids)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_linear_weight_read_only_transposed_is_relaid_in_place(backend):
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 512, bias=False).half()
    x = torch.randn(16, 256, dtype=torch.float16)
    want = lin(x)
    dlin = lin.to("spyre").requires_grad_(False)
    w_bytes = dlin.weight.numel() * dlin.weight.element_size()
    cf = _compile(dlin, backend)
    dx = x.to("spyre")
    before, s0 = _start()
    with torch.no_grad(), Launches() as got:
        out = cf(dx)
        grown = torch.spyre.memory_allocated() - before
        for _ in range(3):
            cf(dx)
    s = relayout.stats()
    assert grown == out.numel() * out.element_size(), grown    # the output only: no re-laid copy
    assert len(got.relayouts) == 1                             # the re-layout is still charged, once
    assert all(k.est_us > 0 for k in got.relayouts)
    assert (s["misses"] - s0["misses"], s["hits"] - s0["hits"]) == (1, 3)   # later forwards hit
    assert (s["copies"], s["bytes"], s["in_place"], s["in_place_bytes"]) == (0, 0, 1, w_bytes)
    torch.testing.assert_close(out.cpu(), want, rtol=1e-2, atol=1e-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_weight_read_both_ways_holds_both_layouts(backend):
    torch.manual_seed(0)
    x, w, y = (torch.randn(*s, dtype=torch.float16) for s in ((16, 256), (512, 256), (256, 32)))
    dw = torch.nn.Parameter(w.to("spyre"), requires_grad=False)
    w_bytes = w.numel() * w.element_size()
    cf = _compile(lambda x, w, y: (x @ w.t(), w @ y), backend)
    dx, dy = x.to("spyre"), y.to("spyre")
    before, s0 = _start()
    with torch.no_grad(), Launches() as got:
        a, b = cf(dx, dw, dy)
        grown = torch.spyre.memory_allocated() - before
        cf(dx, dw, dy)
    s = relayout.stats()
    outs = a.numel() * a.element_size() + b.numel() * b.element_size()
    assert grown == outs + w_bytes, (grown, outs, w_bytes)   # the outputs and the re-laid copy
    assert len(got.relayouts) == 1
    assert (s["copies"], s["bytes"], s["in_place"]) == (1, w_bytes, 0)
    torch.testing.assert_close(a.cpu(), x.float().matmul(w.float().t()).half(), rtol=1e-2, atol=1e-1)
    torch.testing.assert_close(b.cpu(), w.float().matmul(y.float()).half(), rtol=1e-2, atol=1e-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tied_embedding_and_lm_head_hold_both_layouts(backend):
    torch.manual_seed(0)
    m = TiedLM().half()
    ids = torch.randint(0, 1000, (2, 8))
    want = m(ids)
    dm = m.to("spyre").requires_grad_(False)
    dm.head.weight = dm.emb.weight                      # .to() of an out-of-tree device unties (as on XLA)
    e_bytes = dm.emb.weight.numel() * dm.emb.weight.element_size()
    cf = _compile(dm, backend)
    dids = ids.to("spyre")
    before, s0 = _start()
    with torch.no_grad(), Launches() as got:
        for _ in range(3):
            out = cf(dids)
    s = relayout.stats()
    # the head re-lays the table; the gather reads it as stored (in the same forward, or the next)
    assert len(got.relayouts) == 1
    assert (s["copies"], s["bytes"], s["in_place"]) == (1, e_bytes, 0)
    held = torch.spyre.memory_allocated() - before - out.numel() * out.element_size()
    assert e_bytes <= held < e_bytes + (64 << 10), held     # the copy (and a small buffer the compiler may keep)
    torch.testing.assert_close(out.cpu(), want, rtol=1e-2, atol=1e-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_slices_of_a_fused_weight_are_relaid_in_place(backend):
    torch.manual_seed(0)
    x, w = torch.randn(16, 256, dtype=torch.float16), torch.randn(3 * 128, 256, dtype=torch.float16)
    dw = torch.nn.Parameter(w.to("spyre"), requires_grad=False)
    cf = _compile(lambda x, w: [F.linear(x, w[i * 128:(i + 1) * 128]) for i in range(3)], backend)
    dx = x.to("spyre")
    before, s0 = _start()
    with torch.no_grad(), Launches() as got:
        outs = cf(dx, dw)
        cf(dx, dw)
    s = relayout.stats()
    assert (s["copies"], s["bytes"]) == (0, 0) and s["in_place"] >= 1
    assert torch.spyre.memory_allocated() - before == sum(o.numel() * o.element_size() for o in outs)
    assert 1 <= len(got.relayouts) <= 3
    for i, o in enumerate(outs):
        torch.testing.assert_close(o.cpu(), F.linear(x.float(), w[i * 128:(i + 1) * 128].float()).half(),
                                   rtol=1e-2, atol=1e-1)
