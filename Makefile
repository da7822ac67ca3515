# The two quick-start commands (README.md) and what they need. Everything installs into .venv,
# so a fresh clone needs only python3, make and (for the panel) node/npm.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
LAB_ARGS ?=

.PHONY: install lab test lint bench clean labextension jstest

install: $(VENV)/.installed

## What the lab needs (`.[lab]`): `make lab` installs only this.
$(VENV)/.lab-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[lab]"
	touch $@

## Everything else the tests need (`.[test]`), on top of the lab's.
$(VENV)/.installed: $(VENV)/.lab-installed pyproject.toml
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@

## Start JupyterLab with Kiwi (embedded scheduler, no other setup).
lab: $(VENV)/.lab-installed labextension
	$(BIN)/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

## The Kiwi GPU panel (labextension/, TypeScript): npm packages, production build, and a link
## from the venv's labextensions to the build so later builds (`npm run watch`) show at once.
LABEXT_BUILT := kiwi_jupyter/labextension/static/style.js
LABEXT_SOURCES := $(wildcard labextension/src/*.ts labextension/style/* labextension/schema/*)

labextension: $(LABEXT_BUILT)

labextension/node_modules/.package-lock.json: labextension/package.json labextension/package-lock.json
	cd labextension && npm install --no-audit --no-fund
	touch $@

$(LABEXT_BUILT): $(VENV)/.lab-installed labextension/node_modules/.package-lock.json $(LABEXT_SOURCES)
	cd labextension && PATH="$(abspath $(BIN)):$$PATH" npm run build:prod
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/jupyter labextension develop --overwrite .
	touch $@

## The panel's model logic (Jest).
jstest: labextension/node_modules/.package-lock.json
	cd labextension && npm test

## The whole test suite: lint, types, then every test.
test: install lint labextension jstest
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

## Every benchmark that needs no GPU, each run three times, as one Markdown report with ranges.
## BENCH_ARGS="--quick --repeat 1" to see it work; "--only handoff,attack" for some of them.
BENCH_ARGS ?=
bench: install
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info labextension/node_modules labextension/lib kiwi_jupyter/labextension
