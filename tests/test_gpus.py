"""Issue 13, N GPUs: one GPU worker per GPU. What a CPU machine can test for real: choosing the
GPUs, each worker's CPUs, environment and sandbox device nodes, the scheduler (the GPU stages
replaced by recorders), per-GPU baseline files and how the page and the table show them."""

from __future__ import annotations

import _thread
import argparse
import contextlib
import dataclasses
import errno
import io
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import pytest

from grader.common import config

from grader.isolation import device as device_mod

from grader.schedule import lookahead

from grader.schedule import workers as scheduling
from grader.schedule.jobs import Jobs

from grader.stages import check as check_stage
from grader.stages import context

from grader.stages import early as early_runs

from grader.stages import folders

from grader.stages import grade as grading

from grader.stages import harnesses

from grader.stages import health

from grader.stages import run as run_stage

from grader.stages import time as time_stage
from grader.stages import ahead as early_hook

from grader.isolation import cpus as cpus_mod, procs, tree as tree_mod

from grader.isolation import sandbox as sandbox_mod
from grader.course.verdicts import BuildResult
from grader.problem import Case
from grader.course.verdicts import CaseResult
from grader.isolation.device import DeviceInfo, GpuSelectionError, parse_gpus, select_gpus
from grader.schedule.gate import GpuGate
from grader.report.progress import Progress
from grader.report.pages import render_leaderboard, text_table
from grader.report.rows import build_rows, gpu_agreement
from grader.course.results import (TIME_PHASES, GpuRef, SubmissionResult, load_result, read_gpu_copies,
                            read_results, write_result)
from grader.course.runs import RunJournal
from grader.isolation.sandbox import Sandbox
from grader.common.status import Status
from grader.course.submission import Kind, Role, inspect_folder
from grader.course.verdicts import ProtocolCost, TimingStats


