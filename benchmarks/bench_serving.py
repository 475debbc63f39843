"""vLLM's engine on the virtual card, each compiler side by side with the same engine on the host CPU.

A tiny Llama (harness.checkpoints, random weights) serves 32 requests (prompts of 16-256 tokens,
16 output tokens each, greedy, submitted at once: vLLM's scheduler batches them continuously with
512-token prefill chunks). Each backend runs in its own process:

* ``cpu``        - the plugin's runner on the host CPU in eager PyTorch (vLLM's own CPU backend
  needs its compiled CPU kernels, which the PyPI wheel does not carry): the wall-time baseline;
* ``inductor``   - the card, the step graph compiled by Inductor with the card's extension;
* ``standalone`` - the card, the step graph compiled by the standalone compiler.

Printed per backend: start-up (engine + compile) cold (fresh Inductor, FX-graph and plan caches)
and warm (a second process with those caches kept), the graphs compiled; host wall time per step
and its ratio to the CPU's (first pass: every new step shape is planned; second pass: the same
requests again, shapes already planned); device kernels and host fallbacks per step; the latency
model's estimated device time per step, split by step kind (prefill chunk, decode batch, mixed).
All figures name the hardware preset; the estimate assumes no host overhead between launches.

    python benchmarks/bench_serving.py [--requests 32] [--hw torch-spyre] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

BACKENDS = ("cpu", "inductor", "standalone")


def one(backend: str, model: str, requests: int, seed: int) -> dict:
    os.environ["VSPYRE_VLLM_BACKEND"] = backend
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch
    from vllm import LLM, SamplingParams

    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(16, 257, (requests,), generator=g).tolist()
    prompts = [{"prompt_token_ids": torch.randint(3, 500, (n,), generator=g).tolist()} for n in lens]
    t0 = time.perf_counter()
    llm = LLM(model, dtype="float16", kv_cache_memory_bytes=256 << 20, max_model_len=1024, seed=0,
              enable_prefix_caching=False)
    startup = time.perf_counter() - t0
    st0 = llm.collective_rpc("runner_stats")[0]
    sp = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    passes = []
    for _ in range(2 if requests else 0):
        before = llm.collective_rpc("runner_stats")[0]
        t1 = time.perf_counter()
        llm.generate(prompts, sp, use_tqdm=False)
        wall = time.perf_counter() - t1
        after = llm.collective_rpc("runner_stats")[0]
        steps = after["per_step"][len(before["per_step"]):]
        passes.append({"wall_s": wall, "steps": steps, "graphs": after["graphs"] - before["graphs"],
                       "compile_s": after["compile_s"] - before["compile_s"]})
    from vspyre import hardware
    return {"backend": backend, "startup_s": startup, "graphs_at_startup": st0["graphs"],
            "compile_s_at_startup": st0["compile_s"], "passes": passes, "prompt_tokens": sum(lens),
            "hw": hardware.get_config().name}


def _summary(r: dict) -> dict:
    from vspyre.vllm_plugin.runner import Step, by_kind

    out = {}
    for i, p in enumerate(r["passes"]):
        steps = [Step._make(s) for s in p["steps"]]
        n = max(len(steps), 1)
        kinds = {k: {"steps": d["steps"], "wall_ms": 1e3 * d["mean_wall_s"], "est_us": d["mean_est_us"],
                     "tokens": d["mean_tokens"]} for k, d in by_kind(steps).items()}
        out[f"pass{i + 1}"] = {
            "steps": len(steps), "wall_ms_per_step": 1e3 * sum(s.wall_s for s in steps) / n,
            "fallbacks_per_step": sum(s.fallbacks for s in steps) / n,
            "kernels_per_step": sum(s.kernels for s in steps) / n,
            "est_ms_total": sum(s.est_us for s in steps) / 1e3, "graphs": p["graphs"], "kinds": kinds}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hw", default=None, help="hardware preset (VSPYRE_HW)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.hw:
        os.environ["VSPYRE_HW"] = a.hw
    if a.one:
        print("RESULT " + json.dumps(one(a.one, a.model, a.requests, a.seed)))
        return

    from vspyre.harness import checkpoints

    tmp = tempfile.mkdtemp(prefix="vspyre-bench-serving-")
    model = checkpoints.write(os.path.join(tmp, "llama"), "llama")
    results = {}
    for b in BACKENDS:
        caches = {"TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, f"inductor-{b}"),
                  "VSPYRE_CACHE_DIR": os.path.join(tmp, f"vspyre-{b}")}
        env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", **caches)
        runs = []
        for requests in (a.requests, 0):          # cold caches with the load; then a warm start-up only
            p = subprocess.run([sys.executable, __file__, "--one", b, "--model", model, "--requests", str(requests),
                                "--seed", str(a.seed)], capture_output=True, text=True, env=env)
            line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
            if p.returncode or not line:
                print(f"{b}: failed\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
                sys.exit(1)
            runs.append(json.loads(line[0][7:]))
        results[b] = runs[0]
        results[b]["warm_startup_s"] = runs[1]["startup_s"]
        results[b]["warm_compile_s"] = runs[1]["compile_s_at_startup"]
        results[b]["summary"] = _summary(results[b])

    hw = results["inductor"]["hw"]
    print(f"\nvLLM 0.32 serving a tiny Llama (2 layers, width 128, GQA 4/2, fp16), {a.requests} requests "
          f"({results['cpu']['prompt_tokens']} prompt tokens, 16 output tokens each), greedy, 512-token chunks")
    print(f"device estimates: hardware preset '{hw}', device time only (no host overhead per launch)\n")
    cpu = {k: results["cpu"]["summary"][k]["wall_ms_per_step"] for k in ("pass1", "pass2")}
    hdr = (f"{'backend':<11} {'start-up s':>10} {'warm':>5} {'graphs':>6} {'compile s':>9} {'warm':>5} {'steps':>5} "
           f"{'wall ms/step p1':>15} {'vs cpu':>7} {'wall ms/step p2':>15} {'vs cpu':>7} {'kernels/step':>12} "
           f"{'fallbacks/step':>14} {'est. device ms':>14}")
    print(hdr)
    print("-" * len(hdr))
    for b, r in results.items():
        s = r["summary"]
        print(f"{b:<11} {r['startup_s']:>10.1f} {r['warm_startup_s']:>5.1f} "
              f"{r['graphs_at_startup'] + s['pass1']['graphs'] + s['pass2']['graphs']:>6} "
              f"{r['compile_s_at_startup']:>9.1f} {r['warm_compile_s']:>5.1f} {s['pass1']['steps']:>5} "
              f"{s['pass1']['wall_ms_per_step']:>15.1f} {s['pass1']['wall_ms_per_step'] / cpu['pass1']:>6.1f}x "
              f"{s['pass2']['wall_ms_per_step']:>15.1f} {s['pass2']['wall_ms_per_step'] / cpu['pass2']:>6.1f}x "
              f"{s['pass2']['kernels_per_step']:>12.1f} {s['pass2']['fallbacks_per_step']:>14.2f} "
              f"{s['pass2']['est_ms_total']:>14.2f}")
    print("\nestimated device time per step on the card (second pass), by step kind:")
    for b in ("inductor", "standalone"):
        for k, v in results[b]["summary"]["pass2"]["kinds"].items():
            print(f"  {b:<11} {k:<8} {v['steps']:>3} steps, {v['tokens']:>6.1f} tokens/step: "
                  f"{v['est_us']:>8.1f} us estimated, {v['wall_ms']:>7.1f} ms host wall")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
