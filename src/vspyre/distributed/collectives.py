"""Each collective between cards: how its values move and what it costs, side by side.

A collective's values move through the host aliases of device memory (device memory is host
memory here) with gloo, PyTorch's CPU backend; its time is the card-to-card link model of the
hardware config (``card_link_bandwidth``, ``card_link_latency_us``, ``collective_algorithm``,
``host_link_bandwidth``), never the wall time of gloo on this machine. ``docs/multi-card.md``
derives each formula.

Ring (bandwidth-optimal, peer to peer between neighbouring cards, N cards, B bytes):

* all_reduce = reduce-scatter + all-gather: 2(N-1) steps of B/N; in the reduce-scatter half each
  step also adds the received chunk to the local one on the vector unit (read 2, write 1 chunk at
  the device-memory bandwidth), overlapped with the next chunk's transfer (the slower of the two);
* all_gather (B = one rank's input): N-1 steps of B; reduce_scatter (B = one rank's input): N-1
  steps of B/N with the add; broadcast: pipelined along the ring, B / bandwidth + (N-1) latencies;
* scatter/gather (B = the root's whole tensor): the root sends (receives) N-1 chunks of B/N, one
  after another over its link;
* send/recv: one message; barrier: 2(N-1) empty steps.

Host (every card to host memory over its own PCIe link and back; the host's reduction is taken
as overlapped with the transfers, not costed): all_reduce B up + B down; all_gather B up + NB
down; reduce_scatter B up + B/N down; broadcast B up from the root + B down; send/recv B up + B
down; scatter/gather B through the root's link and B/N through each other card's; barrier 2
latencies.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import hardware


@dataclass(frozen=True)
class Cost:
    us: float
    link_bytes: int      # bytes this card sends
    steps: int           # messages per card
    algorithm: str


COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "scatter", "gather", "send", "recv",
               "barrier")


def cost(name: str, nbytes: int, world: int, cfg: hardware.HardwareConfig | None = None) -> Cost:
    """The link model's time for collective ``name`` on ``world`` cards with a payload of ``nbytes``
    (all_reduce/broadcast/send/recv: the tensor; all_gather/reduce_scatter: this rank's input;
    scatter/gather: the root's whole tensor)."""
    if name not in COLLECTIVES:
        raise ValueError(f"collective cost: unknown collective {name!r} (known: {', '.join(COLLECTIVES)})")
    cfg = cfg or hardware.get_config()
    if world <= 1:
        return Cost(0.0, 0, 0, "local")
    lat, bw, mem = cfg.card_link_latency_us, cfg.card_link_bandwidth, cfg.device_memory_bandwidth
    n, b = world, nbytes
    if name in ("send", "recv"):
        if cfg.collective_algorithm == "host":
            return Cost(2 * lat + 2 * b / cfg.host_link_bandwidth * 1e6, b, 2, "host")
        return Cost(lat + b / bw * 1e6, b if name == "send" else 0, 1, "p2p")
    if cfg.collective_algorithm == "host":
        up_down = {"all_reduce": (b, b), "all_gather": (b, n * b), "reduce_scatter": (b, b / n),
                   "broadcast": (b, b), "scatter": (b, b / n), "gather": (b / n, b), "barrier": (0, 0)}[name]
        return Cost(2 * lat + sum(up_down) / cfg.host_link_bandwidth * 1e6, int(up_down[0]), 2, "host")

    def step(chunk: float, add: bool) -> float:
        move = chunk / bw * 1e6
        return lat + (max(move, 3 * chunk / mem * 1e6) if add else move)

    if name == "all_reduce":
        c = b / n
        return Cost((n - 1) * (step(c, True) + step(c, False)), int(2 * (n - 1) * c), 2 * (n - 1), "ring")
    if name == "all_gather":
        return Cost((n - 1) * step(b, False), (n - 1) * b, n - 1, "ring")
    if name == "reduce_scatter":
        c = b / n
        return Cost((n - 1) * step(c, True), int((n - 1) * c), n - 1, "ring")
    if name in ("scatter", "gather"):
        return Cost((n - 1) * step(b / n, False), int((n - 1) * b / n), n - 1, "ring")
    if name == "broadcast":
        return Cost((n - 1) * lat + b / bw * 1e6, b, n - 1, "ring")
    return Cost(2 * (n - 1) * lat, 0, 2 * (n - 1), "ring")          # barrier