def gpu(index: int, name: str = "NVIDIA H200", capability=(9, 0)) -> DeviceInfo:
    return DeviceInfo(cuda=True, name=name, capability=capability, arch="90a", l2_bytes=1 << 20,
                      memory_bytes=0, sm_count=132, driver="580", torch_version="x",
                      cuda_version="13.0", nvcc=None, python="3", matmul_tflops=700.0 + index,
                      index=index, uuid=f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd")


LISTED = [dict(index=0, name="NVIDIA H200", uuid="GPU-a", capability=[9, 0]),
          dict(index=1, name="NVIDIA H200", uuid="GPU-b", capability=[9, 0])]


# ---------------------------------------------------------------- choosing the GPUs


def test_gpus_option_parses_a_set_of_indices():
    assert parse_gpus("0,1") == [0, 1]
    assert parse_gpus(" 1, 0 ") == [0, 1]          # the first GPU is the lowest: results stay put
    assert parse_gpus("3") == [3]
    assert parse_gpus(None) is None and parse_gpus("all") is None
    for bad, said in (("0,0", "GPU 0 is named twice"), ("x", "'x' is not a GPU index"),
                      ("-1", "'-1' is not a GPU index"), ("", "names no GPU"), (",", "names no GPU"),
                      ("0,,1", "'' is not a GPU index")):
        with pytest.raises(GpuSelectionError, match=said):
            parse_gpus(bad)


def test_gpus_are_checked_against_the_machines():
    assert select_gpus(None, LISTED) == [0, 1]
    assert select_gpus([1], LISTED) == [1]
    with pytest.raises(GpuSelectionError, match=r"no GPU 2 on this machine; its GPUs: 0 \(NVIDIA H200\), 1"):
        select_gpus([0, 2], LISTED)
    mixed = LISTED + [dict(index=2, name="NVIDIA A100", uuid="GPU-c", capability=[8, 0])]
    assert select_gpus(None, mixed) == [0, 1]     # by default the first one's kind
    with pytest.raises(GpuSelectionError, match=r"different kinds.*--gpus 0,1\)"):
        select_gpus([0, 1, 2], mixed)
    with pytest.raises(GpuSelectionError, match="names no GPU"):
        select_gpus([], LISTED)


def test_detect_gpus_probes_the_chosen_ones_and_refuses_others(monkeypatch):
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        wanted = [int(i) for i in cmd[cmd.index("--gpus") + 1].split(",")] if "--gpus" in cmd else [0, 1]
        probed = [dict(cuda=True, name="NVIDIA H200", capability=[9, 0], l2_bytes=1, memory_bytes=2,
                       sm_count=3, torch_version="t", cuda_version="c", matmul_tflops=700.0,
                       index=i, uuid=LISTED[i]["uuid"]) for i in wanted if i < 2]
        return subprocess.CompletedProcess(cmd, 0, json.dumps(dict(listed=LISTED, probed=probed)), "")

    monkeypatch.setattr(device_mod.subprocess, "run", fake_run)
    monkeypatch.setattr(device_mod, "_driver", lambda: "580")
    both = device_mod.detect_gpus(None)
    assert [(d.index, d.uuid, d.arch, d.label) for d in both] == [
        (0, "GPU-a", "90a", "GPU 0 (NVIDIA H200)"), (1, "GPU-b", "90a", "GPU 1 (NVIDIA H200)")]
    assert device_mod.detect_gpus([1])[0].uuid == "GPU-b"
    assert device_mod.detect().index == 0          # the one-GPU probe: GPU 0, as before
    with pytest.raises(GpuSelectionError, match="no GPU 5"):
        device_mod.detect_gpus([0, 5])


def test_without_cuda_the_option_means_one_cpu_worker(capsys):
    from grader.cli.grade import _devices
    devices = _devices(argparse.Namespace(command="grade", gpus="0,1", cpu=True))
    assert [d.cuda for d in devices] == [False]
    assert "--gpus 0,1: no CUDA device here; grading with one CPU worker" in capsys.readouterr().err
    assert _devices(argparse.Namespace(command="grade", gpus="0,0", cpu=True)) is None
    assert "GPU 0 is named twice" in capsys.readouterr().err


def test_grade_lists_the_option_and_a_bad_set_is_a_usage_error(tmp_path):
    helped = subprocess.run([str(config.REPO_ROOT / ".venv/bin/python"), "-m", "grader", "grade",
                             "--help"], cwd=config.REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert "--gpus" in helped.stdout   # bench/bench_grader.py looks for it there
    (tmp_path / "subs" / "alice").mkdir(parents=True)
    (tmp_path / "subs" / "alice" / "submission.py").write_text("def custom_kernel(data):\n    return data[0]\n")
    proc = subprocess.run([str(config.REPO_ROOT / ".venv/bin/python"), "-m", "grader", "grade",
                           str(tmp_path / "subs"), "--out", str(tmp_path / "out"), "--build-dir",
                           str(tmp_path / "build"), "--gpus", "1,x"],
                          cwd=config.REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "error: --gpus '1,x': 'x' is not a GPU index" in proc.stderr


# ---------------------------------------------------------------- each worker's CPUs, env, nodes


def test_each_gpu_worker_keeps_cpus_of_its_own_and_builds_get_the_rest():
    one = cpus_mod.split_cpus(3, range(16))
    assert cpus_mod.split_cpus(3, range(16), workers=1, slot=0) == one   # one worker: as before
    w0, w1 = (cpus_mod.split_cpus(3, range(16), workers=2, slot=k) for k in (0, 1))
    assert w0.gpu == (13, 14, 15) and w1.gpu == (10, 11, 12)
    assert w0.build == w1.build == tuple(range(10))
    eight = [cpus_mod.split_cpus(3, range(8), workers=2, slot=k) for k in (0, 1)]
    assert [s.gpu for s in eight] == [(5, 6, 7), (2, 3, 4)] and eight[0].build == (0, 1)
    six = [cpus_mod.split_cpus(3, range(6), workers=3, slot=k) for k in (0, 1, 2)]   # one each
    assert [s.gpu for s in six] == [(5,), (4,), (3,)] and six[0].build == (0, 1, 2)
    assert not cpus_mod.split_cpus(3, range(6), workers=6).reserved   # the builds would get none
    assert not cpus_mod.split_cpus(3, range(4), workers=2).reserved   # too few to reserve at all
    # A caller that does not say (the checker, a build) gets its thread's worker's, or the rest.
    cpus_mod.set_gpu_workers(2)
    try:
        assert cpus_mod.split_cpus(3, range(16)).gpu == (13, 14, 15)
        with cpus_mod.gpu_worker(1):
            assert cpus_mod.split_cpus(3, range(16)).gpu == (10, 11, 12)
            seen = []
            t = threading.Thread(target=lambda: seen.append(cpus_mod.split_cpus(3, range(16)).gpu))
            t.start()
            t.join()
            assert seen == [(13, 14, 15)]   # another thread is not worker 1
        assert cpus_mod.split_cpus(3, range(16)).build == tuple(range(10))
    finally:
        cpus_mod.set_gpu_workers(1)
    assert cpus_mod.split_cpus(3, range(16)) == one


FAKE_NODES = ["/dev/nvidia-caps", "/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
              "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia10", "/dev/nvidiactl"]


def _bound(args: list[str]) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == "--dev-bind"]


def test_a_workers_sandbox_binds_only_its_own_gpu_node(monkeypatch):
    monkeypatch.setattr(sandbox_mod.glob, "glob",
                        lambda pattern: FAKE_NODES if pattern == "/dev/nvidia*" else [])
    monkeypatch.setattr(sandbox_mod, "drop_privileges", lambda: [])
    box = Sandbox("/usr/bin/bwrap", readable=("/usr",))
    shared = ["/dev/nvidia-caps", "/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
              "/dev/nvidiactl"]
    assert _bound(box.wrap(["true"])) == FAKE_NODES                 # no worker: every node
    assert _bound(box.for_gpu(None).wrap(["true"])) == FAKE_NODES   # node unknown: every node
    one = box.for_gpu(1).wrap(["python", "loop.py"])
    assert _bound(one) == shared[:4] + ["/dev/nvidia1", shared[4]]
    assert "/dev/nvidia0" not in one and "/dev/nvidia10" not in one
    assert one[-2:] == ["python", "loop.py"]
    assert box.for_gpu(1).describe() == box.describe()   # the key's part: unchanged
    assert Sandbox(None, "off").for_gpu(1).wrap(["true"]) == ["true"]
    # a Python submission's import check (build.py): no GPU's node at all
    assert _bound(box.without_gpus().wrap(["true"])) == shared


def test_device_minor_comes_from_the_drivers_account(tmp_path):
    for bus, uuid, minor in (("0000:19:00.0", "GPU-a", 1), ("0000:3b:00.0", "GPU-b", 0)):
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "information").write_text(
            f"Model: \t\t NVIDIA H200\nIRQ:   \t\t 1\nGPU UUID: \t {uuid}\nBus Location: \t {bus}\n"
            f"Device Minor: \t {minor}\n")
    assert device_mod.device_minor("GPU-a", str(tmp_path)) == 1
    assert device_mod.device_minor("GPU-b", str(tmp_path)) == 0
    assert device_mod.device_minor("GPU-z", str(tmp_path)) is None
    assert device_mod.device_minor("GPU-a", str(tmp_path / "none")) is None


def _ctx(tmp_path, small_case, devices, stream=None) -> context.GradeContext:
    return context.GradeContext(
        cases=(small_case,), device=devices[0], limits=config.Limits(), out_dir=tmp_path / "out",
        build_dir=tmp_path / "build", progress=Progress(1, live=False, stream=stream or io.StringIO()),
        sandbox=Sandbox("/usr/bin/bwrap"), gpus=tuple(devices) if len(devices) > 1 else ())


def test_worker_contexts_pin_env_cpus_and_device_node(monkeypatch, tmp_path, small_case):
    devices = [gpu(0), gpu(1)]
    minors = {devices[0].uuid: 0, devices[1].uuid: 1}
    monkeypatch.setattr(scheduling, "device_minor", lambda uuid: minors.get(uuid))
    monkeypatch.setattr(procs.os, "sched_getaffinity", lambda pid: set(range(16)))
    workers = scheduling.worker_contexts(_ctx(tmp_path, small_case, devices))
    assert [w.device.index for w in workers] == [0, 1] and [w.slot for w in workers] == [0, 1]
    assert [w.env["CUDA_VISIBLE_DEVICES"] for w in workers] == [d.uuid for d in devices]
    assert [w.sandbox.gpu_nodes for w in workers] == [("/dev/nvidia0",), ("/dev/nvidia1",)]
    assert [w.cpus.gpu for w in workers] == [(13, 14, 15), (10, 11, 12)]
    assert [w.gpu_tag for w in workers] == ["", "gpu1"]
    assert workers[1].gpu_ref == GpuRef(1, "NVIDIA H200", devices[1].uuid)
    single = scheduling.worker_contexts(_ctx(tmp_path, small_case, [gpu(0)]))
    assert len(single) == 1 and single[0].cpus == cpus_mod.split_cpus(3, range(16))
    assert single[0].gpu_tag == "" and single[0].progress is single[0].progress
    cpu = dataclasses.replace(gpu(0), cuda=False, name="cpu", index=None, uuid="")
    assert scheduling.worker_contexts(_ctx(tmp_path, small_case, [cpu]))[0].env["CUDA_VISIBLE_DEVICES"] == ""


# ---------------------------------------------------------------- the scheduler


def _timing(ms: float) -> TimingStats:
    return TimingStats(n=100, median_ms=ms, mean_ms=ms, min_ms=ms, std_ms=0.01, rse=0.001,
                       tflops=10.0, warmup_calls=2, budget_s=15.0, stopped_by="rse", wall_s=1.0)


def as_steps(fn):
    """`fn` as a grading's steps (stages/behind.Steps): what it returns is their result."""
    def steps(*args, **kwargs):
        return fn(*args, **kwargs)
        yield   # a generator, stopping nowhere
    return steps


class Recorder:
    """Stands in for the GPU stages: records which worker (GPU) ran what, and when."""

    def __init__(self, seconds: float = 0.05):
        self.seconds, self.lock, self.runs = seconds, threading.Lock(), []
        self.next_of: dict[str, str | None] = {}

    def run(self, what: str, ctx, role: str):
        started = time.monotonic()
        time.sleep(self.seconds)
        with self.lock:
            self.runs.append(dict(what=what, slot=ctx.slot, uuid=ctx.device.uuid, role=role,
                                  thread=threading.current_thread().name, start=started,
                                  end=time.monotonic(), cpus=ctx.cpus.gpu, protocol=ctx.protocol))

    def grade_submission(self, sub, build, ctx, source=""):
        queued = early_hook.early().queued   # the worker's next (Lookahead), as run_cases sees it
        self.next_of[sub.id] = queued[0][0].id if queued else None
        self.most_queued = max(getattr(self, "most_queued", 0), len(queued))
        self.run(sub.id, ctx, sub.role.value)
        return SubmissionResult(id=sub.id, label=sub.id, kind=sub.kind.value, role=sub.role.value,
                                status=Status.PASS, message="ok", timing=_timing(10.0 + ctx.slot),
                                timed_case="c", build=build)

    def grade_baseline(self, name, ctx):
        self.run(name, ctx, "baseline")
        return SubmissionResult(id=name, label=name, kind="builtin", role="baseline",
                                status=Status.PASS, message="ok", timing=_timing(100.0 + ctx.slot),
                                timed_case="c")


@pytest.fixture
def course(monkeypatch, tmp_path, make_submission, small_case):
    """Eight students and the solution, builds and GPU stages faked, on `devices`."""
    recorder = Recorder()
    calibrated = []
    monkeypatch.setattr(scheduling, "grade_submission", recorder.grade_submission)
    monkeypatch.setattr(scheduling, "grade_baseline", recorder.grade_baseline)
    monkeypatch.setattr(scheduling, "calibrate_protocol",
                        lambda ctx, reuse=False: calibrated.append(ctx.device.uuid) or ProtocolCost())
    monkeypatch.setattr(scheduling, "build_submission",
                        lambda sub, **kw: time.sleep(0.01) or BuildResult(Status.PASS, "import", 0.01))
    monkeypatch.setattr(scheduling, "device_minor", lambda uuid: None)
    monkeypatch.setattr(lookahead, "prepare", lambda sub, build, ctx, timed: None)   # no processes
    subs = [inspect_folder(make_submission(f"s{i}", "def custom_kernel(data):\n    return data[0]\n"))
            for i in range(8)]
    subs.append(inspect_folder(make_submission("sol", "def custom_kernel(data):\n    return data[0]\n"),
                               role=Role.BASELINE, id="solution"))

    def grade(devices, baselines=("torch_reference", "sdpa_flash"), **kw):
        ctx = _ctx(tmp_path, small_case, devices)
        ctx.out_dir.mkdir(parents=True, exist_ok=True)
        journal = RunJournal(ctx.out_dir, dict(submissions=[s.id for s in subs]))
        graded = scheduling.grade_all(subs, ctx, baselines=list(baselines),
                                    build_jobs=2, journal=journal, **kw)
        journal.finish("finished")
        return ctx, graded

    return dataclasses.make_dataclass("Course", ["grade", "recorder", "calibrated", "subs"])(
        grade, recorder, calibrated, subs)


def test_workers_share_the_students_and_time_every_baseline_on_every_gpu(course):
    devices = [gpu(0), gpu(1)]
    ctx, graded = course.grade(devices)
    runs = course.recorder.runs
    assert sorted(course.calibrated) == sorted(d.uuid for d in devices)   # each on its own GPU
    students = [r for r in runs if r["role"] == "student"]
    assert sorted(r["what"] for r in students) == [f"s{i}" for i in range(8)]   # each once
    for what in ("torch_reference", "sdpa_flash", "solution"):   # once on every GPU
        assert sorted(r["slot"] for r in runs if r["what"] == what) == [0, 1]
    assert {r["slot"] for r in students} == {0, 1}   # both GPUs took students
    for slot in (0, 1):   # one at a time on each GPU, from one thread, on its own CPUs
        mine = sorted((r for r in runs if r["slot"] == slot), key=lambda r: r["start"])
        assert all(a["end"] <= b["start"] for a, b in zip(mine, mine[1:]))
        assert {r["thread"] for r in mine} == {f"gpu-worker-{slot}"}
        assert {r["uuid"] for r in mine} == {devices[slot].uuid}
    # Every result records the GPU that graded it; the first GPU's baselines where they always
    # were, the others' under baselines/gpu1/.
    out = ctx.out_dir
    for r in runs:
        if r["role"] == "student":
            assert load_result(out / f"{r['what']}.json").gpu.uuid == r["uuid"]
    assert load_result(out / "baselines" / "sdpa_flash.json").gpu == GpuRef(0, "NVIDIA H200", devices[0].uuid)
    assert load_result(out / "baselines" / "gpu1" / "sdpa_flash.json").gpu.index == 1
    assert load_result(out / "baselines" / "gpu1" / "solution.json").timing.median_ms == 11.0
    assert len(graded) == 8 + 2 * 3
    # The page's roster: one row each; the other GPU's baselines read apart.
    run = json.loads((out / "_run.json").read_text())
    assert len(run["roster"]) == 8 + 2 * 3 and run["progress"]["graded"] == 14
    rows = read_results(out)
    assert sorted(r.id for r in rows if r.role == "baseline") == ["sdpa_flash", "solution", "torch_reference"]
    assert all(r.gpu.index == 0 for r in rows if r.role == "baseline")
    copies = read_gpu_copies(out)
    assert sorted((r.id, r.gpu.index) for r in copies) == [
        ("sdpa_flash", 1), ("solution", 1), ("torch_reference", 1)]


def test_a_rerun_resumes_and_a_baseline_from_another_gpu_is_timed_again(course):
    course.grade([gpu(0), gpu(1)])
    before = len(course.recorder.runs)
    _, graded = course.grade([gpu(0), gpu(1)])
    assert graded == [] and len(course.recorder.runs) == before   # nothing changed: all skipped
    # One GPU, now GPU 1: the students keep their results (same kind of GPU: the same key), the
    # baselines are timed again on it, their files the first GPU's.
    _, graded = course.grade([gpu(1)])
    assert sorted(r.id for r in graded) == ["sdpa_flash", "solution", "torch_reference"]
    assert {r.gpu.index for r in graded} == {1}


def test_a_quick_build_starts_first_and_the_cuda_ones_start_among_the_first(
        course, monkeypatch, make_submission):
    """CUDA submissions whose ids sort first are built in turn with the Python ones, a Python one
    first (workers.build_order): the GPU's first job is an import check's seconds away, not a
    compile's minutes, and the CUDA builds are not all left until the Python ones are graded
    (session 34's course lost about 95 s so)."""
    cudas = [inspect_folder(make_submission(f"a_cuda{i}", "// compiles for minutes\n",
                                            "submission.cu")) for i in range(2)]
    course.subs[:0] = cudas
    started = []
    monkeypatch.setattr(scheduling, "build_submission", lambda sub, **kw: started.append(sub.id)
                        or BuildResult(Status.PASS, "import", 0.01))
    course.grade([gpu(0)])
    assert sorted(started) == sorted(s.id for s in course.subs)
    assert {c.id for c in cudas} <= set(started[:5])   # two builds at a time: early, not last
    assert [s.kind.value for s in scheduling.build_order(course.subs)][:5] == [
        "python", "cuda", "python", "cuda", "python"]


def test_the_build_order_takes_the_kinds_in_turn_and_loses_none():
    """The folders that are neither kind first, then a Python and a CUDA one in turn, each kind in
    the order given, the rest of the longer kind at the end; every submission once."""
    def subs(spec):
        return [types.SimpleNamespace(id=f"{k}{i}", kind={"p": Kind.PYTHON, "c": Kind.CUDA,
                                                          "x": Kind.INVALID}[k])
                for i, k in enumerate(spec)]

    def order(spec):
        return [s.id for s in scheduling.build_order(subs(spec))]

    assert order("ccpxppc") == ["x3", "p2", "c0", "p4", "c1", "p5", "c6"]
    assert order("cccpc") == ["p3", "c0", "c1", "c2", "c4"]
    assert order("pppc") == ["p0", "c3", "p1", "p2"]
    assert order("ccc") == ["c0", "c1", "c2"] and order("") == []
    mixed = subs("pcxcpppccxpc" * 5)
    assert sorted(id(s) for s in scheduling.build_order(mixed)) == sorted(id(s) for s in mixed)


def test_a_build_the_overloaded_machine_failed_is_built_again_once_the_load_falls(
        course, monkeypatch):
    """Issue 32: a build that timed out twice under load (environment_error, under_load) is not
    the run's last word: after the run's other builds, once the load has fallen, it is built
    again, and that build's verdict is what the GPU stages grade. Built again once only."""
    tries: dict[str, int] = {}
    loads = iter([5.0, 5.0, 0.2])   # retry_round waits while the machine is still loaded

    def build(sub, **kw):
        tries[sub.id] = tries.get(sub.id, 0) + 1
        if sub.id in ("s3", "s5") and tries[sub.id] == 1:
            return BuildResult(Status.ENVIRONMENT_ERROR, "import", 1.0, under_load=True,
                               message="import did not finish within 120 s twice, while ...")
        if sub.id == "s6":   # overloaded on every try: the second build's verdict stands
            return BuildResult(Status.ENVIRONMENT_ERROR, "import", 1.0, under_load=True)
        return BuildResult(Status.PASS, "import", 0.01)

    monkeypatch.setattr(scheduling, "build_submission", build)
    monkeypatch.setattr(scheduling, "machine_load", lambda: next(loads, 0.2))
    monkeypatch.setattr(config, "BUILD_RETRY_WAIT_S", 60.0)
    ctx, graded = course.grade([gpu(0)])
    assert tries == {**{s.id: 1 for s in course.subs}, "s3": 2, "s5": 2, "s6": 2}
    by_id = {r.id: r for r in graded}
    assert by_id["s3"].build.status is Status.PASS and by_id["s5"].build.status is Status.PASS
    assert by_id["s6"].build.status is Status.ENVIRONMENT_ERROR   # once more only, then its verdict
    assert len([r for r in graded if r.role == "student"]) == 8   # every one has a result
    assert next(loads, None) is None   # it waited for the load to fall before building again


def test_a_submission_whose_cases_the_overloaded_machine_ended_is_graded_again_later(
        course, monkeypatch):
    """Issue 32: a result the load rule made the machine's (stages/run.py overloaded) is not
    written; it is graded once more after the queue, when the load has fallen, and that is its
    result. A second such result stands (environment_error, for the exit status to report)."""
    graded: dict[str, int] = {}
    loads = iter([5.0, 0.3])
    honest = course.recorder.grade_submission

    def grade(sub, build, ctx, source=""):
        graded[sub.id] = graded.get(sub.id, 0) + 1
        result = honest(sub, build, ctx, source)
        if sub.id == "s2" and graded[sub.id] == 1 or sub.id == "s4":
            case = CaseResult("c", Status.ENVIRONMENT_ERROR, "timed out twice under load",
                              overloaded=True)
            return dataclasses.replace(result, status=Status.ENVIRONMENT_ERROR, cases=[case], timing=None)
        return result

    monkeypatch.setattr(scheduling, "grade_submission", grade)
    monkeypatch.setattr(scheduling, "machine_load", lambda: next(loads, 0.3))
    ctx, results = course.grade([gpu(0)])
    assert graded["s2"] == 2 and graded["s4"] == 2 and graded["s1"] == 1
    by_id = {r.id: r for r in results}
    assert by_id["s2"].status is Status.PASS and by_id["s4"].status is Status.ENVIRONMENT_ERROR
    assert [r.id for r in results].count("s2") == 1   # one result: the second grading's
    runs = [r["what"] for r in course.recorder.runs if r["role"] == "student"]
    assert runs.index("s2", runs.index("s2") + 1) > runs.index("s7")   # after the queue


def test_a_course_build_s_limit_follows_the_machine_s_load():
    """Issue 32: a course build's limits scale with the load per core read before it starts
    (at least 1x, at most config.BUILD_LOAD_SCALE_MAX), and the timeout says it was scaled."""
    from grader.build import stage as build_stage
    limits = config.Limits(build_s=300, import_s=120)
    assert build_stage.under_load(limits, 0.4) == limits
    doubled = build_stage.under_load(limits, 2.0)
    assert (doubled.build_s, doubled.import_s, doubled.load_scale) == (600, 240, 2.0)
    assert build_stage.under_load(limits, 50.0).build_s == 300 * config.BUILD_LOAD_SCALE_MAX


def test_a_worker_knows_its_next_submission_while_it_grades_one(course):
    """lookahead.Lookahead: a GPU worker takes its next job before it grades one, so that the
    next one's run can be begun meanwhile; it then grades exactly that one next."""
    course.grade([gpu(0)])
    order = [r["what"] for r in sorted(course.recorder.runs, key=lambda r: r["start"])]
    told = course.recorder.next_of
    assert sorted(told) == sorted(s.id for s in course.subs)   # each graded once
    assert any(told.values())                                  # it had one queued, mostly
    assert course.recorder.most_queued == config.LOOKAHEAD     # and at times more than one
    for graded, following in zip(order, order[1:] + [None]):
        if told.get(graded):
            assert told[graded] == following, (graded, told[graded], following)


def test_a_worker_begins_its_first_runs_while_its_gpu_is_calibrated(course, monkeypatch):
    """lookahead.first_turn (issue 32, the course's start): the protocol is calibrated in a thread
    of the worker's own while its lane begins its first job's run and the next ones'
    (Lookahead.begin), so that the first turn does not start its processes after the
    calibration. No GPU stage starts before the cost is known, and each is given it (a prepared
    run's spec, written before, holds none: the harness is told it on its turn, turn_word)."""
    cost = ProtocolCost(idle_ms=0.7, busy_ms=0.9, busy_work_ms=10.0)
    began: list = []
    calibration: dict = {}

    def calibrate(ctx, reuse=False):
        deadline = time.monotonic() + 60
        while not began and time.monotonic() < deadline:   # the first runs begin meanwhile
            time.sleep(0.01)
        calibration.update(begun=list(began), ended=time.monotonic())
        return cost

    def prepare(sub, build, ctx, timed):
        began.append((sub.id, ctx.protocol, timed))
        return None

    monkeypatch.setattr(scheduling, "calibrate_protocol", calibrate)
    monkeypatch.setattr(lookahead, "prepare", prepare)
    course.grade([gpu(0)])
    runs = sorted(course.recorder.runs, key=lambda r: r["start"])
    first = next(r["what"] for r in runs if r["what"] in {s.id for s in course.subs})
    assert calibration["begun"] and calibration["begun"][0][0] == first
    assert {p for _, p, _ in calibration["begun"]} == {ProtocolCost()}   # not known yet
    assert all(t is not None for _, _, t in calibration["begun"])
    assert all(r["start"] >= calibration["ended"] and r["protocol"] == cost for r in runs)
    assert len(runs) == len(course.subs) + 2   # every submission, and both baselines


def test_a_calibration_s_error_is_the_run_s(course, monkeypatch):
    """The calibration runs in a thread of its own (CourseRun.calibrating): an error there (a
    grader bug) stops the run and is raised from it, even when every build failed; nothing is
    timed without the cost."""
    monkeypatch.setattr(scheduling, "build_submission",
                        lambda sub, **kw: BuildResult(Status.BUILD_ERROR, "import", 0.01))
    ended = []

    def calibrate(ctx, reuse=False):
        time.sleep(0.5)
        ended.append(time.monotonic())
        raise RuntimeError("calibration bug")

    monkeypatch.setattr(scheduling, "calibrate_protocol", calibrate)
    with pytest.raises(RuntimeError, match="calibration bug"):
        course.grade([gpu(0)], baselines=())
    assert ended and course.recorder.runs == []


def test_a_calibration_the_run_s_stop_killed_saves_no_cost(tmp_path, small_case, monkeypatch):
    """At a Ctrl-C the calibration's harness dies with no record: that is the stop, not a
    calibration that failed. Cancelled is raised and no cost is saved, so a resumed run
    (reuse) calibrates again instead of reusing a zero that its kept rows were not corrected by;
    without the stop, the same end is a failed calibration (zero, noted)."""
    ctx = _ctx(tmp_path, small_case, [gpu(0)])
    ctx.out_dir.mkdir(parents=True)
    monkeypatch.setattr(time_stage, "run_harness", lambda *a, **k: (None, "killed"))
    assert time_stage.calibrate_protocol(ctx) == ProtocolCost()
    saved = ctx.out_dir / time_stage.PROTOCOL_FILE
    assert saved.exists()
    saved.unlink()
    procs.CHILDREN.cancelled.set()   # what cancel_all sets, without killing other tests' children
    try:
        with pytest.raises(procs.Cancelled):
            time_stage.calibrate_protocol(ctx)
    finally:
        procs.end_run()
    assert not saved.exists()


def test_the_next_submissions_are_prepared_claimed_and_timed_on_their_own_subjects(
        tmp_path, make_submission, monkeypatch):
    """Lookahead on the CPU, with real harness and subject processes: up to config.LOOKAHEAD
    begun while another runs (begin), no time stage waits for them (they load no submission
    code), each claimed on its turn, run and timed on the subject it prepared; a turn that
    comes after a run begun for an earlier one closes that one; the worker's end closes what is
    left."""
    monkeypatch.setattr(config, "LOOKAHEAD", 2)   # the mechanism, with three submissions
    case = Case(1, 2, 16, 64, seed=3)
    cpu = dataclasses.replace(gpu(0), cuda=False, name="cpu", index=None, uuid="", l2_bytes=1 << 20)
    ctx = dataclasses.replace(_ctx(tmp_path, case, [cpu]), sandbox=Sandbox(None, "off in this test"))
    source = "import os\nprint('subject pid', os.getpid(), flush=True)\ndef custom_kernel(data):\n    return data[2].clone()\n"
    subs = [inspect_folder(make_submission(name, source)) for name in ("next", "other", "third")]
    built = BuildResult(Status.PASS, "import", 0.1)
    job = lambda sub, build=built: ("submission", None, sub, build)
    with lookahead.keep_warm():
        ahead = early_hook.early()
        ahead.queue([("baseline", None, None, None),
                     job(subs[0], BuildResult(Status.BUILD_ERROR, "import", 0.1))])
        assert ahead.queued == []       # only a submission's run is begun early, its build passed
        ahead.queue([job(s) for s in subs])
        ahead.begin(ctx, case)
        assert [p.sub for p in ahead.prepared] == subs[:config.LOOKAHEAD] == subs[:2]
        assert ahead.queued == [(subs[2], built)]
        ahead.queue([job(s) for s in subs[1:]])   # subs[0]'s turn came: not begun again
        assert ahead.queued == [(subs[2], built)]
        got = ahead.claim(subs[0])
        assert got is not None and got.ready and [p.sub for p in ahead.prepared] == [subs[1]]
        with got.folders:
            ran = run_stage.run_cases(subs[0], built, [case], ctx, got.work, got.jit, case, got)
            assert ran.runs[case.id]["status"] == "pass", ran.output
            assert ran.stages is got.stages and ran.phases_s["load"] >= 0
            assert [p.sub for p in ahead.prepared] == subs[1:]   # the third begun in its run
            timed = time_stage.time_target({}, case, ctx, folder=[], stages=ran.stages)
            assert isinstance(timed, time_stage.TimedRun) and timed.stats.n >= 2
        run_pid = [l for l in ran.output.splitlines() if l.startswith("subject pid")]
        time_pid = [l for l in timed.record["output"].splitlines() if l.startswith("subject pid")]
        assert len(set(run_pid + time_pid)) == 1   # one subject for both stages
        skipped = ahead.prepared[0]
        dying = ahead.claim(subs[2])     # subs[1]'s turn is past: its run is closed
        assert skipped.stages.harness.closed and ahead.prepared == []
        assert ahead.claim(subs[1]) is None
        # a prepared subject that died while it waited: the run starts anew, the usual way
        assert dying is not None and dying.ready
        harness_pid = dying.stages.harness.proc.pid
        for pid in tree_mod.process_tree(harness_pid) - {harness_pid}:
            os.kill(pid, signal.SIGKILL)
        with dying.folders, pytest.raises(harnesses.NotStarted):   # grade_submission: anew
            run_stage.run_cases(subs[2], built, [case], ctx, dying.work, dying.jit, case, dying)
        assert dying.stages.harness.closed
        ahead.queue([job(subs[1])])
        ahead.begin(ctx, case)
        left = ahead.prepared
    assert left and all(p.stages.harness.closed for p in left)   # the worker ended
    assert getattr(early_hook.early(), "prepared", []) == []   # nothing begun early is left



def test_on_lanes_nothing_begun_before_a_health_check_of_the_gpu_is_used(
        tmp_path, make_submission, monkeypatch):
    """Lanes share a GPU (GpuGate): a crash on one lane checks the GPU's health
    (ensure_gpu_healthy), which counts on the gate when it begins and when it ends. A run begun
    early on another lane (Prepared), or a time stage's subject (TimeSubject), begun before that,
    started CUDA beside the crash: it is closed on its turn, not used, and its submission runs
    or is timed on new subjects. What was begun after it is used."""
    case = Case(1, 2, 16, 64, seed=3)
    cpu = dataclasses.replace(gpu(0), cuda=False, name="cpu", index=None, uuid="", l2_bytes=1 << 20)
    gate = GpuGate()
    ctx = dataclasses.replace(_ctx(tmp_path, case, [cpu]), sandbox=Sandbox(None, "off in this test"),
                              gate=gate)
    source = "def custom_kernel(data):\n    return data[2].clone()\n"
    subs = [inspect_folder(make_submission(name, source)) for name in ("first", "second", "third")]
    built = BuildResult(Status.PASS, "import", 0.1)
    with lookahead.keep_warm():
        ahead = early_hook.early()
        ahead.queue([("submission", None, s, built) for s in subs])
        ahead.begin(ctx, case)
        (first,) = ahead.prepared                       # one a lane (ctx.lookahead)
        assert ahead.claim(subs[0], gate) is first      # no check since: used
        assert first.timer is not None and early_runs.current_timer(first.timer, ctx) is first.timer
        ahead.begin(ctx, case)
        (second,) = ahead.prepared
        monkeypatch.setattr(health, "probe_gpu", lambda ctx_, tries: None)
        other_lane = threading.Thread(target=health.ensure_gpu_healthy,   # after its crash
                                      args=(dataclasses.replace(ctx, device=gpu(0)),))
        other_lane.start()
        other_lane.join(60)
        assert not second.stages.harness.closed         # this lane's, still open until its turn
        assert gate.health_checks == 2                  # as it began, and as it ended
        assert early_runs.current_timer(first.timer, ctx) is None and first.timer.harness.closed
        first.close()
        assert ahead.claim(subs[1], gate) is None       # begun before the check: not used
        assert second.stages.harness.closed and second.timer.harness.closed
        ahead.begin(ctx, case)
        (third,) = ahead.prepared
        assert third.health_checks == 2
        assert ahead.claim(subs[2], gate) is third      # begun after it: used
        third.close()


def test_a_run_begun_early_keeps_its_folders_while_other_threads_start_processes(
        tmp_path, make_submission):
    """Session 14's 100-copy course: 6 of 9 runs begun early failed on their turn, their work
    folders gone. A child started with a preexec_fn (procs.spawn_capped: every build, harness
    and checker) runs Python after fork, where the other threads' thread-local data is freed: a
    preparation held only there had its folders' finalizers (TemporaryDirectory) run in the
    child, which removed them from under the run. The worker's preparations are held where a
    fork leaves them alone."""
    case = Case(1, 2, 16, 64, seed=3)
    cpu = dataclasses.replace(gpu(0), cuda=False, name="cpu", index=None, uuid="", l2_bytes=1 << 20)
    ctx = dataclasses.replace(_ctx(tmp_path, case, [cpu]), sandbox=Sandbox(None, "off in this test"))
    sub = inspect_folder(make_submission("kept", "def custom_kernel(data):\n    return data[2].clone()\n"))
    begun, forked, seen = threading.Event(), threading.Event(), {}

    def worker():
        with lookahead.keep_warm():
            early_hook.early().queue([("submission", None, sub, BuildResult(Status.PASS, "import", 0.1))])
            early_hook.early().begin(ctx, case)
            folders = [(p.work, p.jit) for p in early_hook.early().prepared]
            begun.set()
            forked.wait(60)
            seen["folders"] = [(w.is_dir(), j.is_dir()) for w, j in folders]
            got = early_hook.early().claim(sub)
            seen["claimed"] = got is not None
            if got is not None:
                got.close()

    thread = threading.Thread(target=worker, name="gpu-worker-0")
    thread.start()
    assert begun.wait(60)
    for _ in range(3):   # as a build thread does, beside the worker
        assert procs.run_limited([sys.executable, "-c", "pass"], timeout_s=60).ok
    forked.set()
    thread.join(300)
    assert seen == dict(folders=[(True, True)], claimed=True)


def _course_on_the_cpu(tmp_path, kernel: str, *grader_args: str,
                       sandbox: bool = True) -> tuple[dict, str]:
    """`grade` of 8 Python submissions (`kernel`, each with its number in a comment) with a GPU's
    flow driven on the CPU (tests/gpu_flow_on_cpu.py): the results by id, and what it said.
    Sandboxed where bubblewrap works, unless not `sandbox`."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    course = tmp_path / "course"
    for i in range(8):
        (course / f"t{i}").mkdir(parents=True)
        (course / f"t{i}" / "submission.py").write_text(textwrap.dedent(kernel) + f"# {i}\n")
    cases = tmp_path / "cases.txt"
    cases.write_text("batch_size: 1; num_heads: 2; seq_len: 16; head_dim: 64; seed: 1\n"
                     "batch_size: 1; num_heads: 2; seq_len: 40; head_dim: 64; seed: 2\n")
    env = dict(os.environ)
    if not sandbox or not Sandbox.probe(**sandbox_mod.default_layout(), mode="auto").active:
        env["GRADER_SANDBOX"] = "off"
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "gpu_flow_on_cpu.py"), "grade", str(course),
         "--out", str(out), "--build-dir", str(tmp_path / "build"), "--cases", str(cases),
         "--no-hidden", "--no-baselines", "--no-solution", "--calibration", *grader_args],
        capture_output=True, text=True, timeout=1200, env=env, cwd=config.REPO_ROOT)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-3000:]
    assert "did not start" not in said and "grader error" not in said, said[-4000:]
    results = {p.stem: json.loads(p.read_text()) for p in out.glob("t*.json")}
    # on the CPU no kernel explains the timed calls' time and no NVML can say why: review (or
    # flagged, with no kernel at all) when it is above the allowance
    assert len(results) == 8 and {r["status"] for r in results.values()} <= {"pass", "flagged", "review"}, said[-3000:]
    # every time stage says where its seconds went (results.TIME_PHASES): its parts up to the
    # timed loop's end within it; the report and the spot checks may come after "timed", behind
    # the turn (stages/behind.py), beside the next submission's run stage
    for name, r in results.items():
        stage_s = r["stage_s"]
        parts = [stage_s[f"time.{p}"] for p in TIME_PHASES]
        assert TIME_PHASES[4:] == ("report", "spots") and all(p >= 0 for p in parts), stage_s
        assert 0 < sum(parts[:4]) <= stage_s["time"], (name, stage_s)
    return results, said


def test_a_course_graded_through_the_gpu_flow_on_the_cpu_begins_its_runs_early(tmp_path):
    """The real `grade` (builds in threads, the GPU worker, runs begun early, the warm checker,
    time stages) with a GPU's flow driven on the CPU, one submission at a time (--lanes 1):
    builds go on while the first runs are begun early, as in a course; session 14's lost folders
    showed here as grader errors. Every submission is run, checked and timed, and all but the
    first two runs (graded before any build was ready to begin) are begun early."""
    results, said = _course_on_the_cpu(tmp_path, """
        import torch
        def custom_kernel(data):
            q, k, v = data
            return torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float()).half()
        """, "--lanes", "1")
    begun = sorted(n for n, r in results.items() if "run.load" in (r.get("stage_s") or {}))
    assert len(begun) >= 6, (begun, said[-3000:])


def test_on_lanes_run_stages_share_the_gpu_and_nothing_runs_beside_a_timed_call(tmp_path):
    """grade --lanes 3 (issue 13, grader/schedule/gate.py) with the GPU's flow on the CPU. Each call of
    every subject prints its process's token and CLOCK_MONOTONIC (one clock machine-wide, sandbox
    or not), and the logs keep what each stage's subject printed. The run stages of several
    submissions overlap, which is what lanes are for; yet while one submission's calls are timed
    (from its time stage's first call to its last), no call of any other submission happens; and
    each is timed on a subject of its own, not the one its cases ran on beside the others."""
    results, said = _course_on_the_cpu(tmp_path, """
        import os, time, torch
        TOKEN, CALLS = os.urandom(6).hex(), []
        def custom_kernel(data):
            print(f"CALL {TOKEN} {time.monotonic():.6f}", flush=True)
            CALLS.append(1)
            time.sleep(1.0 if len(CALLS) <= 2 else 0.01)   # the cases, or the warm-up: slow
            q, k, v = data
            return torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float()).half()
        """, "--lanes", "3")
    logs = tmp_path / "results" / "logs"

    def calls(name: str, stage: str) -> list[tuple[str, float]]:
        text = (logs / f"{name}.{stage}.log").read_text()
        return [(m.group(1), float(m.group(2))) for m in re.finditer(r"CALL (\w+) ([\d.]+)", text)]

    runs = {n: calls(n, "run") for n in results}
    times = {n: calls(n, "time") for n in results}
    for n in results:
        assert len(runs[n]) == 2 and len(times[n]) >= 4, (n, runs[n], times[n])
        assert not {t for t, _ in runs[n]} & {t for t, _ in times[n]}, n   # a fresh subject
        start, end = min(t for _, t in times[n]), max(t for _, t in times[n])
        for other in results:
            if other != n:
                beside = [t for _, t in runs[other] + times[other] if start <= t <= end]
                assert not beside, (n, other, start, end, beside)
    spans = sorted((min(t for _, t in r), max(t for _, t in r)) for r in runs.values())
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:])), spans   # run stages overlapped


@pytest.mark.parametrize("how", ["thread", "escaped_process"])
def test_on_lanes_a_submission_that_keeps_working_after_its_calls_never_works_beside_a_timed_call(tmp_path, how):
    """The attack twin of the test above: every subject starts, on its first call, a thread (or
    a process that leaves its group and its parent: setsid and a double fork) that goes on
    "using the GPU", hoping to slow the others' timed calls; it notes each moment it works
    (CLOCK_MONOTONIC) in a file of its own outside the grader. Unsandboxed, so that what is
    tested is the grader's own rule, not the sandbox's PID namespace: each run stage's subject
    and everything it started are killed, and have exited, before its hold on the GPU's gate ends
    and a time stage may begin (run_stage.let_go, gate.py; the harness adopts what left the
    tree: procs.become_subreaper). So no moment of one submission's work falls inside another's
    timed calls, and the run goes on."""
    marks = tmp_path / "busy"
    marks.mkdir()
    results, said = _course_on_the_cpu(tmp_path, f"""
        import os, threading, time, torch
        NAME, CALLS = open(__file__).read().rsplit("#", 1)[1].strip(), []
        END = time.monotonic() + 150   # never past the test, whatever happens
        def busy():
            with open(os.path.join({str(marks)!r}, f"t{{NAME}}"), "a") as f:
                while time.monotonic() < END:
                    f.write(f"{{time.monotonic():.6f}}\\n")
                    f.flush()
                    time.sleep(0.02)
        def escape():
            child = os.fork()
            if child == 0:
                os.setsid()
                if os.fork() == 0:
                    busy()
                os._exit(0)
            os.waitpid(child, 0)
        def custom_kernel(data):
            print(f"CALL {{NAME}} {{time.monotonic():.6f}}", flush=True)
            if not CALLS:
                if {how == "thread"!r}:
                    threading.Thread(target=busy, daemon=True).start()
                else:
                    escape()
            CALLS.append(1)
            time.sleep(1.0 if len(CALLS) <= 2 else 0.01)
            q, k, v = data
            return torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float()).half()
        """, "--lanes", "3", sandbox=False)
    logs = tmp_path / "results" / "logs"
    busy = {n: [float(x) for x in (marks / n).read_text().split()] for n in results}
    assert all(len(b) >= 10 for b in busy.values()), {n: len(b) for n, b in busy.items()}
    for n in results:
        timed = [float(m.group(1)) for m in
                 re.finditer(r"CALL \w+ ([\d.]+)", (logs / f"{n}.time.log").read_text())]
        start, end = min(timed), max(timed)
        for other in results:
            if other != n:
                beside = [t for t in busy[other] if start <= t <= end]
                assert not beside, (n, other, start, end, beside[:5])


def test_a_run_begun_early_that_did_not_start_is_graded_anew_in_new_folders(
        tmp_path, make_submission, monkeypatch):
    """A prepared run whose harness ends on its turn with no record (its subject died while it
    waited, or the harness failed) is no grader error: the submission is graded again from the
    start, in new folders (the prepared ones go), the lost time counted as waiting, and the
    harness's last words noted for the instructor."""
    stream = io.StringIO()
    case = Case(1, 2, 16, 64, seed=3)
    ctx = _ctx(tmp_path, case, [gpu(0)], stream=stream)
    sub = inspect_folder(make_submission("again", "def custom_kernel(data):\n    return data[2]\n"))
    folders, removed = contextlib.ExitStack(), []
    folders.callback(lambda: removed.append(True))
    prepared = harnesses.Prepared(sub, tmp_path / "work", tmp_path / "jit", stages=None, folders=folders)
    monkeypatch.setattr(lookahead.Lookahead, "claim", lambda self, s, gate=None: prepared if s is sub else None)
    calls = []

    def graded(sub_, build, ctx_, source, jit, prepared_=None, waited_s=0.0):
        calls.append((jit, prepared_, waited_s))
        if prepared_ is not None:
            time.sleep(0.2)
            raise harnesses.NotStarted("Traceback (most recent call last):\nOSError: the reason")
        return "graded anew"

    monkeypatch.setattr(grading, "_grade_built", as_steps(graded))
    with lookahead.keep_warm():   # a GPU worker's lane: its runs begun early are its Lookahead's
        assert grading.grade_submission(sub, BuildResult(Status.PASS, "import", 0.1), ctx) == "graded anew"
    assert [c[1] for c in calls] == [prepared, None] and removed == [True]
    assert calls[1][0] is not None and calls[1][0] != prepared.jit and calls[1][2] >= 0.2
    assert "again: its run begun early did not start; running it anew" in stream.getvalue()
    assert "OSError: the reason" in stream.getvalue()


