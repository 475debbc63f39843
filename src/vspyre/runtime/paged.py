"""``torch.ops.spyre.paged_attention``: attention over a paged KV cache, the op the vLLM plugin's
models call once per layer and step.

The KV cache is ``[num_blocks, block_size, kv_heads, head_dim]`` per layer for keys and the same
for values (blocks of 64 tokens in the plugin); which block holds which tokens of a sequence is the
block table's row for that sequence, as vLLM's KV-cache manager assigns them. One call:

1. writes the step's new keys and values into the cache, token ``t`` at slot
   ``slot_mapping[t]`` (``block * block_size + offset``; ``-1``: a padding token, not written);
2. returns, for every token of the step, attention of its query over its sequence's cached keys
   up to its own position (causal; with ``sliding_window > 0`` only the last ``sliding_window``
   positions), reading the cache through the block table.

Batch layout (vLLM's, flattened): the step's tokens are the concatenation of its sequences'
scheduled tokens; sequence ``s`` owns tokens ``query_start_loc[s] .. query_start_loc[s+1]-1``
and, after this step, holds ``seq_lens[s]`` tokens, so its ``i``-th token of the step sits at
position ``seq_lens[s] - q_len[s] + i``. Tokens past ``query_start_loc[S]`` are padding (their
output is 0); sequences with no token this step (padding rows) have ``q_len == 0``.
``max_query_len`` (0: none) bounds the tokens any sequence has in this step when the caller knows
more than the shapes say: a static batch of ``S`` prompts padded to ``P`` tokens each has ``T = S *
P`` tokens but at most ``P`` per sequence, so the card's program is sized ``S x P`` query rows, not
``S x (T - S + 1)``; it checks the bound.

The cache write is a side effect that the op's schema does not declare, exactly as vLLM's own
``unified_attention`` op writes its layer's cache: the compilers see a functional op (so
functionalization makes no copy of the cache) whose result is used, so it is never dropped or
duplicated; the cache tensors are its inputs, so it is ordered after their allocation.

``reference`` below is the op's meaning in plain torch (its CPU kernel and the tests' oracle);
the card runs the tile programs of ``vspyre.ir.library`` (registered for the ``spyre`` device).
"""

from __future__ import annotations

import torch

from ..ir.library import paged_attend, paged_positions as positions_of

__all__ = ["paged_attention", "reference", "positions_of"]

_LIB = torch.library.Library("spyre", "FRAGMENT")  # noqa: TOR901 - the namespace's own library
_LIB.define(
    "paged_attention(Tensor q, Tensor k, Tensor v, Tensor k_cache, Tensor v_cache, Tensor slot_mapping, "
    "Tensor block_table, Tensor query_start_loc, Tensor seq_lens, float scale, int sliding_window=0, int max_query_len=0) -> Tensor")


def _check(q, k, v, k_cache, v_cache, slot_mapping, block_table, query_start_loc, seq_lens) -> None:
    def need(ok: bool, what: str) -> None:
        if not ok:
            raise ValueError(f"spyre::paged_attention: {what} (q {tuple(q.shape)}, k {tuple(k.shape)}, "
                             f"k_cache {tuple(k_cache.shape)}, block_table {tuple(block_table.shape)}, "
                             f"query_start_loc {tuple(query_start_loc.shape)}, seq_lens {tuple(seq_lens.shape)})")

    need(q.dim() == 3 and k.dim() == 3 and v.dim() == 3, "q, k, v must be [tokens, heads, head_dim]")
    need(k.shape == v.shape and k.shape[0] == q.shape[0], "k and v must be [tokens, kv_heads, head_dim] like q's tokens")
    need(k_cache.dim() == 4 and k_cache.shape == v_cache.shape,
         "k_cache and v_cache must be one shape [num_blocks, block_size, kv_heads, head_dim]")
    need(tuple(k_cache.shape[2:]) == tuple(k.shape[1:]), "the cache's (kv_heads, head_dim) must be k's")
    need(q.shape[2] == k.shape[2] and q.shape[1] % k.shape[1] == 0, "query heads must be a multiple of kv heads")
    need(slot_mapping.dim() == 1 and slot_mapping.shape[0] == q.shape[0], "slot_mapping must be [tokens]")
    need(block_table.dim() == 2 and seq_lens.dim() == 1 and seq_lens.shape[0] == block_table.shape[0],
         "block_table must be [seqs, max_blocks] and seq_lens [seqs]")
    need(query_start_loc.dim() == 1 and query_start_loc.shape[0] == seq_lens.shape[0] + 1,
         "query_start_loc must be [seqs + 1]")
    for name, t in (("slot_mapping", slot_mapping), ("block_table", block_table),
                    ("query_start_loc", query_start_loc), ("seq_lens", seq_lens)):
        need(not t.dtype.is_floating_point and t.dtype != torch.bool, f"{name} must be an integer tensor, not {t.dtype}")
    need(k.dtype == v.dtype == k_cache.dtype == v_cache.dtype, "k, v and the caches must have one dtype")


def reference(q, k, v, k_cache, v_cache, slot_mapping, block_table, query_start_loc, seq_lens, scale: float,
              sliding_window: int = 0, max_query_len: int = 0) -> torch.Tensor:
    """The op in plain torch (fp32 inside, the result in q's dtype); writes the caches. The
    attention half is ``vspyre.ir.library.paged_attend``, which the card's fast mode also runs as
    the attention program's host form."""
    _check(q, k, v, k_cache, v_cache, slot_mapping, block_table, query_start_loc, seq_lens)
    qlen = query_start_loc[1:] - query_start_loc[:-1]
    if max_query_len > 0 and bool((qlen > max_query_len).any()):
        raise ValueError(f"spyre::paged_attention: a sequence has {int(qlen.max())} tokens this step, more than "
                         f"max_query_len={max_query_len}")
    nb, bs, hkv, d = k_cache.shape
    slots = slot_mapping.to(torch.int64)
    keep = slots >= 0
    k_cache.view(nb * bs, hkv, d)[slots[keep]] = k[keep]
    v_cache.view(nb * bs, hkv, d)[slots[keep]] = v[keep]
    return paged_attend(q, k_cache, v_cache, block_table, query_start_loc, seq_lens, scale,
                        sliding_window).to(q.dtype)


@torch.library.register_fake("spyre::paged_attention", lib=_LIB)
def _fake(q, k, v, k_cache, v_cache, slot_mapping, block_table, query_start_loc, seq_lens, scale, sliding_window=0,
          max_query_len=0):
    _check(q, k, v, k_cache, v_cache, slot_mapping, block_table, query_start_loc, seq_lens)
    return q.new_empty(q.shape)


_LIB.impl("paged_attention", reference, "CPU")


def paged_attention(q, k, v, k_cache, v_cache, slot_mapping, block_table, query_start_loc, seq_lens,
                    scale: float, sliding_window: int = 0, max_query_len: int = 0) -> torch.Tensor:
    return torch.ops.spyre.paged_attention(q, k, v, k_cache, v_cache, slot_mapping, block_table, query_start_loc,
                                           seq_lens, float(scale), int(sliding_window), int(max_query_len))
