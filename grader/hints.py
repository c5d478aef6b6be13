"""Where to look next: one student-facing hint from a result's stages and findings.

The TODO numbers are those of the kit's skeletons (student/submission.cu and, for the Python
track, student/triton/submission.py). Whether a TODO is still open is read from the code, never
from its label: a TODO is open while the code around it is still exactly the skeleton's (the
same code lines, nothing of the student's added in its place). Comments are ignored, so a label
kept above finished code, or a label deleted before the work is done, changes nothing.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import re
from pathlib import Path

from . import config
from .build import BuildResult
from .correctness import CaseResult
from .status import Status

# The pristine skeletons: grader/skeleton/ in the student release (scripts/release.py copies them
# there, because students edit student/ itself), student/ in the course's repository.
SKELETON_DIRS = (Path(__file__).resolve().parent / "skeleton", config.REPO_ROOT / "student")
SKELETON_FILES = {"cuda": ("submission.cu", "submission.cu"),
                  "python": ("submission.py", "triton/submission.py"),
                  "tilelang": ("tilelang_submission.py", "tilelang/submission.py"),
                  "cute": ("cute_submission.cu", "cute/submission.cu")}   # (in skeleton/, in student/)
_TILELANG = re.compile(r"^\s*(import|from)\s+tilelang\b", re.MULTILINE)
_CUTE = re.compile(r"^\s*#\s*include\s*[<\"]cute/", re.MULTILINE)   # the CuTe track's C++

_LABEL = re.compile(r"TODO\((\d+)(?:\.(\d+))?\):?")
QUOTE_CHARS = 300   # a quoted TODO: its whole text up to this length, else its first whole sentences


@dataclasses.dataclass(frozen=True)
class Todo:
    number: tuple[int, int]   # TODO(1.2) -> (1, 2)
    text: str                 # the TODO's whole text in the skeleton, on one line
    optional: bool            # its stage is optional (the skeleton says so)
    open: bool                # the code where it sits is still the skeleton's

    @property
    def label(self) -> str:
        return f"TODO({self.number[0]}.{self.number[1]})"

    @property
    def stage(self) -> int:
        return self.number[0]

    def quote(self) -> str:
        """The label and the TODO's text, cut only between whole sentences."""
        return f"{self.label}: {whole_sentences(self.text, QUOTE_CHARS)}"


# ---------------------------------------------------------------- reading code, not comments


@dataclasses.dataclass(frozen=True)
class _Line:
    code: str          # the code, comments removed, whitespace collapsed ('' for none)
    comment: str       # the comment text on this line ('' for none)
    level: int         # nesting: brace depth (C++) or indentation (Python) where the line starts


def _cpp_lines(source: str) -> list[_Line]:
    """Each physical line split into code and comment; strings and characters are respected."""
    out, depth, in_block, openers = [], 0, False, []
    for raw in source.splitlines():
        code, comment, i, quote = [], [], 0, ""
        while i < len(raw):
            ch, two = raw[i], raw[i:i + 2]
            if in_block:
                if two == "*/":
                    in_block, i = False, i + 2
                    code.append(" ")
                    continue
                comment.append(ch)
            elif quote:
                code.append(ch)
                if ch == "\\" and i + 1 < len(raw):
                    code.append(raw[i + 1])
                    i += 1
                elif ch == quote:
                    quote = ""
            elif two == "//":
                comment.append(raw[i + 2:])
                break
            elif two == "/*":
                in_block, i = True, i + 2
                continue
            else:
                if ch in "\"'":
                    quote = ch
                code.append(ch)
            i += 1
        text = " ".join("".join(code).split())
        closing = len(text) - len(text.lstrip("}"))
        level = depth - closing
        key = text
        if text:
            # A closing brace is known by the line that opened its block: alone, every `}` looks
            # alike, and the comparison could pair the skeleton's with any of the student's.
            stripped = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', "", text)
            for n, ch in enumerate(c for c in stripped if c in "{}"):
                if ch == "{":
                    openers.append(text)
                else:
                    opener = openers.pop() if openers else ""
                    if n == 0 and closing:
                        key = f"{text} <{opener}>"
            depth += stripped.count("{") - stripped.count("}")
        out.append(_Line(key, "".join(comment), level))
    return out