def test_a_turn_with_nothing_begun_early_waited_for_nothing(tmp_path, make_submission, monkeypatch):
    """stage_s "wait" is the time a turn waited for its run begun early. With none begun, none:
    not the time making its JIT folder took, nor a loaded machine's delay in getting there
    (CI's 2-core machine gave a CPU run a "wait" that way)."""
    case = Case(1, 2, 16, 64, seed=3)
    ctx = _ctx(tmp_path, case, [gpu(0)])
    sub = inspect_folder(make_submission("alone", "def custom_kernel(data):\n    return data[2]\n"))
    real_jit_cache, calls = folders.jit_cache, []

    @contextlib.contextmanager
    def slow_jit_cache(sub_, limits, build=None):
        time.sleep(0.05)   # a loaded machine
        with real_jit_cache(sub_, limits, build) as jit:
            yield jit

    monkeypatch.setattr(grading, "jit_cache", slow_jit_cache)
    monkeypatch.setattr(grading, "_grade_built",
                        as_steps(lambda sub_, build, ctx_, source, jit, prepared_=None, waited_s=0.0:
                                 calls.append(waited_s) or "graded"))
    assert grading.grade_submission(sub, BuildResult(Status.PASS, "import", 0.1), ctx) == "graded"
    assert calls == [0.0]


