"""Where to look next: one student-facing hint from a result's stages and findings.

The TODO numbers are those of the kit's skeletons (student/submission.cu and, for the Python
track, student/triton/submission.py). Whether a TODO is done is read from what the code does,
never from comments. Each TODO has a place in the skeleton: the statements of its block around
its comment, down to its placeholder. The student's code lines are paired with the skeleton's
(a longest common subsequence), and those of the student's own that sit in a TODO's place are
its code. The TODO is done when that code does what it asks, which _DOES spells out per TODO
(the names its work cannot do without: TODO(1.2) of the CUDA skeleton updates m_i and l_i).
Several TODOs often share one place (one comment block above one placeholder): code there closes
only the TODOs whose work it does. A label kept above finished code, or deleted before the work
is done, changes nothing; nor does deleting a placeholder. A TODO whose place is no longer in
the code (rewritten around it) is neither open nor done: no hint names it. The reading lives
in hints_code.py (code apart from comments), hints_skeleton.py (the skeletons and their TODOs'
places) and hints_todos.py (the student's code against them, and _DOES).
"""

from __future__ import annotations

import re

from grader.common.status import Status
from grader.course.verdicts import BuildResult, CaseResult
from grader.report.hints_skeleton import track
from grader.report.hints_todos import Todo, todo_states


# ---------------------------------------------------------------- the hint


def open_todos(source: str, skeleton: str | None = None) -> list[Todo]:
    """The TODOs a student should still do, in order: the open ones of the required stages,
    except a stage left untouched while a later one has been worked on (that version was skipped)."""
    return _still_to_do(todo_states(source, skeleton))


def _still_to_do(todos: list[Todo]) -> list[Todo]:
    required = [t for t in todos if not t.optional]
    worked = {t.stage for t in required if t.done}
    return [t for t in required
            if t.open and (t.stage in worked or not any(s > t.stage for s in worked))]


def first_open_todo(source: str, skeleton: str | None = None) -> str | None:
    """The first TODO of a required stage whose work the code does not do yet, quoted whole."""
    todo = next(iter(open_todos(source, skeleton)), None)
    return todo.quote() if todo else None


def progress_hint(source: str, skeleton: str | None = None) -> str:
    """What a check that could not run the kernel can say: the first TODO whose work the code does
    not do yet, with whole sentences of it, and those of its stage it does; or that none of the
    required ones is left; an optional stage is named as optional, never as open."""
    states = todo_states(source, skeleton)
    if not states:
        return ""
    required = _still_to_do(states)
    if required:
        first = required[0]
        yours = [t.label for t in states if t.stage == first.stage and t.done]
        if yours:
            return (f"Stage {first.stage} has your code for {_and(yours)}; the first TODO your "
                    f"code does not do yet is {first.quote()}")
        return f"The first TODO still on the skeleton's code is {first.quote()}"
    stages = sorted({t.stage for t in states if not t.optional})
    text = (f"No TODO of stage{'s' if len(stages) > 1 else ''} {_and(map(str, stages))} is still "
            f"on the skeleton's code; only a run shows whether your kernel is right.")
    optional = [t for t in states if t.optional]
    if optional and all(t.open for t in optional):
        text += (f" Stage {optional[0].stage} is optional: if you want the speed, it starts at "
                 f"{optional[0].quote()}")
    return text


def _and(items) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# Which TODO each kind of mistake points at, per track (the Triton skeleton has stage 1 only).
_REFS = {
    "cuda": dict(inputs="TODO(0)", scores="TODO(1.1)", output="TODO(1.4)", max="TODO(1.2), TODO(2.2)",
                 rescale="TODO(1.2), TODO(2.3)", tails="TODO(2.4)", tail_keys="TODO(2.1)",
                 scale="TODO(1.1)", divide="TODO(1.4)"),
    "python": dict(inputs="custom_kernel", scores="TODO(1.1)", output="TODO(1.4)", max="TODO(1.2)",
                   rescale="TODO(1.2)", tails="TODO(1.2), TODO(1.4)", tail_keys="TODO(1.1)",
                   scale="TODO(1.1)", divide="TODO(1.4)"),
    "tilelang": dict(inputs="custom_kernel", scores="TODO(1.2)", output="TODO(1.5)", max="TODO(1.3)",
                     rescale="TODO(1.3), TODO(1.4)", tails="TODO(1.2)", tail_keys="TODO(1.2)",
                     scale="TODO(1.3)", divide="TODO(1.5)"),
    "cute": dict(inputs="flash_attention_forward", scores="TODO(1.2)", output="TODO(1.5)",
                 max="TODO(1.2)", rescale="TODO(1.3)", tails="TODO(1.1), TODO(1.5)",
                 tail_keys="TODO(1.1)", scale="TODO(1.2)", divide="TODO(1.5)"),
}


