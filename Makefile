# FlashAttention assignment kit. Verbs are targets; knobs are variables:
#   make grade SUBMISSIONS=path/to/folders-or-drop.zip RESULTS=results ROSTER=roster.csv GPUS=0,1
#   make grade EXECUTOR=slurm PARTITION=gpu SLURM_WORKERS=4   (grade on Slurm nodes)
#   make check SUBMISSION=student VERBOSE=1   (VERBOSE=1: ptxas registers, spills, shared memory)
#   make check SUBMISSION=student EXECUTOR=slurm PARTITION=gpu   (the check on a Slurm GPU node)
#   make check GRADER_BUILD_S=900   (a slow or busy machine: the compile's limit, default 300 s)
#   make serve STORE=service ROSTER=roster.csv [HOST=127.0.0.1 PORT=8008 GPUS=0,1]   (the check service)
#   make submit SERVER=https://... TOKEN=... KIND=check | make status SERVER=... WAIT=1   (the service)
#   make test | make test-gpu | make bench | make adversarial | make timing-trust
#   make bench-grader COPIES=100 BUDGET=15 GPUS="0 0,1" BENCH_ARGS=--warm   (grader throughput)
#   make review | make review ID=alice DECISION=cleared|disqualified NOTE="why"   (the review queue)
#   make release DIST=dist (needs no set-up) | make clean (keeps results/) | make clean-results
SHELL := /bin/sh
PYTHON_BASE ?= python3
TORCH_SPEC ?= torch==2.13.0
# auto: a machine without an NVIDIA GPU gets torch's CPU build (scripts/bootstrap.sh); pip: PyPI's.
TORCH_INDEX ?= auto
# auto: install where the machine can (Triton, TileLang: a wheel exists; Playwright: a chromium is
# installed); 1: required (set-up fails without it); 0: not installed.
WITH_TRITON ?= auto
WITH_TILELANG ?= auto
WITH_BROWSER ?= auto
SUBMISSIONS ?= examples
SUBMISSION ?= student
VERBOSE ?=
RESULTS ?= results
ROSTER ?=
POLICY ?=
JOBS ?=
# 0: compile every CUDA submission again (--no-build-cache); default: reuse unchanged builds.
BUILD_CACHE ?=
PYTEST_ARGS ?=
DIST ?= dist
# Issue 13: EXECUTOR=slurm grades (or checks: issue 15) on Slurm nodes through submitit
# (grader/executors/slurm.py): PARTITION is the nodes' partition, SLURM_WORKERS the grading array's tasks
# (each grades a share), SLURM_ARGS any more options ("--slurm-time 120 --slurm-arg mem=64G").
EXECUTOR ?= local
PARTITION ?=
SLURM_WORKERS ?=
SLURM_ARGS ?=
EXECUTOR_ARGS := --executor $(EXECUTOR) $(if $(PARTITION),--partition $(PARTITION)) $(SLURM_ARGS)
VENV := .venv
PY := $(VENV)/bin/python
GRADE_ARGS := --out $(RESULTS) $(if $(JOBS),--jobs $(JOBS)) $(if $(POLICY),--policy $(POLICY)) \
  $(if $(filter 0,$(BUILD_CACHE)),--no-build-cache)
REPORT_ARGS := $(if $(ROSTER),--roster $(ROSTER)) $(if $(POLICY),--policy $(POLICY))

# Set-up runs again whenever a knob that changes what it installs changes: the stamp's name is a
# checksum of their values (and of whether a chromium is installed), so `make test WITH_TRITON=0`
# after `make test` is a set-up of its own. scripts/bootstrap.sh writes the values into the stamp.
CHROMIUM := $(shell command -v chromium || command -v chromium-browser)
KNOBS := base=$(PYTHON_BASE) torch=$(TORCH_SPEC) triton=$(WITH_TRITON) tilelang=$(WITH_TILELANG) browser=$(WITH_BROWSER) chromium=$(CHROMIUM)
STAMP := $(VENV)/.ready-$(shell printf '%s' '$(KNOBS)' | cksum | cut -d' ' -f1)

.PHONY: env grade check serve submit status leaderboard review lint test test-gpu bench bench-grader adversarial timing-trust perf-table release clean clean-results

env: $(STAMP)

$(STAMP): pyproject.toml scripts/bootstrap.sh
	@BASE_PYTHON='$(PYTHON_BASE)' TORCH_SPEC='$(TORCH_SPEC)' TORCH_INDEX='$(TORCH_INDEX)' \
	  WITH_TRITON='$(WITH_TRITON)' WITH_TILELANG='$(WITH_TILELANG)' WITH_BROWSER='$(WITH_BROWSER)' \
	  STAMP='$@' KNOBS='$(KNOBS)' sh scripts/bootstrap.sh

grade: env
	$(PY) -m grader grade $(SUBMISSIONS) $(GRADE_ARGS) $(if $(ROSTER),--roster $(ROSTER)) \
	  $(if $(GPUS),--gpus $(GPUS)) $(EXECUTOR_ARGS) $(if $(SLURM_WORKERS),--slurm-workers $(SLURM_WORKERS))

# A slow or busy machine's check may need more time (seconds, grader/common/config.py Limits): the
# compile's, GRADER_BUILD_S (default 300), and a Python file's import's, GRADER_IMPORT_S (default
# 120): make check GRADER_BUILD_S=900. The grader reads them from its environment.
CHECK_LIMITS = $(if $(GRADER_BUILD_S),GRADER_BUILD_S='$(GRADER_BUILD_S)') \
  $(if $(GRADER_IMPORT_S),GRADER_IMPORT_S='$(GRADER_IMPORT_S)')
