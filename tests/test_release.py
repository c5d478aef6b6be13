"""The student release: exactly the allowed files, nothing instructor-only, and it works."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tarfile

import pytest

from grader import config

from .conftest import has_nvcc

ROOT = config.REPO_ROOT
spec = importlib.util.spec_from_file_location("release", ROOT / "scripts" / "release.py")
release = importlib.util.module_from_spec(spec)
spec.loader.exec_module(release)

EXPECTED = {
    "README.md", "Makefile", "pyproject.toml", "scripts/bootstrap.sh", "test_cases/test.txt",
    "templates/leaderboard.html.j2", "student/README.md", "student/Makefile",
    "student/submission.cu", "student/triton/submission.py",
} | {str(p.relative_to(ROOT)) for p in (ROOT / "grader").rglob("*.py") if "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    archive = release.build(out)
    dest = tmp_path_factory.mktemp("unpacked")
    with tarfile.open(archive) as tar:
        # the 'data' filter (safe extraction) exists from Python 3.11.4 / 3.12 on
        tar.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return dest / release.NAME


def test_archive_holds_exactly_the_student_files(unpacked):
    files = {str(p.relative_to(unpacked)) for p in unpacked.rglob("*") if p.is_file()}
    assert files == EXPECTED


def test_nothing_instructor_only_leaks(unpacked):
    solution = (ROOT / "solution" / "submission.cu").read_text()
    markers = ["Reference solution (instructors only", "attention_kernel3", "ldmatrix_x4_trans",
               "mma.sync.aligned", "fast_exp2"]
    assert all(m in solution for m in markers)   # the markers really are the solution's
    hidden = [l.strip() for l in (ROOT / "test_cases" / "hidden.txt").read_text().splitlines()
              if l.strip() and not l.startswith("#")]
    example = (ROOT / "examples" / "tiled_cuda" / "submission.cu").read_text()
    example_line = next(l.strip() for l in example.splitlines() if "__shfl_sync(0xffffffff, p, j)" in l)
    for path in unpacked.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert not any(m in text for m in markers), path
            assert not any(h in text for h in hidden), path
            assert example_line not in text, path   # a correct kernel from examples/


def test_leak_check_refuses_planted_content(tmp_path):
    (tmp_path / "student").mkdir()
    solution_line = next(l for l in (ROOT / "solution" / "submission.cu").read_text().splitlines()
                         if "cp.async.cg.shared.global" in l)
    (tmp_path / "student" / "submission.cu").write_text("// mine\n" + solution_line + "\n")
    (tmp_path / "notes.txt").write_text("hello")
    problems = release.find_leaks(tmp_path)
    assert any("notes.txt: not on the allow-list" in p for p in problems)
    assert any("student/submission.cu: contains instructor-only content" in p for p in problems)


@pytest.mark.slow
@pytest.mark.skipif(not has_nvcc(), reason="the compile check needs nvcc")
def test_make_check_from_the_unpacked_release(unpacked):
    env = dict(os.environ, PYTHON_BASE=sys.executable, TORCH_SPEC="torch")
    env["GRADER_CUDA_INCLUDE"] = env.get("GRADER_CUDA_INCLUDE", str(ROOT / ".venv" / "cuda-include"))
    env.pop("MAKEFLAGS", None)
    proc = subprocess.run(["make", "check"], cwd=unpacked, env=env, capture_output=True, text=True,
                          timeout=900)
    out = proc.stdout
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "student: NOT_RUN" in out and "compiled; not run: no CUDA device" in out
    assert "the first is TODO(1.1)" in out


def test_handout_performance_table_is_generated_from_the_bench_results():
    spec = importlib.util.spec_from_file_location("perf_table", ROOT / "scripts" / "perf_table.py")
    perf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(perf)
    results = perf.json.loads(perf.RESULTS.read_text())
    handout = perf.HANDOUT.read_text()
    assert perf.update(handout, perf.render(results)) == handout, \
        "student/README.md's table is stale or hand-edited: run scripts/perf_table.py"
    assert results["device"] in handout and "SDPA FLASH" in handout
