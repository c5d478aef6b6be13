# FlashAttention assignment kit. Verbs are targets; knobs are variables:
#   make grade SUBMISSIONS=path/to/folders RESULTS=results
#   make check SUBMISSION=student
#   make test | make test-gpu | make bench | make adversarial | make timing-trust
#   make release | make clean
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

.PHONY: env grade check leaderboard test test-gpu bench adversarial timing-trust perf-table release clean

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

# Issue 5: the adversarial submissions beside the examples, graded as a course would grade them.
adversarial: env
	rm -rf build/adversarial && $(PY) tests/adversarial/assemble.py build/adversarial/submissions
	cp -r examples/naive_cuda examples/triton_flash examples/tiled_cuda build/adversarial/submissions/
	GRADER_RUN_S=$${GRADER_RUN_S:-30} GRADER_TIME_BUDGET_S=$${GRADER_TIME_BUDGET_S:-5} \
	  $(PY) -m grader grade build/adversarial/submissions --out results-adversarial \
	  --build-dir build/adversarial/build $(if $(JOBS),--jobs $(JOBS))

# Issue 5: same kernel graded twice (< 1% apart); an SDPA FLASH wrapper in calibration mode
# (< 2% from the SDPA FLASH baseline row).
timing-trust: env
	$(PY) bench/timing_trust.py

perf-table: env
	$(PY) scripts/perf_table.py

release: env
	$(PY) scripts/release.py --out dist

clean:
	rm -rf build results results-adversarial dist $(VENV) .pytest_cache
