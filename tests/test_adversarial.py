"""Issue 5: adversarial submissions, one per cheat or fault, each with the verdict it must get.

tests/adversarial/expected.json lists them with their threat (1-8) and verdicts. Without a GPU
(CI) the Python ones run on the CPU and the CUDA ones whose fault shows at compile time are
compiled; with one (make test-gpu) every one runs, beside an honest submission to compare with.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

from grader.common import config
from grader.isolation.sandbox import Sandbox, default_layout

from .adversarial.assemble import EXPECTED, INCLUDE, assemble, fifos, names
from .adversarial.verdicts import TWIN_RULES, gpu_finding, median
from .conftest import EXAMPLES, cuda_available, has_nvcc

# Short limits: the hanging and sleeping submissions cost their limit each. Builds get 240 s: a
# compile check of a file that includes torch takes a minute or more on a loaded 2-core machine.
LIMITS = dict(GRADER_RUN_S="30", GRADER_BUILD_S="240", GRADER_IMPORT_S="60", GRADER_TIME_S="150",
              GRADER_TIME_BUDGET_S="3")


def test_every_threat_has_a_python_and_a_cuda_submission():
    threats: dict[int, set[str]] = {}
    for name in names():
        if "threat" in EXPECTED[name]:
            threats.setdefault(EXPECTED[name]["threat"], set()).add(name.rsplit("_", 1)[-1])
    assert set(threats) == set(range(1, 9))
    both = {t for t, forms in threats.items() if forms == {"py", "cu"}}
    assert both == {1, 2, 3, 5, 6, 7, 8}, threats   # tampering with the harness (4) is Python's


def test_every_trust_boundary_class_has_an_attack_and_the_twins_exist():
    classes = {EXPECTED[n]["trust"] for n in names() if "trust" in EXPECTED[n]}
    assert classes >= {"profiler", "lazy output", "grader state", "helper process", "compiler",
                       "side stream", "precision", "honest twin", "time between calls"}
    for name in names():
        for key in TWIN_RULES:
            twin = EXPECTED[name].get(key)
            assert twin is None or twin in EXPECTED, (name, key, twin)


def test_assembled_submissions_are_standalone(tmp_path):
    folders = assemble(tmp_path)
    assert sorted(f.name for f in folders) == sorted(names())
    for folder in folders:
        files = {p.name for p in folder.iterdir()}
        pipes = set(fifos(folder.name))   # named_pipe_py: made by assemble, never in git
        assert all(stat.S_ISFIFO((folder / p).lstat().st_mode) for p in pipes), folder
        files -= pipes
        if "submission.cu" in files:
            assert INCLUDE not in (folder / "submission.cu").read_text()
            assert files == {"submission.cu"}
        else:   # a data file beside them is the attack's (audit_datafile_py's notes.dat)
            assert files - {"notes.dat", "torch_kernels.cuh"} == {"submission.py", "honest_flash.py"}, folder


def sandbox_or_skip() -> None:
    if not Sandbox.probe(**default_layout(), mode="auto").active:
        if os.environ.get("REQUIRE_SANDBOX") == "1":
            pytest.fail("REQUIRE_SANDBOX=1 but bubblewrap cannot run here")
        pytest.skip("bubblewrap is not available: the adversarial set needs the sandbox")


def grade(folder, tmp_path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "results"
    env = {**os.environ, **LIMITS, "GRADER_SANDBOX": "require"}
    proc = subprocess.run([sys.executable, "-m", "grader", "grade", str(folder), "--out", str(out),
                           "--build-dir", str(tmp_path / "build"), "--no-solution", *extra],
                          capture_output=True, text=True, cwd=config.REPO_ROOT, timeout=3000, env=env)
    results = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json") if not p.name.startswith("_")}
    return proc, results


def check_verdicts(results: dict, expected: dict[str, list[str]]) -> None:
    wrong = {name: (results.get(name, {}).get("status"), want, results.get(name, {}).get("message", "")[:300])
             for name, want in expected.items() if results.get(name, {}).get("status") not in want}
    assert not wrong, json.dumps(wrong, indent=1)


def check_common(results: dict, out) -> None:
    assert "LEAK" not in json.dumps(results["snoop_py"])
    log = (out / "logs" / "spam_py.run.log").read_text()
    assert len(log) < 64_000 and "bytes of output dropped" in log
    for name in ("hang_py", "sleep_py"):
        assert "still running after" in results[name]["message"]


@pytest.mark.slow
@pytest.mark.skipif(not has_nvcc(), reason="compile checks need nvcc")
def test_adversarial_without_a_gpu(tmp_path):
    sandbox_or_skip()
    runnable = [n for n in names() if n.endswith("_py") or EXPECTED[n]["cpu"] != ["not_run"]]
    folder = tmp_path / "subs"
    assemble(folder, runnable)
    proc, results = grade(folder, tmp_path, "--cpu", "--no-baselines", "--jobs", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_verdicts(results, {n: EXPECTED[n]["cpu"] for n in runnable})
    check_common(results, tmp_path / "results")
    flagged = results["lib_sdpa_py"]["message"]
    assert "aten::" in flagged and "scaled_dot_product" in flagged   # what ran, named
    # what import_gpu_hog_py prints at its import check is what the GPU runs look for
    build_log = (tmp_path / "results" / "logs" / "import_gpu_hog_py.build.log").read_text()
    assert EXPECTED["import_gpu_hog_py"]["gpu_logs"]["build"] in build_log


def test_a_gpu_finding_names_a_wrong_verdict_and_a_log_without_its_text(tmp_path):
    want = EXPECTED["import_gpu_hog_py"]
    result = dict(id="import_gpu_hog_py", status=want["gpu"][0])
    for stage, text in want["gpu_logs"].items():
        (tmp_path / f"import_gpu_hog_py.{stage}.log").write_text(f"loading\n{text}\n")
    assert gpu_finding(result, want, tmp_path) is None
    assert gpu_finding(dict(result, status="timeout"), want, tmp_path) == "got timeout"
    (tmp_path / "import_gpu_hog_py.build.log").write_text("import_gpu_hog: 8 GPUs visible\n")
    assert "build log" in gpu_finding(result, want, tmp_path)   # the import check had the GPUs


def test_a_gpu_finding_names_a_row_faster_than_its_twin_or_not_timed_as_it(tmp_path):
    want, medians = EXPECTED["rest_gpu_py"], dict(honest_py=20.0)
    assert want["not_faster_than"] == "honest_py"

    def row(ms):
        return dict(id="rest_gpu_py", status=want["gpu"][0], timing=dict(median_ms=ms))
    for ms in (19.61, 20.0, 40.0):   # under 2% faster, as fast, slower: its trick bought nothing
        assert gpu_finding(row(ms), want, tmp_path, medians) is None
    assert gpu_finding(row(19.5), want, tmp_path, medians) == (
        "not_faster_than honest_py: rest_gpu_py 19.500 ms is 0.975 x honest_py's 20.000 ms, "
        "not at least 0.98 x it: more than 2% faster")
    assert "no median" in gpu_finding(row(20.0), want, tmp_path, {})   # no twin graded
    assert "no median" in gpu_finding(dict(row(None), timing=None), want, tmp_path, medians)
    same = dict(gpu=want["gpu"], same_time_as="honest_py")   # within 5%, either way
    assert gpu_finding(row(19.1), same, tmp_path, medians) is None
    assert "not within 5% of it" in gpu_finding(row(21.1), same, tmp_path, medians)


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU")
def test_adversarial_on_the_gpu(tmp_path):
    sandbox_or_skip()
    folder = tmp_path / "subs"
    assemble(folder)
    shutil.copytree(EXAMPLES / "triton_flash", folder / "honest_triton")   # what honest costs
    proc, results = grade(folder, tmp_path, "--no-baselines")
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_verdicts(results, {n: EXPECTED[n]["gpu"] for n in names()} | {"honest_triton": ["pass"]})
    # the verdicts, the logs and the medians against the honest twins (same_time_as,
    # not_faster_than), as tests/adversarial/verdicts.py checks make adversarial's
    medians = {n: median(r) for n, r in results.items()}
    findings = {n: gpu_finding(results[n], EXPECTED[n], tmp_path / "results" / "logs", medians)
                for n in names()}
    assert not {n: f for n, f in findings.items() if f}, findings
    check_common(results, tmp_path / "results")
    # the verdicts above hold with runs begun early (lookahead.Lookahead): some were
    begun_early = [n for n, r in results.items() if "run.load" in dict(r.get("stage_s") or ())]
    assert begun_early, "no run was begun before its turn (lookahead.Lookahead)"
    said = proc.stdout + proc.stderr   # and none of them failed on its turn (harnesses.NotStarted)
    assert "did not start" not in said, said[said.find("did not start") - 300:][:4000]
    assert "returned a wrong output" in results["cache_by_ptr_py"]["message"]
    assert "flash" in results["lib_timed_only_py"]["message"].lower()
    assert "unaccounted for" in results["lib_timed_only_py"]["message"]
    assert "reaches past its kernel" in results["forge_kernels_py"]["message"]
    assert "PyImport_AddModule" in results["forge_kernels_cu"]["message"]
    assert any("precision budget" in (c.get("message") or "") for c in results["lowprec_py"]["cases"])
