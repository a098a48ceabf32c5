# One virtual environment, built from the pinned set in constraints.txt.
# pip, setuptools and wheel first (setuptools builds DeepSpeed and this package), then
# torch (the pin keeps pip from pulling CUDA wheels on CPU machines), then
# DeepSpeed without build isolation (its build imports the torch just installed), then
# this package, then Whisper's tokenizer assets without their heavy dependencies (numba,
# triton: never imported, so pip is told not to warn that they are missing), then
# DeepSpeed's CPU op, compiled once here rather than inside the first run.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# --build-constraint: what pip builds from source in an isolated environment (this package,
# an sdist dependency) is built with constraints.txt's setuptools too. The venv's own pip
# may predate that option: it first installs the pinned pip. DeepSpeed builds without isolation,
# with the venv's own (pinned) setuptools, and pip refuses --build-constraint there.
PIP_PINNED := $(BIN)/pip install --quiet --constraint constraints.txt
PIP := $(PIP_PINNED) --build-constraint constraints.txt

.PHONY: install demo demo-chat demo-preference test test-all lint format bench gpu-check image-check image-test clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP_PINNED) pip setuptools wheel
	$(PIP) torch
	DS_BUILD_OPS=0 $(PIP_PINNED) --no-build-isolation deepspeed
	$(PIP) --editable '.[test,ray,serve]'
	$(PIP) --no-deps --no-warn-conflicts openai-whisper
	$(BIN)/python -m trainer.build_cpu_ops
	touch $@

demo: install
	$(BIN)/python -m trainer --nproc_per_node 2

# Text generation's demo: a tiny Qwen2 learns invented capitals from chats (trainer/tasks/text_generation/demo.py).
demo-chat: install
	$(BIN)/python -m trainer --task text-generation --nproc_per_node 1 --deepspeed none

# Preference tuning's demo: a tiny Qwen2 given an SFT stage, then DPO on pairs that prefer
# answers ending "Safe travels!"; the share of sampled answers that do, before and after, and
# the reward accuracy (trainer/tasks/preference_tuning/demo.py).
demo-preference: install
	$(BIN)/python -m trainer --task preference-tuning --nproc_per_node 1 --deepspeed none
	$(BIN)/python -m trainer.tasks.preference_tuning.demo outputs/preference-demo

# The fast tier (a few minutes): the layer contracts, then every test not marked slow.
# Each tier ends with its 15 slowest tests (--durations): a slow test that grows shows there.
# pytest exits 5 when a marker selects no test: a tier left empty is not a failure.
# Tests run in TEST_WORKERS processes (pytest-xdist), a test file per process at a time, so
# a module's shared run is made once; TEST_WORKERS=0 runs them in this one process.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15
test: install
	$(BIN)/lint-imports
	$(PYTEST) -m "not slow" tests || test $$? -eq 5

# Everything (what CI runs): the fast tier first, so a broken build fails in minutes,
# then the end-to-end runs that start real training processes (and the few other tests
# of many seconds each).
test-all: test
	$(PYTEST) -m slow tests || test $$? -eq 5

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

bench: install
	$(BIN)/python bench/preprocessing.py

# The GPU path proved in one command (bench/gpu_check.py, docs/benchmarks.md "The GPU check"):
# every part on this node's GPUs, each in its own process with its own time limit (under
# 8 minutes in all on one H100-class GPU), one table as Markdown and JSON in OUT
# (outputs/gpu-check unless given: make gpu-check OUT=folder).
# GPU_CHECK_FLAGS=--cpu: every part at tiny sizes on this CPU.
OUT ?= outputs/gpu-check
GPU_CHECK_FLAGS ?=
gpu-check: install
	$(BIN)/python bench/gpu_check.py --out $(OUT) $(GPU_CHECK_FLAGS)

# The image's Python stack with CUDA torch and DeepSpeed's compiled ops, built for real in a
# fresh venv outside the repository (slow: GBs of wheels, a compile; not part of `make test`).
# PYTHON must be a 3.12, as in the image: make image-check PYTHON=python3.12
image-check:
	PYTHON=$(PYTHON) docker/check-stack.sh

# The three images built and run as Cloud Build and their users run them
# (docker/image-test.sh): their smoke tests, the demo trained in the training image, its model
# served by the serving image and by google-cloud-aiplatform's LocalModel. Needs a Docker
# engine; slow (cold builds take about 25 minutes on 2 cores); never part of `make test`. Run
# it when docker/, cloudbuild.yaml, pyproject.toml or constraints.txt change. On a machine that
# pulls from no registry: make image-test DOCKER=... CUDA_BASE=<a stand-in base>
DOCKER ?= docker
CUDA_BASE ?=
RAY_BASE ?=
image-test: install
	DOCKER="$(DOCKER)" CUDA_BASE="$(CUDA_BASE)" RAY_BASE="$(RAY_BASE)" PYTHON=$(BIN)/python \
		docker/image-test.sh

clean:
	rm -rf $(VENV) outputs .pytest_cache
