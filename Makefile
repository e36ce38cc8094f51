# Two entry points on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow venv bench-deps bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install 'torch==2.13.0'
	$(BIN)/pip install -e '.[dev]'
	$(BIN)/python -m tierec.warmup  # compile the kernels once per install (no run pays for it)
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	rm -rf runs/demo
	$(BIN)/tierec train --run-dir runs/demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

# The longer end-to-end runs `make test` leaves out (tests marked slow: the synthetic default with DeepFM,
# DCN-v2 and Wide&Deep, about 2.5 minutes on 2 cores).
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

# Peer systems for benchmarks: fbgemm-gpu-cpu and torchrec's pure-Python deps
# (the `bench` extra), then torchrec without its deps (otherwise pip pulls the
# CUDA fbgemm-gpu and the import breaks). Checks that no other torch came in.
bench-deps: $(STAMP)
	$(BIN)/pip install -e '.[dev,bench]'
	$(BIN)/pip install --no-deps 'torchrec==1.8.0'
	$(BIN)/python -c "import torch, fbgemm_gpu, torchrec; assert torch.__version__.startswith('2.13.0'), torch.__version__"

# The headline engine comparison (docs/performance.md lists the full set of runs).
bench: bench-deps
	$(BIN)/python -m benchmarks.run --which all --out runs/bench/bench.json

clean:
	rm -rf $(VENV) runs build *.egg-info
