"""bench/bench_grader.py (`make bench-grader`): the synthetic course, the figures it reads from
result files, and a whole run on the CPU with a few copies of a Python submission."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest

from grader.common import config
from grader.course.verdicts import BuildResult
from grader.course.verdicts import CaseResult
from grader.course.results import RUN_PHASES, SubmissionResult
from grader.common.status import Status
from grader.course.verdicts import TimingStats

BENCH = config.REPO_ROOT / "bench" / "bench_grader.py"
spec = importlib.util.spec_from_file_location("bench_grader", BENCH)
bench_grader = sys.modules.setdefault("bench_grader", importlib.util.module_from_spec(spec))
spec.loader.exec_module(bench_grader)

NUMPY_KERNEL = """
    import numpy as np
    import torch

    def custom_kernel(data):
        q, k, v = (t.detach().cpu().float().numpy() for t in data)
        s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
        p = np.exp(s - s.max(-1, keepdims=True))
        return torch.from_numpy(p / p.sum(-1, keepdims=True) @ v).half().to(data[0].device)
"""


def test_overhead_is_the_gpu_serial_time_less_the_submissions_own_calls():
    timing = TimingStats(n=100, median_ms=20.0, mean_ms=20.0, min_ms=19.0, std_ms=0.1, rse=0.001,
                         tflops=1.0, warmup_calls=2, budget_s=15.0, stopped_by="rse", wall_s=2.5)
    result = SubmissionResult(
        id="a", label="a", kind="cuda", role="student", status=Status.PASS, message="",
        build=BuildResult(Status.PASS, "extension", 40.0),
        cases=(CaseResult("c1", Status.PASS, run_s=0.5), CaseResult("c2", Status.PASS, run_s=0.3),
               CaseResult("c3", Status.NOT_RUN)),
        timing=timing, wall_s=50.0,
        stage_s=(("build", 40.0), ("run", 4.0), ("check", 2.0), ("time", 3.5)))
    f = bench_grader.figures_of(result)
    assert f.gpu_serial_s == pytest.approx(10.0)                # the build ran beside others
    assert f.kernel_s == pytest.approx(0.8 + 102 * 0.020)       # first calls, timed and warm-up
    assert f.overhead_s == pytest.approx(10.0 - 0.8 - 2.04)
    assert f.stages == {"build": 40.0, "run": 4.0, "check": 2.0, "time": 3.5}
    assert bench_grader.spread([3.0, 1.0, 2.0]) == dict(n=3, median=2.0, mean=2.0, p90=3.0,
                                                        max=3.0, sum=6.0)


def test_the_same_kernel_figure_says_how_copies_medians_agree_as_graded_and_on_their_first_calls(tmp_path):
    """Issue 13: copies of one kernel, each timed in turn, show how far one kernel's medians
    wander within a run (timing trust's 1% for the same kernel graded twice), and how that
    depends on the number of calls: each copy's first n calls, from its logs."""
    def timed(sid: str, median: float, times: list[float]) -> SubmissionResult:
        (tmp_path / "logs").mkdir(exist_ok=True)
        (tmp_path / "logs" / f"{sid}.time.calls.json").write_text(json.dumps(dict(times_ms=times)))
        return SubmissionResult(
            id=sid, label=sid, kind="python", role="student", status=Status.PASS, message="",
            timing=TimingStats(n=len(times), median_ms=median, mean_ms=median, min_ms=median,
                               std_ms=0.1, rse=0.001, tflops=1.0, warmup_calls=2, budget_s=15.0,
                               stopped_by="rse", wall_s=2.0))
    # the first 20 calls of copy b run 3% faster; after 100 all three agree within 0.5%
    results = [timed("a", 10.0, [10.0] * 100), timed("b", 10.05, [9.7] * 20 + [10.05] * 80),
               timed("c", 9.98, [9.98] * 100), timed("d", 20.0, [20.0] * 30)]
    plan = {r.id: bench_grader.Planned(r.id, "k" if r.id != "d" else "other", True, "pass")
            for r in results}
    figures = bench_grader.same_kernel(tmp_path, results, plan)
    k = figures["k"]
    assert k["graded"]["n"] == 3 and k["graded"]["median_ms"] == 10.0
    assert k["graded"]["max"] == pytest.approx(0.005) and k["graded"]["pairs_over_1pct"] == 0
    assert k["first_20"]["pairs_over_1pct"] == pytest.approx(2 / 3, abs=1e-4)   # b against a, c
    assert k["first_100"]["n"] == 3 and k["first_100"]["pairs_over_1pct"] == 0
    assert k["calls"]["median"] == 100
    assert figures["other"]["graded"] == {"n": 1} and figures["other"]["first_50"] == {"n": 0}


def test_the_course_has_distinct_ids_and_sources_and_the_expected_verdicts(tmp_path):
    planned = bench_grader.make_course(tmp_path / "course", honest=list(bench_grader.HONEST),
                                       failing=None, copies=4, gpu=True)
    ids = [p.id for p in planned]
    assert ids == ["triton_flash_000", "solution_001", "triton_flash_002", "solution_003",
                   "fail_build_error", "fail_wrong_no_rescale", "fail_crash_oob"]
    sources = [next((tmp_path / "course" / i).glob("submission.*")).read_bytes() for i in ids]
    assert len(set(sources)) == len(sources)                    # nothing skipped or reused
    assert [p.expected for p in planned] == ["pass"] * 4 + ["build_error", "mismatch",
                                                            "runtime_error"]
    cpu = bench_grader.make_course(tmp_path / "cpu", honest=list(bench_grader.HONEST), failing=None,
                                   copies=2, gpu=False)
    assert [(p.id, p.expected) for p in cpu] == [
        ("triton_flash_000", "pass"), ("solution_001", "not_run"), ("py_build_error", "build_error"),
        ("py_wrong_answer", "mismatch"), ("py_crash", "runtime_error")]


@pytest.mark.slow
def test_a_cpu_run_reports_throughput_overhead_and_stages(tmp_path):
    """The whole bench on the CPU: 3 copies of a Python kernel and the three Python failures,
    on one small case (about 45 s on the 2-core CPU machine)."""
    kernel = tmp_path / "numpy_kernel"
    kernel.mkdir()
    (kernel / "submission.py").write_text(textwrap.dedent(NUMPY_KERNEL))
    cases = tmp_path / "cases.txt"
    cases.write_text("batch_size: 1; num_heads: 2; seq_len: 77; head_dim: 64; seed: 2\n")
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--cpu", "--copies", "3", "--honest",
                           str(kernel), "--out", str(out), "--work", str(tmp_path / "work"),
                           "--no-baselines", "--", "--no-hidden", "--cases", str(cases)],
                          capture_output=True, text=True, cwd=config.REPO_ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for field in ("subs/min", "overhead s: median", "build s", "run s", "check s", "time s",
                  f"written: {out}", "6 submissions: 3 honest copies (3 numpy_kernel), 3 failing"):
        assert field in proc.stdout, field
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["date"][:4].isdigit() and report["host"]["cpus"] >= 1
    (run,) = report["runs"]
    assert (run["planned"], run["graded"], run["missing"], run["stopped"]) == (6, 6, 0, False)
    # a kernel in numpy is off the Python audit's allowlist: right, graded, sent to review
    assert run["statuses"] == {"review": 3, "build_error": 1, "mismatch": 1, "runtime_error": 1}
    assert run["unexpected"] == [] and run["build_cache"] == "cold" and run["builds_reused"] == 0
    assert run["submissions_per_min"] == pytest.approx(6 / run["wall_s"] * 60, rel=0.01)
    assert run["grading_s"] <= run["wall_s"]
    stages = run["stages_s"]
    assert (stages["build"]["n"], stages["run"]["n"], stages["check"]["n"], stages["time"]["n"]) \
        == (6, 5, 4, 0)   # the syntax error stops at the build, the crash after its run; no GPU
    assert run["overhead_s"]["n"] == 5 and run["overhead_honest_s"]["n"] == 3
    assert 0 < run["overhead_s"]["median"] < run["gpu_serial_s"]["max"]
    # the figures are the result files' own
    result = json.loads((tmp_path / "work" / "results-cpu" / "numpy_kernel_000.json").read_text())
    stage_s = result["stage_s"]
    parts = {f"run.{p}" for p in RUN_PHASES if p not in ("prepare", "waiting", "load")}   # not begun early
    assert set(stage_s) == {"build", "run", "check"} | parts
    assert sum(stage_s[p] for p in parts) <= stage_s["run"] + 0.05   # the run's parts, in it
    assert stages["run.subject"]["n"] == 5 and "run stage's parts, median s: harness" in proc.stdout
    assert stage_s["build"] == pytest.approx(result["build"]["elapsed_s"], abs=1e-3)
    assert stage_s["run"] + stage_s["check"] <= result["wall_s"] - stage_s["build"] + 0.05
