# specdec-harness: the two commands a fresh clone needs.
#
#   make run    set up .venv and run scenarios/quickstart.yaml on this machine (CPU is fine),
#               logging to the embedded MLflow store results/mlflow.db
#   make test   set up .venv with the dev extras and run the test suite
#
# torch is needed only by the worker. TORCH pins the build this machine serves (the CPU
# build of 2.13.0 here); on a GPU box, point it at your CUDA build or reuse an installed one.

PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install --quiet --disable-pip-version-check

.PHONY: run test setup clean ui

run: $(VENV)/.installed
	$(VENV)/bin/harness run scenarios/quickstart.yaml

# One test process per core, a file's tests in one process (module fixtures). The suite is
# CPU-bound (real workers, sshd, MLflow, Chromium, the Triton interpreter): on two cores, two
# processes ran it in 423 s, three in 437 s, four in 465 s (2026-12-01, the same clone).
# One OpenMP thread per process: with more processes than cores, torch's spinning intra-op
# threads slow every CPU worker the tests start several times over (a real-worker A/B gate
# test: 21 s with one thread, 91 s with the default, on two loaded cores).
TEST_JOBS ?= $(shell nproc 2>/dev/null || echo 2)

test: $(VENV)/.installed-dev
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile

ui: $(VENV)/.installed
	$(VENV)/bin/harness ui

setup: $(VENV)/.installed-dev

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# torch first and pinned, so the ">=" in the extras is already satisfied and pip never
# reaches for a multi-gigabyte CUDA build.
$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(PIP) "$(TORCH)"
	$(PIP) -e ".[worker]"
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	$(PIP) -e ".[dev]"
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info
