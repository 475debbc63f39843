"""The ``spyre`` torch.distributed backend: one card per rank, collectives on device tensors.

``torch.distributed.init_process_group("spyre")`` (or ``"cpu:gloo,spyre:spyre"``) creates a
:class:`SpyreProcessGroup`. Each rank binds the card ``spyre:LOCAL_RANK`` (``torch.spyre.set_device``),
as a real rank binds its card. A collective on spyre tensors

* checks that every tensor is on this rank's card (a clear error otherwise);
* is costed on the card-to-card link model (``collectives.cost``) and published as a
  ``trace.CollectiveEvent`` (profiles, the Chrome trace, ``vspyre estimate``);
* moves the values with gloo on the tensors' host aliases (device memory is host memory here):
  no copies for contiguous tensors, asynchronous work objects as c10d expects, non-contiguous
  ones through a contiguous staging buffer copied back on ``wait()``;
* in estimate-only mode (tensors without values) is costed, not executed.

``simulate(world_size)`` makes one process rank 0 of ``world_size`` ranks that are all alike (tensor
parallel is symmetric): collectives are costed, nothing is exchanged. It is for estimate-only runs;
with values it refuses (the other ranks' values do not exist).

A rank that does not join a collective makes the others time out after the group's timeout
(``init_process_group(timeout=...)``) with an error naming the ranks that did not join.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from .. import compat, hardware, trace
from . import collectives

BACKEND = "spyre"


class SpyreDistributedError(RuntimeError):
    pass


class _Work(dist.Work):
    """Wraps gloo's work: on ``wait()`` copies staged results back to device memory, and turns a
    timeout into an error naming the ranks that did not join."""

    def __init__(self, pg: "SpyreProcessGroup", name: str, seq: int, inner: Any = None,
                 copy_back: Sequence[tuple[torch.Tensor, torch.Tensor]] = ()) -> None:
        super().__init__()
        self._pg, self._name, self._seq, self._inner, self._copy_back = pg, name, seq, inner, list(copy_back)
        self._done = inner is None
        self._fut: Any = None

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        if self._done:
            return True
        try:
            self._inner.wait() if not timeout else self._inner.wait(timeout)
        except RuntimeError as e:
            raise self._pg._join_error(self._name, self._seq, e) from e
        for dst, src in self._copy_back:
            dst.copy_(src)
        self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done or bool(self._inner.is_completed())

    def is_success(self) -> bool:
        return self.is_completed()

    def get_future(self) -> Any:
        if self._fut is None:
            self._fut = torch.futures.Future()
            self.wait()
            self._fut.set_result(None)
        return self._fut


_simulated: list[int] = []          # world size while simulate() is active


class SpyreProcessGroup(dist.ProcessGroup):
    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta, simulated: bool = False) -> None:
        super().__init__(rank, size)
        self._store, self._timeout, self.simulated = store, timeout, simulated
        self._seq = 0
        if simulated:
            inner = compat.FakeProcessGroup._create_internal(rank, size, None)
            self._gloo = None
        else:
            inner = self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("spyre/gloo", store), rank, size, timeout)
        # the group's name and CPU tensors (object collectives, barriers of other libraries) go through
        # the inner backend; spyre tensors through the methods below
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, inner)
        # ... and is the group's default backend (torch 2.15's flight recorder files entries under it)
        self._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        self.device = _bind_card(rank, size, simulated)

    def getBackendName(self) -> str:
        return BACKEND

    # -- the collectives ---------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts or dist.AllreduceOptions()
        return self._run("all_reduce", tensors, tensors, _nbytes(tensors),
                         lambda ins, outs: self._gloo.allreduce(outs, opts))

    def allgather(self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor],
                  opts: Any = None) -> dist.Work:
        opts = opts or compat.AllgatherOptions()
        outs = [t for lst in output_lists for t in lst]
        self._check_sizes("all_gather", [len(lst) for lst in output_lists], self.size(), "output tensors per input")
        return self._run("all_gather", input_list, outs, _nbytes(input_list),
                         lambda ins, o: self._gloo.allgather(_regroup(o, self.size()), ins, opts))

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        opts = opts or compat.AllgatherOptions()
        self._check_sizes("all_gather_into_tensor", [output.numel()], input.numel() * self.size(),
                          "output elements (input elements x world size)")
        return self._run("all_gather", [input], [output], _nbytes([input]),
                         lambda ins, outs: self._gloo._allgather_base(outs[0], ins[0], opts))

    all_gather_single = _allgather_base             # torch 2.13+ spelling (all_gather_into_tensor)

    def reduce_scatter(self, output_list: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                       opts: Any = None) -> dist.Work:
        opts = opts or dist.ReduceScatterOptions()
        ins = [t for lst in input_lists for t in lst]
        self._check_sizes("reduce_scatter", [len(lst) for lst in input_lists], self.size(), "input tensors per output")
        return self._run("reduce_scatter", ins, output_list, _nbytes(ins),
                         lambda i, outs: self._gloo.reduce_scatter(outs, _regroup(i, self.size()), opts))

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        opts = opts or dist.ReduceScatterOptions()
        self._check_sizes("reduce_scatter_tensor", [input.numel()], output.numel() * self.size(),
                          "input elements (output elements x world size)")
        return self._run("reduce_scatter", [input], [output], _nbytes([input]),
                         lambda ins, outs: self._gloo._reduce_scatter_base(outs[0], ins[0], opts))

    reduce_scatter_single = _reduce_scatter_base      # torch 2.13+ spelling (reduce_scatter_tensor)

    def alltoall_base(self, *args: Any, **kwargs: Any) -> dist.Work:
        raise SpyreDistributedError("spyre c10d: all_to_all is not supported (nor by the real card's backend, "
                                    "spyreccl): use all_gather or send/recv")

    all_to_all_single = alltoall_base
    alltoall = alltoall_base

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts or dist.BroadcastOptions()
        return self._run("broadcast", tensors, tensors, _nbytes(tensors),
                         lambda ins, outs: self._gloo.broadcast(outs, opts))

    def scatter(self, output_tensors: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                opts: Any = None) -> dist.Work:
        opts = opts or dist.ScatterOptions()
        ins = [t for lst in input_lists for t in lst]
        if ins:
            self._check_sizes("scatter", [len(lst) for lst in input_lists], self.size(), "input tensors at the root")
        return self._run("scatter", ins, output_tensors, _nbytes(output_tensors) * self.size(),
                         lambda i, outs: self._gloo.scatter(outs, _regroup(i, self.size()) if i else [], opts))

    def gather(self, output_lists: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: Any = None) -> dist.Work:
        opts = opts or dist.GatherOptions()
        outs = [t for lst in output_lists for t in lst]
        if outs:
            self._check_sizes("gather", [len(lst) for lst in output_lists], self.size(), "output tensors at the root")
        return self._run("gather", input_tensors, outs, _nbytes(input_tensors) * self.size(),
                         lambda ins, o: self._gloo.gather(_regroup(o, self.size()) if o else [], ins, opts))

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> dist.Work:
        self._check_peer("send", dst)
        return self._run("send", tensors, [], _nbytes(tensors), lambda ins, outs: self._gloo.send(ins, dst, tag))

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> dist.Work:
        self._check_peer("recv", src)
        return self._run("recv", [], tensors, _nbytes(tensors), lambda ins, outs: self._gloo.recv(outs, src, tag))

    def barrier(self, opts: Any = None) -> dist.Work:
        opts = opts or dist.BarrierOptions()
        return self._run("barrier", [], [], 0, lambda ins, outs: self._gloo.barrier(opts))

    # -- how each runs -----------------------------------------------------------------------------
    def _run(self, name: str, ins: list[torch.Tensor], outs: list[torch.Tensor], nbytes: int,
             call: Callable[[list[torch.Tensor], list[torch.Tensor]], Any]) -> dist.Work:
        tensors = list(ins) + [t for t in outs if not any(t is i for i in ins)]
        on_card = self._check_devices(name, tensors)
        self._seq += 1
        seq = self._seq
        if not on_card and tensors:                   # CPU tensors: gloo as it is, no card traffic
            if self.simulated:
                raise SpyreDistributedError(f"spyre c10d: {name} on CPU tensors in a simulated group "
                                            f"(world size {self.size()}, one process): nothing to exchange")
            return call(ins, outs)
        t0 = time.perf_counter_ns()
        c = collectives.cost(name, nbytes, self.size())
        executed = not self.simulated and all(torch.spyre.has_values(t) for t in tensors)
        if self.simulated and not torch.spyre.is_estimate_only() and any(
                torch.spyre.has_values(t) for t in tensors):
            raise SpyreDistributedError(
                f"spyre c10d: {name} with values in a simulated group (world size {self.size()}, one process "
                f"for all ranks): the other ranks' values do not exist; simulate() is for estimate-only runs")
        work: dist.Work = _Work(self, name, seq)
        if executed:
            self._store.set(f"spyre/joined/{self.rank()}", str(seq))
            staged: list[tuple[torch.Tensor, torch.Tensor]] = []
            h_ins = [self._host(t, staged, copy_back=False) for t in ins]
            h_outs = [self._host(t, staged, copy_back=True) for t in outs]
            h_ins = [next((ho for o, ho in zip(outs, h_outs) if o is i), hi) for i, hi in zip(ins, h_ins)]
            try:
                inner = call(h_ins, h_outs)
            except RuntimeError as e:
                raise self._join_error(name, seq, e) from e
            work = _Work(self, name, seq, inner, staged)
        if trace.listening():
            trace.publish(trace.CollectiveEvent(
                name=name, device=self.device.index or 0, host_start_ns=t0, host_end_ns=time.perf_counter_ns(),
                est_us=c.us, nbytes=nbytes, link_bytes=c.link_bytes, world_size=self.size(),
                algorithm=c.algorithm, steps=c.steps, executed=executed))
        return work

    @staticmethod
    def _host(t: torch.Tensor, staged: list, copy_back: bool) -> torch.Tensor:
        from ..device import host_view
        h = host_view(t)
        if h.is_contiguous():
            return h
        buf = h.contiguous()
        if copy_back:
            staged.append((h, buf))
        return buf

    def _check_devices(self, name: str, tensors: list[torch.Tensor]) -> bool:
        devices = {t.device for t in tensors}
        if any(d.type == "spyre" for d in devices):
            if len(devices) > 1 or self.device not in devices:
                raise SpyreDistributedError(
                    f"spyre c10d: {name} on tensors of {', '.join(sorted(map(str, devices)))}: every tensor of a "
                    f"collective must be on this rank's card, {self.device} (rank {self.rank()})")
            return True
        return False

    def _check_sizes(self, name: str, got: list[int], want: int, what: str) -> None:
        if any(g != want for g in got):
            raise SpyreDistributedError(f"spyre c10d: {name}: {what} is {got}, expected {want} "
                                        f"(world size {self.size()})")

    def _check_peer(self, name: str, peer: int) -> None:
        if not 0 <= peer < self.size() or peer == self.rank():
            raise SpyreDistributedError(f"spyre c10d: {name} to/from rank {peer} from rank {self.rank()}: the peer "
                                        f"must be another rank of 0..{self.size() - 1}")

    def _join_error(self, name: str, seq: int, err: Exception) -> Exception:
        """A collective that failed: if some ranks never reached it, say which."""
        missing = []
        for r in range(self.size()):
            if r == self.rank():
                continue
            key = f"spyre/joined/{r}"
            try:
                joined = int(self._store.get(key)) if self._store.check([key]) else 0
            except Exception:          # the store itself is gone with the rank that held it
                joined = -1
            if joined < seq:
                missing.append(f"rank {r}" + ("" if joined < 0 else f" (last joined collective #{joined})"))
        if not missing:
            return err
        return SpyreDistributedError(
            f"spyre c10d: {name} (collective #{seq}) on rank {self.rank()} failed after waiting up to "
            f"{self._timeout}: {', '.join(missing)} did not join it ({type(err).__name__}: {str(err)[:200]})")


def _nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _regroup(flat: list[torch.Tensor], per: int) -> list[list[torch.Tensor]]:
    return [flat[i:i + per] for i in range(0, len(flat), per)]


def _bind_card(rank: int, size: int, simulated: bool) -> torch.device:
    """One card per rank: ``spyre:LOCAL_RANK`` (as ``torch.cuda.set_device(LOCAL_RANK)``)."""
    if simulated:
        return torch.device("spyre", torch.spyre.current_device())
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", size))
    cards = torch.spyre.device_count()
    if local_world > cards:
        raise SpyreDistributedError(
            f"spyre c10d: {local_world} ranks on this machine but {cards} card(s) (VSPYRE_NUM_CARDS={cards}; "
            f"hardware preset {hardware.get_config().name}): one card per rank, set VSPYRE_NUM_CARDS={local_world} "
            "or start fewer ranks")
    torch.spyre.set_device(local_rank)
    return torch.device("spyre", local_rank)


def _create(opts: Any, backend_opts: Any) -> SpyreProcessGroup:
    if _simulated:
        return SpyreProcessGroup(opts.store, opts.group_rank, opts.group_size, opts.timeout, simulated=True)
    return SpyreProcessGroup(opts.store, opts.group_rank, opts.group_size, opts.timeout)


# -- functional collectives ------------------------------------------------------------------------
# torch.distributed._functional_collectives (what DTensor and compiled graphs use) runs its ops in C++,
# which reaches a Python process group only through the methods PyTorch's trampoline forwards
# (allreduce, allgather, *_coalesced, ...), not all_gather_single / reduce_scatter_single. The card's
# dispatch key gets its own kernels for those ops: they call this group's methods and wait, so the
# tensor they return is ready (``wait_tensor`` on it returns at once).

def _group(group_name: Any) -> SpyreProcessGroup:
    pg = compat.resolve_process_group(group_name) if isinstance(group_name, str) else group_name
    if not isinstance(pg, SpyreProcessGroup):
        raise SpyreDistributedError(f"spyre c10d: a functional collective on spyre tensors in group "
                                    f"{group_name!r} of backend {pg.name()}: spyre tensors need a spyre group")
    return pg


def _gathered(t: torch.Tensor, group_size: int) -> torch.Tensor:
    return t.new_empty((t.shape[0] * group_size, *t.shape[1:]) if t.dim() else (group_size,))


def _scattered(t: torch.Tensor, group_size: int, name: str) -> torch.Tensor:
    if t.dim() == 0 or t.shape[0] % group_size:
        raise SpyreDistributedError(f"spyre c10d: {name} of a tensor of shape {tuple(t.shape)}: its first dim must "
                                    f"divide by the group size {group_size}")
    return t.new_empty((t.shape[0] // group_size, *t.shape[1:]))


def _reduce_op(name: str) -> Any:
    ops = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "product": dist.ReduceOp.PRODUCT,
           "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
    if name.lower() not in ops:
        raise SpyreDistributedError(f"spyre c10d: reduce op {name!r} (known: {', '.join(ops)})")
    return ops[name.lower()]


def _all_gather_out(input: torch.Tensor, group_size: int, group_name: Any, out: torch.Tensor) -> torch.Tensor:
    _group(group_name)._allgather_base(out, input.contiguous()).wait()
    return out


def _reduce_scatter_out(input: torch.Tensor, reduce_op: str, group_size: int, group_name: Any,
                        out: torch.Tensor) -> torch.Tensor:
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = _reduce_op(reduce_op)
    _group(group_name)._reduce_scatter_base(out, input.contiguous(), opts).wait()
    return out


_FUNCTIONAL_KERNELS: dict[str, Callable[..., Any]] = {
    "all_gather_into_tensor": lambda x, n, g: _all_gather_out(x, n, g, _gathered(x, n)),
    "all_gather_into_tensor_out": lambda x, n, g, *, out: _all_gather_out(x, n, g, out),
    "all_gather_into_tensor_coalesced": lambda xs, n, g: [_all_gather_out(x, n, g, _gathered(x, n)) for x in xs],
    "reduce_scatter_tensor": lambda x, op, n, g: _reduce_scatter_out(
        x, op, n, g, _scattered(x, n, "reduce_scatter_tensor")),
    "reduce_scatter_tensor_out": lambda x, op, n, g, *, out: _reduce_scatter_out(x, op, n, g, out),
    "reduce_scatter_tensor_coalesced": lambda xs, op, n, g: [
        _reduce_scatter_out(x, op, n, g, _scattered(x, n, "reduce_scatter_tensor")) for x in xs],
}
_lib: Any = None
_registered = False


def register() -> None:
    """Register ``spyre`` with torch.distributed for the ``spyre`` device, and the card's kernels for the
    functional collectives the C++ side cannot forward to a Python group (idempotent)."""
    global _registered, _lib
    if _registered or not dist.is_available():
        return
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["spyre"])
    _lib = torch.library.Library("_c10d_functional", "IMPL")  # noqa: TOR901 - kernels for the card's key
    for name, fn in _FUNCTIONAL_KERNELS.items():
        if hasattr(torch.ops._c10d_functional, name):
            _lib.impl(name, fn, "PrivateUse1")
    _registered = True
