"""Nothing a student sees names a hidden case, its shape or seed, an absolute path or a real id.

The results are the real GPU run's (tests/fixtures/gpu_run) plus submissions that print what
they saw of the hidden cases: during a hidden case, during a public case afterwards, in the
verdict, in the build log and in the notes.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest

from grader.course.verdicts import BuildResult
from grader.course.verdicts import CaseResult
from grader.course.policy import Policy
from grader.report.privacy import Redactor, hidden_cases
from grader.report.pages import RUN_FILE, write_reports
from grader.course.results import SubmissionResult, read_results, write_result
from grader.common.status import Status

FIXTURES = Path(__file__).parent / "fixtures" / "gpu_run"
POLICY = Policy(pseudonyms=True, hide_solution=True, pseudonym_salt="test-salt")
RUN = json.loads((FIXTURES / RUN_FILE).read_text())
HIDDEN = hidden_cases(RUN["cases"])
PUBLIC_IDS = [c["id"] for c in RUN["cases"] if not c["hidden"]]


def leak_text(tmp: Path) -> str:
    """What a hostile submission prints: every hidden case in every form, and paths."""
    out = []
    for h in HIDDEN:
        b, hd, s, d = h.shape
        out += [f"saw {h.id}", f"Q.shape=torch.Size([{b}, {hd}, {s}, {d}])", f"shape ({b}, {hd}, {s}, {d})",
                f"{b}x{hd}x{s}x{d}", f"batch_size: {b}; num_heads: {hd}; seq_len: {s}; head_dim: {d}; seed: {h.seed}",
                f'{{"seq_len": {s}, "seed": {h.seed}}}', f"S={s} seed={h.seed}",
                f"numel {b * hd * s * d}"]
    out += [f"reading {tmp}/course/test_cases/hidden.txt", "file:///home/prof/secret/key.txt",
            "see /home/prof/course/submissions/mallory/submission.py:12"]
    return "\n".join(out)


def forbidden(tmp: Path) -> list[str]:
    """Strings no student-visible file may hold."""
    words = [str(tmp), "/home/prof", "file:///", "/work/"]
    public_dims = {(i, int(v)) for pid in PUBLIC_IDS
                   for i, v in enumerate(re.fullmatch(r"b(\d+)_h(\d+)_s(\d+)_d(\d+)", pid).groups())}
    for h in HIDDEN:
        b, hd, s, d = h.shape
        words += [h.id, f"{b}, {hd}, {s}, {d}", f"{b}x{hd}x{s}x{d}", f"seed: {h.seed}",
                  f"seed={h.seed}", f'"seed": {h.seed}']
        if (2, s) not in public_dims:
            words += [f"seq_len: {s}", f'"seq_len": {s}', f"S={s}"]
        if b * hd * s * d >= 1000:
            words.append(f"numel {b * hd * s * d}")
    return words


def hostile_results(tmp: Path) -> list[SubmissionResult]:
    base = next(r for r in read_results(FIXTURES) if r.id == "wrong_no_rescale")
    leak = leak_text(tmp)
    hidden_id, public_id = HIDDEN[1].id, PUBLIC_IDS[0]
    cases = tuple(
        dataclasses.replace(c, status=Status.RUNTIME_ERROR, message=leak, launched=(("kernel_" + c.case, 1),))
        if c.case == hidden_id else
        dataclasses.replace(c, status=Status.RUNTIME_ERROR, message="after the hidden ones:\n" + leak)
        if c.case == public_id else c
        for c in base.cases)
    mallory = dataclasses.replace(
        base, id="mallory", label="mallory", status=Status.RUNTIME_ERROR,
        message=f"runtime_error on case {hidden_id}: {leak.splitlines()[1]}", cases=cases,
        notes=(f"ran in {tmp}/build/sub_mallory",), hint=f"look at {hidden_id}",
        build=BuildResult(Status.PASS, "extension", 1.0, artifact=f"{tmp}/build/sub_mallory/m.so",
                          log_tail=f"warning in {tmp}/build/sub_mallory/cuda.cu\n{leak}"))
    # the verdict is about a public case, and quotes what was printed there
    eve = dataclasses.replace(mallory, id="eve", label="eve",
                              message=f"runtime_error on case {public_id}: {leak}",
                              cases=tuple(dataclasses.replace(c, status=Status.PASS, message="ok")
                                          if c.case != public_id else c for c in cases))
    invalid = SubmissionResult(
        id="bob", label="bob", kind="invalid", role="student", status=Status.BUILD_ERROR,
        message=f"{tmp}/subs1/bob has neither submission.cu nor submission.py",
        build=BuildResult(Status.BUILD_ERROR, "none", 0.0,
                          message=f"{tmp}/subs1/bob has neither submission.cu nor submission.py"))
    return [mallory, eve, invalid]


@pytest.fixture
def graded(tmp_path) -> tuple[Path, dict[str, Path]]:
    out = tmp_path / "results"
    shutil.copytree(FIXTURES, out)
    for r in hostile_results(tmp_path):
        write_result(out, r)
    return out, write_reports(out, policy=POLICY)


def student_visible(out: Path) -> list[Path]:
    files = [out / "leaderboard-students.html", *sorted((out / "feedback").glob("*.md")),
             *sorted((out / "gradescope").glob("*/results.json"))]
    assert len(files) == 1 + 2 * 10       # 7 real students + 3 hostile ones
    return files


def test_no_student_visible_file_reveals_a_hidden_case_or_a_path(graded, tmp_path):
    out, _ = graded
    words = forbidden(tmp_path)
    for path in student_visible(out):
        text = path.read_text()
        found = [w for w in words if w in text]
        assert not found, f"{path.relative_to(out)} holds {found}"


def test_the_students_page_shows_no_real_id(graded):
    out, _ = graded
    page = (out / "leaderboard-students.html").read_text()
    for r in read_results(out):
        if r.role == "student" and r.id not in {s.value for s in Status}:   # status words stay
            assert re.search(rf"(?<![\w-]){re.escape(r.id)}(?![\w-])", page) is None, r.id
            assert POLICY.pseudonym(r.id) in page


def test_the_instructors_outputs_keep_full_detail(graded):
    out, _ = graded
    page = (out / "leaderboard.html").read_text()
    assert HIDDEN[1].id in page and "mallory" in page and "Q.shape=torch.Size" in page
    grades = (out / "grades.csv").read_text(encoding="utf-8-sig")
    assert f"runtime_error on case {HIDDEN[1].id}" in grades


def test_feedback_names_the_students_own_pseudonym_and_numbers_hidden_cases(graded):
    out, _ = graded
    md = (out / "feedback" / "mallory.md").read_text()
    assert f"`{POLICY.pseudonym('mallory')}`" in md
    assert "hidden case 2" in md and "runtime_error on hidden case 2" in md
    public = (out / "feedback" / "eve.md").read_text()
    assert "after the hidden ones" in public          # public-case text is kept, scrubbed
    assert "Q.shape=torch.Size([[hidden]])" in public
    assert f"ran in …/sub_{POLICY.pseudonym('mallory')}" in md      # path and id both gone


def test_gradescope_shows_no_hidden_case_before_grades_are_published(graded, tmp_path):
    out, _ = graded
    words = forbidden(tmp_path)
    docs = sorted((out / "gradescope").glob("*/results.json"))
    assert len(docs) == 10
    for path in docs:
        doc = json.loads(path.read_text())
        hidden = [t for t in doc["tests"] if t["name"].startswith("hidden case")]
        assert len(hidden) == len(HIDDEN) and all(t["visibility"] == "after_published" for t in hidden)
        # Gradescope hides the total while a test with points is hidden; performance needs every case
        assert next(t for t in doc["tests"] if t["name"].startswith("performance"))["visibility"] == "after_published"
        visible = [doc["output"]] + [t["name"] + "\n" + t["output"] for t in doc["tests"]
                                     if t["visibility"] == "visible"]
        visible += [f"{e['name']}={e['value']}" for e in doc.get("leaderboard", [])]
        for text in visible:
            assert "hidden case" not in text, (path, text)
            assert not [w for w in words if w in text], (path, text)
        assert {e["name"] for e in doc.get("leaderboard", [])} <= {"median ms", "TFLOP/s"}


def test_the_students_page_has_no_per_hidden_case_verdict(graded):
    """Which hidden case passed or failed is in the feedback and in Gradescope after publication,
    never on the students' page: there, hidden cases are a count."""
    out, _ = graded
    page = (out / "leaderboard-students.html").read_text()
    assert re.search(r"hidden case \d", page) is None
    assert "(hidden)" not in page
    public = len(PUBLIC_IDS)
    for body in re.findall(r'<tbody class="student">(.*?)</tbody>', page, re.S):
        marks = re.findall(r'<span class="case (?:pass|fail|skip)"', body)
        assert len(marks) in (0, public), body[:300]      # a build error ran no case
        if marks:
            assert re.search(rf">\d/{len(HIDDEN)} hidden<", body), body[:300]
    mallory = POLICY.pseudonym("mallory")
    row = next(b for b in re.findall(r'<tbody class="student">(.*?)</tbody>', page, re.S) if mallory in b)
    assert "runtime_error on a hidden case" in row
    instructors = (out / "leaderboard.html").read_text()
    assert f"{HIDDEN[1].id} (hidden): runtime_error" in instructors          # full detail there


