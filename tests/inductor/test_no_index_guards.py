"""A symbolic size is not guarded to fit 32-bit indexing: tile programs compute addresses exactly,
and such a guard recompiled the vLLM plugin's step graph of an 8B model at 128 tokens."""

import torch

from vspyre import compat


def test_large_symbolic_matmul_does_not_recompile():
    counters = compat.get("dynamo_counters")
    compat.get("dynamo_reset")()
    w = None
    with torch.spyre.estimate_only():          # costed, not run: an 8B-sized projection costs no CPU time
        w = torch.empty(4096, 4096, dtype=torch.float16, device="spyre")
        f = torch.compile(lambda x: torch.relu(x @ w))
        before = counters["stats"]["unique_graphs"]
        for t in (64, 1024, 4096):
            x = torch.empty(t, 4096, dtype=torch.float16, device="spyre")
            compat.mark_dynamic(x, 0)
            f(x)
        # 64 x 4096 x 4096 already passes 2**31 / 2**24 = 128 rows: a 32-bit guard would recompile
        assert counters["stats"]["unique_graphs"] - before == 1