class _GoneStages:
    """A prepared run's Stages whose harness ends with no record on its turn."""
    closed = False

    def go(self, protocol):
        pass

    def ran(self, timeout_s):
        return None, "killed"

    def close(self, wait_s=30):
        self.closed = True


def test_a_run_begun_early_that_the_run_s_stop_killed_is_not_started_anew(tmp_path, make_submission):
    """At a Ctrl-C (cancel_all) the prepared runs' harnesses die with no record. That is the
    stop, not a run that failed to start: run_cases raises Cancelled (nothing is graded anew
    or noted as "did not start", as session 15's 2-GPU course did after its --stop-after);
    without the stop the same end is NotStarted."""
    case = Case(1, 2, 16, 64, seed=3)
    ctx = _ctx(tmp_path, case, [gpu(0)])
    sub = inspect_folder(make_submission("stopped", "def custom_kernel(data):\n    return data[2]\n"))
    built = BuildResult(Status.PASS, "import", 0.1)

    def run(stages):
        prepared = harnesses.Prepared(sub, tmp_path / "work", None, stages=stages,
                                     folders=contextlib.ExitStack())
        run_stage.run_cases(sub, built, [case], ctx, tmp_path / "work", timed=case, prepared=prepared)

    stages = _GoneStages()
    with pytest.raises(harnesses.NotStarted):
        run(stages)
    assert stages.closed
    procs.CHILDREN.cancelled.set()   # what cancel_all sets, without killing other tests' children
    try:
        stages = _GoneStages()
        with pytest.raises(procs.Cancelled):
            run(stages)
        assert stages.closed
    finally:
        procs.end_run()


