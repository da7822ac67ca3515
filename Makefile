# The two quick-start commands (README.md) and what they need. Everything installs into .venv,
# so a fresh clone needs only python3, make and (for the panel) node/npm.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
## pytest's worker processes in `make test` and `make sanitize` (pytest-xdist; 0 runs the tests
## in the one process). Two keeps a 2-core CI machine busy while one worker waits on a daemon
## or a kernel; each worker takes the next test as it finishes one (worksteal), so one long
## test never leaves the other worker idle at the end.
TEST_WORKERS ?= 2
PYTEST_PARALLEL := -n $(TEST_WORKERS) --dist worksteal
LAB_ARGS ?=

.PHONY: help install lab test sanitize lint bench clean labextension jstest gpu-check gpu-wheels \
	core images

help: ## this list (a target's line says what it does after "##")
	@awk -F ':.*## ' '/^[a-z][a-z-]*:.*## /{printf "  make %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

## Everything the tests need (`.[test]`) in .venv, with the lab's.
install: $(VENV)/.installed ## the test tools and the lab's packages, into .venv

## The compiled scheduler core (mypyc, nodeside/compiled.py): the install builds it; this
## builds it again when a source of it changed since, so tests and benchmarks never run a core
## the sources do not match (KIWI_PURE_PYTHON=1 runs the pure one instead).
core: $(VENV)/.lint-installed ## compile the scheduler core again if its sources changed (mypyc)
	$(BIN)/python -c "import sys, nodeside.compiled as c; c.main(sys.argv[1:])" --if-stale

## What the lab needs (`.[lab]`): `make lab` installs only this.
$(VENV)/.lab-installed: pyproject.toml
	@echo "make: installing kiwi-jupyter[lab] into $(VENV); the install also builds the CUDA shim, the"
	@echo "make: compiled scheduler core (mypyc) and the panel (npm): a few quiet minutes the first time"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[lab]"
	@# The wheel's kiwi kernelspec is a fixed file; this rewrites it with what the installed
	@# ipykernel declares (kernel_protocol_version, supported_encryption: docs/kernel.md).
	$(BIN)/python -m kiwi_jupyter.kernelspec install --sys-prefix
	touch $@

# Everything else the tests need (`.[test]`), on top of the lab's.
$(VENV)/.installed: $(VENV)/.lab-installed pyproject.toml
	@echo "make: installing the test tools (.[test]) into $(VENV)"
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@

# What lint, bench and images need on top of the lab's, each on its own (pyproject.toml's
# extras of those names): none of them waits for the whole of `.[test]`.
$(VENV)/.lint-installed $(VENV)/.bench-installed $(VENV)/.images-installed: \
		$(VENV)/.%-installed: $(VENV)/.lab-installed pyproject.toml
	@echo "make: installing .[$*] into $(VENV)"
	$(BIN)/python -m pip install -q -e ".[$*]"
	touch $@

## JupyterLab with Kiwi and a scheduler of its own (no other setup), serving binder/: the two demo
## notebooks, and what you make there (kept out of git and the sdist by .gitignore).
##
## The demo's story (binder/kiwi-demo.ipynb says it to the newcomer): each notebook's burst lasts
## 15 s and the time quantum is 5 s (LAB_TQ), so two bursts side by side take turns, three each.
## At a quantum's end the scheduler asks the holder for the GPU back, with a grace of 10 s (the
## daemon's default); the holder gives it back at its next GPU operation, well within it. Where
## this machine has no NVIDIA GPU (no nvidia-smi), the notebooks use Kiwi's stand-in GPU and the
## scheduler is told the GPU has 12 MiB (LAB_GPU_MEMORY): one notebook's 8 MiB of matrices fit,
## two do not, so at each turn the one giving the GPU back moves its memory to host memory and
## the panel shows it. On a GPU machine the scheduler reads the GPU's own size.
## LAB_TQ=30 make lab for the daemon's default quantum; kiwictl -T or the panel change it live.
LAB_TQ ?= 5
LAB_DIR ?= binder
LAB_GPU_MEMORY ?= $(if $(shell command -v nvidia-smi),,12MiB)
comma := ,
LAB_SCHEDULER_ARGS = $(if $(LAB_GPU_MEMORY),--KiwiExtension.scheduler_args='["--gpu-memory"$(comma) "$(LAB_GPU_MEMORY)"]')
lab: $(VENV)/.lab-installed labextension ## JupyterLab with Kiwi and its own scheduler, serving the demo notebooks
	$(BIN)/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) --ServerApp.root_dir=$(LAB_DIR) \
		--KiwiExtension.tq=$(LAB_TQ) $(LAB_SCHEDULER_ARGS) $(LAB_ARGS)

