"""The serving tests run in vLLM's environment (`make test-vllm`); elsewhere they are skipped."""

import os

import pytest

for k, v in {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
             "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}.items():
    os.environ.setdefault(k, v)

pytest.importorskip("vllm", reason="vLLM is not installed here: `make test-vllm` builds its environment")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """family -> directory of a tiny checkpoint (config.json, safetensors, tokenizer)."""
    from vspyre.harness import checkpoints

    root = tmp_path_factory.mktemp("models")
    return {f: checkpoints.write(root / f, f) for f in checkpoints.FAMILIES}
