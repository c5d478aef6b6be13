"""Checks left behind their turn (issue 32: stages/behind.py, schedule/behind.py): a GPU
worker's lane finishes a submission's check stage and verdict beside the next submission's run
stage, and never beside a time stage, a health check or a baseline.

The course below runs the real scheduling (grade_all, its lanes, Lookahead, ChecksBehind) and
the real grade_submission, with the stages that need a GPU faked: each records when it ran, on
which thread, and for which submission."""

from __future__ import annotations

import dataclasses
import io
import threading
import time

import pytest

from grader.common import config
from grader.common.status import Status
from grader.course.submission import inspect_folder
from grader.course.verdicts import BuildResult, CaseResult, ProtocolCost, TimingStats
from grader.isolation.procs import Cancelled
from grader.isolation.sandbox import Sandbox
from grader.problem import Case
from grader.report.progress import Progress
from grader.schedule import behind as lane_behind
from grader.schedule import lookahead
from grader.schedule import workers as scheduling
from grader.stages import behind as stage_behind
from grader.stages import context
from grader.stages import grade as grading
from grader.stages.check import CHECKED_IN_COMPANY
from grader.stages.context import GpuUnhealthy
from grader.stages.run import Ran
from grader.stages.time import TimedRun
from grader.trusted.correctness import CHECKER_BROKE


def gpu():
    from grader.isolation.device import DeviceInfo
    return DeviceInfo(cuda=True, name="NVIDIA H100", capability=(9, 0), arch="90a",
                      l2_bytes=1 << 20, memory_bytes=0, sm_count=132, driver="580",
                      torch_version="x", cuda_version="13.0", nvcc=None, python="3",
                      matmul_tflops=700.0, index=0, uuid="GPU-00000000-aaaa-bbbb-cccc-dddddddddddd")


CASE = Case(1, 2, 16, 64, seed=3)


class Stages:
    """The GPU stages faked: each records (stage, submission, thread, start, end)."""

    def __init__(self, seconds: float = 0.05):
        self.seconds, self.lock, self.spans = seconds, threading.Lock(), []
        self.broken_once: set[str] = set()   # these submissions' first check breaks
        self.fail_run: set[str] = set()      # these submissions' run stage fails beside a check

    def span(self, stage: str, sub_id: str):
        start = time.monotonic()
        time.sleep(self.seconds * (3 if stage == "check" else 1))   # a check outlasts a run stage
        with self.lock:
            self.spans.append(dict(stage=stage, sub=sub_id, start=start, end=time.monotonic(),
                                   thread=threading.current_thread().name))

    def run_cases_under_load(self, sub, build, cases, ctx, work, jit=None, timed=None,
                             prepared=None):
        self.span("run", sub.id)
        status = "pass"
        if sub.id in self.fail_run:   # fails the first time (beside a check, if one ran)
            self.fail_run.discard(sub.id)
            status = "runtime_error"
            with self.lock:
                self.spans.append(dict(stage="failed", sub=sub.id, start=0, end=0, thread=""))
        return Ran({CASE.id: dict(status=status, message="", elapsed_s=0.01)}, "", None, {})

    def run_cases(self, sub, build, cases, ctx, work, jit=None, timed=None, prepared=None):
        return self.run_cases_under_load(sub, build, cases, ctx, work, jit)

    def time_target(self, target, case, ctx, *, folder, log_name=None, jit=None, stages=None,
                    timer=None, later=False):
        self.span("time", log_name)
        stats = TimingStats(n=100, median_ms=10.0, mean_ms=10.0, min_ms=10.0, std_ms=0.01,
                            rse=0.001, tflops=10.0, warmup_calls=2, budget_s=15.0,
                            stopped_by="rse", wall_s=1.0)
        return TimedRun(stats, dict(phases_s={}, loop_s={}))

    def check_cases(self, sub, cases, runs, ctx, work, clock):
        self.span("check", sub.id)
        if sub.id in self.broken_once:
            self.broken_once.discard(sub.id)
            return [CaseResult(CASE.id, Status.RUNTIME_ERROR, f"{CHECKER_BROKE}exited with -9:")]
        run = runs[CASE.id]
        if run["status"] != "pass":   # what did not run keeps its run's verdict, as check_cases does
            return [CaseResult(CASE.id, Status(run["status"]), run["message"])]
        return [CaseResult(CASE.id, Status.PASS, "")]


def fake(monkeypatch, stages: Stages) -> None:
    """The stages' GPU work faked, under the real grade_submission, run_stage and
    time_largest_case (their waits for what is left behind are what is tested)."""
    for name in ("run_cases_under_load", "run_cases", "time_target", "check_cases"):
        monkeypatch.setattr(grading, name, getattr(stages, name))
    monkeypatch.setattr(grading, "ensure_gpu_healthy", lambda ctx: stages.span("health", ""))


