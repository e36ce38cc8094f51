# Two entry points on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test venv bench-deps bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install 'torch==2.13.0'
	$(BIN)/pip install -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/tierec train --run-dir runs/demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

# Peer systems for benchmarks: fbgemm-gpu-cpu, then torchrec without its deps
# (otherwise pip pulls the CUDA fbgemm-gpu and the import breaks).
bench-deps: $(STAMP)
	$(BIN)/pip install -e '.[dev,bench]'
	$(BIN)/pip install --no-deps 'torchrec==1.8.0'
	$(BIN)/pip install 'tensordict' 'iopath' 'pyre-extensions' 'typing-inspect' || true

bench: bench-deps
	$(BIN)/python -m benchmarks.run

clean:
	rm -rf $(VENV) runs build *.egg-info
