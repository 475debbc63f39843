"""``spyre::paged_attention`` on the card: the library programs (``kv_write``, ``paged_attention``)
against the op's plain-torch ``reference`` on the CPU, in fast and checked mode; the eager kernel,
Inductor and the standalone compiler with no host fallback; the device-side checks; and the cost
the latency model sees (a sequence's KV read once per kv head)."""

from __future__ import annotations

import pytest
import torch

from vspyre import numerics, runtime
from vspyre.ir import library as L
from vspyre.ir.ops import DeviceAssertError
from vspyre.runtime import paged

SCALE = 0.35
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=4e-3, atol=4e-3)}
# (q_len, seq_len): a prefill chunk of 5 tokens at KV offset 3, decodes of different lengths, a
# padding sequence (no token, no KV)
MIXED = ((5, 8), (1, 6), (1, 11), (0, 0))


def _card(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the card holds it (fp16 rounded to DLFloat16: a kernel's copy of it is exact)."""
    return numerics.store_cast(t.float(), t.dtype) if t.dtype == torch.float16 else t


def _batch(dtype=torch.float32, seqs=MIXED, tokens=10, hq=4, h=2, d=8, bs=4, nb=12, mb=3, seed=0):
    """(q, k, v, k_cache, v_cache, slot_mapping, block_table, query_start_loc, seq_lens): vLLM's
    flattened batch for ``seqs`` ((q_len, seq_len) each), padded to ``tokens`` tokens (slot -1);
    blocks assigned at random, unused block-table entries out of range (never read)."""
    g = torch.Generator().manual_seed(seed)
    S = len(seqs)
    bt = torch.full((S, mb), nb + 5, dtype=torch.int32)
    free = torch.randperm(nb, generator=g).tolist()
    for s, (_, n) in enumerate(seqs):
        for j in range(-(-n // bs)):
            bt[s, j] = free.pop()
    qsl = torch.zeros(S + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor([ql for ql, _ in seqs]).cumsum(0)
    sl = torch.tensor([n for _, n in seqs], dtype=torch.int32)
    slot = torch.full((tokens,), -1, dtype=torch.int64)
    for s, (ql, n) in enumerate(seqs):
        for j in range(ql):
            p = n - ql + j
            slot[int(qsl[s]) + j] = int(bt[s, p // bs]) * bs + p % bs

    def r(*shape):
        return _card(torch.randn(*shape, generator=g).to(dtype))
    return [r(tokens, hq, d), r(tokens, h, d), r(tokens, h, d), r(nb, bs, h, d), r(nb, bs, h, d), slot, bt, qsl, sl]


def _launch(args, scale=SCALE, window=0, mode="fast"):
    """The op's programs on CPU tensors standing for device memory; returns the output."""
    out = torch.full_like(args[0], float("nan"))
    ts = list(args) + [out]
    for prog, idx in L.paged_attention_launches(*[L.spec_of(t) for t in ts], scale, window):
        runtime.launch(prog, *[ts[i] for i in idx], mode=mode)
    return out


def _clone(args):
    return [a.clone() for a in args]


def test_qmax_is_exact_for_decode_prefill_and_a_chunk_among_decodes():
    assert L.paged_qmax(8, 8) == 1                 # a decode batch
    assert L.paged_qmax(512, 1) == 512             # a single prefill
    assert L.paged_qmax(64 + 7, 8) == 64           # one 64-token chunk among 7 decodes
    q, k, v, kc, vc, slot, bt, qsl, sl = (L.spec_of(t) for t in _batch())
    assert L.paged_attention(q, kc, vc, bt, qsl, sl, q, SCALE).dim("x3").size == 10 - 4 + 1   # the mixed batch


@pytest.mark.parametrize("mode", ["fast", "checked"])
@pytest.mark.parametrize("window", [0, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_programs_match_the_reference(dtype, window, mode):
    """Mixed batch (a prefill chunk at a KV offset, decodes of different lengths, a padding
    sequence, padding tokens), grouped-query heads (4 query heads on 2 kv heads), with and without
    a sliding window: the output as the reference's, padding tokens exactly 0, and the caches
    after the call exactly the reference's."""
    args = _batch(dtype, seed=1)
    ref = _clone(args)
    want = paged.reference(*ref, SCALE, window)
    got = _clone(args)
    out = _launch(got, window=window, mode=mode)
    torch.testing.assert_close(out.float(), want.float(), **TOL[dtype])
    assert torch.equal(out[7:], torch.zeros_like(out[7:]))               # the padding tokens
    assert torch.equal(got[3], ref[3]) and torch.equal(got[4], ref[4])   # the caches
    assert not torch.equal(got[3], args[3])                              # (which the call did write)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_checked_mode_agrees_with_fast_mode(dtype):
    """Fast mode runs the attention's host form (``library.paged_attend``); checked mode runs the
    tile program core by core and proves its schedule (each output element written once)."""
    args = _batch(dtype, seqs=((6, 9), (1, 13), (0, 0), (2, 2)), tokens=12, hq=6, h=3, mb=4, nb=14, seed=2)
    prog = L.paged_attention_launches(*[L.spec_of(t) for t in args + [args[0]]], SCALE)[1][0]
    assert prog.meta["host"][0] == "paged_attention" and "paged_attention" in L.HOST_FORMS
    fast, checked = _launch(_clone(args)), _launch(_clone(args), mode="checked")
    torch.testing.assert_close(checked.float(), fast.float(), **(TOL[dtype] if dtype == torch.float16
                                                                  else dict(rtol=1e-6, atol=1e-6)))


@pytest.mark.parametrize("mode", ["fast", "checked"])
def test_a_static_batch_bounds_its_queries_by_max_query_len(mode):
    """Three prompts padded to 4 tokens each (a static batch: T = 12, S = 3): with
    ``max_query_len=4`` the program has 4 query rows per sequence, not T - S + 1 = 10; the result is
    the reference's; a sequence with more tokens than the bound stops the kernel, naming it."""
    seqs = ((4, 4), (3, 3), (2, 2))
    args = _batch(seqs=seqs, tokens=12, seed=5)
    specs = [L.spec_of(t) for t in args + [args[0]]]
    assert L.paged_attention_launches(*specs, SCALE)[1][0].dim("x3").size == 10
    assert L.paged_attention_launches(*specs, SCALE, 0, 4)[1][0].dim("x3").size == 4
    want = paged.reference(*_clone(args), SCALE, 0, 4)
    out = torch.full_like(args[0], float("nan"))
    ts = _clone(args) + [out]
    for prog, idx in L.paged_attention_launches(*specs, SCALE, 0, 4):
        runtime.launch(prog, *[ts[i] for i in idx], mode=mode)
    torch.testing.assert_close(out, want, **TOL[torch.float32])
    ts = _clone(args) + [out]
    with pytest.raises(DeviceAssertError, match=r"a sequence has more tokens .* = 3"):
        for prog, idx in L.paged_attention_launches(*specs, SCALE, 0, 3):
            runtime.launch(prog, *[ts[i] for i in idx], mode=mode)
    with pytest.raises(ValueError, match=r"spyre::paged_attention: a sequence has 4 tokens .* max_query_len=3"):
        paged.reference(*_clone(args), SCALE, 0, 3)


@pytest.mark.parametrize("mode", ["fast", "checked"])
def test_a_batch_outside_the_program_form_stops_the_kernel(mode):
    """No sequence may have more tokens than T - S + 1 (the program's query dim); the program
    checks it on the card, as it checks the block ids it reads."""
    args = _batch(seqs=((6, 8), (0, 0), (0, 0), (0, 0)), tokens=8)     # Qmax = 8 - 4 + 1 = 5 < 6
    with pytest.raises(DeviceAssertError, match=r"spyre::paged_attention: a sequence has more tokens .* = 5"):
        _launch(args, mode=mode)
    args = _batch()
    args[6][2, 1] = 40                                                   # a block past the cache
    with pytest.raises(DeviceAssertError, match="spyre::paged_attention: block_table names a block outside"):
        _launch(args, mode=mode)


def _same_on_card(out, want, dev_caches, want_caches):
    torch.testing.assert_close(out.cpu().float(), want.float(), **TOL[want.dtype])
    for d, w in zip(dev_caches, want_caches):
        assert torch.equal(d.cpu(), w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_eager_on_the_card_is_a_device_kernel(dtype):
    args = _batch(dtype, seed=3)
    ref = _clone(args)
    want = paged.reference(*ref, SCALE, 0)
    dev = [a.to("spyre") for a in args]
    with torch.spyre.fallback_mode("strict"), torch.spyre.profile() as prof:
        out = torch.ops.spyre.paged_attention(*dev, SCALE, 0)
    assert torch.spyre.fallback_stats() == {}
    assert [(k.name, k.source) for k in prof.kernels] == [("kv_write", "eager"), ("paged_attention", "eager")]
    assert torch.spyre.eager_kernel_stats()["calls"] == {"spyre::paged_attention": 1}
    _same_on_card(out, want, dev[3:5], ref[3:5])


def _two_layers(q, k, v, kc1, vc1, kc2, vc2, slot, bt, qsl, sl):
    a = torch.ops.spyre.paged_attention(q, k, v, kc1, vc1, slot, bt, qsl, sl, SCALE, 0)
    b = torch.ops.spyre.paged_attention(a * 2, k + 1, v, kc2, vc2, slot, bt, qsl, sl, SCALE, 3)
    return a + b


@pytest.mark.parametrize("backend", ["inductor", "spyre_standalone"])
def test_compiled_two_layers_run_on_the_card(backend):
    """A function calling the op twice (two layers, two caches), compiled by each compiler: the
    programs run on the card (the cache writes included), no host fallback anywhere."""
    import vspyre.standalone as S
    from vspyre.inductor.wrapper import compiled_fallbacks, reset_compiled_fallbacks

    q, k, v, kc, vc, slot, bt, qsl, sl = _batch(seed=4)
    cpu = [q, k, v, kc, vc, kc.flip(0).contiguous(), vc.flip(0).contiguous(), slot, bt, qsl, sl]
    dev = [t.to("spyre") for t in cpu]
    want = _two_layers(*_clone(cpu))
    ref = _clone(cpu)
    _two_layers(*ref)
    torch._dynamo.reset()
    reset_compiled_fallbacks()
    S.reset_report()
    try:
        cf = torch.compile(_two_layers, **({"backend": backend} if backend != "inductor" else {}))
        with torch.spyre.fallback_mode("strict"), torch.spyre.profile() as prof:
            out = cf(*dev)
    finally:
        torch._dynamo.reset()
    names = [k.name for k in prof.kernels]
    assert names.count("kv_write") == 2 and names.count("paged_attention") == 2
    assert torch.spyre.fallback_stats() == {} and compiled_fallbacks() == {}
    if backend == "spyre_standalone":
        assert S.report()["fallback_ops"] == 0 and S.report()["native"].get("spyre::paged_attention") == 2
    _same_on_card(out, want, dev[3:7], ref[3:7])


def test_bad_input_raises_naming_the_op():
    dev = [a.to("spyre") for a in _batch()]
    dev[5] = dev[5][:4]                                                  # slot_mapping shorter than the tokens
    with pytest.raises(ValueError, match=r"spyre::paged_attention: slot_mapping must be \[tokens\]"):
        torch.ops.spyre.paged_attention(*dev, SCALE, 0)
    assert torch.spyre.fallback_stats() == {}


def _decode_cost(hq: int, kv_len: int, seqs: int = 4, h: int = 2, d: int = 64, bs: int = 16, spare: int = 0):
    """The attention program's kernel event for a decode batch in estimate-only mode (no values:
    the programs are built from shapes); ``spare`` more blocks in the cache than the batch uses."""
    mb = kv_len // bs
    nb = seqs * mb + spare
    with torch.spyre.estimate_only(), torch.spyre.profile() as prof:
        def e(*shape, dtype=torch.float16):
            return torch.empty(*shape, dtype=dtype, device="spyre")
        torch.ops.spyre.paged_attention(e(seqs, hq, d), e(seqs, h, d), e(seqs, h, d), e(nb, bs, h, d),
                                        e(nb, bs, h, d), e(seqs, dtype=torch.int64),
                                        e(seqs, mb, dtype=torch.int32), e(seqs + 1, dtype=torch.int32),
                                        e(seqs, dtype=torch.int32), 0.125, 0)
    (k,) = [k for k in prof.kernels if k.name == "paged_attention"]
    return k


def test_a_decode_batch_reads_each_sequences_kv_once():
    """The keys and values are loaded through the block table at (sequence, kv head, key, dim):
    the estimated DMA is about the batch's KV bytes (read once, shared by the query heads of a kv
    head), grows with the KV length and not with the query heads; the compulsory bytes (the
    roofline's) are the KV too, however large the cache around it."""
    kv = lambda n, h=2, d=64: 2 * 4 * n * h * d * 2    # noqa: E731 - K and V: seqs x keys x kv heads x dim x fp16
    b1 = _decode_cost(hq=2, kv_len=256).bytes_moved
    b4 = _decode_cost(hq=8, kv_len=256).bytes_moved   # 4x the query heads (GQA groups of 4)
    b2 = _decode_cost(hq=2, kv_len=512).bytes_moved   # 2x the KV
    assert kv(256) <= b1 <= 1.1 * kv(256)
    assert b4 <= 1.1 * b1
    assert 1.8 * b1 <= b2 <= 2.2 * b1
    # a cache of 1088 blocks, 64 of them read, by query heads split over cores (a multicast load)
    big = _decode_cost(hq=32, h=8, d=128, kv_len=256, spare=1024)
    assert kv(256, 8, 128) <= big.extra["compulsory_bytes"] <= 1.1 * kv(256, 8, 128)
    assert big.roofline_us <= big.est_us