@pytest.fixture
def course(monkeypatch, tmp_path, make_submission):
    stages = Stages()
    fake(monkeypatch, stages)
    monkeypatch.setattr(grading, "judge_timed", lambda sheet, sub, build, ctx, source, timed, judged,
                        run: sheet.finish(Status.PASS, "timed", cases=judged.cases, timing=run.stats))
    monkeypatch.setattr(lookahead, "prepare", lambda sub, build, ctx, timed: None)
    monkeypatch.setattr(scheduling, "calibrate_protocol", lambda ctx, reuse=False: ProtocolCost())
    monkeypatch.setattr(scheduling, "build_submission",
                        lambda sub, **kw: BuildResult(Status.PASS, "import", 0.01))
    monkeypatch.setattr(scheduling, "device_minor", lambda uuid: None)
    monkeypatch.setattr(config, "BUILD_RETRY_WAIT_S", 0.0)
    subs = [inspect_folder(make_submission(f"s{i}", "def custom_kernel(data):\n    return data[0]\n"))
            for i in range(6)]

    def grade():
        ctx = context.GradeContext(
            cases=(CASE,), device=gpu(), limits=config.Limits(), out_dir=tmp_path / "out",
            build_dir=tmp_path / "build", progress=Progress(len(subs), live=False, stream=io.StringIO()),
            sandbox=Sandbox(None, "off in this test"))
        ctx.out_dir.mkdir(parents=True, exist_ok=True)
        return scheduling.grade_all(subs, ctx, baselines=[], build_jobs=2)

    return dataclasses.make_dataclass("Course", ["grade", "stages", "subs"])(grade, stages, subs)


def overlap(a: dict, b: dict) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


def test_a_check_runs_beside_the_next_run_stage_and_never_beside_a_time_stage(course):
    results = course.grade()
    assert sorted(r.id for r in results) == [s.id for s in course.subs]
    assert all(r.status is Status.PASS and r.timing is not None for r in results), results
    spans = course.stages.spans
    checks = [s for s in spans if s["stage"] == "check"]
    times = [s for s in spans if s["stage"] == "time"]
    runs = [s for s in spans if s["stage"] == "run"]
    assert len(checks) == len(times) == len(runs) == 6
    # the invariant: no check left behind is running while a call is timed
    assert not [(c, t) for c in checks for t in times if overlap(c, t)]
    # each submission: run, then time, then its check (on the lane's own thread behind)
    for sub in course.subs:
        run, timed, check = (next(s for s in spans if s["stage"] == k and s["sub"] == sub.id)
                             for k in ("run", "time", "check"))
        assert run["end"] <= timed["start"] and timed["end"] <= check["start"]
        assert check["thread"].endswith(".behind") and run["thread"] == timed["thread"]
    # what it is for: checks beside the next submission's run stage
    assert any(overlap(c, r) for c in checks for r in runs if r["sub"] != c["sub"])


def test_a_check_that_breaks_beside_another_submission_is_graded_again_alone(course):
    """A checker that died while another submission's code shared the GPU is the machine's: not a
    verdict, graded again at the end of the run, and then right."""
    course.stages.broken_once = {"s2"}
    results = course.grade()
    by_id = {r.id: r for r in results}
    assert sorted(by_id) == [s.id for s in course.subs]
    assert by_id["s2"].status is Status.PASS   # graded again: its second check did not break
    checks = [s["sub"] for s in course.stages.spans if s["stage"] == "check"]
    assert checks.count("s2") == 2 and checks.index("s2") < len(checks) - 1


def test_a_check_broken_in_company_reads_as_the_machine_s_fault(tmp_path, make_submission, monkeypatch):
    """The first grading's result, as graded again only once: environment_error, never scored."""
    stages = Stages(seconds=0.0)
    stages.broken_once = {"lone"}
    fake(monkeypatch, stages)
    sub = inspect_folder(make_submission("lone", "def custom_kernel(data):\n    return data[0]\n"))
    ctx = context.GradeContext(cases=(CASE,), device=gpu(), limits=config.Limits(),
                               out_dir=tmp_path / "out", build_dir=tmp_path / "build",
                               progress=Progress(1, live=False, stream=io.StringIO()),
                               sandbox=Sandbox(None, "off in this test"))
    with lane_behind.checks_behind() as behind:
        left = grading.grade_submission(sub, BuildResult(Status.PASS, "import", 0.1), ctx)
        assert isinstance(left, stage_behind.Left)   # stopped at its hand-over, after its time stage
        got = []
        behind.leave(left, lambda left_, result, error: got.append((result, error)))
        behind.wait()
    [(result, error)] = got
    assert error is None and result.status is Status.ENVIRONMENT_ERROR
    assert not result.status.scored and CHECKED_IN_COMPANY in result.message
    assert scheduling.overloaded(result)   # graded once more at the end of the run
    # in its turn (no lane: a student's check, the service), the same break is the checker's
    stages.broken_once = {"lone"}
    monkeypatch.setattr(grading, "ensure_gpu_healthy", lambda ctx_: None)
    result = grading.grade_submission(sub, BuildResult(Status.PASS, "import", 0.1), ctx)
    assert result.status is Status.RUNTIME_ERROR and CHECKER_BROKE in result.message


