# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv on first use
# and installs vspyre (with its C++ part) against torch 2.13.0 CPU, pinned in
# constraints/torch-2.13.0.txt. A second `make` reinstalls only when the build inputs changed (the
# .installed stamp).
#
# Other PyTorch releases: `make test TORCH=2.15.0` (or 2.14.1) uses its own environment,
# .venv-2.15.0, pinned by constraints/torch-2.15.0.txt, so switching releases reinstalls nothing.
# 2.14.1 lies on this machine's disk; 2.15.0 comes from the registry (a ~3 GB CUDA build that runs
# on the CPU), past the machine's pip cap on torch (PIP_CONFIG_FILE=/dev/null for that one).

PY ?= python3.11
TORCH ?= 2.13.0
VENV := $(if $(filter 2.13.0,$(TORCH)),.venv,.venv-$(TORCH))
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PINS := constraints/torch-$(TORCH).txt
PIPCFG := $(if $(filter 2.13.% 2.14.%,$(TORCH)),,PIP_CONFIG_FILE=/dev/null)
PIP := $(PIPCFG) $(BIN)/pip install --disable-pip-version-check -q -c $(PINS)
BUILD_INPUTS := pyproject.toml setup.py $(PINS) src/vspyre/device/_extname.py $(wildcard src/vspyre/device/csrc/*.cpp)
PYTEST_ARGS ?=
# The suites run on every core (pytest-xdist; a test module stays on one worker, so its fixtures are
# built once): `make test JOBS=0` runs them in one process.
JOBS ?= auto
XDIST := $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist loadscope)
# vLLM's own environment (see test-vllm below)
VLLM_VENV := .venv-vllm
VLLM_PINS := constraints/vllm-0.32.0.txt
VLLM_PIP := $(VLLM_VENV)/bin/pip install --disable-pip-version-check -q -c $(VLLM_PINS)
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: demo test test-vllm serve bench-serving bench conformance conformance-8bit install clean

demo: $(STAMP)
	$(BIN)/vspyre demo

# `make test` (torch 2.13.0) also runs the serving tests (tests/serving: the vLLM plugin and
# `vspyre serve-estimate`) in vLLM's own environment; `make test TORCH=...` runs the core suite only
# (vLLM pins torch 2.13.0).
SERVING := $(filter 2.13.0,$(TORCH))
test: $(STAMP) $(if $(SERVING),$(VLLM_STAMP))
	$(BIN)/python -m pytest -q $(XDIST) $(PYTEST_ARGS)
ifneq ($(SERVING),)
	$(VLLM_VENV)/bin/python -m pytest -q $(XDIST) tests/serving $(PYTEST_ARGS)
endif

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_fallback.py
	$(BIN)/python benchmarks/bench_runtime.py
	$(BIN)/python benchmarks/bench_inductor.py
	$(BIN)/python benchmarks/bench_standalone.py
	$(BIN)/python benchmarks/bench_shapes.py
	$(BIN)/python benchmarks/bench_estimate.py
	$(BIN)/python benchmarks/bench_compile_depth.py
	$(BIN)/python benchmarks/bench_eager.py
	$(BIN)/python benchmarks/bench_validation.py --fit
	$(MAKE) bench-serving

# The OpInfo conformance sweep (issue #7): every op_db op x float32/float16/bfloat16 x eager/compiled/
# standalone vs the CPU, with a progress bar; resumes from build/conformance-results.jsonl
# (CONFORMANCE_ARGS=--fresh to start over) and writes docs/op-coverage.md.
CONFORMANCE_ARGS ?=
conformance: $(STAMP)
	$(BIN)/python -m vspyre.conformance --results build/conformance-results-$(TORCH).jsonl --doc docs/op-coverage.md $(CONFORMANCE_ARGS)

# The same sweep in the card's 8-bit dtypes (int8, float8_e4m3fn, float8_e5m2): the ops whose OpInfo
# lists them for the CPU; writes docs/op-coverage-8bit.md and its pass rates into docs/op-coverage.md.
# fp8 (3 ops) takes more samples: eye's first 10 are empty.
FP8_HEADER := fp8 ops with up to 200 eager / 24 compiled and standalone samples (eye's first 10 are 0 x n).
conformance-8bit: $(STAMP)
	$(BIN)/python -m vspyre.conformance --8bit --dtypes float8_e4m3fn float8_e5m2 --eager-samples 200 --compiled-samples 24 --results build/conformance-results-fp8-$(TORCH).jsonl $(CONFORMANCE_ARGS)
	$(BIN)/python -m vspyre.conformance --8bit --dtypes int8 --results build/conformance-results-8bit-$(TORCH).jsonl build/conformance-results-fp8-$(TORCH).jsonl --header "$(FP8_HEADER)" $(CONFORMANCE_ARGS)

install: $(STAMP)

# The serving environment (docs/serving.md): vLLM pins its own torch, so it gets its own venv.
# vllm 0.32.0 pins torch==2.13.0 (the CPU build on this machine's disk). Its multimodal media
# packages (torchvision, torchaudio, torchcodec) are removed: their compiled parts do not load beside
# the CPU torch build, vLLM imports them only for multimodal inputs, and the plugin refuses those.

test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -q $(XDIST) tests/serving $(PYTEST_ARGS)

# `make serve` serves MODEL (a checkpoint directory; default: a tiny Llama written on first use) on
# the card with vLLM's OpenAI server; VSPYRE_VLLM_BACKEND=standalone for the old compiler.
MODEL ?= build/tiny-llama
SERVE_ARGS ?=
serve: $(VLLM_STAMP)
	test -f $(MODEL)/config.json || $(VLLM_VENV)/bin/vspyre make-model $(MODEL)
	$(VLLM_VENV)/bin/vllm serve $(MODEL) $(SERVE_ARGS)

bench-serving: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python benchmarks/bench_serving.py
	$(VLLM_VENV)/bin/python benchmarks/bench_serve_estimate.py

$(VLLM_STAMP): $(BUILD_INPUTS) $(VLLM_PINS)
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_PIP) torch==2.13.0 vllm==0.32.0 "setuptools>=68" wheel ninja
	TORCH_DEVICE_BACKEND_AUTOLOAD=0 $(VLLM_PIP) --no-build-isolation -e ".[test,models,plots,torchao]"
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

$(BIN)/python:
	@test -f $(PINS) || { echo "make: no pin file $(PINS): supported releases are $$(ls constraints | sed 's/torch-//; s/.txt//' | tr '\n' ' ')"; exit 2; }
	$(PY) -m venv $(VENV)

$(STAMP): $(BIN)/python $(BUILD_INPUTS)
	$(PIP) torch==$(TORCH) "setuptools>=68" wheel ninja
	TORCH_DEVICE_BACKEND_AUTOLOAD=0 $(PIP) --no-build-isolation -e ".[test,models,plots,quant]"
	touch $(STAMP)

clean:
	rm -rf .venv .venv-* build src/*.egg-info src/vspyre/device/*.so
