# realm-hf developer targets. `make help` lists them.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
LEGACY_VENV ?= /tmp/realm-legacy-venv
# torch first, pinned: the local CPU wheel installs in seconds; any other torch pulls a multi-GB CUDA build.
TORCH ?= torch==2.13.0

.DEFAULT_GOAL := help
.PHONY: help install test test-all demo lint format legacy-venv fixtures bench clean

help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-12s %s\n", $$1, $$2}'

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed ## Create .venv and install realm-hf with its test/dev extras (torch CPU first)

test: install ## Run the test suite (slow and gpu tests deselected)
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q

test-all: install ## Run every test, slow ones included
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m "not gpu"

demo: install ## The main job: FOLDOC corpus + index, fine-tune with re-indexing, save, answer with provenance
	$(if $(MODEL),,HF_HUB_OFFLINE=$${HF_HUB_OFFLINE:-1}) $(PY) examples/demo_foldoc.py $(if $(MODEL),--model $(MODEL),)

lint: install ## ruff check + format check
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: install ## ruff format + autofix
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

$(LEGACY_VENV)/bin/python:
	$(PYTHON) -m venv $(LEGACY_VENV)
	$(LEGACY_VENV)/bin/pip install -q $(TORCH)
	$(LEGACY_VENV)/bin/pip install -q transformers==4.57.6 huggingface-hub==0.36.2 numpy

legacy-venv: $(LEGACY_VENV)/bin/python ## The legacy reference: transformers 4.57.6 (last with REALM) in its own venv

fixtures: legacy-venv ## Regenerate tests/fixtures/legacy with the legacy reference
	$(LEGACY_VENV)/bin/python scripts/make_legacy_fixtures.py

bench: install legacy-venv ## Run the benchmark scripts (tens of minutes on 2 cores; see bench/README.md)
	$(PY) bench/search.py --blocks 1000000 --queries 1000
	$(PY) bench/embed.py
	REALM_LEGACY_PYTHON=$(LEGACY_VENV)/bin/python $(PY) bench/qa.py
	$(PY) bench/reindex.py
	$(PY) bench/pretrain_foldoc.py
	$(PY) bench/train_memory.py
	REALM_LEGACY_PYTHON=$(LEGACY_VENV)/bin/python $(PY) bench/train_step.py
	$(PY) bench/learning_foldoc.py
	$(PY) bench/retrieval_ceiling_foldoc.py
	$(PY) bench/cli_startup.py

clean: ## Remove build artefacts and the demo output
	rm -rf build dist *.egg-info src/*.egg-info demo_output