def test_a_worker_takes_its_next_job_early_only_when_no_other_worker_waits():
    """Lookahead without hoarding: a job taken early is one no idle GPU worker is waiting for."""
    jobs = Jobs(2)
    jobs.pending = 1
    got = []
    waiter = threading.Thread(target=lambda: got.append(jobs.take(1)))
    waiter.start()
    deadline = time.monotonic() + 10
    while jobs.idle == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert jobs.idle == 1
    with jobs.cond:   # two jobs arrive at once; worker 0 looks ahead before worker 1 wakes
        jobs.shared.extend(["a", "b"])
    assert jobs.take(0, wait=False) == "a"        # one left for the waiting worker
    assert jobs.take(0, wait=False) is None
    jobs.put([], built=True)                      # wakes worker 1
    waiter.join(timeout=10)
    assert got == ["b"] and jobs.idle == 0
    jobs.pinned[0].append("mine")
    assert jobs.take(0, wait=False) == "mine"    # a job pinned to this worker is its own
    jobs.stop()
    assert jobs.take(0, wait=False) is None


def test_one_gpu_runs_as_before(course):
    ctx, graded = course.grade([gpu(0)])
    assert {r["slot"] for r in course.recorder.runs} == {0}
    assert len(graded) == 8 + 3 and not (ctx.out_dir / "baselines" / "gpu1").exists()
    roster = json.loads((ctx.out_dir / "_run.json").read_text())["roster"]
    assert not any("gpu" in e for e in roster)
    assert {r["thread"] for r in course.recorder.runs} == {"gpu-worker-0"}