def test_scrubbing_keeps_what_is_public():
    redactor = Redactor.for_run(RUN, {"bob": "calm-koala-1f"})
    public = PUBLIC_IDS[0]
    text = (f"case {public}: shape (1, 64, 1024, 128), seq_len: 1024, see "
            f"https://docs.nvidia.com/cuda/x.html, 1/2 of Q/K, line 77 of bob.cu, bobby")
    assert redactor.text(text) == text.replace("bob.cu", "calm-koala-1f.cu")
    assert redactor.text(f"/srv/course/bob/a.cu and ~/x/y.txt") == "…/a.cu and …/y.txt"
    assert redactor.text(f"failed on {HIDDEN[0].id}") == "failed on hidden case 1"


def test_hidden_case_results_keep_only_shape_free_numbers():
    base = next(r for r in read_results(FIXTURES) if r.id == "wrong_no_rescale")
    shown = Redactor.for_run(RUN).student_result(base)
    hidden = [c for c in shown.cases if c.hidden]
    assert [c.case for c in hidden] == [h.name for h in HIDDEN]
    assert all(c.finding is None and not c.launched for c in hidden)
    assert "91% of elements outside the tolerance" in hidden[1].message   # 8961 of 9856
    assert shown.message.startswith("mismatch on hidden case 2 (1 of 9 cases pass")
    assert CaseResult.from_dict(hidden[1].to_dict()) == hidden[1]
