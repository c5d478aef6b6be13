import csv
import io
import json

from grader.report import RUN_FILE, build_rows, grades_csv, text_table, write_reports
from grader.results import write_result
from grader.status import Status
from grader.timing import summarize

from .test_results import sample

RUN = dict(started_at="2026-11-21T00:00:00+00:00", finished_at="2026-11-21T00:10:00+00:00",
           device=dict(cuda=True, name="NVIDIA H200", driver="580", torch_version="2.11",
                       cuda_version="13.0", grader_version="0.1.0"),
           cases=[dict(id="b1_h1_s1_d64", hidden=True), dict(id="b1_h1_s2_d64", hidden=False)],
           timed_case="b1_h1_s2_d64", rtol=0.01, atol=0.01)


def timing(ms):
    return summarize([ms, ms], flops=10**12, warmup_calls=2, budget_s=5, stopped_by="rse", wall_s=1)


def results():
    return [sample("slow", Status.PASS, timing=timing(20.0)),
            sample("fast", Status.PASS, timing=timing(2.0)),
            sample("broken"),
            sample("torch_reference", Status.PASS, role="baseline", timing=timing(10.0)),
            sample("sdpa_flash", Status.PASS, role="baseline", timing=timing(1.0))]


def test_rows_rank_students_by_median_with_baselines_placed_by_time():
    rows = build_rows(results())
    assert [r.result.id for r in rows] == ["sdpa_flash", "fast", "torch_reference", "slow", "broken"]
    assert [r.rank for r in rows] == [None, 1, None, 2, None]
    fast = rows[1]
    assert fast.speedup_vs_reference == 5.0 and fast.speedup_vs_flash == 0.5
    assert rows[3].speedup_vs_reference == 0.5


def test_scores_between_the_reference_and_flash():
    rows = {r.result.id: r for r in build_rows(results())}
    # 1 of 2 cases pass (35 points) for 'broken'; 'fast' passes all its timed runs but the sample
    # has one mismatching case too: correctness 35, performance log(10/2)/log(10/1) * 30.
    assert rows["broken"].score == 35.0
    assert abs(rows["fast"].score - (35.0 + 30 * 0.69897)) < 0.01
    assert rows["slow"].score == 35.0      # slower than the PyTorch reference: no performance points


def test_grades_csv_has_one_row_per_student():
    data = list(csv.DictReader(io.StringIO(grades_csv(build_rows(results())))))
    assert [d["submission"] for d in data] == ["fast", "slow", "broken"]
    assert data[0]["rank"] == "1" and data[0]["median_ms"] == "2.0000"
    assert data[2]["status"] == "mismatch" and data[2]["median_ms"] == ""


def test_student_text_is_escaped_in_the_page(tmp_path):
    evil = "<img src=x onerror=alert(1)>"
    (tmp_path / RUN_FILE).write_text(json.dumps(RUN))
    for r in results():
        write_result(tmp_path, r)
    import dataclasses
    write_result(tmp_path, dataclasses.replace(sample("evil"), label=evil, message=evil + " msg"))
    paths = write_reports(tmp_path)
    html = paths["leaderboard"].read_text()
    assert evil not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "NVIDIA H200" in html and "driver 580" in html
    summary = json.loads(paths["summary"].read_text())
    assert summary["counts"]["pass"] == 2 and summary["counts"]["mismatch"] == 2


def test_text_table_lists_every_row():
    table = text_table(build_rows(results()))
    assert table.count("\n") == 2 + 5 - 1
    assert "fast" in table and "5.00x" in table
