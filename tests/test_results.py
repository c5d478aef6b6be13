import dataclasses
import json
import statistics

import pytest

from grader.course.verdicts import BuildResult
from grader.course.verdicts import BadElement
from grader.course.verdicts import Finding
from grader.course.verdicts import CaseResult
from grader.course.results import (NO_RESULT_STATUS, ResultUnreadable, RunFileError, SubmissionResult,
                            key_digest, load_result, read_results, write_result)
from grader.common.status import Status, worst
from grader.trusted.timing import median_interval, summarize
from grader.course.verdicts import TimingStats


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


def test_an_unreadable_result_file_is_shown_as_no_result_never_dropped(tmp_path):
    """Issue 32: a damaged result file (here in a run file from before rosters) is its row, with
    no result and a note naming the file and the regrade; it is never silently left out."""
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "_run.json").write_text("{}")
    write_result(tmp_path, sample())
    results = read_results(tmp_path)
    assert [r.id for r in results] == ["alice", "broken"]
    broken = results[1]
    assert broken.no_result and "broken.json" in broken.message and "--only broken" in broken.message


def test_timing_summary():
    t = summarize([2.0, 1.0, 3.0, 2.0], flops=4 * 10**12, warmup_calls=2, budget_s=5,
                  stopped_by="budget", wall_s=1)
    assert t.n == 4 and t.median_ms == 2.0 and t.min_ms == 1.0 and t.mean_ms == 2.0
    assert abs(t.tflops - 2000.0) < 1e-9      # 4e12 FLOP in 2 ms
    assert abs(t.rse - (t.std_ms / 2 / 2.0)) < 1e-12
    assert TimingStats.from_dict(t.to_dict()) == t


def test_the_median_s_interval_holds_the_median_and_narrows_with_more_calls():
    import random
    rng = random.Random(7)
    few = [rng.gauss(13.0, 0.2) for _ in range(30)]
    many = few + [rng.gauss(13.0, 0.2) for _ in range(270)]
    for times in (few, many):
        low, high = median_interval(times)
        assert low <= statistics.median(times) <= high
    assert median_interval(many)[1] - median_interval(many)[0] < median_interval(few)[1] - median_interval(few)[0]
    assert median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)    # too few times: the whole range
    # 100 calls: ranks 40 and 60 of the sorted times (about 95% coverage)
    assert median_interval([float(i) for i in range(100)]) == (40.0, 60.0)


def test_worst_status_orders_by_severity():
    assert worst([Status.PASS, Status.MISMATCH, Status.RUNTIME_ERROR]) is Status.RUNTIME_ERROR
    assert worst([Status.PASS, Status.PASS]) is Status.PASS
    assert worst([Status.MISMATCH, Status.FLAGGED]) is Status.FLAGGED


def test_fields_of_a_newer_grader_are_ignored_at_every_level():
    t = summarize([1.0, 1.1], flops=10**12, warmup_calls=2, budget_s=5, stopped_by="rse", wall_s=3)
    original = sample(timing=t)
    d = original.to_dict()
    d["from_the_future"] = {"x": 1}
    d["build"]["new_build_field"] = 2
    d["cases"][1]["new_case_field"] = 3
    d["cases"][1]["finding"]["new_finding_field"] = 4
    d["timing"]["new_timing_field"] = 5
    assert SubmissionResult.from_dict(json.loads(json.dumps(d))) == original


def test_a_result_that_cannot_be_used_says_why(tmp_path):
    def why(text: str | None) -> str:
        path = tmp_path / "r.json"
        path.unlink(missing_ok=True)
        if text is not None:
            path.write_text(text)
        with pytest.raises(ResultUnreadable) as e:
            load_result(path)
        return str(e.value)

    good = sample().to_dict()
    assert why(None) == "no such file"
    assert why(json.dumps(good)[:50]).startswith("truncated or not JSON (")
    assert why("") .startswith("empty")
    assert why(json.dumps({**good, "schema": 7})).startswith("written by a newer grader (schema 7;")
    assert why(json.dumps({k: v for k, v in good.items() if k != "status"})) == "field 'status' is missing"
    assert "does not know" in why(json.dumps({**good, "status": "melted"}))
    assert why("[1, 2]") == "not a result (a JSON list)"


def _roster(*entries):
    return dict(device={"cuda": False}, cases=[], state="finished", roster=[
        dict(id=i, role="student", kind="cuda", label=i, result=f"{i}.json", key=key)
        for i, key in entries])


def test_read_results_holds_the_run_roster_with_placeholders(tmp_path):
    key = (("source", "aa"), ("grader", "bb"))
    write_result(tmp_path, dataclasses.replace(sample("alice"), key=key))
    write_result(tmp_path, dataclasses.replace(sample("carol"), key=(("source", "old"),)))
    write_result(tmp_path, sample("mallory"))   # another run's: not shown
    run = _roster(("alice", key_digest(key)), ("bob", None), ("carol", key_digest(key)))
    (tmp_path / "_run.json").write_text(json.dumps(run))
    got = read_results(tmp_path)
    assert [r.id for r in got] == ["alice", "bob", "carol"]
    alice, bob, carol = got
    assert not alice.no_result and alice.status is Status.MISMATCH
    assert bob.no_result and bob.status is NO_RESULT_STATUS
    assert bob.message == f"result missing: {tmp_path / 'bob.json'}: no such file (deleted?): " \
                          f"regrade it with 'python -m grader grade --only ID'"
    assert carol.no_result and "graded from other inputs than this run's" in carol.message
    with pytest.raises(ValueError, match="never written"):
        write_result(tmp_path, bob)
    run["state"] = "interrupted"
    (tmp_path / "_run.json").write_text(json.dumps(run))
    assert "the run was interrupted; grade again to finish" in read_results(tmp_path)[1].message
    (tmp_path / "_run.json").write_text(json.dumps(run)[:40])
    with pytest.raises(RunFileError, match=r"_run.json: truncated or not JSON"):
        read_results(tmp_path)