check: env
	$(CHECK_LIMITS) $(PY) -m grader check $(SUBMISSION) $(if $(POLICY),--policy $(POLICY)) \
	  $(if $(filter 1,$(VERBOSE)),--verbose) $(EXECUTOR_ARGS)

# Issue 33: the course check service (grader/cli/serve.py; docs/instructor-guide.md, "The check
# service"): the HTTP service and its grading worker in one process, on this machine's GPUs (GPUS)
# or Slurm's (EXECUTOR=slurm PARTITION=...), loopback unless HOST says otherwise (TLS: a reverse
# proxy in front). STORE: its folder (database, uploads, each job's results); tokens first:
# python -m grader serve tokens --roster $(ROSTER) --store $(STORE).
STORE ?=
HOST ?=
PORT ?=
serve: env
	$(PY) -m grader serve $(if $(STORE),--store $(STORE)) $(if $(ROSTER),--roster $(ROSTER)) \
	  $(if $(HOST),--host $(HOST)) $(if $(PORT),--port $(PORT)) $(if $(GPUS),--gpus $(GPUS)) \
	  $(if $(POLICY),--policy $(POLICY)) $(EXECUTOR_ARGS) \
	  $(if $(SLURM_WORKERS),--slurm-workers $(SLURM_WORKERS))

include release/client.mk

leaderboard: env
	$(PY) -m grader leaderboard --out $(RESULTS) $(REPORT_ARGS)

# Issue 30: the review queue (grader/course/review.py). Without ID: list it; ID alone: that submission in
# full, its source too; ID with DECISION (cleared or disqualified) and NOTE: record the decision
# and re-render the page and exports. ID, DECISION and NOTE reach the command through the
# environment, so a note may hold any quote or space.
review: env
	$(PY) -m grader review --out $(RESULTS) $(REPORT_ARGS) $(if $(DECISION),--decision "$$DECISION") \
	  $(if $(NOTE),--note "$$NOTE") $(if $(ID),-- "$$ID")

test: env lint
	$(PY) -m pytest -m "not gpu" $(PYTEST_ARGS)

# The grader's layers (docs/design.md): import-linter's contracts in pyproject.toml.
lint: env
	@$(PY) -c "import importlinter" 2>/dev/null || { echo "make lint: import-linter is not \
	installed in $(VENV) (make env installs it where pip can reach it: pip install 'import-linter>=2.1')"; exit 1; }
	$(VENV)/bin/lint-imports

test-gpu: env
	$(PY) -m pytest -m gpu $(PYTEST_ARGS)

bench: env
	$(PY) bench/bench.py
	$(PY) scripts/perf_table.py

# Issue 13: the grader's throughput on a synthetic course (COPIES honest copies and a few failing
# ones), graded by the grader itself: submissions per minute, overhead, stages, GPU scaling.
bench-grader: env
	$(PY) bench/bench_grader.py $(if $(COPIES),--copies $(COPIES)) $(if $(BUDGET),--budget $(BUDGET)) \
	  $(if $(GPUS),--gpus $(GPUS)) $(if $(JOBS),--jobs $(JOBS)) $(BENCH_ARGS)

# Issue 5: the adversarial submissions beside the examples, graded as a course would grade them
# (tests/adversarial/verdicts.py checks both against their expected verdicts). The examples are
# the honest kernels of every track: CUDA, Triton, CuTe and TileLang; beside them the honest
# corpus (tests/corpus: Triton written the ways students write it), none of which may be sent to
# review or flagged (issue 30).
ADVERSARIAL_EXAMPLES = naive_cuda tiled_cuda triton_flash cute_flash tilelang_flash
adversarial: env
	rm -rf build/adversarial && $(PY) tests/adversarial/assemble.py build/adversarial/submissions
	cp -r $(addprefix examples/,$(ADVERSARIAL_EXAMPLES)) build/adversarial/submissions/
	cp -r tests/corpus/*/ build/adversarial/submissions/
	GRADER_RUN_S=$${GRADER_RUN_S:-30} GRADER_TIME_BUDGET_S=$${GRADER_TIME_BUDGET_S:-5} \
	  $(PY) -m grader grade build/adversarial/submissions --out results-adversarial \
	  --build-dir build/adversarial/build $(if $(JOBS),--jobs $(JOBS)) $(if $(GPUS),--gpus $(GPUS))

# Issue 5: same kernel graded twice (< 1% apart); an SDPA FLASH wrapper in calibration mode
# (< 2% from the SDPA FLASH baseline row).
timing-trust: env
	$(PY) bench/timing_trust.py

perf-table: env
	$(PY) scripts/perf_table.py

# Issue 34: the kit is built with the base Python (scripts/release.py needs only its standard
# library), not .venv: a venv cannot move, so one made here is no use to a kit unpacked elsewhere,
# and the kit's `make check` sets up its own. DIST: where the archive goes.
release:
	$(PYTHON_BASE) scripts/release.py --out $(DIST)

# Keeps results/ (every run's pages and summary, and the grades): deleting them is its own verb.
clean:
	rm -rf build dist $(VENV) .pytest_cache

clean-results:
	rm -rf $(RESULTS) results-adversarial
