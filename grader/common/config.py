"""Every number the grader depends on, in one place, with where it comes from."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

GRADER_DIR = Path(__file__).resolve().parents[1]   # grader/
REPO_ROOT = GRADER_DIR.parent

# Tolerance: rtol = atol = 1e-2, as in the CS149 assignment and the seeds' own checks.
# An element passes when |got - expected| <= ATOL + RTOL * |expected|; NaN or inf never passes.
RTOL = 1e-2
ATOL = 1e-2

# The precision budget (flash-attention's rule for its kernels): besides the tolerance, a case's
# max abs error against the fp32 reference must be at most PRECISION_FACTOR x the error of a plain
# fp16 PyTorch implementation on the same inputs, plus PRECISION_FLOOR. grading.toml
# ([correctness] precision_factor, precision_floor) overrides both. Measured ratios are in
# notes/gpu_runs.md; fp8 arithmetic lands far above.
PRECISION_FACTOR = 2.0
PRECISION_FLOOR = 1e-3

# The warm checker (grader/trusted/checks/server.py) keeps each case's fp32 reference for the next
# submission, up to this many bytes (on the GPU when there is one). The largest public case's
# is 1 GiB (4·64·8192·128 fp32); the others together are well under 100 MiB.
CHECK_REFERENCE_BYTES = 2 << 30

# Where submissions come from and where results go, unless told otherwise.
DEFAULT_SUBMISSIONS = REPO_ROOT / "examples"
DEFAULT_RESULTS = REPO_ROOT / "results"
DEFAULT_BUILD = REPO_ROOT / "build"
PUBLIC_CASES = REPO_ROOT / "test_cases" / "test.txt"
HIDDEN_CASES = REPO_ROOT / "test_cases" / "hidden.txt"
# Small public cases that `check` adds for a Python submission on a machine without a GPU.
CPU_CHECK_CASES = REPO_ROOT / "test_cases" / "cpu.txt"
SOLUTION_DIR = REPO_ROOT / "solution"

# CUDA submissions: the contract's entry point and the declaration the grader supplies,
# exactly what a CS149-style load_inline(..., functions=["flash_attention_forward"]) compiles.
ENTRY_POINT = "flash_attention_forward"
ENTRY_DECLARATION = (
    "torch::Tensor flash_attention_forward(torch::Tensor Q, torch::Tensor K, torch::Tensor V);")
# Python submissions: GPU MODE's convention.
PY_ENTRY_POINT = "custom_kernel"


@dataclasses.dataclass(frozen=True)
class Limits:
    """Wall-clock limits per stage and per submission (seconds), and output caps (bytes).

    Build: a trivial torch extension takes ~35 s on the GPU machine and 38-50 s with 12 in
    parallel (shared/GPU_NOTES.md); a compile-only check takes ~40-70 s on the 2-core CPU machine.
    Run: a naive one-warp-per-row kernel takes ~4 s a call on the largest public case.
    CPUs: `gpu_stage_cpus` are kept for the GPU stages, off the builds' (cpus.split_cpus).
    """
    build_s: float = 300.0
    import_s: float = 120.0
    run_s: float = 240.0          # loading the submission and every case's first call, together
    # A Triton submission's kernels compiled in its build, with no GPU, one call per case shape
    # (grader/build/ahead.py), within this limit; 0: not compiled ahead (GRADER_AHEAD_S=0).
    # Session 25's short course with it on cut a Triton copy's run stage from about 4 s to 1.7 s
    # once the seed was found (ahead.regrouped), at 6-9 s of build CPU a copy (notes/throughput.md).
    ahead_s: float = 90.0
    # One case's first call on a GPU (issue 13: a hung kernel costs its case's limit, not the
    # run's): case_grace_s for what a first call loads (a Triton JIT compile, CUDA's lazy module
    # loading), plus the case's FLOPs at case_tflops. The handout's naive kernel (one warp per
    # query row) does the largest public case, 8.8 TFLOP, in ~4 s: 2.2 TFLOP/s; a correct
    # kernel 20x slower than that still finishes (118 s on that case, 30 s on a small one).
    case_grace_s: float = 30.0
    case_tflops: float = 0.1
    check_s: float = 300.0
    time_budget_s: float = 15.0   # spent inside the timing loop, after warm-up
    # The GPU left idle for this long before every timed and calibrated call, before its inputs
    # are written (Call.run; after them a subject watching its buffers could compute on the idle
    # GPU before "go"): a call's time depends on what the GPU did just before it. One kernel
    # (cuDNN's, largest case, H200) took 14.34 ms with no pause, 13.99 with 2 ms, 13.37 with 5,
    # 13.32 with 10 and 20; its calls spread 3.96%, 2.91%, 2.32%, 1.10% and 0.77%
    # (bench/placement_probe_s33.json, the idle after the inputs and the flush). With 10 ms
    # there, timing trust's calls spread 0.42%, not 4-5%, and the same kernel's two processes'
    # own events agreed to 0.02% (notes/throughput.md, session 33). 0: no pause.
    timing_idle_ms: float = 10.0
    time_s: float = 180.0         # the timing process (import, warm-up, loop), after a run stage's
    # calls made again on a subject not the run stage's, which have the run stage's limits
    build_memory_gb: float = 16.0  # address space of a build (nvcc, cicc): a runaway compile stops here
    file_gb: float = 4.0           # largest file a submission's process may write (a preprocessor bomb)
    # What a folder given to a submission's code (its build folder, its JIT cache) may hold
    # (grader/isolation/quota.py). Triton's cache of one kernel is a few MB in a few files; a CUDA build's,
    # some 100 MB. The count also bounds each walk of the folder (one every 0.5 s).
    folder_gb: float = 8.0
    folder_files: int = 10_000
    output_head_bytes: int = 8_192
    output_tail_bytes: int = 24_576
    # The harness and the subject both busy-poll their pipes, so a timed call's protocol cost
    # depends on getting a core at once: calibrated while 14 builds compiled it came out
    # 4.4 / 7.5 ms, not 1.2 / 1.3 (notes/gpu_runs.md, session 5). Three: those two, and one for
    # the grader's own threads, bubblewrap and the driver's helper threads (the checker and the
    # health probe run alone). Only on a machine with RESERVE_MIN_CPUS or more; 0: none.
    gpu_stage_cpus: int = 3
    # The share of the build jobs that compile at once while the GPU stages have
    # config.BUILDS_YIELD_AHEAD submissions waiting (1: builds never yield). On 16-CPU H100
    # machines a Triton copy's run stage took 4.1 s with 6 builds beside it and 5.2 s with 13,
    # and a cold 100-copy course graded 59 in 600 s with the builds yielding, against 47 without
    # (three machines: notes/throughput.md, session 17). Builds that never yield, even at a lower
    # CPU priority (build_nice), left the course no faster and the solution copies' medians
    # further apart (p90 1.30% against 0.88%: session 27).
    build_yield_share: float = 0.5
    # The CPU priority (nice, 0-19) of every build (compile, import check, compile ahead) and
    # what it starts, on a GPU machine whose GPU stages keep CPUs of their own: below the runs
    # begun early on the builds' CPUs, which a turn waits for (cpus.build_priority,
    # grader/isolation/priority.py). 0: the grader's own priority, as elsewhere. On a machine
    # shared with other work, that work comes first too: 0 there.
    build_nice: int = 10
    # What a course build's limits were scaled by for the machine's load (build.stage.under_load):
    # 1, or the factor its timeout message names. Set by the build stage, not by a knob.
    load_scale: float = 1.0

    def case_s(self, flops: float) -> float:
        """The run limit of one case's first call on a GPU, from its size."""
        return self.case_grace_s + flops / (self.case_tflops * 1e12)

    @classmethod
    def from_env(cls) -> "Limits":
        """GRADER_<FIELD> environment variables override the defaults (for tests and courses)."""
        overrides = {}
        for field in dataclasses.fields(cls):
            raw = os.environ.get(f"GRADER_{field.name.upper()}")
            if raw is not None:
                overrides[field.name] = int(raw) if field.type == "int" else float(raw)
        return cls(**overrides)


