"""Student-facing text for one result: the failed stage, the case, the error against the
tolerance, a few bad indices, and the TODO to look at; for a `review` result, that it waits for
an instructor (not a cheating verdict) and the lines of its own code the audit named."""

from __future__ import annotations

from .results import SubmissionResult
from .status import Status

REVIEW_HEADING = "Waiting for an instructor's review"
REVIEW_TEXT = ("Your submission passed its cases, but it uses code the grader cannot account for, "
               "so it is not ranked and earns no performance points until an instructor has looked "
               "at it. This is not a cheating verdict: an instructor will clear it (it then ranks "
               "with the time it was measured at) or tell you why not. To rank without waiting, use "
               "only what a kernel wrapper needs (the kernel language, tensors and their shapes, "
               "math).")


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


def feedback_text(r: SubmissionResult) -> str:
    lines = [f"{r.label}: {r.status.value.upper()}", f"  {r.message}"]
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
            lines.append(f"  {'PASS' if c.status is Status.PASS else c.status.value:14} {c.case}{tag}")
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
    lines = [f"# {r.label}: `{r.status.value}`", "", r.message, ""]
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
        lines += [f"| `{c.case}`{_hidden_tag(c)} | {c.status.value} |" for c in r.cases]
        lines.append("")
        for c in r.cases:
            if c.status not in (Status.PASS, Status.NOT_RUN) and c.message:
                lines += [f"### `{c.case}`: {c.status.value}", "", *_code(c.message), ""]
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
