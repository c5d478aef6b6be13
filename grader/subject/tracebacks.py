"""What the harness is told of an error in the subject: its type, message and traceback, the
traceback cut to the frames of the student's own files (student_traceback), never the grader's
or a library's, with the line where it was raised marked. Runs inside the subject."""

from __future__ import annotations

import os
import traceback
from pathlib import Path


# What marks the line where the error was raised. It names the error in words because the build
# stage keeps an import check's output only around lines that do (build/log.relevant_log): a
# SyntaxError's source line and caret follow its "File" line.
RAISED_HERE = "  <- the error is here"
GRADER_CODE = Path(__file__).resolve().parents[1]   # grader/: never the student's code


def student_traceback(e: BaseException, folder: Path, frames: int = 30) -> str:
    """`e` as Python prints it (its chain, a SyntaxError's source line and caret), keeping only
    the frames of files in `folder`, the submission's, each named by its path there
    ("submission.py", "utils/tiles.py"): the student's own code, never the grader's (this file,
    importlib's frames) or a library's. At most the innermost `frames` frames of each exception;
    the line where the last one was raised is marked (RAISED_HERE)."""
    te = traceback.TracebackException.from_exception(e)
    for part in _chain(te):
        part.stack = traceback.StackSummary.from_list(
            [f for f in part.stack if _in_folder(f, folder)][-frames:])
        if part.exc_type is not None and issubclass(part.exc_type, SyntaxError):
            part.filename = _relative(part.filename, folder) or part.filename
    text = "".join(te.format())
    if isinstance(e, SyntaxError) and te.lineno is not None:
        place = f"{te.filename or '<string>'}, line {te.lineno}"
        if te.msg and text.endswith(f": {te.msg}\n"):   # the line a verdict quotes: as str(e)
            text = f"{text[:-1]} ({place})\n"
        raised = f'  File "{te.filename or "<string>"}", line {te.lineno}\n'
    elif te.stack:
        f = te.stack[-1]
        raised = f'  File "{f.filename}", line {f.lineno}, in {f.name}\n'
    else:   # none of the student's code on the way (a CUDA extension's error): the error alone
        return text
    at = text.rfind(raised)
    return text if at < 0 else f"{text[:at]}{raised[:-1]}{RAISED_HERE}\n{text[at + len(raised):]}"


def _chain(te: traceback.TracebackException):
    """`te` and every exception printed with it: its cause, its context, a group's members."""
    seen, todo = set(), [te]
    while todo:
        part = todo.pop()
        if id(part) in seen:
            continue
        seen.add(id(part))
        yield part
        todo += [p for p in (part.__cause__, part.__context__) if p is not None]
        todo += getattr(part, "exceptions", None) or []


def _relative(filename: str | None, folder: Path) -> str:
    """`filename`'s path in `folder` ('' when it is elsewhere, or no file at all: '<string>',
    '<frozen importlib._bootstrap>')."""
    if not filename or not os.path.isabs(filename):
        return ""
    try:   # any name a code object was compiled with: a loop of links, a NUL
        path = Path(filename).resolve()
    except (OSError, RuntimeError, ValueError):
        return ""
    if path.is_relative_to(GRADER_CODE) or not path.is_relative_to(folder):
        return ""
    return str(path.relative_to(folder))


def _in_folder(frame: traceback.FrameSummary, folder: Path) -> bool:
    """Whether `frame` is in the submission's code; it is then named by its path there (its
    source line was read when the exception was captured)."""
    where = _relative(frame.filename, folder)
    if where:
        frame.filename = where
    return bool(where)


def _error(e: BaseException, folder: Path | None) -> dict:
    """What the harness is told of an error: its type, its message and its traceback, which for
    a submission holds the student's own frames only (student_traceback)."""
    text = (student_traceback(e, folder) if folder is not None
            else traceback.format_exc(limit=8))
    return dict(error=type(e).__name__, message=str(e)[:4000], traceback=text[-6000:])