@dataclasses.dataclass(frozen=True)
class ArchiveLimits:
    """What an archive in a course drop may unpack to (grader/course/intake.py). Past any limit nothing
    of it is kept, and the student's row (or, for the whole drop, the error) says which limit."""
    max_bytes: int = 64 << 20        # a submission is a few source files: 64 MiB is generous
    max_files: int = 2_000
    max_ratio: float = 100.0         # unpacked / packed: source text packs 3-10x, zip bombs 1000x+
    ratio_floor_bytes: int = 4 << 20  # below this much unpacked, no ratio can do harm: not checked


STUDENT_ARCHIVE = ArchiveLimits()
# A whole class in one .zip/.tar.gz (SUBMISSIONS=drop.zip): 500 students of the above, at most.
DROP_ARCHIVE = ArchiveLimits(max_bytes=16 << 30, max_files=500_000)
# The build folder's subfolder where archives are unpacked and Canvas files are gathered.
DROP_SCRATCH = "drop"


# The grading machine, not the student: what scripts/bootstrap.sh installs or provides. A build
# that fails because one of these is missing is an environment_error (not scored, tried again).
PROVIDED_MODULES = ("torch", "triton", "tilelang", "numpy", "ninja")
PROVIDED_HEADERS = ("cublas_v2.h", "cublas.h", "cublasLt.h", "cusparse.h", "cusolverDn.h",
                    "cusolver_common.h")
