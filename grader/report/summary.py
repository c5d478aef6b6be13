"""What a grading run leaves to do, for the instructor at a terminal and for a script that runs
`make grade && upload`: the run's exit status (`exit_status`, the one decision that `grade` and
the Slurm head share), and the few lines printed after the leaderboard (`outcome_text` of
`run_outcome`): the counts, the roster's students with no submission and the submissions not on
it, the spread of the scores, what waits for an instructor's review, what was read from another
grader version's file, and what has no final verdict with the command that regrades just that.
The lists, whole, are kept in _summary.json ("outcome"); the terminal shows the first few.

Reads results only (the layers of docs/design.md): the scores come from rows.build_rows, as the
page and grades.csv have them; every reason shown is scrubbed of hidden cases (privacy.Redactor).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import statistics
import sys
from pathlib import Path

from grader.common.status import Status
from grader.course.policy import Policy
from grader.course.results import SubmissionResult, read_gpu_copies
from grader.course.review import load_decisions, review_queue
from grader.course.roster import Roster, join, load_roster
from grader.report.privacy import Redactor
from grader.report.rows import Row, build_rows, counts_line, reported, run_gpus, why_no_grades

# The exit status of `python -m grader grade` (and `make grade`), local or on Slurm.
EXIT_OK = 0              # every entry of the run has a final verdict (review pending included)
EXIT_USAGE = 2           # a usage or configuration error: nothing was graded
EXIT_STOPPED = 3         # stopped: a GPU failed its health check, or a Slurm task was lost
EXIT_NOT_FINAL = 4       # finished, but some entries have no final verdict: regrade them
EXIT_INTERRUPTED = 130   # Ctrl-C or SIGTERM
# The grading side's failures: not a verdict on the submission, graded again by the next run.
NOT_FINAL = (Status.ENVIRONMENT_ERROR, Status.NO_RESULT)
SUMMARY_FILE = "_summary.json"   # where the whole lists are (pages.write_reports writes it)
SHOWN = 5                # names on one line before "and N more"
REASON_CHARS = 100       # a reason's length on the terminal


def not_final(results: list[SubmissionResult]) -> list[SubmissionResult]:
    """The run's entries (students and baselines) with no final verdict: the grading machine
    failed on them (environment_error), there is no usable result (no_result), or what was read
    of another grader version's file cannot be scored (its cases or timing lost: `partial`)."""
    return [r for r in results if r.status in NOT_FINAL or r.no_result or r.partial]


