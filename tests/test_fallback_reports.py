"""Every path's report of host fallbacks agrees with what the device counted, op for op.

The device counts each host fallback as it runs (``torch.spyre.fallback_stats()``, the overload
the dispatcher ran); the standalone compiler's report and Inductor's compiled-fallback list say
which graph nodes they left to the host. For one call they must name the same ops (joined on
the op without its overload, ``vspyre.trace.op_packet``) the same number of times."""

import collections

import pytest
import torch

import vspyre.standalone as S
from vspyre.inductor.wrapper import compiled_fallbacks, reset_compiled_fallbacks
from vspyre.trace import op_packet


def f(x):
    y = torch.special.bessel_j0(x) + 1          # no tile form: a host fallback on every path
    m = torch.median(y, dim=1).values * 2        # no tile form either
    return m, torch.special.zeta(y, 2.0), (y * 3).sum()


def _packets(counts: dict[str, int]) -> dict[str, int]:
    out: collections.Counter = collections.Counter()
    for name, n in counts.items():
        out[op_packet(name)] += n
    return dict(out)


WANT = {"aten::special_bessel_j0": 1, "aten::median": 1, "aten::special_zeta": 1}


@pytest.mark.parametrize("path", ["eager", "inductor", "spyre_standalone"])
def test_the_report_names_what_the_device_ran_on_the_host(path):
    x = torch.rand(8, 16)
    torch._dynamo.reset()
    S.compiler.reset_report()
    reset_compiled_fallbacks()
    torch.spyre.reset_fallback_stats()
    run = f if path == "eager" else torch.compile(f, backend=path)
    out = run(x.to("spyre"))
    for o, r in zip(out, f(x)):
        torch.testing.assert_close(o.cpu(), r, rtol=1e-5, atol=1e-5)
    device = _packets(torch.spyre.fallback_stats())
    assert device == WANT, device
    if path == "inductor":
        assert _packets(compiled_fallbacks()) == device
    elif path == "spyre_standalone":
        rep = S.compiler.report()
        assert _packets(rep["fallback_calls"]) == device
        assert rep["fallback_ops"] == len(device)


def test_op_packet():
    assert op_packet("aten::median.dim_values") == "aten::median"
    assert op_packet("aten::i0") == "aten::i0"
    assert op_packet("transformers::grouped_mm_fallback") == "transformers::grouped_mm_fallback"
    assert op_packet("operator.getitem") == "operator.getitem"