# A build that times out while the 1-minute load average per core is at least this is tried
# again; a second timeout under such load is the machine's (environment_error). A submission's
# own build adds about 1 to the load: 2 per core means others are competing for the cores.
OVERLOADED_PER_CORE = 2.0
# A course build's limits (Limits.build_s, import_s) are scaled by the machine's load per core
# read before it starts, between 1 and this (build.stage.under_load): a 300 s compile limit is
# 600 s at a load of 2 per core, and at most 1200 s.
BUILD_LOAD_SCALE_MAX = 4.0
# A build that ended as the machine's failure (environment_error, e.g. two timeouts under load) is
# built once more in the same run, after the run's other builds, once the load per core is under
# BUILD_RETRY_CALM (or after BUILD_RETRY_WAIT_S of waiting, whichever comes first):
# schedule/workers.py CourseRun.retry_round.
BUILD_RETRY_CALM = 1.0
BUILD_RETRY_WAIT_S = 300.0
# A student's check says what its build is doing (the compiler's phase, the time so far) every
# this many seconds in a log or a pipe; a terminal's live display updates its line every second.
# A compile check takes 35-65 s on an idle 2-core machine and minutes on a busy one
# (notes/check_speed.md): silent, it looks hung.
BUILD_PROGRESS_S = 12.0

# Memory one build may use at its peak, for the default number of builds at once
# (cpus.default_build_jobs): a compile check of examples/tiled_cuda peaks at 1.6 GB resident
# (nvcc's cicc, on the 2-core CPU machine, 2026-11-22; notes/throughput.md); a GPU build runs two
# such compiles at once (ninja, MAX_JOBS=2) with the full torch/extension.h, then links.
BUILD_PEAK_GB = 4.0

# The GPU stages get CPUs of their own (Limits.gpu_stage_cpus) only where the grader may use at
# least this many: with fewer, the builds would be left one or two, and timing shares the machine.
RESERVE_MIN_CPUS = 6