def _workers_left(wait_s: float = 5.0) -> list:
    """The GPU workers' threads (their lanes' and those of the checks left behind, each ending
    with its lane, within a second of it: schedule/behind.py) still alive after `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        left = [t for t in threading.enumerate() if t.name.startswith("gpu-worker-") and t.is_alive()]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def test_an_unhealthy_gpu_stops_every_worker(course, monkeypatch):
    fine = course.recorder.grade_submission
    count = []

    def sick(sub, build, ctx, source=""):
        if ctx.slot == 1 and sub.role is Role.STUDENT:
            count.append(sub.id)
            raise context.GpuUnhealthy("GPU 1 failed its health check")
        return fine(sub, build, ctx, source)

    monkeypatch.setattr(scheduling, "grade_submission", sick)
    with pytest.raises(context.GpuUnhealthy, match="GPU 1"):
        course.grade([gpu(0), gpu(1)])
    assert len(count) == 1   # the worker stopped at once
    assert not _workers_left()


def test_ctrl_c_stops_every_worker_and_keeps_what_finished(course, monkeypatch, tmp_path):
    fine = course.recorder.grade_submission
    done = []

    def then_interrupt(sub, build, ctx, source=""):
        result = fine(sub, build, ctx, source)
        done.append(sub.id)
        if len(done) == 3:
            _thread.interrupt_main()   # a Ctrl-C in the grader's main thread
            deadline = time.monotonic() + 60   # this one's result comes after the run stopped
            while not procs.CHILDREN.cancelled.is_set() and time.monotonic() < deadline:
                time.sleep(0.05)       # (cancel_all, once the main thread has the Ctrl-C)
        return result

    monkeypatch.setattr(scheduling, "grade_submission", then_interrupt)
    # interrupt_main does nothing where SIGINT is ignored (a test run started in the background)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            course.grade([gpu(0), gpu(1)])
    finally:
        signal.signal(signal.SIGINT, previous)
        procs.end_run()   # cancel_all set the run's stop flag: let later tests start children
    assert not _workers_left()
    written = {p.stem for p in (tmp_path / "out").glob("s*.json")}
    assert written and written < set(done)   # finished ones kept; the one cut off is not


# ---------------------------------------------------------------- per-GPU baselines on the page


def _result(id, role, ms, index, **kw) -> SubmissionResult:
    return SubmissionResult(id=id, label=kw.pop("label", id), kind="builtin" if role == "baseline" else "python",
                            role=role, status=Status.PASS, message="ok", timing=_timing(ms),
                            timed_case="c", gpu=GpuRef(index, "NVIDIA H200", f"GPU-{index}"), **kw)


RUN = dict(started_at="2026-11-23T12:00:00+00:00", finished_at="2026-11-23T12:10:00+00:00",
           device=dict(cuda=True, name="NVIDIA H200", driver="580", torch_version="2.11",
                       cuda_version="13.0", grader_version="0.1.0", matmul_tflops=700.0),
           cases=[dict(id="c", hidden=False)], timed_case="c", rtol=0.01, atol=0.01,
           gpus=[dict(index=0, name="NVIDIA H200", uuid="GPU-0", matmul_tflops=700.0),
                 dict(index=1, name="NVIDIA H200", uuid="GPU-1", matmul_tflops=500.0)])


def test_result_files_without_a_gpu_still_load_and_with_one_round_trip(tmp_path):
    old = SubmissionResult(id="alice", label="alice", kind="python", role="student",
                           status=Status.PASS, message="ok")
    path = write_result(tmp_path, old)
    assert "gpu" not in json.loads(path.read_text())   # as results were written before
    assert load_result(path).gpu is None
    new = dataclasses.replace(old, gpu=GpuRef(1, "NVIDIA H200", "GPU-1"))
    assert load_result(write_result(tmp_path, new)).gpu == GpuRef(1, "NVIDIA H200", "GPU-1")


def test_the_table_and_page_show_each_rows_gpu_and_how_far_the_gpus_agree():
    results = [_result("torch_reference", "baseline", 100.0, 0, label="PyTorch reference"),
               _result("sdpa_flash", "baseline", 20.0, 0, label="SDPA FLASH"),
               _result("alice", "student", 10.0, 0), _result("bob", "student", 11.0, 1)]
    copies = [_result("torch_reference", "baseline", 110.0, 1, label="PyTorch reference"),
              _result("sdpa_flash", "baseline", 20.2, 1, label="SDPA FLASH")]
    gpus = gpu_agreement(results, copies, RUN)
    assert [b["medians"] for b in gpus["rows"]] == [[100.0, 110.0], [20.0, 20.2]]
    assert gpus["max_spread_pct"] == pytest.approx(10.0) and not gpus["agree"]
    assert "The GPUs DISAGREE" in gpus["line"] and "up to 10.0%" in gpus["line"]
    rows = build_rows(results, run=RUN, gpu_copies=copies)
    by = {r.name: r for r in rows}
    assert by["bob"].gpu == "GPU 1" and by["alice"].gpu == "GPU 0"
    assert by["bob"].speedup_vs_reference == pytest.approx(10.0)    # GPU 1's reference: 110 ms
    assert by["alice"].speedup_vs_reference == pytest.approx(10.0)  # GPU 0's: 100 ms
    assert by["bob"].percent_of_peak == pytest.approx(100 * 10.0 / 500.0)   # GPU 1's own peak
    table = text_table(rows, width=120, gpus=gpus)
    head = table.splitlines()[0]
    assert "  gpu  verdict" in head
    bob = next(line for line in table.splitlines() if " bob " in line)
    assert bob[head.index("gpu") - 2:head.index("gpu") + 3].strip() == "1"
    assert "PyTorch reference           100.000    110.000   10.00%" in table
    assert "The GPUs DISAGREE" in table
    page = render_leaderboard(rows, RUN, history=[], gpus=gpus)
    assert "<h2>GPUs</h2>" in page and "GPU 1 (NVIDIA H200) ms" in page
    assert '<p class="note">The GPUs DISAGREE' in page
    assert '<span class="label">on</span>GPU 1</td>' in page and 'colspan="8"' in page
    # Within 2%: said, and not as a warning.
    close = gpu_agreement(results, [dataclasses.replace(c, timing=_timing(c.timing.median_ms * 0.99 if
                                                                          c.id == "sdpa_flash" else 101.0))
                                    for c in copies], RUN)
    assert close["agree"] and "they agree" in close["line"] and "at most 1.00%" in close["line"]


def test_one_gpu_pages_and_tables_are_unchanged():
    results = [_result("torch_reference", "baseline", 100.0, 0), _result("alice", "student", 10.0, 0)]
    one = dict(RUN, gpus=RUN["gpus"][:1])
    assert gpu_agreement(results, [], one) is None
    rows = build_rows(results, run=one)
    assert all(r.gpu == "" for r in rows)
    def shown(rows):
        return [(r.name, r.rank, r.speedup_vs_reference, r.percent_of_peak, r.score, r.gpu) for r in rows]

    assert shown(rows) == shown(build_rows([dataclasses.replace(r, gpu=None) for r in results], run=one))
    assert " gpu " not in text_table(rows, width=120)
    page = render_leaderboard(rows, one, history=[])
    assert "<h2>GPUs</h2>" not in page and 'colspan="7"' in page


def test_a_full_scratch_disk_is_the_machines_fault_not_the_submissions(course, monkeypatch):
    """Issue 13's red team: a submission that fills the scratch disk (its JIT cache folder)
    makes the grader's own writes fail for the submission graded beside or after it. That is
    an environment_error (never scored, graded again by the next run), not a grader error that
    counts as the victim's runtime_error; the other submissions are graded as usual."""
    real = scheduling.grade_submission   # the course fixture's recorder

    def full(sub, build, ctx, source=""):
        if sub.id == "s3":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(sub, build, ctx, source)

    monkeypatch.setattr(scheduling, "grade_submission", full)
    ctx, graded = course.grade([gpu(0)])
    victim = load_result(ctx.out_dir / "s3.json")
    assert victim.status is Status.ENVIRONMENT_ERROR, victim.message
    assert "ran out of scratch space" in victim.message and "graded again" in victim.message
    assert not victim.status.scored   # not scored
    assert {r.status for r in graded if r.id != "s3"} == {Status.PASS}