## The Kiwi GPU panel (labextension/, TypeScript): npm packages, production build, and a link
## from the venv's labextensions to the build so later builds (`npm run watch`) show at once.
## JupyterLab 4.6 moved `jupyter labextension build|develop` to `jupyter-builder` and warns on
## the old names; the older JupyterLabs that pyproject.toml allows have only the old ones.
LABEXT_TOOL = $(if $(wildcard $(BIN)/jupyter-builder),$(BIN)/jupyter-builder,$(BIN)/jupyter labextension)
LABEXT_BUILT := kiwi_jupyter/labextension/static/style.js
LABEXT_SOURCES := $(wildcard labextension/src/*.ts labextension/style/* labextension/schema/*)

labextension: $(LABEXT_BUILT) ## build the Kiwi GPU panel (npm)

labextension/node_modules/.package-lock.json: labextension/package.json labextension/package-lock.json
	cd labextension && npm install --no-audit --no-fund
	touch $@

$(LABEXT_BUILT): $(VENV)/.lab-installed labextension/node_modules/.package-lock.json $(LABEXT_SOURCES)
	cd labextension && PATH="$(abspath $(BIN)):$$PATH" npm run build:prod
	PATH="$(abspath $(BIN)):$$PATH" $(LABEXT_TOOL) develop --overwrite .
	touch $@

## The panel's model logic (Jest).
jstest: labextension/node_modules/.package-lock.json ## the panel's Jest tests
	cd labextension && npm test

## The whole test suite: lint, types, then every test, then the shim's tests again under the
## sanitizers.
test: install core lint labextension jstest ## the whole test suite: lint, Jest, pytest, the shim under the sanitizers
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) $(PYTEST_ARGS)
	$(MAKE) --no-print-directory sanitize

## The shim's tests (no GPU), and the protocol's transcripts against its C client, against
## sanitized builds: a memory error, undefined behaviour or a data race in the C code fails the
## test that caused it, with the sanitizer's report.
## AddressSanitizer with UBSan, then ThreadSanitizer.
SANITIZED_TESTS := tests/shim tests/protocol/test_transcripts.py tests/protocol/test_c_decoder.py \
	tests/protocol/test_client_handle.py
sanitize: install ## the shim's tests under AddressSanitizer, then ThreadSanitizer
	KIWI_TEST_SANITIZE=address $(BIN)/python -m pytest -q $(PYTEST_PARALLEL) -m "not gpu" \
		$(SANITIZED_TESTS)
	KIWI_TEST_SANITIZE=thread $(BIN)/python -m pytest -q $(PYTEST_PARALLEL) -m "not gpu" \
		$(SANITIZED_TESTS)

## ruff and mypy, and the files made from the protocol's table (nodeside/protocol/messages.py),
## from the formatters (nodeside/formats_panel.py) and from the daemon's status document (the panel's
## fixture) read what those make now; every path the docs name exists (tests/doc_references.py).
lint: $(VENV)/.lint-installed ## ruff, mypy, the generated files and the docs' references
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m nodeside.protocol.generate --check
	$(BIN)/python -m nodeside.formats_panel --check
	$(BIN)/python tests/status_fixtures.py --check
	$(BIN)/python tests/doc_references.py --check
	$(BIN)/python tests/shim_layout.py --check

## The node and notebook images (docs/kubernetes.md), built with buildah from nodeside/Dockerfile
## and images/notebook/Dockerfile as shipped, both from the one wheel this checkout builds; their
## bases upstream where they can be pulled, else stand-ins from Debian's packages
## (images/build.sh says how). Then each image is started and checked (tests/images).
## Needs buildah and mmdebstrap (apt-get install buildah mmdebstrap) and root.
images: $(VENV)/.images-installed core labextension ## build the node and notebook images and check them (buildah, root)
	PYTHON=$(BIN)/python images/build.sh
	KIWI_TEST_IMAGES=1 $(BIN)/python -m pytest -q -p no:cacheprovider tests/images; \
		status=$$?; images/build.sh --remove-containers; exit $$status

## Every benchmark that needs no GPU, each run three times, as one Markdown report with ranges.
## BENCH_ARGS="--quick --repeat 1" to see it work; "--only handoff,attack" for some of them.
BENCH_ARGS ?=
bench: $(VENV)/.bench-installed core ## every benchmark that needs no GPU, into one report
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

## On a machine with an NVIDIA GPU (docs/gpu-check.md): build the shim, run the GPU tests and
## every GPU benchmark, one Markdown report. Uses the machine's own Python and packages (no venv,
## no network); without a GPU it is a dry run that says so.
GPU_PYTHON ?= python3
GPU_CHECK_ARGS ?=
gpu-check: ## on a machine with an NVIDIA GPU: its tests and benchmarks
	$(GPU_PYTHON) -m benchmarks.shim.gpu_check $(GPU_CHECK_ARGS)

## Wheels for a GPU machine that lacks a package gpu-check needs (it names any it misses), for
## its Python 3.12 on x86-64, into the ignored .whl/ to carry there. The package's own runtime
## dependencies and the test runner's plugin (the GPU image had them all on 2026-11-17), and
## what the two-kernel switch test needs that the image lacks: Jupyter's kernel and client,
## each pinned, with every dependency of theirs the image does not have (they are installed
## --no-deps; gpu-check installs them itself where the machine lacks jupyter_client or
## ipykernel: docs/gpu-check.md).
JUPYTER_WHEELS ?= jupyter_client==8.10.0 jupyter_core==5.9.1 ipykernel==7.4.0 ipython==9.18.1 \
	ipython_pygments_lexers==1.1.1 comm==0.2.3 debugpy==1.8.22 matplotlib-inline==0.2.2 \
	nest-asyncio2==1.7.4 jedi==0.20.1 parso==0.8.7 pexpect==4.9.0 ptyprocess==0.7.0 \
	prompt_toolkit==3.0.53 wcwidth==0.9.4 stack_data==0.6.3 executing==2.3.0 \
	asttokens==3.0.2 pure_eval==0.2.4 pyzmq==27.3.0 tornado==6.6.1 traitlets==5.16.1 \
	platformdirs==4.14.8
GPU_WHEELS ?= pyyaml prometheus_client nvidia-ml-py pytest-timeout $(JUPYTER_WHEELS)
gpu-wheels: install ## wheels for a GPU machine that lacks some of gpu-check's packages
	$(BIN)/python -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
		--platform manylinux2014_x86_64 -d .whl $(GPU_WHEELS)

clean: ## remove .venv and every build output
	rm -rf $(VENV) .build build dist *.egg-info labextension/node_modules labextension/lib kiwi_jupyter/labextension
	rm -f nodeside/compiled.sha256 $(wildcard nodeside/*.so nodeside/*/*.so)
