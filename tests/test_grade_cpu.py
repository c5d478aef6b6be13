"""The whole grader on Python submissions, on the CPU: every verdict, and nothing stops it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from grader.common import config

pytestmark = pytest.mark.slow

NUMPY_ATTENTION = """
    import numpy as np
    import torch

    def attention(q, k, v):
        q, k, v = (t.detach().cpu().float().numpy() for t in (q, k, v))
        s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
        p = np.exp(s - s.max(-1, keepdims=True))
        return torch.from_numpy(p / p.sum(-1, keepdims=True) @ v).half()
"""

SUBMISSIONS = {
    "correct": NUMPY_ATTENTION + """
    def custom_kernel(data):
        q, k, v = data
        return attention(q, k, v).to(q.device)
    """,
    "zeros": """
    import torch
    def custom_kernel(data):
        return torch.zeros_like(data[0])
    """,
    "raises": """
    def custom_kernel(data):
        raise ValueError("my kernel is not finished")
    """,
    "hangs": """
    import time
    def custom_kernel(data):
        time.sleep(600)
    """,
    "segfaults": """
    import torch
    import triton
    import triton.language as tl
    @triton.jit
    def far_load(x, out):   # no mask, 1 TiB past the input: the interpreter reads unmapped memory
        tl.store(out, tl.load(x + (1 << 40)))
    def custom_kernel(data):
        out = torch.empty_like(data[0])
        far_load[(1,)](data[0], out)
        return out
    """,
    "noisy": NUMPY_ATTENTION + """
    def custom_kernel(data):
        for _ in range(40 * 1024):
            print("y" * 1023)
        return attention(*data).to(data[0].device)
    """,
    "half_heads": NUMPY_ATTENTION + """
    import torch
    def custom_kernel(data):
        q, k, v = data
        out = torch.empty_like(q)
        h = q.shape[1] // 2
        out[:, :h] = attention(q[:, :h], k[:, :h], v[:, :h])
        return out
    """,
    "nan_row": NUMPY_ATTENTION + """
    def custom_kernel(data):
        out = attention(*data)
        out[0, 0, -1] = float("nan")
        return out
    """,
    "wrong_shape": """
    def custom_kernel(data):
        return data[0][..., :32]
    """,
    "syntax_error": "def custom_kernel(data)\n    return data\n",
}

# "correct" and "noisy" compute in numpy, which the Python audit's allowlist does not hold: right,
# graded, and sent to review (not ranked until an instructor clears it; grader/trusted/audit/allowlist.py).
EXPECTED = {"correct": "review", "zeros": "mismatch", "raises": "runtime_error", "hangs": "timeout",
            "segfaults": "runtime_error", "noisy": "review", "half_heads": "mismatch",
            "nan_row": "mismatch", "wrong_shape": "mismatch", "syntax_error": "build_error",
            "both_files": "build_error", "no_file": "build_error"}

CASES = ("batch_size: 1; num_heads: 2; seq_len: 1; head_dim: 64; seed: 1\n"
         "batch_size: 2; num_heads: 2; seq_len: 77; head_dim: 64; seed: 2\n"
         "batch_size: 1; num_heads: 4; seq_len: 130; head_dim: 128; seed: 3\n")


def _grader(*args, env_extra=None, timeout=900):
    env = {**os.environ, "GRADER_RUN_S": "25", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "grader", *args], capture_output=True, text=True,
                          cwd=config.REPO_ROOT, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    import textwrap
    root = tmp_path_factory.mktemp("subs")
    for name, src in SUBMISSIONS.items():
        (root / name).mkdir()
        (root / name / "submission.py").write_text(textwrap.dedent(src))
    (root / "both_files").mkdir()
    (root / "both_files" / "submission.py").write_text(textwrap.dedent(SUBMISSIONS["correct"]))
    (root / "both_files" / "submission.cu").write_text("// also here\n")
    (root / "no_file").mkdir()
    (root / "no_file" / "attention.py").write_text("")
    cases = root.parent / "cases.txt"
    cases.write_text(CASES)
    out = root.parent / "results"
    proc = _grader("grade", str(root), "--out", str(out), "--build-dir", str(root.parent / "build"),
                   "--cases", str(cases), "--no-hidden", "--cpu", "--no-solution")
    return proc, out


def test_grading_finishes_and_every_verdict_is_right(graded):
    proc, out = graded
    got = {name: json.loads((out / f"{name}.json").read_text())["status"] for name in EXPECTED}
    expected = dict(EXPECTED)
    if importlib.util.find_spec("triton") is None:   # the machine's fault, never the student's
        expected["segfaults"] = "environment_error"
    # 4: finished with an entry that has no final verdict (docs/instructor-guide.md, Exit status)
    assert proc.returncode == (4 if "environment_error" in expected.values() else 0), proc.stderr[-3000:]
    assert got == expected


def test_findings_and_messages_are_student_facing(graded):
    _, out = graded
    load = lambda n: json.loads((out / f"{n}.json").read_text())
    zeros = load("zeros")
    assert zeros["cases"][1]["finding"]["all_zero"] and "TODO(1.1)" in zeros["hint"]
    nan = load("nan_row")
    assert nan["cases"][0]["finding"]["nan_count"] == 64
    assert nan["cases"][0]["finding"]["first_bad"][0]["index"] == [0, 0, 0, 0]
    half = load("half_heads")
    bad = [c for c in half["cases"] if c["status"] == "mismatch"]
    assert bad and all(b["index"][1] >= 1 for c in bad for b in c["finding"]["first_bad"])
    assert "my kernel is not finished" in load("raises")["message"]
    assert "still running after 25 s" in load("hangs")["message"]
    if importlib.util.find_spec("triton") is not None:
        assert "SIGSEGV" in load("segfaults")["cases"][0]["message"]
    assert "shape" in load("wrong_shape")["message"]
    assert "SyntaxError" in load("syntax_error")["build"]["log_tail"]
    assert "both submission.cu and submission.py" in load("both_files")["message"]
    ops = dict(load("zeros")["cases"][0]["launched"])
    assert "aten::zeros_like" in ops                   # what the call ran, as the profiler saw it
    correct_ops = dict(load("correct")["cases"][0]["launched"])
    assert "aten::_to_copy" in correct_ops and "aten::matmul" not in correct_ops   # numpy did the math
    noisy_log = (out / "logs" / "noisy.run.log").read_text()
    assert "bytes of output dropped" in noisy_log and len(noisy_log) < 64 * 1024


def test_reports_say_what_ran(graded):
    _, out = graded
    run = json.loads((out / "_run.json").read_text())
    assert run["device"]["cuda"] is False and run["finished_at"]
    html = (out / "leaderboard.html").read_text()
    assert "No CUDA device on the grading machine" in html and "nothing was timed" in html
    # no GPU: correctness was not fully checked, so the run writes no grades (grader/report/exports.py)
    assert not (out / "grades.csv").exists()
    assert len(list((out / "feedback").glob("*.md"))) == len(EXPECTED)
    correct = json.loads((out / "correct.json").read_text())
    assert correct["timing"] is None and "not timed: no CUDA device" in correct["notes"]


def test_leaderboard_command_rerenders(graded):
    _, out = graded
    (out / "leaderboard.html").unlink()
    proc = _grader("leaderboard", "--out", str(out))
    assert proc.returncode == 0 and (out / "leaderboard.html").exists()
    assert "correct" in proc.stdout


def test_check_prints_the_failed_case_and_the_todo(tmp_path, make_submission):
    folder = make_submission("mine", SUBMISSIONS["zeros"])
    cases = tmp_path / "cases.txt"
    cases.write_text(CASES)
    proc = _grader("check", str(folder), "--out", str(tmp_path / "r"), "--build-dir",
                   str(tmp_path / "b"), "--cases", str(cases), "--no-hidden", "--cpu")
    assert proc.returncode == 1
    text = proc.stdout
    assert "mine: CPU-MISMATCH" in text and "b1_h2_s1_d64" in text   # its cases ran on the CPU
    assert "the output is all zeros" in text and "Hint:" in text and "TODO(1.1)" in text


def test_malformed_case_file_stops_with_file_and_line(tmp_path, make_submission):
    folder = make_submission("mine", SUBMISSIONS["zeros"])
    cases = tmp_path / "cases.txt"
    cases.write_text(CASES + "batch_size: 1; num_heads: two; seq_len: 3; head_dim: 64; seed: 1\n")
    proc = _grader("check", str(folder), "--out", str(tmp_path / "r"), "--cases", str(cases), "--cpu")
    assert proc.returncode == 2
    assert f"{cases}:4: num_heads must be a whole number; got 'two'" in proc.stderr


# ---------------------------------------------------------------- set-up: the README's commands


def _make_dry_run(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WITH_", "MAKEFLAGS", "MAKELEVEL"))}
    return subprocess.run(["make", "-n", *args], capture_output=True, text=True, cwd=config.REPO_ROOT,
                          env=env, timeout=60, check=True).stdout


def _stamp(text: str) -> str:
    import re
    return re.search(r"STAMP='([^']+)'", text)[1]


def test_a_knob_change_reruns_set_up():
    """The stamp is named after the knobs: another value is another stamp, so set-up runs."""
    import shutil
    if shutil.which("make") is None:
        pytest.skip("needs make")
    default = _make_dry_run("-B", "env")
    assert "WITH_TRITON='auto'" in default and "WITH_BROWSER='auto'" in default
    stamps = {_stamp(default), _stamp(_make_dry_run("-B", "env", "WITH_TRITON=0")),
              _stamp(_make_dry_run("-B", "env", "TORCH_SPEC=torch==2.12.0")),
              _stamp(_make_dry_run("-B", "env", "WITH_BROWSER=1")),
              _stamp(_make_dry_run("-B", "env", "WITH_TILELANG=0"))}
    assert "WITH_TILELANG='auto'" in default
    assert len(stamps) == 5 and all(s.startswith(".venv/.ready-") for s in stamps)


def test_ci_installs_nothing_the_readme_does_not_and_clean_keeps_results():
    import re
    ci = (config.REPO_ROOT / ".ci" / "run").read_text()
    exported = re.findall(r"^\s*export\s+(.+)$", ci, re.M)
    names = {item.split("=")[0] for line in exported for item in line.split()}
    assert names and all(n.startswith("REQUIRE_") for n in names), names
    assert "make test" in ci.splitlines()[-1]
    deps = " ".join(__import__("tomllib").loads(
        (config.REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    assert "numpy" in deps   # the CPU test submissions above import it
    clean = _make_dry_run("-B", "clean")
    assert "results" not in clean and "rm -rf" in clean
    assert "results" in _make_dry_run("-B", "clean-results")


def test_a_python_submissions_stages_share_its_jit_cache_and_no_one_elses(make_submission):
    """A Triton submission's timing process finds the kernels its run process compiled (session 8:
    recompiling cost about 8 s of a 28 s timing stage on an H100); another submission's processes
    never see them. Sandboxed where bubblewrap works (then as the sandbox's user), else plain."""
    from grader.stages.folders import jit_cache, jit_env
    from grader.isolation.procs import child_env, run_limited
    from grader.isolation.sandbox import Sandbox, default_layout
    from grader.course.submission import inspect_folder
    sandbox = Sandbox.probe(**default_layout(), mode="auto")
    if not sandbox.active and os.environ.get("REQUIRE_SANDBOX") == "1":
        pytest.fail("REQUIRE_SANDBOX=1 but bubblewrap cannot run here")
    a, b = (inspect_folder(make_submission(n, "def custom_kernel(data):\n    return data[0]\n"))
            for n in ("a", "b"))
    write = ("import os, pathlib; d = pathlib.Path(os.environ['TRITON_CACHE_DIR']); "
             "(d / 'kernel.cubin').write_text('compiled'); print(sorted(p.name for p in d.iterdir()))")
    read = ("import os, pathlib; print(sorted(p.name for p in "
            "pathlib.Path(os.environ['TRITON_CACHE_DIR']).iterdir()))")

    def run(jit, code: str) -> str:
        cmd = sandbox.wrap([sys.executable, "-c", code], writable=[jit])
        proc = run_limited(cmd, timeout_s=120, env=jit_env(child_env(cuda=False), jit))
        assert proc.ok, proc.output[-2000:]
        return proc.output.strip().splitlines()[-1]
    with jit_cache(a, config.Limits()) as jit_a, jit_cache(b, config.Limits()) as jit_b:
        assert jit_a != jit_b
        assert run(jit_a, write) == "['kernel.cubin']"    # the run stage compiles
        assert run(jit_a, read) == "['kernel.cubin']"     # the timing stage finds it
        assert run(jit_b, read) == "[]"                   # another submission does not
    assert not jit_a.exists() and not jit_b.exists()
    cuda = inspect_folder(make_submission("c", "x", filename="submission.cu"))
    with jit_cache(cuda, config.Limits()) as none:
        assert none is None                               # a CUDA build has nothing to JIT