@pytest.mark.parametrize("company", [True, False])
def test_a_run_stage_that_failed_beside_others_is_run_again_alone(
        monkeypatch, tmp_path, make_submission, small_case, company):
    """grade --lanes (grader/schedule/gate.py): a case that failed (out of memory here) while another
    submission's run stage shared the GPU may be that one's doing. The cases run again with the
    GPU held alone before the verdict counts. A run stage that had the GPU to itself (no
    company) keeps its failure: nothing is run twice."""
    cpu = dataclasses.replace(gpu(0), cuda=False, name="cpu")
    ctx = dataclasses.replace(_ctx(tmp_path, small_case, [cpu]), gate=GpuGate(), lanes=3)
    sub = inspect_folder(make_submission("s", "def custom_kernel(data):\n    return data[0]\n"))
    tries = []

    def ran(status: str, cases):
        return run_stage.Ran({c.id: dict(status=status, message="CUDA out of memory" if status != "pass"
                                         else "", elapsed_s=0.1) for c in cases}, status, None, {})

    def first(sub_, build, cases, ctx_, work, jit=None, timed=None, prepared=None):
        tries.append("alone" if ctx_.gate.held_alone else "shared")
        time.sleep(0.3)
        return ran("runtime_error", cases)

    def again(sub_, build, cases, ctx_, work, jit=None, timed=None, prepared=None):
        tries.append("alone" if ctx_.gate.held_alone else "shared")
        return ran("pass", cases)

    monkeypatch.setattr(grading, "run_cases_under_load", first)
    monkeypatch.setattr(grading, "run_cases", again)
    monkeypatch.setattr(check_stage, "check_outputs", lambda cases, runs, **kw: [
        CaseResult(c.id, Status(runs[c.id]["status"]), runs[c.id]["message"], c.hidden) for c in cases])
    probes = []   # the GPU's health probe after a failure: alone, no other submission beside it
    monkeypatch.setattr(grading, "ensure_gpu_healthy", lambda ctx: probes.append(ctx.gate.held_alone))
    other = threading.Event()

    def beside():   # another lane's run stage, under way when this one starts
        with ctx.gate.shared():
            other.set()
            time.sleep(0.5)

    neighbour = threading.Thread(target=beside)
    if company:
        neighbour.start()
        other.wait(10)
    result = grading.grade_submission(sub, BuildResult(Status.PASS, "import", 0.1), ctx)
    if company:
        neighbour.join(10)
        assert tries == ["shared", "alone"] and result.status is Status.PASS, result.message
        assert "running its cases again alone" in ctx.progress.stream.getvalue()
    else:
        assert tries == ["shared"] and result.status is Status.RUNTIME_ERROR
        assert probes == [True]


