"""vspyre: a virtual Spyre-class AI accelerator for PyTorch.

Layers (imports go one way, downwards in this list):

* ``vspyre.hardware``, ``vspyre.numerics``, ``vspyre.trace`` - the card's numbers, its fp16
  numerics, the events it reports;
* ``vspyre.device`` - the PyTorch device ``spyre`` (C++ allocator/guard/hooks, host fallback,
  the ``torch.spyre`` module);
* ``vspyre.ir`` - tile programs, the op registry (semantics and cost), planning helpers;
* ``vspyre.runtime`` - executes tile programs; latency model; profiler;
* ``vspyre.inductor``, ``vspyre.standalone`` - the two compilers;
* ``vspyre.eager`` - eager ATen ops as device kernels (built through the standalone op table);
* ``vspyre.distributed`` - several cards: the ``spyre`` c10d backend, its link model, tensor parallel;
* ``vspyre.harness`` - the parity harness and CLI.
"""

__version__ = "0.1.0"


def _autoload() -> None:
    """Entry point PyTorch calls at ``import torch`` (group ``torch.backends``)."""
    import torch

    from .device import register

    register()
    torch.spyre.profile = profile

    from .inductor import install_hooks

    install_hooks()

    from . import eager

    eager.register()
    torch.spyre.eager_kernel_stats = eager.stats
    torch.spyre.reset_eager_kernel_stats = eager.reset_stats
    torch.spyre.eager_kernels = eager.enabled

    from .distributed import register as register_distributed

    register_distributed()                 # torch.distributed.init_process_group("spyre")

    from .runtime import routing

    torch.spyre.sync_stats = routing.sync_stats          # data-dependent sizes read back, per op
    torch.spyre.reset_sync_stats = routing.reset_sync_stats


def profile(*args, **kwargs):
    """``with torch.spyre.profile() as prof:`` records kernels and host fallbacks.

    See ``vspyre.runtime.profiler.profile``; imported on first use so ``import torch`` stays light.
    """
    from .runtime.profiler import profile as _profile

    return _profile(*args, **kwargs)


# `import torch` calls _autoload (entry point) when vspyre is installed; importing vspyre first
# must work too, so _autoload is defined before torch is imported and called again (idempotent).
import torch  # noqa: E402

_autoload()
