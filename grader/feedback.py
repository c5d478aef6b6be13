"""Student-facing text for one result: the failed stage, the case, the error against the
tolerance, a few bad indices, and the TODO to look at."""

from __future__ import annotations

from .results import SubmissionResult
from .status import Status


def feedback_text(r: SubmissionResult) -> str:
    lines = [f"{r.label}: {r.status.value.upper()}", f"  {r.message}"]
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
