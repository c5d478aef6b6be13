import json

from grader.build import BuildResult
from grader.compare import BadElement, Finding
from grader.correctness import CaseResult
from grader.results import SubmissionResult, read_results, write_result
from grader.status import Status, worst
from grader.timing import TimingStats, summarize


def sample(id="alice", status=Status.MISMATCH, role="student", timing=None):
    finding = Finding(ok=False, numel=10, mismatches=1, nan_count=0, inf_count=0,
                      max_abs_error=0.5, max_rel_error=0.5, rtol=1e-2, atol=1e-2,
                      first_bad=(BadElement((0, 1, 2, 3), 1.0, 0.5),))
    return SubmissionResult(
        id=id, label=id, kind="cuda", role=role, status=status, message="m", hint="h",
        build=BuildResult(Status.PASS, "extension", 40.0, artifact="/x.so"),
        cases=(CaseResult("b1_h1_s1_d64", Status.PASS, hidden=True),
               CaseResult("b1_h1_s2_d64", Status.MISMATCH, "bad", finding=finding, run_s=0.1)),
        timing=timing, notes=("n",), wall_s=1.5, graded_at="2026-11-21T00:00:00+00:00")


def test_round_trip_and_files_on_disk(tmp_path):
    t = summarize([1.0, 1.1, 0.9], flops=10**12, warmup_calls=2, budget_s=5, stopped_by="rse", wall_s=3)
    results = [sample(), sample("bob", Status.PASS, timing=t), sample("torch_reference", role="baseline")]
    for r in results:
        write_result(tmp_path, r)
    assert (tmp_path / "alice.json").exists() and (tmp_path / "baselines" / "torch_reference.json").exists()
    assert not list(tmp_path.glob(".*tmp"))
    back = {r.id: r for r in read_results(tmp_path)}
    assert back["alice"] == results[0] and back["bob"] == results[1]
    assert back["bob"].ranked and not back["alice"].ranked
    assert json.loads((tmp_path / "alice.json").read_text())["status"] == "mismatch"


def test_unreadable_result_files_are_skipped(tmp_path):
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "_run.json").write_text("{}")
    write_result(tmp_path, sample())
    assert [r.id for r in read_results(tmp_path)] == ["alice"]


def test_timing_summary():
    t = summarize([2.0, 1.0, 3.0, 2.0], flops=4 * 10**12, warmup_calls=2, budget_s=5,
                  stopped_by="budget", wall_s=1)
    assert t.n == 4 and t.median_ms == 2.0 and t.min_ms == 1.0 and t.mean_ms == 2.0
    assert abs(t.tflops - 2000.0) < 1e-9      # 4e12 FLOP in 2 ms
    assert abs(t.rse - (t.std_ms / 2 / 2.0)) < 1e-12
    assert TimingStats.from_dict(t.to_dict()) == t


def test_worst_status_orders_by_severity():
    assert worst([Status.PASS, Status.MISMATCH, Status.RUNTIME_ERROR]) is Status.RUNTIME_ERROR
    assert worst([Status.PASS, Status.PASS]) is Status.PASS
    assert worst([Status.MISMATCH, Status.FLAGGED]) is Status.FLAGGED
