import csv
import re
import dataclasses
import io
import json

import pytest

from grader.report.exports import GRADES_COLUMNS, grades_csv, gradescope_results
from grader.report.feedback import feedback_markdown
from grader.course.policy import Policy, PolicyError, load_policy
from grader.report.pages import RUN_FILE, chart, text_table, write_reports
from grader.report.rows import build_rows
from grader.course.results import write_result
from grader.common.status import Status
from grader.trusted.timing import summarize

from .test_results import sample

CASES = [dict(id="b1_h1_s1_d64", hidden=True), dict(id="b1_h1_s2_d64", hidden=False)]
RUN = dict(started_at="2026-11-21T00:00:00+00:00", finished_at="2026-11-21T00:10:00+00:00",
           device=dict(cuda=True, name="NVIDIA H200", driver="580", torch_version="2.11",
                       cuda_version="13.0", grader_version="0.1.0", matmul_tflops=700.0),
           cases=CASES, timed_case="b1_h1_s2_d64", rtol=0.01, atol=0.01)
POLICY = Policy(public_case_points=10, hidden_case_points=5, performance_points=30,
                pseudonyms=True, hide_solution=True, pseudonym_salt="s")


def timing(ms):
    return summarize([ms, ms], flops=7 * 10**11, warmup_calls=2, budget_s=5, stopped_by="rse", wall_s=1)


def results():
    return [sample("slow", Status.PASS, timing=timing(20.0)),
            sample("fast", Status.PASS, timing=timing(2.0)),
            sample("broken"),
            sample("torch_reference", Status.PASS, role="baseline", timing=timing(10.0)),
            sample("sdpa_flash", Status.PASS, role="baseline", timing=timing(1.0)),
            sample("solution", Status.PASS, role="baseline", timing=timing(1.5))]


def test_rows_rank_students_by_median_with_baselines_placed_by_time():
    rows = build_rows(results(), run=RUN, policy=POLICY)
    assert [r.result.id for r in rows] == ["sdpa_flash", "solution", "fast", "torch_reference", "slow", "broken"]
    assert [r.rank for r in rows] == [None, None, 1, None, 2, None]
    fast = rows[2]
    assert fast.speedup_vs_reference == 5.0 and fast.speedup_vs_flash == 0.5
    assert fast.percent_of_peak == pytest.approx(100 * 350 / 700)   # 0.7 TFLOP in 2 ms = 350 TFLOP/s


def test_scores_follow_the_policy():
    rows = {r.result.id: r for r in build_rows(results(), run=RUN, policy=POLICY)}
    # the sample passes the hidden case (5 points) and fails the public one (0)
    assert rows["broken"].score.correctness == 5 and rows["broken"].score.performance == 0
    assert rows["fast"].score.performance == pytest.approx(30 * 0.69897, abs=0.01)   # log(10/2)/log(10)
    assert rows["slow"].score.performance == 0      # slower than the PyTorch reference
    assert rows["fast"].score.max_total == 10 + 5 + 30
    fixed = dataclasses.replace(POLICY, zero_at=4.0, full_at=2.0)
    assert build_rows(results(), run=RUN, policy=fixed)[2].score.performance == 30


def test_policy_file_is_read_and_bad_keys_are_named(tmp_path):
    assert load_policy(tmp_path / "absent.toml") == Policy()
    good = tmp_path / "g.toml"
    good.write_text('[correctness]\npublic_case_points = 3\n[performance]\npoints = 7\nfull_at = 5.0\n'
                    '[display]\npseudonyms = false\n')
    p = load_policy(good)
    assert (p.public_case_points, p.performance_points, p.full_at, p.pseudonyms) == (3, 7, 5.0, False)
    bad = tmp_path / "b.toml"
    bad.write_text("[performance]\nzero_at = 'torch_reference'\n")
    with pytest.raises(PolicyError, match=r'b.toml(:\d+)?: \[performance\] zero_at'):
        load_policy(bad)
    bad.write_text("[correctness]\npoints_per_case = 3\n")
    with pytest.raises(PolicyError, match="unknown key"):
        load_policy(bad)
    from grader.common.config import REPO_ROOT
    load_policy(REPO_ROOT / "grading.toml")   # the shipped policy is valid


