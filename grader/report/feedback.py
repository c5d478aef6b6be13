"""Student-facing text for one result: the failed stage, the case, the error against the
tolerance, a few bad indices, and the TODO to look at; for a `review` result, that it waits for
an instructor (not a cheating verdict) and the lines of its own code the audit named."""

from __future__ import annotations

from grader.common.status import Status
from grader.course.results import SubmissionResult
from grader.report.privacy import withheld_message

REVIEW_HEADING = "Waiting for an instructor's review"
REVIEW_TEXT = ("Your submission passed its cases, but it uses code the grader cannot account for, "
               "so it is not ranked and earns no performance points until an instructor has looked "
               "at it. This is not a cheating verdict: an instructor will clear it (it then ranks "
               "with the time it was measured at) or tell you why not. To rank without waiting, use "
               "only what a kernel wrapper needs (the kernel language, tensors and their shapes, "
               "math).")


# The note the pipeline writes when cases ran without a CUDA device (run.ran_where), and
# only then: its count is of cases that ran, never of cases that were only tried (TileLang's
# compile without a GPU runs none).
CPU_NOTE = "ran on the CPU"
# The verdicts that running cases decides: on the CPU they are labelled so (status_label).
DECIDED_BY_CASES = (Status.PASS, Status.REVIEW, Status.MISMATCH, Status.RUNTIME_ERROR,
                    Status.TIMEOUT)


def cpu_note(ran: int, of: int) -> str:
    """'ran on the CPU: 4 of 7 cases (no CUDA device)', for a result of which `ran` cases ran."""
    return f"{CPU_NOTE}: {ran} of {of} cases (no CUDA device)"


def ran_on_cpu(r: SubmissionResult) -> bool:
    """Whether `r`'s cases ran on the CPU (no CUDA device): its notes say so (cpu_note)."""
    return any(n.startswith(f"{CPU_NOTE}: ") for n in r.notes)


def status_label(r: SubmissionResult) -> str:
    """The verdict as a student first reads it: the status in capitals, with CPU- in front when
    the cases that decided it ran on the CPU (Triton's interpreter on the small cases, no CUDA
    device): CPU-PASS is not a pass on the course's GPU. Presentation only: the status (the
    JSON, the CSV, a grade) is the same word without it."""
    word = r.status.value.upper()
    return f"CPU-{word}" if r.status in DECIDED_BY_CASES and ran_on_cpu(r) else word


def status_detail(r: SubmissionResult) -> str:
    """What the label does not say of where the cases ran: 'on the CPU: 4 of 7 cases ran; the 3
    others need a GPU: not run', 'nothing ran: no CUDA device', or '' (a GPU ran them)."""
    if not ran_on_cpu(r):
        return "nothing ran: no CUDA device" if r.status is Status.NOT_RUN else ""
    not_run = sum(c.status is Status.NOT_RUN for c in r.cases)
    others = (f"; the {not_run} other{'s need' if not_run > 1 else ' needs'} a GPU: not run"
              if not_run else "")
    return f"on the CPU: {len(r.cases) - not_run} of {len(r.cases)} cases ran{others}"


def status_line(r: SubmissionResult) -> str:
    """'triton: CPU-PASS (on the CPU: 4 of 7 cases ran; ...)': feedback_text's first line."""
    detail = status_detail(r)
    return f"{r.label}: {status_label(r)}" + (f" ({detail})" if detail else "")


def _case_status(c) -> str:
    """A case's status in the cases list: 'not run' in words, the others as they are."""
    return "not run" if c.status is Status.NOT_RUN else c.status.value


def review_lines(r: SubmissionResult) -> list[str]:
    """What the grader's audit could not account for, in the student's own code: 'file line N:
    name (why)' each; [] unless `r` waits for review."""
    if r.status is not Status.REVIEW:
        return []
    return list(r.review) or ["(the audit named no line: ask your instructor)"]


def review_summary(r: SubmissionResult) -> str:
    """REVIEW_TEXT and the lines it is about, in a paragraph; '' unless `r` waits for review."""
    lines = review_lines(r)
    return f"{REVIEW_TEXT} It could not account for: {'; '.join(lines)}." if lines else ""


# Said where every error a submission raised was on a hidden case (a CPU run of the course's cases
# runs only its small ones, which are hidden): the feedback then holds no message, file or line.
ERRORS_WITHHELD = ("The error's message is not shown: it was raised on hidden cases only, whose "
                   "output is never shown. Run `make check` on your folder: it runs the public "
                   "cases (small ones on a machine without a GPU) and shows an error raised there "
                   "with its file, line and code.")


def errors_withheld(r: SubmissionResult) -> bool:
    """Whether `r` (as a student sees it: privacy.Redactor.student_result) raised errors whose
    text was withheld, every one of them: raised on hidden cases, and none on a public case."""
    raised = [c for c in r.cases if c.status is Status.RUNTIME_ERROR
              and not c.message.startswith("not run")]   # "not run: the submission did not load"
    return bool(raised) and all(c.hidden and c.message == withheld_message(c) for c in raised)


