"""The verdict's first word as a student reads it (grader/report/feedback.py status_label): a check whose
cases ran only on the CPU says so (CPU-PASS), one where nothing ran says not run, and every place
a student reads the verdict (the check's text, its Markdown, the page, the progress line, the
terminal table) shows the same word. The status itself, in the JSON and the grades, is unchanged."""

from __future__ import annotations

import dataclasses
import io
import json
import types

from grader.stages import run as run_stage
from grader.course.verdicts import CaseResult
from grader.report.feedback import cpu_note, feedback_markdown, feedback_text, status_label
from grader.report.progress import Progress
from grader.report.pages import RUN_FILE, text_table, write_reports
from grader.report.rows import build_rows
from grader.course.results import SubmissionResult, write_result
from grader.common.status import Status

from .test_report import POLICY, RUN

SMALL = [f"b1_h2_s{s}_d64" for s in (3, 64, 130, 200)]
LARGE = ["b1_h64_s1024_d128_qk6", "b2_h64_s4096_d128", "b4_h64_s8192_d128"]
GPU_SIZED = "not run: too large for the CPU (no CUDA device)"


def on_the_cpu(status: Status = Status.PASS, small: Status = Status.PASS) -> SubmissionResult:
    """A Triton check without a GPU: the small cases ran on the CPU, the large ones did not."""
    cases = [CaseResult(c, small) for c in SMALL] + [CaseResult(c, Status.NOT_RUN, GPU_SIZED)
                                                     for c in LARGE]
    return SubmissionResult(id="triton", label="triton", kind="python", role="student",
                            status=status, message="all 4 cases run pass", cases=tuple(cases),
                            notes=(cpu_note(4, 7), "not timed: no CUDA device"))


def compiled_only() -> SubmissionResult:
    """A TileLang check without a GPU: every case it was given was compiled, none ran."""
    tried = "not run: TileLang lowered attention_kernel to CUDA and nvcc compiled it for sm_90a"
    cases = [CaseResult(c, Status.NOT_RUN, tried) for c in SMALL] + \
        [CaseResult(c, Status.NOT_RUN, GPU_SIZED) for c in LARGE]
    return SubmissionResult(id="tilelang", label="tilelang", kind="python", role="student",
                            status=Status.NOT_RUN, message=tried, cases=tuple(cases))


def test_a_pass_on_the_cpu_says_so_in_its_first_word_and_lists_the_gpu_cases_as_not_run():
    text = feedback_text(on_the_cpu())
    lines = text.splitlines()
    assert lines[0] == "triton: CPU-PASS (on the CPU: 4 of 7 cases ran; the 3 others need a GPU: not run)"
    for case in LARGE:
        assert f"  not run        {case}" in lines
    for case in SMALL:
        assert f"  PASS           {case}" in lines
    assert "PASS" not in lines[0].replace("CPU-PASS", "")


def test_every_verdict_decided_by_cases_on_the_cpu_is_labelled_so_and_others_are_not():
    assert status_label(on_the_cpu(Status.MISMATCH, Status.MISMATCH)) == "CPU-MISMATCH"
    assert status_label(on_the_cpu(Status.RUNTIME_ERROR, Status.RUNTIME_ERROR)) == "CPU-RUNTIME_ERROR"
    assert status_label(on_the_cpu(Status.REVIEW)) == "CPU-REVIEW"
    # not decided by how the cases came out: the same word as anywhere
    assert status_label(on_the_cpu(Status.FLAGGED)) == "FLAGGED"
    assert status_label(on_the_cpu(Status.ENVIRONMENT_ERROR)) == "ENVIRONMENT_ERROR"
    # graded on a GPU (no note of the CPU): the status alone, first line unchanged
    gpu = dataclasses.replace(on_the_cpu(), notes=())
    assert status_label(gpu) == "PASS" and feedback_text(gpu).splitlines()[0] == "triton: PASS"
    assert feedback_markdown(gpu).startswith("# triton: `pass`\n\nall 4 cases run pass\n")


def test_nothing_run_says_not_run_and_claims_no_case_ran():
    r = compiled_only()
    text = feedback_text(r)
    assert text.splitlines()[0] == "tilelang: NOT_RUN (nothing ran: no CUDA device)"
    assert "ran on the CPU" not in text and "cases ran" not in text
    assert feedback_markdown(r).startswith("# tilelang: `not_run`\n\nNothing ran: no CUDA device.\n")


def test_the_pipeline_notes_only_cases_that_ran_and_only_without_a_gpu():
    """run_stage.ran_where: the note (and so the label) counts cases that ran; TileLang's compiled
    cases are not among them, and a GPU's run needs no note."""
    cpu = types.SimpleNamespace(device=types.SimpleNamespace(cuda=False))
    gpu = types.SimpleNamespace(device=types.SimpleNamespace(cuda=True))
    assert run_stage.ran_where(cpu, list(on_the_cpu().cases)) == ["ran on the CPU: 4 of 7 cases (no CUDA device)"]
    assert run_stage.ran_where(cpu, list(compiled_only().cases)) == []
    assert run_stage.ran_where(gpu, list(on_the_cpu().cases)) == []
    # a case that ran and failed ran
    failed = [CaseResult(SMALL[0], Status.RUNTIME_ERROR, "boom"), *compiled_only().cases[1:]]
    assert run_stage.ran_where(cpu, failed) == ["ran on the CPU: 1 of 7 cases (no CUDA device)"]


def test_the_markdown_page_progress_and_table_show_the_same_label(tmp_path):
    r = on_the_cpu()
    md = feedback_markdown(r)
    assert md.startswith("# triton: `cpu-pass`\n\nOn the CPU: 4 of 7 cases ran; the 3 others need a "
                         "GPU: not run.\n")
    assert f"| `{LARGE[0]}` | not run |" in md and f"| `{SMALL[0]}` | pass |" in md

    stream = io.StringIO()
    progress = Progress(1, live=False, stream=stream)
    progress.done(r)
    progress.close()
    assert "triton: cpu-pass - all 4 cases run pass" in stream.getvalue()
    assert stream.getvalue().rstrip().endswith(": 1 cpu-pass")

    run = dict(RUN, device=dict(RUN["device"], cuda=False, name="cpu", cuda_version=None),
               cases=[dict(id=c, hidden=False) for c in SMALL + LARGE], timed_case=LARGE[-1])
    (tmp_path / RUN_FILE).write_text(json.dumps(run))
    write_result(tmp_path, r)
    paths = write_reports(tmp_path, policy=POLICY)
    for page in ("leaderboard", "students"):
        html = paths[page].read_text()
        assert ">cpu-pass</span>" in html and ">pass</span>" not in html, page
        assert 'title="on the CPU: 4 of 7 cases ran; the 3 others need a GPU: not run"' in html
    assert (tmp_path / "feedback" / "triton.md").read_text().startswith("# triton: `cpu-pass`")
    assert " cpu-pass " in text_table(build_rows([r], run=run, policy=POLICY))
    # the record keeps the vocabulary's word
    assert json.loads((tmp_path / "triton.json").read_text())["status"] == "pass"
