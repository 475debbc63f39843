"""Eager ATen ops as device kernels.

Without this layer every eager op on a ``spyre`` tensor except views, copies and fills runs as a
host fallback. Here each eager op that has a tile form runs on the card as a *device kernel*: a
single-op tile program, launched through :func:`vspyre.runtime.launch` like a compiled one (so it
is planned and costed by the same planner and latency model, and shows in ``torch.spyre.profile()``
and the trace with ``source="eager"``). Ops without a tile form stay counted host fallbacks.

**Which compiler path builds them.** Eager kernels are built through the *standalone compiler's*
op table and kernel generators (``vspyre.standalone.lowerings`` / ``.kernels``), not through
``torch.compile``: that table is already one lowering per ATen op (the granularity of an eager
call), its programs use the same op registry (semantics and cost) as the Inductor path, and
building one costs about a millisecond. Building through Inductor (what IBM's stack does) costs
~0.12 s per op cold and ~95 us per call of Dynamo/AOT wrapper overhead on this machine, against
~24 us for the whole host fallback (docs/eager.md has the measurements).

**Built once per op, dtypes and rank.** The common kinds - pointwise (every op of the table and
the registry), reductions, matmuls, softmax, layer norm, gathers, copies/concatenation, batch
norm in inference - are built with *symbolic* sizes and strides (``s0..``, bound from the tensors
at launch), so a new shape reuses the built program and is only planned again. A few kinds are
built per shape (convolution, attention, padding, triangular masks, ``arange``): their programs
derive index arithmetic from concrete sizes. :func:`stats` counts calls, builds and reuses.

In-place and ``out=`` variants keep their semantics: the kernel writes the given tensor (through
a temporary when it overlaps an input in another layout); ``out`` is resized as ATen resizes it.

The device layer does not import this package: :func:`register` installs the kernels with
``torch.library`` (and, for the few ops the device layer itself gives Python kernels,
through ``vspyre.device.fallback.set_device_kernel``). ``VSPYRE_EAGER_KERNELS=0`` or
:func:`enabled` turns them off (every op then runs as a host fallback, as before).
"""

from __future__ import annotations

from .kernels import TABLE, enabled, is_enabled, register, reset_stats, stats

__all__ = ["TABLE", "enabled", "is_enabled", "register", "reset_stats", "stats"]