def hint_for(build: BuildResult | None, cases: list[CaseResult], source: str | None = None) -> str:
    ref = _REFS[track(source) if source is not None else "cuda"]
    if build is not None and build.status is Status.ENVIRONMENT_ERROR:
        if build.students_machine:   # a student's check: the message names what to install
            return ("Nothing to change in your code: this machine lacks something the kit's "
                    "set-up installs. Do what the message above says, then check again.")
        return ("Nothing to change in your code: the grading machine lacked something it should "
                "have. Your submission will be graded again once the machine is fixed.")
    if build is not None and build.status is Status.BUILD_ERROR and build.mode == "none":
        return ("Nothing was compiled or run: fix what the message above names in your folder "
                "(its files, their names, or what the folder may not hold), then submit again.")
    if build is not None and build.status is Status.BUILD_ERROR and build.mode == "import":
        return _import_hint(build, source)
    if build is not None and build.status is Status.BUILD_ERROR:
        m = re.search(r"submission\.(cu|py):(\d+)", build.log_tail or "")
        where = f" at line {m.group(2)} of submission.{m.group(1)}" if m else ""
        return f"Fix the first error the compiler reports{where}; later errors often follow from it."
    if build is not None and build.status is Status.TIMEOUT:
        if build.students_machine:   # a student's check: the message names the limit to raise
            return ("Your code need not be wrong: the build ran out of time on this machine, which "
                    "may be slow or busy. Raise the limit as the message above says and check "
                    "again; if it still runs long, look for huge unrolled loops or templates.")
        return "The build ran past its time limit: look for huge unrolled loops or templates."
    ran = [c for c in cases if c.status is not Status.NOT_RUN]
    if not ran and source is not None:
        progress = progress_hint(source)
        if not progress:
            return ""
        compiled = [c for c in cases if "TileLang lowered" in c.message]
        if compiled:   # subject/loop.py: compiled for the course GPU, not launched
            arch = re.search(r"for (sm_\w+)", compiled[0].message)
            why = (f"TileLang lowered your kernel to CUDA and nvcc compiled it for "
                   f"{arch.group(1) if arch else 'the course GPU'} on {len(compiled)} small "
                   f"case{'s' if len(compiled) > 1 else ''}; none of them ran (TileLang has no CPU "
                   f"interpreter), so whether it is right, or fast, needs a GPU")
        elif any("too large for the CPU" in c.message for c in cases):
            why = "No case here is small enough for the CPU, so nothing was checked"
        elif cases and all("no CUDA device" in c.message for c in cases):
            why = "Correctness is not checked without a CUDA device"
        else:
            why = "No case ran"
        return f"{why}. {progress}"
    failed = [c for c in ran if c.status is not Status.PASS]
    if not failed:
        return ""
    hint = _failure_hint(failed[0], ran, ref)
    if source is not None and len(failed) == len(ran) and open_todos(source):
        hint = f"{hint} {progress_hint(source)}"   # nothing passes yet: where the work stands
    return hint


def _import_hint(build: BuildResult, source: str | None) -> str:
    """A Python submission (Triton, TileLang) that did not import. Python, not a compiler, read
    it: a syntax error is found in its text (the import's log keeps the traceback's first lines,
    not always the line), any other error is what its import raised."""
    error = _syntax_error(source) if source is not None else None
    if error is not None:
        line, what = error
        return (f"Python cannot read submission.py: a syntax error at line {line} ({what}). Fix "
                f"the syntax there, or just above it (an unclosed bracket, a missing colon).")
    m = re.search(r'submission\.py", line (\d+)|submission\.py:(\d+)', build.log_tail or "")
    line = m.group(1) or m.group(2) if m else None
    if re.search(r"\b(?:Syntax|Indentation|Tab)Error\b", build.message):
        where = f"at line {line}" if line else "(the message above names the line)"
        return f"Python cannot read submission.py: a syntax error {where}. Fix the syntax there."
    where = f" at line {line} of submission.py" if line else ""
    return f"Importing submission.py raised an error{where}: fix what the message above names."


def _syntax_error(source: str) -> tuple[int, str] | None:
    """(line, Python's words) of the first syntax error in `source`, or None. Compiling runs
    nothing."""
    import warnings
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")      # an invalid escape is a warning, not the error
            compile(source, "submission.py", "exec", dont_inherit=True)
    except SyntaxError as e:
        return (e.lineno or 1, e.msg)
    except (ValueError, RecursionError, MemoryError):   # any text a student sends
        return None
    return None


def _failure_hint(first: CaseResult, ran: list[CaseResult], ref: dict) -> str:
    """What the first failing case's kind of failure most often means, and the TODO to look at."""
    if first.status is Status.TIMEOUT:
        return (f"Case {first.case} ran past the time limit: check loop bounds (an infinite loop "
                f"or a __syncthreads() that not every thread reaches), then speed.")
    if first.status is Status.RUNTIME_ERROR:
        if "CUDA error" in first.message or "SIGSEGV" in first.message:
            return ("A CUDA error in your kernel, most often an access outside Q, K, V or O: check "
                    "your index arithmetic and the tail guards when seq_len is not a multiple of "
                    f"your tile ({ref['tails']}). Run it under compute-sanitizer to find the line.")
        if first.hidden:   # its message is withheld from students (grader/report/privacy.py)
            return (f"The call raised an error on a hidden case, whose message is not shown: run "
                    f"make check to see the error on the public cases, then the input checks "
                    f"({ref['inputs']}).")
        return f"The call raised an error: read the message above, then the input checks ({ref['inputs']})."
    finding = first.finding
    if finding is None:
        return ""
    if finding.problem:
        return f"Return O with the same shape as Q, dtype float16 ({ref['inputs']})."
    if finding.all_zero:
        return (f"O is all zeros: nothing was written to it. Start with {ref['scores']} (the scores) "
                f"and {ref['output']} (writing the output).")
    if finding.nan_count or finding.inf_count:
        return (f"NaN or inf in O: subtract the running max m_i before exponentiating ({ref['max']}), "
                f"and give keys past the end weight zero, never garbage ({ref['tail_keys']}).")
    passed = [c for c in ran if c.status is Status.PASS]
    if passed:
        return (f"Some cases pass but {first.case} does not: check the rescaling of acc and l_i by "
                f"exp(m_old - m_new) when a new key raises the max ({ref['rescale']}), and "
                f"the tails when seq_len is not a multiple of the tile ({ref['tails']}).")
    return ("Every case is wrong: compare one row by hand with the reference: the scale "
            f"1/sqrt(D) ({ref['scale']}), then the division by l_i ({ref['divide']}).")
