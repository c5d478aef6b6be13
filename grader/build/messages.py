"""What a build says to the student about the machine: a course's grading machine (NOT_YOURS) or,
in a student's own check (StudentCheck), their machine (YOUR_MACHINE, machine_words); a check's
timeout that names the limit to raise (LIMIT_ENV, slow_build_message) and its progress line.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from grader.common import config


@dataclasses.dataclass(frozen=True)
class StudentCheck:
    """A build for a student's `check` (make check, python -m grader check) on their own machine,
    not for a course's `grade`. Its messages speak of this machine: a timeout says the machine
    may be slow or busy and names the limit to raise (slow_build_message), and is not tried
    again (a second try only doubles the wait); a missing tool is this machine's set-up. While
    it runs, `report` gets a line on what it is doing (progress_line) every `every_s` seconds:
    a terminal's live display updates one line in place (often), a log gets a line each time."""
    report: Callable[[str], None] | None = None
    every_s: float = config.BUILD_PROGRESS_S


# Said to the student whenever the machine, not the submission, failed.
NOT_YOURS = ("This is not your fault and it is not graded: the instructor fixes the machine and "
             "grades it again.")
# The same in a student's check, on their own machine: nobody else will fix it.
YOUR_MACHINE = ("It is this machine's set-up, not your code: make env sets it up again "
                "(scripts/bootstrap.sh); if that does not help, ask your instructor.")


def machine_words(student_check: StudentCheck | None) -> tuple[str, str]:
    """How a build's message names the machine, and what it says of the machine's fault: a
    course's grading machine (`grade`), or, in a student's check, their own."""
    if student_check is None:
        return "the grading machine", NOT_YOURS
    return "this machine", YOUR_MACHINE


# A check's limits, as a student raises them: Limits.from_env's variables for Limits.build_s and
# Limits.import_s, which `make check` passes on (make check GRADER_BUILD_S=900).
LIMIT_ENV = {"compile": "GRADER_BUILD_S", "import": "GRADER_IMPORT_S"}


def slow_build_message(what: str, limit_s: float, *, source_name: str, phase: str,
                       load: float) -> str:
    """A student's check whose compile (or a Python file's import) ran past its limit: what was
    running when it stopped, that this machine may be slow or busy, and the limit to raise, as
    a `make check` variable and as the environment variable python -m grader reads."""
    knob = LIMIT_ENV[what]
    more = max(900, -(-3 * int(limit_s) // 100) * 100)   # three times as long, at least 900 s
    # (a compile's hint, grader/report/hints.py, names what makes a compile itself slow)
    stuck = " If it never finishes, look at what your file runs when it is imported." \
        if what == "import" else ""
    return (f"the {what} of {source_name} did not finish in {limit_s:.0f} s"
            f"{f' (it was in: {phase})' if phase else ''}: this machine may be slow or busy (load "
            f"{load:.1f} per core when it began). Raise the limit: make check {knob}={more} (for "
            f"python -m grader check, the environment variable {knob}={more}).{stuck}")


def progress_line(what: str, source_name: str, phase: str, elapsed_s: float, limit_s: float) -> str:
    """'compiling submission.cu: ptxas, 42 s (limit 300 s: GRADER_BUILD_S)'."""
    doing = "compiling" if what == "compile" else "importing"
    return (f"{doing} {source_name}{f': {phase}' if phase else ''}, {elapsed_s:.0f} s "
            f"(limit {limit_s:.0f} s: {LIMIT_ENV[what]})")
