"""``vllm serve DIR`` starts on the card, answers ``/v1/completions``, and vLLM's own benchmark
client (``vllm bench serve``) completes against it. Everything on the loopback address."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = pytest.mark.slow

VLLM = os.path.join(os.path.dirname(sys.executable), "vllm")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def _post(url: str, body: dict, timeout: float = 120.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


@pytest.mark.parametrize("backend", ["inductor", "standalone"])
def test_serve_and_bench(tiny_models, tmp_path, backend):
    path = tiny_models["llama"]
    port = _free_port()
    env = dict(os.environ, VSPYRE_VLLM_BACKEND=backend, VLLM_ENABLE_V1_MULTIPROCESSING="1")
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen([VLLM, "serve", str(path), "--host", "127.0.0.1", "--port", str(port),
                               "--max-model-len", "512", "--kv-cache-memory-bytes", str(64 << 20)],
                              stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-4000:]
            try:
                if _get(base + "/health") is not None:
                    break
            except OSError:
                pass
            assert time.time() < deadline, "the server did not start in 300 s"
            time.sleep(1)
        out = _post(base + "/v1/completions", {"model": str(path), "prompt": "Hello, card", "max_tokens": 5,
                                               "temperature": 0.0, "ignore_eos": True})
        assert out["usage"]["completion_tokens"] == 5 and isinstance(out["choices"][0]["text"], str)
        bench = subprocess.run([VLLM, "bench", "serve", "--backend", "vllm", "--base-url", base, "--model", str(path),
                                "--tokenizer", str(path), "--dataset-name", "random", "--random-input-len", "40",
                                "--random-output-len", "6", "--num-prompts", "8", "--ignore-eos", "--save-result",
                                "--result-dir", str(tmp_path), "--result-filename", "bench.json"],
                               capture_output=True, text=True, timeout=600, env=env)
        assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-3000:]
        res = json.loads((tmp_path / "bench.json").read_text())
        assert res["completed"] == 8 and res["total_output_tokens"] == 8 * 6
        assert res["mean_ttft_ms"] > 0 and res["mean_itl_ms"] > 0
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
    text = (tmp_path / "server.log").read_text()
    # start-up says which graphs it compiled for the card, with which compiler, in how long
    assert f"compiled the step graph for the card with {backend}" in text, text[-4000:]
