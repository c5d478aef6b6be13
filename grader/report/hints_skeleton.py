"""The kit's skeletons and their TODOs: which track a source is written for, where its pristine
skeleton is installed, and where each TODO sits in the skeleton's code lines (its place: the
statements around its comment, down to its placeholder)."""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

from grader.common import config
from grader.report.hints_code import _Line, _is_python


# The pristine skeletons: grader/skeleton/ in the student release (scripts/release.py copies them
# there, because students edit student/ itself), student/ in the course's repository.
SKELETON_DIRS = (config.GRADER_DIR / "skeleton", config.REPO_ROOT / "student")
SKELETON_FILES = {"cuda": ("submission.cu", "submission.cu"),
                  "python": ("submission.py", "triton/submission.py"),
                  "tilelang": ("tilelang_submission.py", "tilelang/submission.py"),
                  "cute": ("cute_submission.cu", "cute/submission.cu")}   # (in skeleton/, in student/)
_TILELANG = re.compile(r"^\s*(import|from)\s+tilelang\b", re.MULTILINE)
_CUTE = re.compile(r"^\s*#\s*include\s*[<\"]cute/", re.MULTILINE)   # the CuTe track's C++


@functools.lru_cache(maxsize=4)
def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def track(source: str) -> str:
    """The track a submission's source is written for: 'cuda', 'cute', 'python' (Triton) or
    'tilelang' (the keys of SKELETON_FILES and _REFS)."""
    if _is_python(source):
        return "tilelang" if _TILELANG.search(source) else "python"
    return "cute" if _CUTE.search(source) else "cuda"


def read_skeleton(kind: str) -> str | None:
    """The pristine skeleton of a track (track()), or None where none is installed."""
    for folder in SKELETON_DIRS:
        name = SKELETON_FILES[kind][0 if folder.name == "skeleton" else 1]
        text = _read(folder / name)
        if text is not None:
            return text
    return None


_LABEL = re.compile(r"TODO\((\d+)(?:\.(\d+))?\):?")


# ---------------------------------------------------------------- the skeleton's TODOs


@dataclasses.dataclass(frozen=True)
class _Slot:
    """Where a TODO sits in the skeleton's code lines (indices into the code-only sequence)."""
    number: tuple[int, int]
    text: str
    optional: bool
    before: int | None     # the code line above its place (None: start of file; _place_start)
    under: tuple[int, int]  # [first, last) code lines that are its placeholder (may be empty)
    after: int | None      # the code line that follows (None: end of file, or it has a placeholder)
    level: int             # its nesting level
    closes: bool           # its placeholder ends with the line that closes its block
    inline: bool           # written after code on the same line: that line is the whole TODO


def _skeleton_slots(lines: list[_Line], python: bool) -> list[_Slot]:
    code_index, n = {}, 0
    for row, line in enumerate(lines):
        if line.code:
            code_index[row] = n
            n += 1
    blocks = _comment_blocks(lines)
    slots = []
    for rows, text in blocks:
        labels = list(_LABEL.finditer(text))
        if not labels:
            continue
        optional = "optional" in text[:labels[0].start()].lower() or "(optional)" in text.lower()
        first, last = rows[0], rows[-1]
        inline = bool(lines[first].code)
        for k, m in enumerate(labels):
            number = (int(m.group(1)), int(m.group(2) or 0))
            if number[0] == 0:   # TODO(0): the boilerplate, nothing to do
                continue
            end = labels[k + 1].start() if k + 1 < len(labels) else len(text)
            body = _todo_text(text[m.end():end])
            if inline:
                i = code_index[first]
                slots.append(_Slot(number, body, optional, None, (i, i + 1), None,
                                   lines[first].level, False, True))
                continue
            before = max((code_index[r] for r in code_index if r < first), default=None)
            level = lines[first].level if python else _depth_at(lines, first)
            # its placeholder: code lines right below the block, up to a blank line, a comment
            # line, another TODO, or the line that closes its block (that one included)
            under, row, closes = [], last + 1, False
            while row < len(lines) and lines[row].code and not _LABEL.search(lines[row].comment):
                under.append(code_index[row])
                if _closes(lines[row], level, python):
                    closes = True
                    break
                row += 1
            after = None
            if not under:
                after = min((code_index[r] for r in code_index if r > last), default=None)
                under_range = (after, after) if after is not None else (n, n)
            else:
                under_range = (under[0], under[-1] + 1)
            slots.append(_Slot(number, body, optional, before, under_range, after, level, closes,
                               False))
    return [dataclasses.replace(slot, before=_place_start(slot, slots, lines, python))
            if not slot.inline else slot for slot in slots]


def _place_start(slot: _Slot, slots: list[_Slot], lines: list[_Line], python: bool) -> int | None:
    """The code line above the TODO's place. Its place reaches up over the plain statements of
    its own block (a student may write the TODO's code above one of them, or move one below it),
    to the line that opens the block, closes a block, or belongs to another TODO."""
    code = [line for line in lines if line.code]
    levels = [line.level for line in code]
    others = set()
    for other in slots:
        if other is not slot:
            others.update(range(*other.under))
    before = slot.before
    while before is not None and levels[before] == slot.level and before not in others \
            and not (before + 1 < len(code) and levels[before + 1] > levels[before]) \
            and not (not python and code[before].code.startswith("}")):
        before = before - 1 if before > 0 else None
    return before


def _comment_blocks(lines: list[_Line]) -> list[tuple[list[int], str]]:
    """Runs of comment lines (a trailing comment starts one) with their text joined, a rule of
    dashes or an empty comment line ending a run."""
    blocks, rows, parts = [], [], []

    def flush():
        if rows:
            blocks.append((list(rows), " ".join(" ".join(parts).split())))
        rows.clear()
        parts.clear()

    for row, line in enumerate(lines):
        body = line.comment.strip()
        is_rule = bool(body) and set(body) <= set("-=*/ ")
        if not body or is_rule or (line.code and rows):
            flush()
            if body and not is_rule and line.code:
                rows.append(row)
                parts.append(body)
            continue
        rows.append(row)
        parts.append(body)
    flush()
    return blocks


def _todo_text(text: str) -> str:
    return " ".join(text.split()).strip()


def _depth_at(lines: list[_Line], row: int) -> int:
    """Brace depth at a comment-only line: where the next code line starts, before it closes
    anything."""
    for line in lines[row:]:
        if line.code:
            closing = len(line.code) - len(line.code.lstrip("}"))
            return line.level + closing
    return 0


def _closes(line: _Line, level: int, python: bool) -> bool:
    if python:
        return line.level < level
    return line.code.startswith("}")
