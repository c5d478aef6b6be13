"""`python -m grader check PATH` (what `make check` runs): a mistake in the command is a usage
error (exit 2, the path and the fix), never a verdict; and the student's output holds no
instructor-only text."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from grader.common import config
from grader.course.verdicts import BuildResult
from grader.problem import load_cases
from grader.common.status import Status
from grader.cli.main import main
from grader.cli.check import check_usage

from .conftest import has_nvcc


def run_check(path, capsys) -> tuple[int, str, str]:
    code = main(["check", str(path)])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_missing_path_is_a_usage_error(tmp_path, capsys):
    code, out, err = run_check(tmp_path / "studnet", capsys)
    assert code == 2 and out == ""
    assert f"error: {tmp_path / 'studnet'}: no such folder" in err
    assert "make check SUBMISSION=student" in err and "BUILD_ERROR" not in out + err


@pytest.mark.parametrize("name", ["submission.py", "submission.cu"])
def test_a_submission_file_instead_of_its_folder_is_a_usage_error(tmp_path, capsys, name):
    folder = tmp_path / "triton"
    folder.mkdir()
    (folder / name).write_text("# mine\n")
    code, out, err = run_check(folder / name, capsys)
    assert code == 2 and out == ""
    assert f"{folder / name} is a file; check takes the folder that holds it" in err
    assert f"make check SUBMISSION={folder}" in err and f"python -m grader check {folder}" in err


def test_another_file_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "kernel.cu").write_text("// mine\n")
    code, _, err = run_check(tmp_path / "kernel.cu", capsys)
    assert code == 2 and "is a file; check takes the folder that holds your submission.cu" in err


def test_a_folder_of_students_is_a_usage_error(tmp_path, capsys):
    for sid, name in [("alice", "submission.cu"), ("bob", "submission.py"), ("carol", "submission.cu")]:
        (tmp_path / sid).mkdir()
        (tmp_path / sid / name).write_text("x\n")
    (tmp_path / "notes").mkdir()
    code, out, err = run_check(tmp_path, capsys)
    assert code == 2 and out == ""
    assert f"{tmp_path} holds 3 submissions (alice, bob, carol); check takes one" in err
    assert f"make check SUBMISSION={tmp_path / 'alice'}" in err
    assert f"make grade SUBMISSIONS={tmp_path}" in err


def test_a_folder_around_one_submission_names_it(tmp_path):
    (tmp_path / "student").mkdir()
    (tmp_path / "student" / "submission.cu").write_text("x\n")
    problem = check_usage(tmp_path)
    assert "holds no submission.cu or submission.py itself; its folder student does" in problem
    assert f"make check SUBMISSION={tmp_path / 'student'}" in problem


def test_a_submission_folder_is_fine_and_a_misnamed_file_stays_a_verdict(tmp_path):
    assert check_usage(config.REPO_ROOT / "student") == ""          # it holds triton/ as well
    assert check_usage(config.REPO_ROOT / "student" / "triton") == ""
    (tmp_path / "submision.cu").write_text("x\n")   # what grading would say: a build_error
    assert check_usage(tmp_path) == ""


def test_check_prints_no_instructor_only_warning(tmp_path):
    """Without a sandbox (a student's laptop has no bubblewrap) the check says nothing of the
    solution, the hidden cases or sandboxing; a grading run still warns."""
    sub = tmp_path / "subs" / "mine"
    sub.mkdir(parents=True)
    (sub / "submission.py").write_text("def custom_kernel(data):\n    return data[0]\n")
    cases = tmp_path / "cases.txt"
    cases.write_text("batch_size: 1; num_heads: 1; seq_len: 5; head_dim: 64; seed: 3\n")
    env = dict(os.environ, GRADER_SANDBOX="off", PYTHONWARNINGS="default")
    common = ["--cases", str(cases), "--no-hidden", "--cpu", "--build-dir", str(tmp_path / "build")]
    proc = subprocess.run([sys.executable, "-m", "grader", "check", str(sub), "--out",
                           str(tmp_path / "out"), *common], capture_output=True, text=True,
                          cwd=config.REPO_ROOT, env=env, timeout=600)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text[-3000:]   # returning Q is a mismatch
    # its case and the check's small CPU cases (test_cases/cpu.txt) ran, all on the CPU
    assert proc.stdout.startswith("mine: CPU-MISMATCH (on the CPU: 5 of 5 cases ran)\n")
    for instructor_only in ("NOT SANDBOXED", "GRADER_SANDBOX", "the solution", "hidden cases",
                            "Failed to initialize NumPy"):
        assert instructor_only not in text, instructor_only
    assert "NOT SANDBOXED" in (tmp_path / "out" / "mine.json").read_text()   # the record keeps it
    graded = subprocess.run([sys.executable, "-m", "grader", "grade", str(sub.parent), "--out",
                             str(tmp_path / "graded"), "--no-solution", "--no-baselines", *common],
                            capture_output=True, text=True, cwd=config.REPO_ROOT, env=env, timeout=600)
    assert "WARNING: NOT SANDBOXED" in graded.stderr


# ---------------------------------------------------------------- the faster compile check


def test_a_compile_failure_is_trusted_only_when_it_cannot_involve_torch():
    from grader.build.child import check_error_is_own
    own = '/b/cuda.cu(45): error: identifier "m_nwe" is undefined\n'
    assert check_error_is_own(own, "float m_new;")
    assert check_error_is_own("/b/cuda.cu:12:3: error: expected ';' before '}' token\n", "")
    # a name the full torch/extension.h may declare, an error inside a header, or a file that
    # pulls torch's namespaces in: compiled again with the real header
    assert not check_error_is_own('/b/cuda.cu(9): error: namespace "torch" has no member "nn"\n', "")
    assert not check_error_is_own('/b/cuda.cu(9): error: identifier "py" is undefined\n', "")
    assert not check_error_is_own("/t/include/ATen/core/Tensor.h(3): error: oops\n", "")
    assert not check_error_is_own(own, "using namespace torch;\nfloat m_new;")
    assert not check_error_is_own("nvcc fatal : something\n", "")   # no error line of the file


def test_verbose_check_summarises_ptxas_per_kernel(tmp_path):
    from grader.cli.check import build_summary, ptxas_report
    log = tmp_path / "b.log"
    log.write_text(
        "ptxas info    : 28 bytes gmem\n"
        "ptxas info    : Compiling entry function '_Z17attention_kernel2ILi64EEvPK6__halfS2_S2_PS0_if' for 'sm_90a'\n"
        "ptxas info    : Function properties for _Z17attention_kernel2ILi64EEvPK6__halfS2_S2_PS0_if\n"
        "    0 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 168 registers, used 1 barriers, 24832 bytes smem, 400 bytes cmem[0]\n")
    [k] = ptxas_report(log.read_text())
    assert (k["registers"], k["spill_stores"], k["spill_loads"], k["smem"]) == (168, 8, 12, 24832)
    passed = BuildResult(Status.PASS, "compile_only", 31.0)
    text = build_summary(passed, {"arch": "90a", "cuda": False}, log, verbose=True)
    assert text.startswith("Compiled for sm_90a, the course GPU's architecture (no GPU here")
    assert "168 registers  8 B spill stores  12 B spill loads  0 B stack  24832 B static shared memory" in text
    assert "make check VERBOSE=1" in build_summary(passed, {"arch": "90a"}, log, verbose=False)


def test_compiled_for_is_said_only_after_a_compile_that_passed(tmp_path):
    """Issue 34: the check said "Compiled for sm_90a" after a compile that failed or never
    finished. Nothing was compiled then: no summary at all."""
    from grader.cli.check import build_summary
    log = tmp_path / "b.log"
    log.write_text("compile check for sm_90a (no GPU here: compiled, not run)\n")
    for status in (Status.TIMEOUT, Status.BUILD_ERROR, Status.ENVIRONMENT_ERROR, Status.FLAGGED):
        failed = BuildResult(status, "compile_only", 300.0, message="compile did not finish")
        for verbose in (False, True):
            assert build_summary(failed, {"arch": "90a"}, log, verbose=verbose) == "", status
    assert build_summary(None, {"arch": "90a"}, log, verbose=False) == ""
    assert build_summary(BuildResult(Status.PASS, "compile_only", 31.0), {"arch": "90a"}, log,
                         verbose=False).startswith("Compiled for sm_90a")


@pytest.mark.slow
@pytest.mark.skipif(not has_nvcc(), reason="needs nvcc")
def test_a_file_the_real_build_accepts_is_never_called_broken(tmp_path):
    """Host code that uses a part of torch the compile check's lighter header leaves out
    (torch::nn::functional) fails the fast compile, is compiled again with the real
    torch/extension.h, and passes; the object the audit reads is there."""
    import dataclasses
    from grader.build.stage import build_submission
    from grader.trusted.audit.reach import STUDENT_OBJECT
    from grader.isolation.device import DeviceInfo, find_nvcc
    from grader.course.submission import inspect_folder
    from grader.common.status import Status
    skeleton = (config.REPO_ROOT / "student" / "submission.cu").read_text()
    source = skeleton.replace("    auto O = torch::zeros_like(Q);",
                              "    auto O = torch::zeros_like(Q);\n"
                              "    (void)torch::nn::functional::softmax(O, 1);")
    assert source != skeleton
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "submission.cu").write_text(source)
    cpu = DeviceInfo(cuda=False, name="cpu", capability=None, arch=config.DEFAULT_CUDA_ARCH,
                     l2_bytes=0, memory_bytes=0, sm_count=0, driver="none", torch_version="x",
                     cuda_version=None, nvcc=find_nvcc(), python="3")
    log = tmp_path / "build.log"
    r = build_submission(inspect_folder(tmp_path / "s"), build_dir=tmp_path / "b", device=cpu,
                         limits=dataclasses.replace(config.Limits(), build_s=600), log_path=log)
    assert r.status is Status.PASS, r.log_tail
    assert "compiling again with the full torch/extension.h" in log.read_text()
    assert (tmp_path / "b" / STUDENT_OBJECT).is_file()


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="this machine has no Triton wheel (the kit's set-up says so too)")
def test_without_a_gpu_a_triton_submission_runs_on_the_small_public_cases(tmp_path):
    """The public cases are too large for Triton's interpreter: check runs test_cases/cpu.txt
    too, and an honest kernel passes every one of them. They are check's alone: grading on a
    CPU keeps the course's cases."""
    common = ["--no-hidden", "--cpu", "--build-dir", str(tmp_path / "build")]
    env = dict(os.environ, GRADER_SANDBOX="off")
    example = config.REPO_ROOT / "examples" / "triton_flash"
    proc = subprocess.run([sys.executable, "-m", "grader", "check", str(example), "--out",
                           str(tmp_path / "out"), *common], capture_output=True, text=True,
                          cwd=config.REPO_ROOT, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    small = load_cases(config.CPU_CHECK_CASES)
    assert len(small) == 4 and all(c.flops <= config.CPU_MAX_FLOPS for c in small)
    for case in small:
        assert re.search(rf"PASS\s+{case.id}\b", proc.stdout), proc.stdout[-3000:]
    assert "ran on the CPU: 4 of 7 cases (no CUDA device)" in proc.stdout
    # issue 34: only CPU cases ran, and the first word says so; the GPU-sized cases did not run
    assert proc.stdout.startswith("triton_flash: CPU-PASS (on the CPU: 4 of 7 cases ran; the 3 "
                                  "others need a GPU: not run)\n"), proc.stdout[:500]
    for case in load_cases(config.PUBLIC_CASES):
        assert re.search(rf"\n  not run\s+{case.id}\n", proc.stdout), proc.stdout[-3000:]
    assert json.loads((tmp_path / "out" / "triton_flash.json").read_text())["status"] == "pass"
    run = json.loads((tmp_path / "out" / "_run.json").read_text())
    assert {c["id"] for c in run["cases"]} >= {c.id for c in small}
    graded = subprocess.run([sys.executable, "-m", "grader", "grade", str(example.parent),
                             "--only", "triton_flash", "--out", str(tmp_path / "graded"),
                             "--no-solution", "--no-baselines", *common],
                            capture_output=True, text=True, cwd=config.REPO_ROOT, env=env, timeout=900)
    run = json.loads((tmp_path / "graded" / "_run.json").read_text())
    assert not {c["id"] for c in run["cases"]} & {c.id for c in small}, graded.stderr[-2000:]


# ---------------------------------------------------------------- a slow machine (issue 34)


def test_a_checks_builds_report_to_its_display_and_a_courses_builds_do_not(tmp_path):
    """The build stage's line of the check's display carries the build's progress: in place
    every second in a terminal, a line every config.BUILD_PROGRESS_S seconds in a log. A
    course's `grade` has every submission on its display: its builds report nothing."""
    import dataclasses
    import io
    from grader.stages import context
    from grader.isolation.device import DeviceInfo
    from grader.report.progress import Progress
    from grader.course.submission import inspect_folder
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "submission.cu").write_text("// mine\n")
    sub = inspect_folder(tmp_path / "mine")
    cpu = DeviceInfo(cuda=False, name="cpu", capability=None, arch="90a", l2_bytes=0,
                     memory_bytes=0, sm_count=0, driver="none", torch_version="x",
                     cuda_version=None, nvcc=None, python="3")
    log = io.StringIO()
    ctx = context.GradeContext(cases=(), device=cpu, limits=config.Limits(), out_dir=tmp_path,
                                build_dir=tmp_path / "b", progress=Progress(1, live=False, stream=log))
    assert context.student_check(ctx, sub) is None
    check = context.student_check(dataclasses.replace(ctx, student_check=True), sub)
    assert check.every_s == config.BUILD_PROGRESS_S
    check.report("compiling submission.cu: ptxas, 42 s (limit 300 s: GRADER_BUILD_S)")
    assert re.search(r"\] mine: build: compiling submission\.cu: ptxas, 42 s \(limit 300 s: "
                     r"GRADER_BUILD_S\)\n$", log.getvalue()), log.getvalue()
    terminal = Progress(1, live=True, stream=io.StringIO())
    try:
        if terminal.in_place:   # rich is installed: the line is updated in place
            live = dataclasses.replace(ctx, student_check=True, progress=terminal)
            assert context.student_check(live, sub).every_s == 1.0
    finally:
        terminal.close()


def test_a_check_whose_import_runs_past_its_limit_names_the_limit_to_raise(tmp_path):
    """What `check` says when its build (here a Python file's import) runs past its limit on the
    student's own machine: a timeout of this machine, with the variable that raises the limit,
    never the grading machine's environment_error or "the instructor fixes the machine"."""
    sub = tmp_path / "subs" / "mine"
    sub.mkdir(parents=True)
    (sub / "submission.py").write_text("import time\ntime.sleep(600)\n\n"
                                       "def custom_kernel(data):\n    return data[0]\n")
    cases = tmp_path / "cases.txt"
    cases.write_text("batch_size: 1; num_heads: 1; seq_len: 5; head_dim: 64; seed: 3\n")
    env = dict(os.environ, GRADER_SANDBOX="off", GRADER_IMPORT_S="4")
    proc = subprocess.run([sys.executable, "-m", "grader", "check", str(sub), "--out",
                           str(tmp_path / "out"), "--cases", str(cases), "--no-hidden", "--cpu",
                           "--build-dir", str(tmp_path / "build")],
                          capture_output=True, text=True, cwd=config.REPO_ROOT, env=env, timeout=600)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text[-3000:]
    assert "mine: TIMEOUT" in proc.stdout
    assert "the import of submission.py did not finish in 4 s: this machine may be slow or busy" \
        in proc.stdout
    assert "make check GRADER_IMPORT_S=900" in proc.stdout
    for wrong in ("ENVIRONMENT_ERROR", "environment_error", "instructor", "tried twice",
                  "Compiled for"):
        assert wrong not in text, wrong
