import pytest
import torch

from vspyre.inductor.wrapper import reset_compiled_fallbacks


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    reset_compiled_fallbacks()
    yield
    torch._dynamo.reset()