def feedback_text(r: SubmissionResult) -> str:
    lines = [status_line(r), f"  {r.message}"]
    if review_lines(r):
        lines += [f"\n{REVIEW_HEADING}: {REVIEW_TEXT}", "What it could not account for:"]
        lines += [f"  {line}" for line in review_lines(r)]
    if r.build and r.build.status is not Status.PASS:
        lines.append(f"\nStage: build ({r.build.mode}, {r.build.elapsed_s:.0f} s)")
        if r.build.log_tail:
            lines += ["", _indent(r.build.log_tail)]
    elif r.build and r.build.log_tail:
        lines += ["\nCompiler warnings:", _indent(r.build.log_tail)]
    if r.cases:
        lines.append("\nCases:")
        for c in r.cases:
            tag = " (hidden)" if c.hidden else ""
            lines.append(f"  {'PASS' if c.status is Status.PASS else _case_status(c):14} {c.case}{tag}")
            if c.status not in (Status.PASS, Status.NOT_RUN) and c.message:
                lines.append(_indent(c.message, 6))
    if r.launched:
        case, launched = r.launched
        lines.append(f"\nLaunched during one call on {case}:")
        lines += [f"  {count:4d} x {name}" for name, count in launched[:12]]
    if r.timing:
        t = r.timing
        lines.append(f"\nTiming on {r.timed_case}: median {t.median_ms:.3f} ms "
                     f"({t.tflops:.1f} TFLOP/s), mean {t.mean_ms:.3f}, min {t.min_ms:.3f}, "
                     f"std {t.std_ms:.3f}, n={t.n}")
    for note in r.notes:
        lines.append(f"\nNote: {note}")
    if r.hint:
        lines.append(f"\nHint: {r.hint}")
    return "\n".join(lines)


def _indent(text: str, n: int = 4) -> str:
    return "\n".join(" " * n + line for line in text.rstrip().splitlines())


def feedback_markdown(r: SubmissionResult, *, score=None, rank: int | None = None,
                      pseudonym: str | None = None) -> str:
    """The same content as feedback_text, as Markdown for posting back to the student (pass the
    result through privacy.Redactor.student_result first). Code blocks hold the student's own
    output verbatim; fences are lengthened past any backticks."""
    detail = status_detail(r)
    lines = [f"# {r.label}: `{status_label(r).lower()}`", "",
             *([f"{detail[0].upper()}{detail[1:]}.", ""] if detail else []), r.message, ""]
    if pseudonym:
        lines += [f"**Your name on the students' leaderboard:** `{pseudonym}`", ""]
    if rank:
        lines += [f"**Rank:** {rank}", ""]
    if score is not None:
        lines += [f"**Score:** {score.total:g} / {score.max_total:g} (correctness "
                  f"{score.correctness:g}, performance {score.performance:g}: "
                  f"{score.performance_basis})", ""]
    if review_lines(r):
        lines += [f"## {REVIEW_HEADING}", "", REVIEW_TEXT, "", "What it could not account for:", ""]
        lines += [f"- `{_inline(line)}`" for line in review_lines(r)] + [""]
    if r.build and r.build.log_tail and r.build.status is not Status.PASS:
        lines += [f"## Build ({r.build.mode})", "", *_code(r.build.log_tail), ""]
    if r.cases:
        lines += ["## Cases", "", "| case | status |", "|---|---|"]
        lines += [f"| `{c.case}`{_hidden_tag(c)} | {_case_status(c)} |" for c in r.cases]
        lines.append("")
        for c in r.cases:
            if c.status not in (Status.PASS, Status.NOT_RUN) and c.message:
                lines += [f"### `{c.case}`: {c.status.value}", "", *_code(c.message), ""]
        if errors_withheld(r):
            lines += [ERRORS_WITHHELD, ""]
    if r.launched:
        case, launched = r.launched
        lines += [f"## Launched during one call on `{case}`", ""]
        lines += [f"- `{name}` × {count}" for name, count in launched] + [""]
    if r.timing:
        t = r.timing
        lines += ["## Timing", "", f"On `{r.timed_case}`: median {t.median_ms:.3f} ms "
                  f"({t.tflops:.1f} TFLOP/s); mean {t.mean_ms:.3f}, min {t.min_ms:.3f}, "
                  f"std {t.std_ms:.3f}, n = {t.n}.", ""]
    lines += [f"*{note}*" for note in r.notes]
    if r.hint:
        lines += ["", f"**Hint:** {r.hint}"]
    return "\n".join(lines).rstrip() + "\n"


def _inline(text: str) -> str:
    """Text for an inline code span: a backtick cannot end it early."""
    return text.replace("`", "'")


def _hidden_tag(c) -> str:
    return " (hidden)" if c.hidden and not c.case.startswith("hidden case") else ""


def _code(text: str) -> list[str]:
    fence = "```"
    while fence in text:
        fence += "`"
    return [fence, text.rstrip(), fence]
