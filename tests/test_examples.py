"""The bundled examples get their verdicts: compile checks and CPU runs here, everything on a GPU."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from grader.common import config

from .conftest import EXAMPLES, cuda_available, expected_verdicts, has_nvcc


def test_every_example_has_an_expected_verdict():
    folders = {p.name for p in EXAMPLES.iterdir() if p.is_dir()}
    assert folders == set(expected_verdicts())
    verdicts = {v["gpu"] for v in expected_verdicts().values()}
    assert {"pass", "mismatch", "build_error", "runtime_error"} <= verdicts


def test_the_skeleton_example_is_the_shipped_skeleton():
    assert (EXAMPLES / "skeleton" / "submission.cu").resolve() == \
        (config.REPO_ROOT / "student" / "submission.cu").resolve()


def grade_examples(tmp_path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "grader", "grade", str(EXAMPLES), "--out", str(out),
                           "--build-dir", str(tmp_path / "build"), *extra],
                          capture_output=True, text=True, cwd=config.REPO_ROOT, timeout=1800)
    results = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json") if not p.name.startswith("_")}
    return proc, results


@pytest.mark.slow
@pytest.mark.skipif(not has_nvcc(), reason="compile checks need nvcc")
def test_examples_without_a_gpu(tmp_path):
    proc, results = grade_examples(tmp_path, "--cpu", "--no-solution")
    expected = {name: v["cpu"] for name, v in expected_verdicts().items()}
    if importlib.util.find_spec("triton") is None:   # the machine's fault, never the student's
        expected["triton_flash"] = "environment_error"
        assert "triton" in results["triton_flash"]["message"]
    if importlib.util.find_spec("tilelang") is None:
        expected["tilelang_flash"] = "environment_error"
        assert "tilelang" in results["tilelang_flash"]["message"]
    else:   # compiled for the course GPU by TileLang and nvcc, never run here
        assert all("TileLang lowered attention_kernel" in c["message"] or "too large" in c["message"]
                   for c in results["tilelang_flash"]["cases"])
    assert {name: r["status"] for name, r in results.items()} == expected
    # 4: an entry with no final verdict (a module the set-up did not install here)
    assert proc.returncode == (4 if "environment_error" in expected.values() else 0), proc.stderr[-3000:]
    assert results["naive_cuda"]["build"]["mode"] == "compile_only"
    assert "not run: no CUDA device" in results["naive_cuda"]["message"]
    assert "m_nwe" in results["build_error"]["message"]


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU")
def test_examples_on_the_gpu(tmp_path):
    """The full grade: verdicts, baselines, the solution, timing, memory and time per submission."""
    proc, results = grade_examples(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = {name: v["gpu"] for name, v in expected_verdicts().items()}
    assert {name: r["status"] for name, r in results.items()} == expected

    baselines = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "results" / "baselines").glob("*.json")}
    assert baselines["solution"]["status"] == "pass", baselines["solution"]["message"]
    assert all(c["status"] == "pass" for c in baselines["solution"]["cases"])
    for name in ("torch_reference", "sdpa_flash"):
        assert baselines[name]["status"] == "pass" and baselines[name]["timing"]["n"] >= 2

    for r in results.values():
        if r["status"] == "pass":
            t = r["timing"]
            assert t["n"] >= 2 and t["min_ms"] <= t["median_ms"] and r["timed_case"] == "b4_h64_s8192_d128"
    # one correct, reasonably fast submission is graded end to end (build included) within 90 s
    assert results["triton_flash"]["wall_s"] < 90, results["triton_flash"]["wall_s"]
    # the large case was checked, and its check fit in memory
    large = next(c for c in baselines["solution"]["cases"] if c["case"] == "b4_h64_s8192_d128")
    assert large["status"] == "pass" and large["peak_memory_bytes"] < 40 * 2**30
    crash = results["crash_oob"]
    assert "CUDA error" in crash["message"] and "compute-sanitizer" in crash["hint"]
    assert all("context was lost" in c["message"] for c in crash["cases"][2:])
    assert results["skeleton"]["cases"][0]["finding"]["all_zero"]
    assert "TODO(1.1)" in results["skeleton"]["hint"]
    # the profiler sees the student's own kernel, and PyTorch's ones for the SDPA-free examples only
    naive = dict(results["naive_cuda"]["cases"][-1]["launched"])
    assert any("attention_kernel1" in name for name in naive), naive
    assert not any("flash" in name.lower() or "gemm" in name.lower() for name in naive), naive
    # the solution compiles several kernel versions: 138.6 s on the H100 machine (2026-11-22, 8
    # builds at once on 13 of 16 CPUs); making it fast is issue 13's, this bounds a regression
    assert baselines["solution"]["wall_s"] < 240, baselines["solution"]["wall_s"]
