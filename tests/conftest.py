"""Test-wide set-up: two virtual cards so cross-card behaviour is testable in one process."""

import os

# Must happen before torch is imported (torch autoloads the spyre device at import).
os.environ.setdefault("VSPYRE_NUM_CARDS", "2")
# The planner's cross-process cache starts empty for each test run, in a folder of its own (the
# tests then exercise both its stores and its hits, and never read plans from another run).
if "VSPYRE_CACHE_DIR" not in os.environ:
    import tempfile
    os.environ["VSPYRE_CACHE_DIR"] = tempfile.mkdtemp(prefix="vspyre-test-cache-")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_fallback_state():
    """Each test starts with allow mode and empty fallback and eager-kernel counters."""
    prev = torch.spyre.set_fallback_mode("allow")
    torch.spyre.reset_fallback_stats()
    torch.spyre.reset_eager_kernel_stats()
    yield
    torch.spyre.set_fallback_mode(prev)