def test_student_page_view_hides_solution_ids_and_hidden_shapes():
    evil = dataclasses.replace(sample("zed"), message="mismatch on case b1_h1_s1_d64: bad")
    rows = build_rows(results() + [evil], run=RUN, policy=POLICY, public=True)
    ids = [r.result.id for r in rows]
    assert "solution" not in ids and "sdpa_flash" in ids
    names = {r.result.id: r.name for r in rows}
    assert names["fast"] != "fast" and names["fast"] == POLICY.pseudonym("fast")
    assert names["sdpa_flash"] == "sdpa_flash"        # baselines keep their names
    zed = next(r for r in rows if r.result.id == "zed")
    # the students' page tells no hidden case apart: which one failed is in the feedback only
    assert zed.verdict == "mismatch on a hidden case: bad"
    assert [c.case for c in zed.result.cases] == ["b1_h1_s2_d64"]         # public cases only
    assert (zed.hidden_passed, zed.hidden_total) == (1, 1)
    assert POLICY.pseudonym("fast") != dataclasses.replace(POLICY, pseudonym_salt="t").pseudonym("fast")


def test_grades_csv_has_one_row_per_student():
    rows = [r for r in build_rows(results(), run=RUN, policy=POLICY) if r.result.role == "student"]
    data = list(csv.DictReader(io.StringIO(grades_csv(rows, RUN, POLICY))))
    assert list(data[0]) == GRADES_COLUMNS
    assert [d["submission"] for d in data] == ["fast", "slow", "broken"]
    assert data[0]["rank"] == "1" and data[0]["median_ms"] == "2.0000" and data[0]["max_score"] == "45.00"
    assert (data[2]["public_passed"], data[2]["public_total"], data[2]["hidden_passed"]) == ("0", "1", "1")
    # one format per column: every score has two decimals, whether it is whole or not
    assert all(re.fullmatch(r"\d+\.\d\d", d["score"]) for d in data)
    assert data[0]["pseudonym"] == POLICY.pseudonym("fast")


def test_gradescope_results_follow_the_autograder_schema():
    rows = {r.result.id: r for r in build_rows(results(), run=RUN, policy=POLICY)}
    doc = gradescope_results(rows["fast"], RUN, POLICY)
    json.dumps(doc, allow_nan=False)                  # strict JSON: no NaN or Infinity
    assert set(doc) >= {"score", "tests", "output", "visibility", "leaderboard"}
    assert doc["score"] == pytest.approx(sum(t["score"] for t in doc["tests"]))
    for t in doc["tests"]:
        assert set(t) >= {"name", "score", "max_score", "output", "visibility"}
        assert t["visibility"] in {"visible", "hidden", "after_due_date", "after_published"}
        assert 0 <= t["score"] <= t["max_score"]
    hidden = [t for t in doc["tests"] if t["name"].startswith("hidden case")]
    assert hidden and all(t["visibility"] == "after_published" for t in hidden)
    # the total is hidden until publication because a test with points is after_published
    perf = next(t for t in doc["tests"] if t["name"].startswith("performance"))
    assert perf["visibility"] == "after_published" and "b1_h1_s1_d64" not in json.dumps(doc)
    assert doc["leaderboard"][0] == {"name": "median ms", "value": 2.0, "order": "asc"}
    assert "leaderboard" not in gradescope_results(rows["broken"], RUN, POLICY)