def test_what_a_shared_run_stage_tuned_is_forgotten_and_its_kernels_kept(tmp_path):
    """grade --lanes: an autotuner's choice cached in a run stage that shared the GPU (Triton's
    autotune(cache_results)) was measured beside other submissions, which could have slowed it
    on purpose. It is removed before the time stage, whose subject tunes again alone; the
    compiled kernels stay."""
    jit = tmp_path / "jit"
    (jit / "triton" / "ab12").mkdir(parents=True)
    tuned = jit / "triton" / "ab12" / "attn_fwd.autotune.json"
    kernel = jit / "triton" / "ab12" / "attn_fwd.cubin"
    tuned.write_text("{}")
    kernel.write_bytes(b"\0")
    folders.forget_tuning(jit)
    assert not tuned.exists() and kernel.exists()
    folders.forget_tuning(None)   # no JIT folder (a CUDA build): nothing to do


def test_on_lanes_run_stages_leave_the_gpu_stages_cpus_to_the_time_stages(
        monkeypatch, tmp_path, small_case, make_submission):
    """grade --lanes: the run stages that share a GPU run on the builds' CPUs (idle in a
    regrade), so that three of them do not crowd the GPU stages' three CPUs, which stay the time
    stages' and the checker's. One lane: the run stage keeps the GPU stages' CPUs, as before."""
    monkeypatch.setattr(procs.os, "sched_getaffinity", lambda pid: set(range(16)))
    one = _ctx(tmp_path, small_case, [gpu(0)])
    assert one.run_cpus == one.cpus and one.cpus.gpu == (13, 14, 15)
    lanes = dataclasses.replace(one, lanes=3, gate=GpuGate())
    assert lanes.run_cpus.gpu == lanes.run_cpus.build == tuple(range(13))
    assert lanes.cpus.gpu == (13, 14, 15)
    seen = {}

    class Recorded:
        def __init__(self, spec, spec_path, *, env, cpus, spare=True):
            seen["run"] = cpus

        def close(self, wait_s=30):
            pass

    def timer(sub, build, ctx, timed, work, jit):
        seen["time"] = ctx.cpus
        return types.SimpleNamespace(close=lambda: None)

    monkeypatch.setattr(early_runs, "Stages", Recorded)
    monkeypatch.setattr(early_runs, "time_subject", timer)
    sub = inspect_folder(make_submission("s", "def custom_kernel(data):\n    return data[2]\n"))
    prepared = early_runs.prepare(sub, BuildResult(Status.PASS, "import", 0.1), lanes, small_case)
    try:
        assert seen == dict(run=lanes.run_cpus, time=lanes.cpus)
    finally:
        prepared.close()


def test_the_build_order_model_says_in_turn_is_never_slower():
    """bench/build_order_sim.py, the model behind build_order's claim: on session 34's figures
    (CUDA builds of 95 s) the order in turn ends the course well before every Python build
    first did, and where the builds keep up (50 s) it is no slower."""
    path = config.REPO_ROOT / "bench" / "build_order_sim.py"
    spec = importlib.util.spec_from_file_location("build_order_sim", path)
    sim = sys.modules.setdefault("build_order_sim", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(sim)   # in sys.modules first: its dataclasses look themselves up
    subs = sim.course(50, 50)
    slow, keeps_up = sim.Model(cuda_build=95.0), sim.Model(cuda_build=50.0)
    assert sim.course_wall(scheduling.build_order(subs), slow) < \
        sim.course_wall(sim.quick_first(subs), slow) - 60
    assert sim.course_wall(scheduling.build_order(subs), keeps_up) <= \
        sim.course_wall(sim.quick_first(subs), keeps_up)
