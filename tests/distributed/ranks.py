"""What each rank runs in the distributed tests (module-level functions: spawned ranks import them)."""

import json
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from vspyre.distributed import collectives


def collectives_values(rank: int) -> dict:
    """Every collective on this rank's card against the values it must give; returns the profile's
    collectives (name, bytes, est. us) and the Chrome trace's collective events."""
    n, card = dist.get_world_size(), torch.device("spyre", rank)
    assert torch.spyre.current_device() == rank
    base = torch.arange(6, dtype=torch.float32)
    total = sum(base + r for r in range(n))
    with torch.spyre.profile() as prof:
        x = (base + rank).to(card)
        dist.all_reduce(x)
        torch.testing.assert_close(x.cpu(), total)

        nc = (base + rank).reshape(2, 3).to(card).t()          # non-contiguous: staged and copied back
        dist.all_reduce(nc, op=dist.ReduceOp.MAX)
        torch.testing.assert_close(nc.cpu(), (base + n - 1).reshape(2, 3).t())

        outs = [torch.empty(6, device=card) for _ in range(n)]
        dist.all_gather(outs, (base + rank).to(card))
        for r in range(n):
            torch.testing.assert_close(outs[r].cpu(), base + r)

        big = torch.empty(6 * n, device=card)
        dist.all_gather_into_tensor(big, (base + rank).to(card))
        torch.testing.assert_close(big.cpu(), torch.cat([base + r for r in range(n)]))

        rs_in = [torch.full((3,), float(rank * 10 + j), device=card) for j in range(n)]
        rs_out = torch.empty(3, device=card)
        dist.reduce_scatter(rs_out, rs_in)
        torch.testing.assert_close(rs_out.cpu(), torch.full((3,), float(sum(r * 10 + rank for r in range(n)))))

        flat = torch.arange(4 * n, dtype=torch.float32).to(card) * (rank + 1)
        part = torch.empty(4, device=card)
        dist.reduce_scatter_tensor(part, flat)
        torch.testing.assert_close(part.cpu(), torch.arange(4 * rank, 4 * rank + 4, dtype=torch.float32)
                                   * sum(r + 1 for r in range(n)))

        b = torch.full((5,), float(rank), device=card, dtype=torch.float16)
        dist.broadcast(b, src=n - 1)
        torch.testing.assert_close(b.cpu(), torch.full((5,), float(n - 1), dtype=torch.float16))

        if rank == 0:
            dist.send(torch.tensor([42.0, 7.0], device=card), dst=1)
        elif rank == 1:
            got = torch.empty(2, device=card)
            dist.recv(got, src=0)
            torch.testing.assert_close(got.cpu(), torch.tensor([42.0, 7.0]))

        works = [dist.all_reduce(t, async_op=True) for t in [(base + rank).to(card), torch.ones(3, device=card)]]
        for w in works:
            w.wait()
        dist.barrier()

        # functional collectives (DTensor's and compiled graphs' path)
        y = funcol.all_reduce((base + rank).to(card), "sum", dist.group.WORLD)
        torch.testing.assert_close(y.cpu(), total)
        g = funcol.all_gather_tensor((base + rank).reshape(2, 3).to(card), 0, dist.group.WORLD)
        torch.testing.assert_close(g.cpu(), torch.cat([(base + r).reshape(2, 3) for r in range(n)]))
        s = funcol.reduce_scatter_tensor(torch.arange(2 * n, dtype=torch.float32).to(card), "sum", 0,
                                         dist.group.WORLD)
        torch.testing.assert_close(s.cpu(), torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float32) * n)
    trace = prof.chrome_trace()
    return {"collectives": [(c.name, c.nbytes, c.est_us, c.world_size, c.algorithm, c.executed)
                            for c in prof.collectives],
            "trace": [e for e in trace["traceEvents"] if e.get("cat") == "collective"],
            "table": json.dumps([list(r) for r in prof.collective_summary()]),
            "total_est_us": prof.total_est_us, "collective_est_us": prof.collective_est_us}