def test_markdown_feedback_has_the_findings_and_survives_backticks():
    base = sample()
    tricky = dataclasses.replace(base.cases[1], message="printed ``` then\nmore")
    md = feedback_markdown(dataclasses.replace(base, cases=(base.cases[0], tricky)))
    assert md.startswith("# alice: `mismatch`")
    assert "| `b1_h1_s2_d64` | mismatch |" in md and "**Hint:** h" in md
    assert "````\nprinted ``` then\nmore\n````" in md   # the fence outgrows the student's backticks


def test_reports_history_and_rank_movement(tmp_path):
    evil = "<img src=x onerror=alert(1)>"
    (tmp_path / RUN_FILE).write_text(json.dumps(RUN))
    for r in results():
        write_result(tmp_path, r)
    write_result(tmp_path, dataclasses.replace(sample("evil"), label=evil, message=evil + " msg"))
    paths = write_reports(tmp_path, policy=POLICY, archive=True)
    html = paths["leaderboard"].read_text()
    assert evil not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "NVIDIA H200" in html and "driver 580" in html and "700 TFLOP/s" in html
    assert "<svg" in html and "Earlier runs" not in html
    students = paths["students"].read_text()
    assert ">solution<" not in students and "b1_h1_s1_d64 (hidden)" not in students
    assert (tmp_path / "gradescope" / "fast" / "results.json").exists()
    assert (tmp_path / "feedback" / "broken.md").exists()
    assert (tmp_path / "history" / "20261121T000000Z" / "leaderboard.html").exists()

    # a second run a day later in which 'slow' got faster than 'fast'
    run2 = dict(RUN, started_at="2026-11-22T00:00:00+00:00")
    (tmp_path / RUN_FILE).write_text(json.dumps(run2))
    write_result(tmp_path, sample("slow", Status.PASS, timing=timing(1.2)))
    write_reports(tmp_path, policy=POLICY, archive=True)
    summary = json.loads((tmp_path / "_summary.json").read_text())
    ranks = {row["id"]: (row["rank"], row["previous_rank"]) for row in summary["rows"]}
    assert ranks["slow"] == (1, 2) and ranks["fast"] == (2, 1)
    html = (tmp_path / "leaderboard.html").read_text()
    assert "Earlier runs" in html and 'href="history/20261121T000000Z/leaderboard.html"' in html
    assert "▲1" in html and "▼1" in html


def test_chart_and_text_table():
    rows = build_rows(results(), run=RUN, policy=POLICY)
    c = chart(rows)
    assert len(c["bars"]) == 5 and len(c["lines"]) == 3
    widths = {b["name"]: b["w"] for b in c["bars"]}
    assert widths["sdpa_flash"] < widths["fast"] < widths["slow"]
    table = text_table(rows)
    assert "5.00x" in table
    assert table.splitlines()[-1] == "3 submissions: 1 mismatch · 2 pass"
    assert chart([r for r in rows if not r.result.timing]) is None


def test_text_table_wraps_verdicts_at_words_and_never_cuts_them():
    long = "mismatch on case b1_h1_s2_d64: " + " ".join(f"word{i}" for i in range(40))
    rows = build_rows([dataclasses.replace(sample("zed"), message=long)], run=RUN, policy=POLICY)
    table = text_table(rows, width=130)
    verdict_col = table.splitlines()[0].index("verdict")
    body = [line for line in table.splitlines()[2:] if line.strip() and "submission:" not in line]
    assert len(body) > 1 and all(len(line) <= 130 for line in body)
    assert " ".join(line[verdict_col:].strip() for line in body) == long


def test_chart_stays_one_screen_tall_for_a_big_class():
    many = [sample(f"s{i:03d}", Status.PASS, timing=timing(2.0 + i * 0.1)) for i in range(300)]
    rows = build_rows(many + results()[3:], run=RUN, policy=POLICY)
    c = chart(rows)
    students = [b for b in c["bars"] if not b["baseline"]]
    assert len(students) == 15 and len(c["bars"]) == 15 + 3
    assert sum(h["n"] for h in c["histogram"]) == 300
    assert c["height"] < 700