# A GPU worker begins its next submissions' runs while one runs (lookahead.Lookahead): the harness
# and the subject start, with CUDA and the profiler, loading no submission code (10-15 s on an
# H100, more beside the builds, whose CPUs they use). This many at once: a submission's stages
# take 5-10 s once they are begun early, so one preparation would seldom be ready at its turn;
# with two, session 25's turns of about 7 s waited a median 1.8 s for a preparation of 12 s; with
# three, session 29's turns of 4.7 s waited 61 times (112 s in all) for preparations of 11.2 s
# (p90 13.1 s) on the builds' CPUs. Five give a lead of about 23 s; each holds a CUDA context
# and the largest case's buffers (about 3 GB of GPU memory) until its turn.
LOOKAHEAD = 5
# Run and check stages of this many submissions may share a GPU at once (grade --lanes N). Their
# time stages still run one at a time, each alone on the GPU, on a fresh subject (grader/schedule/gate.py
# says what is kept apart). 1, the default: one submission at a time, its time stage on its run's
# subject. On an H100 with 16 CPUs, 3 lanes graded 5.3 submissions/min against 5.6 with 1 (cold)
# and 5.9 against 6.3 (builds reused): each submission then needs two subjects prepared, and
# their CPU work and the run stages' on the GPU stages' three CPUs cost more than the overlap
# saves (notes/throughput.md, session 16). That time stage's subject first makes the run stage's
# calls again, with the GPU held alone (run_stage.run_stage_calls: one path for every timed row),
# Triton's autotuning of each shape included.
GPU_LANES = 1
# Builds yield to a GPU that has work (gate.BuildThrottle): while at least BUILDS_YIELD_AHEAD
# built submissions wait for the GPU stages, at most Limits.build_yield_share of the build jobs
# compile at once (on a GPU machine). Ten submissions are more than a minute of GPU work.
BUILDS_YIELD_AHEAD = 10
# A turn waits at most this long for its preparation to end; past it the early start is given up
# and the submission runs the usual way.
PREPARE_S = 120.0

# Timing: stop when the relative standard error of the mean is under 0.5% ...
TIMING_TARGET_RSE = 0.005
# And at least this many (or the budget). Calls made back to back spread 4-5% and drifted (the
# first 10 of 100 calls 5% faster than the last 10): that needed 100 (H100, notes/throughput.md,
# session 17). With the GPU idle before each call (Limits.timing_idle_ms) they spread 0.42% and
# drift under 0.4% between halves; the first 50 calls' medians were within 0.2% of the 100
# calls', and their sampling error is about 0.1% (H200, session 33). 50 paced calls take less
# of the GPU than 100 unpaced ones (1.9 s against 2.4-2.5 s for 13 ms calls). Unpaced
# (GRADER_TIMING_IDLE_MS=0), 50 calls rank less steadily than 100 did.
TIMING_MIN_REPS = 50
TIMING_MAX_REPS = 500
# Precision where it decides ranks (issue 13): a call slower than TIMING_COARSE_FRACTION of the
# fp16 matmul peak measured on the GPU (about 10x slower than cuDNN's attention, which runs at
# ~80% of it) ranks far below the fast ones, and needs no 0.5% RSE to be placed: the loop stops
# once TIMING_COARSE_MIN_REPS calls agree to TIMING_COARSE_RSE (TimingStats.stopped_by 'coarse').
TIMING_COARSE_FRACTION = 0.08
TIMING_COARSE_RSE = 0.02
TIMING_COARSE_MIN_REPS = 10
TIMING_WARMUP_CALLS = 2
# A bounded cost per submission (issue 32): a call slower than TIMING_SLOW_FACTOR times the coarse
# threshold (about 100x slower than cuDNN: over a second on the largest case) gets one warm-up
# call and is placed on TIMING_SLOW_CALLS calls; and the loop stops ('bound') when one more call
# and the spot checks (TIMING_SPOT_RESERVE_S) might not end within the stage's limit
# (Limits.time_s), ranking what was timed. A submission's GPU stages then hold its GPU at most
# Limits.run_s + Limits.time_s + its check, and Limits.run_s more with lanes (the time stage's
# own subject makes the run stage's calls again first; docs/instructor-guide.md, "A bounded cost").
TIMING_SLOW_FACTOR = 10.0
TIMING_SLOW_CALLS = 3
TIMING_SPOT_RESERVE_S = 15.0
# The protocol's calibration (grader/trusted/harness.py calibrate), per trusted subject: warm-up calls
# before a timed loop's own warm-up, then the calls measured.
CALIBRATION_WARMUP_CALLS = 6
CALIBRATION_CALLS = 50
# ... every timed call's output is checked in the harness when it returns (call_checks.verify_call):
# every element written (O is filled with NaN before each call), and this many of its
# (batch, head) slices, picked at random after the reply, against SDPA. The largest case has 256:
# a sixteenth of SDPA's and the comparison's work (the whole output's took about 40 ms a call on
# an H100, three times the call: notes/throughput.md); an output wrong in a part p of its slices
# is found in a call with chance 1 - (1 - p)^16, and every call is checked. (Not a share of the
# calls: compared on a quarter of them, the reference solution's calls ran 4.5% slower and its
# processes 2.7% apart against 1.4%, the work between two calls is part of a call's conditions;
# H100, session 29, bench/protocol_probe_share_s29.json.) ...
TIMING_VERIFY_HEADS = 16
# ... and the loop stops once this many calls were wrong and they are more than half of those
# checked (time_stage.wrong_enough, TimingStats.stopped_by 'wrong'): a submission is timed before
# its check stage (stages/grade.py), and one whose outputs are wrong costs a few calls, not a
# time stage. Its verdict is the check's, or the wrong timed calls' (integrity.timing_findings).
TIMING_WRONG_STOP = 3
# ... and this many, picked at random after they return, with the fp32 reference and the
# precision budget, each on TIMING_SPOT_HEADS of its (batch, head) slices picked after the last
# call (all of them where there are no more). Whole, on the largest case's 256, the three took
# 1.45 s of a 5.25 s time stage (H100, 2026-11-26, notes/throughput.md session 16); an output
# whose precision is cut in a part p of its slices is found with chance 1 - (1 - p)^96, and the
# cases' checks see every element of every case.
TIMING_SPOT_SAMPLES = 3
TIMING_SPOT_HEADS = 32
# ... and every this many calls the harness lists the processes holding a CUDA context (NVML),
# and takes up NVML's utilization samples since its last look (gpu_watch.BusyWatch: NVML keeps only
# the last few seconds of them).
TIMING_PROCESS_CHECK_EVERY = 10
# ... and NVML's utilization samples are read at least this often (seconds) during the timed
# loop: NVML keeps only each process's newest sample, one per 200 ms period on an H100
# (gpu_watch.BusyWatch; session 19's probe: read every 0.5 s, three of five were lost).
TIMING_NVML_READ_S = 0.1