def bad_input(rank: int) -> list[str]:
    """Collectives on the wrong tensors fail with a clear error; the group stays usable."""
    errors = []
    card, other = torch.device("spyre", rank), torch.device("spyre", 1 - rank)
    for call in (lambda: dist.all_reduce(torch.ones(2, device=other)),
                 lambda: dist.all_gather_into_tensor(torch.empty(4, device=card), torch.ones(2, device=other)),
                 lambda: dist.all_gather_into_tensor(torch.empty(5, device=card), torch.ones(2, device=card)),
                 lambda: dist.all_gather([torch.empty(2, device=card)], torch.ones(2, device=card)),
                 lambda: dist.send(torch.ones(2, device=card), dst=rank)):
        try:
            call()
            errors.append("no error")
        except Exception as e:  # noqa: BLE001
            errors.append(f"{type(e).__name__}: {e}")
    x = torch.ones(3, device=card)
    dist.all_reduce(x)                                   # still usable
    torch.testing.assert_close(x.cpu(), torch.full((3,), 2.0))
    return errors


def one_rank_does_not_join(rank: int) -> str:
    """Rank 1 skips an all_reduce; rank 0's fails after the group's timeout naming rank 1."""
    store = dist.distributed_c10d._get_default_store()
    if rank == 1:
        store.wait(["rank0-done"], __import__("datetime").timedelta(seconds=60))
        return ""
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(2, device="spyre:0"))
        msg = "no error"
    except Exception as e:  # noqa: BLE001
        msg = f"{type(e).__name__}: {e} (after {time.monotonic() - t0:.1f} s)"
    store.set("rank0-done", "1")
    return msg


def expected_cost(name: str, nbytes: int, world: int) -> float:
    return collectives.cost(name, nbytes, world).us


# -- tensor parallel ---------------------------------------------------------------------------------
def tp_model(family: str):
    """Tiny Llama / Granite whose heads, KV heads and MLP divide by 1, 2 and 4 (random weights, seed 0)."""
    from transformers import GraniteConfig, GraniteForCausalLM, LlamaConfig, LlamaForCausalLM

    from vspyre.harness import models

    common = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=8,
                  num_key_value_heads=4, vocab_size=512, max_position_embeddings=64, tie_word_embeddings=False,
                  use_cache=False, attn_implementation="sdpa", bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "llama":
        return models._build(LlamaForCausalLM, LlamaConfig(**common), 0)
    return models._build(GraniteForCausalLM, GraniteConfig(
        **common, embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125,
        logits_scaling=8.0), 0)


def tp_input():
    return torch.randint(3, 512, (1, 12), generator=torch.Generator().manual_seed(0))


def tp_forward(rank: int, family: str, modes: tuple[str, ...]) -> dict:
    """The model split over the group's ranks, run eagerly and compiled: logits, collectives per
    forward, host fallbacks, graph breaks and the standalone compiler's host-fallback nodes."""
    import vspyre.standalone as standalone
    from vspyre import compat
    from vspyre.distributed import tp

    card = torch.device("spyre", rank)
    model = tp_model(family).to(card)
    tp.parallelize(model)
    ids = tp_input().to(card)
    out = {}
    for mode in modes:
        compat.dynamo_reset()
        compat.dynamo_counters.clear()
        standalone.reset_report()
        torch.spyre.reset_fallback_stats()
        fn = model if mode == "eager" else torch.compile(model, backend=mode)
        with torch.no_grad():
            fn(input_ids=ids)                                   # compile
            with torch.spyre.profile() as prof:
                logits = fn(input_ids=ids).logits
        out[mode] = {"logits": logits.cpu(), "collectives": [c.name for c in prof.collectives],
                     "fallbacks": dict(torch.spyre.fallback_stats()),
                     "graph_breaks": sum(compat.dynamo_counters["graph_break"].values()),
                     "standalone_fallback_nodes": standalone.report()["fallback_ops"],
                     "kernel_est_us": prof.kernel_est_us, "collective_est_us": prof.collective_est_us,
                     "local_q_weight": tuple(model.model.layers[0].self_attn.q_proj.weight.to_local().shape)}
    return out