def exit_status(code: int, results: list[SubmissionResult]) -> int:
    """The exit status of a grading run that ended with `code` (0, EXIT_STOPPED or
    EXIT_INTERRUPTED, kept as they are): EXIT_NOT_FINAL when an entry has no final verdict.
    A submission that waits for review has one: the instructor's decision is not a regrade."""
    if code:
        return code
    return EXIT_NOT_FINAL if not_final(results) else EXIT_OK


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a run leaves to do (run_outcome), as lists of ids."""
    counts: str                                  # rows.counts_line, the roster's missing included
    scores: str                                  # the spread of the scores (score_spread)
    times: str                                   # the spread of the ranked times ('' if none)
    on_roster: int | None                        # students on the roster (None: no roster)
    missing: tuple[str, ...]                     # roster folders with no submission
    not_on_roster: tuple[str, ...]
    review: tuple[str, ...]                      # waiting for an instructor's review
    other_version: tuple[tuple[str, str], ...]   # (id, note): read from another grader version
    regrade: tuple[tuple[str, str, str], ...]    # (id, status, reason): no final verdict
    command: str                                 # the command that regrades just those ('' if none)

    def to_dict(self) -> dict:
        return dict(final=not self.regrade, counts=self.counts, scores=self.scores,
                    times=self.times, on_roster=self.on_roster, missing=list(self.missing),
                    not_on_roster=list(self.not_on_roster), review=list(self.review),
                    other_version=[dict(id=i, note=n) for i, n in self.other_version],
                    regrade=[dict(id=i, status=s, reason=w) for i, s, w in self.regrade],
                    regrade_command=self.command)


def run_outcome(out_dir: Path, results: list[SubmissionResult], run: dict, *,
                policy: Policy | None = None, roster: Path | Roster | None = None,
                copies: list[SubmissionResult] | None = None) -> Outcome:
    """What the run in `out_dir` leaves to do, from its results as read (the review decisions
    are applied here, as every report applies them)."""
    roster = load_roster(roster) if isinstance(roster, (str, Path)) else roster
    if copies is None:
        copies = read_gpu_copies(out_dir, run) if run_gpus(run) else []
    rows = build_rows(reported(out_dir, results), run=run, policy=policy, gpu_copies=copies)
    students = [row for row in rows if row.result.role == "student"]
    joined = join(roster, students) if roster else None
    redactor = Redactor.for_run(run)
    regrade = tuple((r.id, r.status.value, _reason(r, redactor)) for r in not_final(results))
    again = {id for id, _, _ in regrade}
    return Outcome(
        counts=counts_line(rows, len(joined.missing) if joined else 0),
        **dict(zip(("scores", "times"), score_spread(students, run))),
        on_roster=len(joined.matched) if joined else None,
        missing=tuple(s.folder for s in joined.missing) if joined else (),
        not_on_roster=tuple(row.result.id for row in joined.extra) if joined else (),
        review=tuple(waiting_for_review(out_dir, results)),
        other_version=tuple((r.id, r.version_note) for r in results
                            if r.version_note and r.id not in again),
        regrade=regrade,
        command=regrade_command(run.get("command", ""), [id for id, _, _ in regrade],
                                out_dir=out_dir) if regrade else "")


def waiting_for_review(out_dir: Path, results: list[SubmissionResult]) -> list[str]:
    """The submissions that wait for an instructor's review before they rank: a `review`
    result with no decision, or one whose decision was made on another source."""
    return [e.id for e in review_queue(results, load_decisions(out_dir), top=0, with_source=False)
            if e.pending and (e.graded is Status.REVIEW or e.stale)]


def score_spread(students: list[Row], run: dict) -> tuple[str, str]:
    """('10 scored (of 45.00): min 12.50 · median 40.00 · max 45.00', '8 ranked, median ms:
    fastest ... · median ... · slowest ...'): the rows' own scores and times (build_rows, by the
    policy, as the page and grades.csv have them), never recomputed."""
    scored = sorted(row.score.total for row in students if row.score is not None)
    times = sorted(row.result.timing.median_ms for row in students if row.rank)
    if scored:
        top = next(row.score.max_total for row in students if row.score is not None)
        line = (f"{len(scored)} scored (of {top:.2f}): min {scored[0]:.2f} · median "
                f"{statistics.median(scored):.2f} · max {scored[-1]:.2f}")
    else:
        why = why_no_grades(run)
        line = f"none ({re.split(r',| [(]', why)[0]})" if why else "none scored"
    ranked = (f"{len(times)} ranked, median ms: fastest {times[0]:.3f} · median "
              f"{statistics.median(times):.3f} · slowest {times[-1]:.3f}") if times else ""
    return line, ranked


def _reason(r: SubmissionResult, redactor: Redactor) -> str:
    """The first line of a result's verdict, with no hidden case in it, cut to one line."""
    line = (redactor.verdict(r).splitlines() or [r.status.description])[0]
    return line if len(line) <= REASON_CHARS else line[:REASON_CHARS - 1] + "…"


def regrade_command(command: str, ids: list[str], *, out_dir: Path,
                    python: str = sys.executable) -> str:
    """The command that regrades just `ids`: the run's own `grade` command line (the run file's
    'command': the same submissions, --out and options), its --only and --force replaced by
    --only IDS; `grade --out OUT --only IDS` when the run file holds no grade command."""
    try:
        argv = shlex.split(command or "")
    except ValueError:
        argv = []
    if "grade" in argv:
        argv = argv[argv.index("grade"):]
    else:
        argv = ["grade", "--out", str(out_dir)]
    kept, skipping = [], False
    for arg in argv:
        if skipping and not arg.startswith("-"):
            continue   # an id of the run's own --only
        skipping = arg == "--only"
        if arg in ("--only", "--force") or arg.startswith("--only="):
            continue
        kept.append(arg)
    return shlex.join([python, "-m", "grader", *kept, "--only", *ids])


def _listed(names, out_dir: Path) -> str:
    names = list(names)
    shown = ", ".join(names[:SHOWN])
    if len(names) > SHOWN:
        shown += f" and {len(names) - SHOWN} more (see {out_dir / SUMMARY_FILE})"
    return shown


def outcome_text(outcome: Outcome, *, out_dir: Path, code: int | None = None) -> str:
    """The lines printed after the leaderboard; the last ones list what has no final verdict
    and the command that regrades just that. `code`: a grading run's exit status (None: a
    re-render, `leaderboard`, which exits 0 whatever it finds)."""
    lines = ["", f"summary of the run in {out_dir}:", f"  statuses: {outcome.counts}"]
    if outcome.on_roster is not None:
        extra = outcome.not_on_roster
        lines.append(f"  roster:   {len(outcome.missing)} of {outcome.on_roster} students with no "
                     f"submission" + (f": {_listed(outcome.missing, out_dir)}" if outcome.missing else "")
                     + (f"; not on the roster: {_listed(extra, out_dir)}" if extra else
                        "; every submission is on the roster"))
    lines.append(f"  scores:   {outcome.scores}")
    if outcome.times:
        lines.append(f"  times:    {outcome.times}")
    if outcome.review:
        lines.append(f"  review:   {len(outcome.review)} wait(s) for an instructor's review (not "
                     f"a missing verdict): {_listed(outcome.review, out_dir)}; "
                     f"python -m grader review --out {shlex.quote(str(out_dir))}")
    if outcome.other_version:
        lines.append(f"  version:  {len(outcome.other_version)} result(s) read from another grader "
                     f"version's file, shown as read: "
                     f"{_listed([i for i, _ in outcome.other_version], out_dir)}; regrade with "
                     f"--only ID to refresh")
    exit = f" (exit status {code})" if code is not None else ""
    if not outcome.regrade:
        lines.append(f"every entry has a final verdict{exit}")
        return "\n".join(lines)
    lines.append(f"NO FINAL VERDICT for {len(outcome.regrade)} entr"
                 f"{'ies' if len(outcome.regrade) != 1 else 'y'}{exit}, through no fault of "
                 f"the submissions (the grading side failed, or the result is missing or unreadable):")
    width = max(len(id) for id, _, _ in outcome.regrade[:SHOWN])
    lines += [f"  {id:{width}}  {st:17}  {why}" for id, st, why in outcome.regrade[:SHOWN]]
    if len(outcome.regrade) > SHOWN:
        lines.append(f"  and {len(outcome.regrade) - SHOWN} more (see {out_dir / SUMMARY_FILE})")
    lines.append(f"regrade just these: {outcome.command}")
    return "\n".join(lines)
