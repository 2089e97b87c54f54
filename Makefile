# The two commands of the README. Both create .venv and install the project first (needs Python 3.11+).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: quickstart test lint bench

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# the whole pipeline (download, train, aggregate) on the quick setting: LeNet, real CIFAR-10, minutes on a CPU
quickstart: $(BIN)/.installed
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m cheaptrain.quick

# lint, then every test (unit tests and the end-to-end runs of the real stages on the shared CIFAR-10)
test: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