def _python_lines(source: str) -> list[_Line]:
    """Logical lines (a bracketed expression over several physical lines is one, at its first
    line), code and comment apart; the level is the indentation, Python's nesting. Source that
    does not tokenize is read line by line, '#' starting a comment."""
    import io
    import tokenize
    physical = source.splitlines()
    indent = [len(raw) - len(raw.lstrip()) for raw in physical]
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        out = []
        for row, raw in enumerate(physical):
            code, _, comment = raw.partition("#")
            text = " ".join(code.split())
            out.append(_Line(text, comment, indent[row]))
        return out
    code: dict[int, list[str]] = {}     # first row of a logical line -> its tokens
    comment: dict[int, str] = {}
    start = None
    skip = (tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER)
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            comment[tok.start[0] - 1] = tok.string[1:]
            continue
        if tok.type in skip:
            continue
        if tok.type == tokenize.NEWLINE:
            start = None
            continue
        if start is None:
            start = tok.start[0] - 1
        code.setdefault(start, []).append(tok.string)
    return [_Line(" ".join(code.get(row, [])), comment.get(row, ""), indent[row])
            for row in range(len(physical))]


def _is_python(source: str) -> bool:
    try:
        ast.parse(source)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):   # any text a student sends
        return False


# ---------------------------------------------------------------- the skeleton's TODOs


@dataclasses.dataclass(frozen=True)
class _Slot:
    """Where a TODO sits in the skeleton's code lines (indices into the code-only sequence)."""
    number: tuple[int, int]
    text: str
    optional: bool
    before: int | None     # the code line just above it (None: start of file)
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
            # its placeholder: code lines right below the block, up to a blank line, another
            # comment, or the line that closes its block (that one included)
            under, row, closes = [], last + 1, False
            while row < len(lines) and lines[row].code and not lines[row].comment.strip():
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
    return slots


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


# ---------------------------------------------------------------- the student's code against it


def todo_states(source: str, skeleton: str | None = None) -> list[Todo]:
    """Every TODO of the skeleton that `source` derives from, in order, open or not."""
    python = _is_python(source) if skeleton is None else _is_python(skeleton)
    if skeleton is None:
        skeleton = read_skeleton(track(source))
        if skeleton is None:
            return []
    parse = _python_lines if python else _cpp_lines
    skel_lines, stud_lines = parse(skeleton), parse(source)
    slots = _skeleton_slots(skel_lines, python)
    skel = [(l.code, l.level if python else 0) for l in skel_lines if l.code]
    stud = [(l.code, l.level if python else 0) for l in stud_lines if l.code]
    stud_levels = [l.level for l in stud_lines if l.code]
    ops = difflib.SequenceMatcher(None, skel, stud, autojunk=False).get_opcodes()
    kept = set()              # skeleton code lines the student still has, unchanged
    added: list[tuple[int, int, int]] = []   # (first, last) skeleton positions around, level
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":
            kept.update(range(i1, i2))
        else:
            added += [(i1, i2, stud_levels[j]) for j in range(j1, j2)]
    todos = []
    for slot in slots:
        todos.append(Todo(slot.number, slot.text, slot.optional, _still_skeleton(slot, slots, kept, added)))
    return sorted(todos, key=lambda t: t.number)


