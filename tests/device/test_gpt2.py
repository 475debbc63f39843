"""The demo's model: a tiny GPT-2 (transformers config, random weights) eager on the card."""

import copy

import torch

from vspyre.harness.models import tiny_gpt2


def test_tiny_gpt2_forward_on_device_equals_cpu():
    case = tiny_gpt2(batch=2, seq=16)
    with torch.no_grad():
        ref = case.model(**case.inputs).logits
        dev = copy.deepcopy(case).to("spyre")
        out = dev.model(**dev.inputs).logits
    assert out.device.type == "spyre"
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)
    # every eager op of the forward runs as a device kernel (none falls back to the host)
    assert sum(torch.spyre.eager_kernel_stats()["calls"].values()) > 30
    assert torch.spyre.fallback_stats() == {}


def test_demo_runs_and_reports(capsys):
    from rich.console import Console

    from vspyre.harness import demo

    console = Console(width=120, force_terminal=False)
    assert demo.run(console) == 0
    text = capsys.readouterr().out
    assert "matches CPU fp32" in text and "yes" in text
    assert "host fallbacks: 0 calls" in text and "eager device kernels" in text
