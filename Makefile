# FlashAttention assignment kit. Verbs are targets; knobs are variables:
#   make grade SUBMISSIONS=path/to/folders RESULTS=results
#   make check SUBMISSION=student
#   make test | make test-gpu | make bench | make release | make clean
SHELL := /bin/sh
PYTHON_BASE ?= python3
TORCH_SPEC ?= torch==2.13.0
SUBMISSIONS ?= examples
SUBMISSION ?= student
RESULTS ?= results
JOBS ?=
PYTEST_ARGS ?=
VENV := .venv
PY := $(VENV)/bin/python
GRADE_ARGS := --out $(RESULTS) $(if $(JOBS),--jobs $(JOBS))

.PHONY: env grade check leaderboard test test-gpu bench perf-table release clean

env: $(VENV)/.ready

$(VENV)/.ready: pyproject.toml scripts/bootstrap.sh
	BASE_PYTHON=$(PYTHON_BASE) TORCH_SPEC=$(TORCH_SPEC) sh scripts/bootstrap.sh

grade: env
	$(PY) -m grader grade $(SUBMISSIONS) $(GRADE_ARGS)

check: env
	$(PY) -m grader check $(SUBMISSION)

leaderboard: env
	$(PY) -m grader leaderboard --out $(RESULTS)

test: env
	$(PY) -m pytest -m "not gpu" $(PYTEST_ARGS)

test-gpu: env
	$(PY) -m pytest -m gpu $(PYTEST_ARGS)

bench: env
	$(PY) bench/bench.py
	$(PY) scripts/perf_table.py

perf-table: env
	$(PY) scripts/perf_table.py

release: env
	$(PY) scripts/release.py --out dist

clean:
	rm -rf build results dist $(VENV) .pytest_cache
