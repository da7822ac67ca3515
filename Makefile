# The two quick-start commands (README.md) and what they need. Everything installs into .venv,
# so a fresh clone needs only python3, make and (for the panel) node/npm.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: install lab test lint bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@

## Start JupyterLab with Kiwi (embedded scheduler, no other setup).
lab: install
	$(BIN)/jupyter lab

## The whole test suite: lint, types, then every test.
test: install lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: install
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) build dist *.egg-info
