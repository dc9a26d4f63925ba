# Two commands matter: `make run` (the main job on the embedded default) and `make test`.
# Both run `make setup` first, which is idempotent: it rebuilds the venv only when
# pyproject.toml or constraints.txt change.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
TORCH_VERSION ?= 2.13.0
EXTRAS ?= train,dev
PYTEST_ARGS ?=

.PHONY: setup test run lock clean help

help:
	@echo "make run    - run the main job on the embedded default"
	@echo "make test   - run the whole test suite"
	@echo "make setup  - create $(VENV) and install the project (idempotent)"
	@echo "make lock   - refresh constraints.txt from the current venv"

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	@# torch first, pinned, so no other package pulls a multi-GB CUDA build it did not ask for.
	@# On a machine without CUDA, set TORCH_INDEX_URL to a CPU wheel index if pip would pick a CUDA build.
	@if $(PY) -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$(TORCH_VERSION)' else 1)" 2>/dev/null; then \
		echo "torch $(TORCH_VERSION) already installed"; \
	else \
		$(PIP) install -q "torch==$(TORCH_VERSION)" $${TORCH_INDEX_URL:+--index-url $$TORCH_INDEX_URL}; \
	fi
	$(PIP) install -q -c constraints.txt -e ".[$(EXTRAS)]"
	@touch $(STAMP)

test: setup
	$(PY) -m pytest tests $(PYTEST_ARGS)

run: setup
	@bash scripts/run_demo.sh

lock:
	$(PIP) freeze --exclude-editable | grep -v -E '^(torch|areal-tasks)==' > constraints.txt

clean:
	rm -rf $(VENV) .pytest_cache
