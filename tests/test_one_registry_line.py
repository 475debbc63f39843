"""A new vector op is one line in the registry (``vspyre.ir.ops``) and runs on the card on every
path: eager (a device kernel), Inductor (the kernel's ops.<name>) and the standalone compiler (its
ATen namesake, ``<name>`` or ``special_<name>``), with no host fallback on any. The special
functions below came this way: before their registry lines, each was a host fallback on all three."""

import pytest
import torch

import vspyre.standalone as S

CASES = {
    "i0": lambda x: torch.i0(x) * 2,
    "i1": lambda x: torch.special.i1(x) + 1,
    "i0e": lambda x: torch.special.i0e(x),
    "i1e": lambda x: torch.special.i1e(x),
    "ndtr": lambda x: torch.special.ndtr(x),
    "ndtri": lambda x: torch.special.ndtri(x.sigmoid()),
    "log_ndtr": lambda x: torch.special.log_ndtr(x),         # Inductor: through erfcx for x < -1
    "erfcx": lambda x: torch.special.erfcx(x),
}


@pytest.mark.parametrize("path", ["eager", "inductor", "spyre_standalone"])
@pytest.mark.parametrize("name", list(CASES))
def test_a_registry_line_runs_on_every_path(name, path):
    f = CASES[name]
    x = torch.linspace(-3, 3, 6 * 37).reshape(6, 37)
    torch.spyre.reset_fallback_stats()
    torch.spyre.reset_eager_kernel_stats()
    if path == "eager":
        out = f(x.to("spyre"))
        assert sum(torch.spyre.eager_kernel_stats()["calls"].values()) >= 1
    else:
        torch._dynamo.reset()
        S.compiler.reset_report()
        cf = torch.compile(f) if path == "inductor" else torch.compile(f, backend=path)
        out = cf(x.to("spyre"))
        if path == "spyre_standalone":
            assert S.compiler.report()["fallback_ops"] == 0
    assert torch.spyre.fallback_stats() == {}, torch.spyre.fallback_stats()
    torch.testing.assert_close(out.cpu(), f(x), rtol=1e-5, atol=1e-6, equal_nan=True)