def _still_skeleton(slot: _Slot, slots: list[_Slot], kept: set[int], added) -> bool:
    first, last = slot.under
    if slot.inline:
        return first in kept
    # Its placeholder (or, where it has none, the line that follows it) is still there ...
    anchors = set(range(first, last)) | ({slot.after} if slot.after is not None else set())
    if not anchors <= kept:
        return False
    # ... and none of the student's code was added where it sits. Where several TODOs share
    # the place (code that replaces a placeholder ending one block may start the next one's),
    # an added line goes to the deepest TODO that its own nesting allows.
    for a1, a2, level in added:
        if not _overlaps(slot, a1, a2):
            continue
        here = [s for s in slots if not s.inline and _overlaps(s, a1, a2)]
        fits = [s.level for s in here if s.level <= level] or [min(s.level for s in here)]
        if slot.level == max(fits):
            return False
    return True


def _region(slot: _Slot) -> tuple[int, int]:
    """The positions (an insertion before skeleton code line p is at p) that are this TODO's:
    from just below the code line above it to its placeholder's end, not past a closing line."""
    lo = slot.before + 1 if slot.before is not None else 0
    hi = slot.under[1] - 1 if slot.closes else slot.under[1]
    return lo, max(lo, hi)


def _overlaps(slot: _Slot, a1: int, a2: int) -> bool:
    lo, hi = _region(slot)
    return a1 <= hi and a2 >= lo


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


def whole_sentences(text: str, limit: int) -> str:
    """`text` whole if it fits in `limit` characters, else as many whole sentences from its start
    as fit (at least one, however long). A sentence ends at . ! or ? before a space, not in an
    ellipsis or an abbreviation such as e.g."""
    if len(text) <= limit:
        return text
    ends = [m.end() for m in re.finditer(r"(?<!\.)(?<!\be\.g)(?<!\bi\.e)(?<!\betc)[.!?](?=\s)", text)]
    cut = max((e for e in ends if e <= limit), default=ends[0] if ends else len(text))
    return text[:cut]


# ---------------------------------------------------------------- the hint


def open_todos(source: str, skeleton: str | None = None) -> list[Todo]:
    """The TODOs a student should still do, in order: the open ones of the required stages,
    except a stage left untouched while a later one has been worked on (that version was skipped)."""
    todos = [t for t in todo_states(source, skeleton) if not t.optional]
    worked = {t.stage for t in todos if not t.open}
    return [t for t in todos if t.open and (t.stage in worked or not any(s > t.stage for s in worked))]


def first_open_todo(source: str, skeleton: str | None = None) -> str | None:
    """The first TODO of a required stage whose code is still the skeleton's, quoted whole."""
    todo = next(iter(open_todos(source, skeleton)), None)
    return todo.quote() if todo else None


def progress_hint(source: str, skeleton: str | None = None) -> str:
    """What a check that could not run the kernel can say: the first TODO still on the skeleton's
    code, with whole sentences of it, or that none of the required ones is; an optional stage is
    named as optional, never as open."""
    states = todo_states(source, skeleton)
    if not states:
        return ""
    required = open_todos(source, skeleton)
    if required:
        first = required[0]
        yours = [t.label for t in states if t.stage == first.stage and not t.open]
        mine = (f"Stage {first.stage} has your code where {_and(yours)} sit; the first TODO still "
                if yours else "The first TODO still ")
        return f"{mine}on the skeleton's code is {first.quote()}"
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
        return ("Nothing to change in your code: the grading machine lacked something it should "
                "have. Your submission will be graded again once the machine is fixed.")
    if build is not None and build.status is Status.BUILD_ERROR and build.mode == "none":
        return ("Nothing was compiled or run: fix what the message above names in your folder "
                "(its files, their names, or what the folder may not hold), then submit again.")
    if build is not None and build.status is Status.BUILD_ERROR:
        m = re.search(r"submission\.(cu|py):(\d+)", build.log_tail or "")
        where = f" at line {m.group(2)} of submission.{m.group(1)}" if m else ""
        return f"Fix the first error the compiler reports{where}; later errors often follow from it."
    if build is not None and build.status is Status.TIMEOUT:
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