# What the subject reports is a claim, checked before the harness keeps it (grader/trusted/harness.py,
# "what the subject reports"; issue 30): every number finite, of its type and within bounds, or
# the reply is a protocol violation (runtime_error, naming the field). A list of launched kernels
# holds at most REPORT_KERNELS entries (the subject lists at most 200: subject/loop.py
# launched_names). The list covers a stretch of the harness's clock (a call, from its request to
# its reply; the timed loop, from "profile on" to its report). One kernel's launches are at most
# REPORT_LAUNCH_FLOOR plus REPORT_LAUNCHES_PER_MS for each ms of it: one launch a microsecond,
# several times what a CUDA graph or a tight loop of launches reaches. One kernel's GPU time is
# at most that stretch, plus REPORT_CLOCK_SLACK of it and REPORT_CLOCK_SLACK_MS (the GPU's clock
# against the host's): a kernel does not run longer than the calls it ran in.
REPORT_KERNELS = 200
REPORT_LAUNCHES_PER_MS = 1000
REPORT_LAUNCH_FLOOR = 10_000
REPORT_CLOCK_SLACK = 0.01
REPORT_CLOCK_SLACK_MS = 1.0
# The subject runs the whole timed loop under torch.profiler (GPU activity only), for every row
# alike: what the timed calls launch is listed, and their GPU time accounted for.

# Without a CUDA device, Python submissions run on the CPU on the cases at most this many FLOPs
# (4·B·H·S²·D): the hidden awkward shapes, not the large public ones.
CPU_MAX_FLOPS = 2.0e9

# Architecture to compile for when no GPU is present (the course's GPU: Hopper).
DEFAULT_CUDA_ARCH = "90a"

