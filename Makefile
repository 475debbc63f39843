# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv on first use
# and installs vspyre (with its C++ part) against torch 2.13.0 CPU, pinned in constraints.txt.
# A second `make` reinstalls only when the build inputs changed (the .installed stamp).

PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP := $(BIN)/pip install --disable-pip-version-check -q -c constraints.txt
BUILD_INPUTS := pyproject.toml setup.py constraints.txt $(wildcard src/vspyre/device/csrc/*.cpp)
PYTEST_ARGS ?=

.PHONY: demo test bench conformance install clean

demo: $(STAMP)
	$(BIN)/vspyre demo

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_fallback.py
	$(BIN)/python benchmarks/bench_runtime.py
	$(BIN)/python benchmarks/bench_inductor.py
	$(BIN)/python benchmarks/bench_standalone.py
	$(BIN)/python benchmarks/bench_shapes.py

# The OpInfo conformance sweep (issue #7): every op_db op x float32/float16 x eager/compiled/
# standalone vs the CPU, with a progress bar; resumes from build/conformance-results.jsonl
# (CONFORMANCE_ARGS=--fresh to start over) and writes docs/op-coverage.md.
CONFORMANCE_ARGS ?=
conformance: $(STAMP)
	$(BIN)/python -m vspyre.conformance --results build/conformance-results.jsonl --doc docs/op-coverage.md $(CONFORMANCE_ARGS)

install: $(STAMP)

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): $(BIN)/python $(BUILD_INPUTS)
	$(PIP) torch==2.13.0 "setuptools>=68" wheel ninja
	TORCH_DEVICE_BACKEND_AUTOLOAD=0 $(PIP) --no-build-isolation -e ".[test,models,plots]"
	touch $(STAMP)

clean:
	rm -rf $(VENV) build src/*.egg-info src/vspyre/device/*.so
