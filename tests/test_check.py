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

from grader import config
from grader.cases import load_cases
from grader.__main__ import check_usage, main

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
    assert "mine: MISMATCH" in proc.stdout
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
    from grader.build import check_error_is_own
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
    from grader.__main__ import build_summary, ptxas_report
    log = tmp_path / "b.log"
    log.write_text(
        "ptxas info    : 28 bytes gmem\n"
        "ptxas info    : Compiling entry function '_Z17attention_kernel2ILi64EEvPK6__halfS2_S2_PS0_if' for 'sm_90a'\n"
        "ptxas info    : Function properties for _Z17attention_kernel2ILi64EEvPK6__halfS2_S2_PS0_if\n"
        "    0 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 168 registers, used 1 barriers, 24832 bytes smem, 400 bytes cmem[0]\n")
    [k] = ptxas_report(log.read_text())
    assert (k["registers"], k["spill_stores"], k["spill_loads"], k["smem"]) == (168, 8, 12, 24832)
    text = build_summary({"arch": "90a", "cuda": False}, log, verbose=True)
    assert text.startswith("Compiled for sm_90a, the course GPU's architecture (no GPU here")
    assert "168 registers  8 B spill stores  12 B spill loads  0 B stack  24832 B static shared memory" in text
    assert "make check VERBOSE=1" in build_summary({"arch": "90a"}, log, verbose=False)


@pytest.mark.slow
@pytest.mark.skipif(not has_nvcc(), reason="needs nvcc")
def test_a_file_the_real_build_accepts_is_never_called_broken(tmp_path):
    """Host code that uses a part of torch the compile check's lighter header leaves out
    (torch::nn::functional) fails the fast compile, is compiled again with the real
    torch/extension.h, and passes; the object the audit reads is there."""
    import dataclasses
    from grader.build import STUDENT_OBJECT, build_submission
    from grader.device import DeviceInfo, find_nvcc
    from grader.submission import inspect_folder
    from grader.status import Status
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
    run = json.loads((tmp_path / "out" / "_run.json").read_text())
    assert {c["id"] for c in run["cases"]} >= {c.id for c in small}
    graded = subprocess.run([sys.executable, "-m", "grader", "grade", str(example.parent),
                             "--only", "triton_flash", "--out", str(tmp_path / "graded"),
                             "--no-solution", "--no-baselines", *common],
                            capture_output=True, text=True, cwd=config.REPO_ROOT, env=env, timeout=900)
    run = json.loads((tmp_path / "graded" / "_run.json").read_text())
    assert not {c["id"] for c in run["cases"]} & {c.id for c in small}, graded.stderr[-2000:]