def test_a_run_stage_that_fails_beside_a_check_runs_again_after_it(course):
    """A case that failed while a check left behind shared the GPU runs again, once that check
    is done (CROWDED_RETRY): the check's memory or time may have been what it lacked."""
    course.stages.fail_run = {"s3", "s4"}
    results = course.grade()
    assert all(r.status is Status.PASS for r in results), [(r.id, r.message) for r in results]
    spans = course.stages.spans
    for sub in ("s3", "s4"):
        first, second = [s for s in spans if s["stage"] == "run" and s["sub"] == sub]
        checks = [s for s in spans if s["stage"] == "check" and s["sub"] != sub]
        assert any(overlap(first, c) for c in checks)   # it failed beside a check...
        assert not any(overlap(second, c) for c in checks)   # ...and ran again alone
    assert not [s for s in spans if s["stage"] == "health"]   # passed alone: no crash to probe


def test_a_case_that_timed_out_beside_a_check_is_not_run_again(course, monkeypatch):
    """A check lasts about a second and a case's limit is 30 s at least: a timeout beside it is
    the submission's, and running it again would cost its limit twice (BESIDE_CHECK_RETRY)."""
    real = course.stages.run_cases_under_load

    def hangs(sub, build, cases, ctx, work, jit=None, timed=None, prepared=None):
        ran = real(sub, build, cases, ctx, work, jit, timed, prepared)
        if sub.id == "s3":
            return Ran({CASE.id: dict(status="timeout", message="hung")}, "", None, {})
        return ran
    monkeypatch.setattr(grading, "run_cases_under_load", hangs)
    by_id = {r.id: r for r in course.grade()}
    assert by_id["s3"].status is Status.TIMEOUT
    runs = [s for s in course.stages.spans if s["stage"] == "run" and s["sub"] == "s3"]
    assert len(runs) == 1   # once, though a check ran beside it
    assert [s["sub"] for s in course.stages.spans if s["stage"] == "health"] == [""]   # probed


def test_what_stops_a_check_left_behind_stops_the_lane_at_its_next_wait():
    """An unhealthy GPU or the run stopping, met while a check finishes behind: raised where the
    lane next waits, never lost; a grader bug becomes that submission's result."""
    def steps(error: BaseException | None, value="done"):
        yield
        if error is not None:
            raise error
        return value

    def left_of(error=None, value="done"):
        s = steps(error, value)
        s.send(None)
        return stage_behind.Left(s, "x")

    def unhealthy(left, result, error):
        raise GpuUnhealthy("the GPU failed its health check")

    def again(left, result, error):   # as CourseRun.grader_error does with these
        raise error

    got = []
    with lane_behind.checks_behind() as behind:
        assert behind.takes() and stage_behind.behind() is behind
        behind.leave(left_of(), lambda left, result, error: got.append(result))
        behind.leave(left_of(KeyError("bug")), lambda left, result, error: got.append(repr(error)))
        behind.wait()
        assert got == ["done", "KeyError('bug')"] and not behind.busy()
        behind.leave(left_of(), unhealthy)
        with pytest.raises(GpuUnhealthy):
            behind.wait()
        behind.wait()   # said once
        behind.leave(left_of(Cancelled("stopping")), again)
        with pytest.raises(Cancelled):
            behind.wait()
    with pytest.raises(GpuUnhealthy):   # the lane's end says what stopped its last one
        with lane_behind.checks_behind() as behind:
            behind.leave(left_of(), unhealthy)
    # outside any lane: nothing is left behind, and waiting is free
    assert not stage_behind.behind().takes() and not stage_behind.behind().busy()
    stage_behind.behind().wait()


def test_the_thread_behind_a_lane_ends_with_it_even_without_its_end():
    """ChecksBehind's thread belongs to its lane: a lane that ends without end() (a thread cut
    short) leaves no thread behind for more than about a second."""
    made = []
    lane = threading.Thread(target=lambda: made.append(lane_behind.ChecksBehind(name="lane-x.behind")))
    lane.start()
    lane.join(10)
    thread = made[0]._thread
    thread.join(5)
    assert not thread.is_alive()
