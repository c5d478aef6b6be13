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
the code (rewritten around it) is neither open nor done: no hint names it.
"""

from __future__ import annotations

import ast
import bisect
import dataclasses
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
    # 'open': its place is in the code and nothing there does its work yet; 'done': code there
    # does; 'gone': the skeleton's lines around its place are not in the code (rewritten, or
    # code that shares nothing with the skeleton): nothing can be said of it
    state: str

    @property
    def open(self) -> bool:
        return self.state == "open"

    @property
    def done(self) -> bool:
        return self.state == "done"

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
    out, depth, in_block, openers, statement = [], 0, False, [], ""
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
            # A closing brace is known by the statement that opened its block (all its lines: a
            # kernel's signature ends alike in every kernel): alone, every `}` looks alike, and
            # the comparison could pair the skeleton's with any of the student's.
            statement = f"{statement} {text}".strip()
            stripped = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', "", text)
            for n, ch in enumerate(c for c in stripped if c in "{}"):
                if ch == "{":
                    openers.append(statement)
                else:
                    opener = openers.pop() if openers else ""
                    if n == 0 and closing:
                        key = f"{text} <{opener}>"
            depth += stripped.count("{") - stripped.count("}")
            if text.endswith((";", "{", "}")) or text.startswith("#"):
                statement = ""
        out.append(_Line(key, "".join(comment), level))
    # `template <int D>` alone is every template's first line: it is known by the next one
    code_rows = [row for row, line in enumerate(out) if line.code]
    for row, nxt in zip(code_rows, code_rows[1:]):
        if re.fullmatch(r"template\s*<.*>", out[row].code):
            out[row] = dataclasses.replace(out[row], code=f"{out[row].code} {out[nxt].code}")
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


# ---------------------------------------------------------------- what each TODO's code does


# Per track, per TODO: what the student's code in the TODO's place must hold for the TODO to be
# done, every entry of it: a name the work cannot do without ('a|b': either), as a whole word, or
# a pattern. Kept to what any correct solution writes there, whatever else it names its own: the
# score of CUDA's TODO(1.1) reads a row of K (q may have been loaded before the loop), TODO(1.2)
# updates m_i and l_i, TODO(1.3) adds p v_j to acc. A TODO's entry must name something the other
# TODOs of its place do not need, or code for one of them would close it too.
_COMPARES_S = re.compile(r"[<>]=?\s*S\b|\bS\s*[<>]")       # a row or key checked against S
_MMA = re.compile(r"\bw?mma")                                 # mma.sync, wmma::mma_sync, mma_...
_EXP = re.compile(r"\b(?:__)?h?2?exp2?f?\s*\(|\bex2\.approx")  # expf, __expf, exp2f, hexp2, ...
# a float computed in the kernel (not a constant) converted to half
_TO_HALF = re.compile(r"(?:__float2half(?:_rn)?|static_cast\s*<\s*(?:__)?half\s*>)\s*\(\s*"
                      r"(?![-+]?[\d.]+f?\s*\))|__floats?2half2|__float22half2")
_DOES: dict[str, dict[tuple[int, int], tuple[str | re.Pattern, ...]]] = {
    "cuda": {
        (1, 1): ("k|K",),                    # s = q · k_j
        (1, 2): ("m_i", "l_i"),
        (1, 3): ("acc", "v|V"),              # acc gains p v_j
        (1, 4): ("o|O", "l_i"),              # o = acc / l_i
        (2, 0): ("KERNEL_VERSION",),         # its own line, changed
        (2, 1): ("k_s", "v_s"),              # the tile's copy
        (2, 2): ("k_s", "m_i"),              # the scores of q_s with k_s, the max
        (2, 3): ("l_i", "v_s"),              # l_i, and acc gains p_j v_s[j]
        (2, 4): (_COMPARES_S,),              # rows past S not written
        (2, 5): ("o|O", "l_i"),
        (3, 1): (_MMA,),                     # the optional stage's kernel, written below its TODOs
        (3, 2): (_EXP,),
        (3, 3): (_MMA, _TO_HALF),            # P as fp16 into the second MMA
    },
    "python": {                              # Triton
        (1, 1): ("q",),                      # tl.dot(q, k)
        (1, 2): ("m_i", "l_i"),
        (1, 3): ("acc", "v|V"),
        (1, 4): ("O", "l_i"),                # tl.store(O + ..., acc / l_i)
    },
    "tilelang": {
        (1, 1): ("m_i", "l_i"),              # the state's fragments
        (1, 2): ("k_tile",),                 # T.gemm(q_tile, k_tile, scores, ...)
        (1, 3): ("m_i", "l_i"),
        (1, 4): ("acc", "v_tile"),           # T.gemm(p, v_tile, acc)
        (1, 5): ("l_i",),
    },
    "cute": {
        (1, 1): ("kv_rows",),                # the mask of the last tile
        (1, 2): ("quad_max|__shfl_xor_sync",),   # the tile's row max across the quad
        (1, 3): ("l_i", "o_rc"),             # the rescale
        (1, 4): ("acc_o", "gemm"),           # O += P V
        (1, 5): ("tOgO",),
        # The optional stage's work changes the kernel above its place (which lies between the
        # kernel and its launcher): it is named as optional until code like this lands there.
        (2, 1): ("cp_async_fence",),
        (2, 2): ("tSrQ",),
        (2, 3): (re.compile(r"\bBr\s*=\s*128\b"),),
    },
}


# ---------------------------------------------------------------- the student's code against it


def todo_states(source: str, skeleton: str | None = None) -> list[Todo]:
    """Every TODO of the skeleton that `source` derives from, in order, open or not."""
    python = _is_python(source) if skeleton is None else _is_python(skeleton)
    if skeleton is None:
        skeleton = read_skeleton(track(source))
        if skeleton is None:
            return []
    does = _DOES.get(track(skeleton), {})
    skel, slots = _skeleton_view(skeleton, python)
    stud_lines = (_python_lines if python else _cpp_lines)(source)
    stud = [(l.code, l.level if python else 0) for l in stud_lines if l.code]
    pairs = _common_lines(skel, stud)
    kept = {i for i, _ in pairs}    # skeleton code lines the student still has, unchanged
    spans = {}                      # the student's own code lines -> the skeleton lines between
    for (i0, j0), (i1, j1) in zip([(-1, -1)] + pairs, pairs + [(len(skel), len(stud))]):
        spans.update({j: (i0 + 1, i1) for j in range(j0 + 1, j1)})   # which they sit
    levels = _own_levels([l.level for l in stud_lines if l.code], spans)
    added = [_Added(*spans[j], levels[j], stud[j][0]) for j in sorted(spans)]
    placed = _placed(slots, added)
    todos = [Todo(slot.number, slot.text, slot.optional,
                  _state(slot, kept, added, placed, does.get(slot.number)))
             for slot in slots]
    return sorted(todos, key=lambda t: t.number)


@functools.lru_cache(maxsize=8)
def _skeleton_view(skeleton: str, python: bool) -> tuple[list[tuple[str, int]], list[_Slot]]:
    """The skeleton's code lines, as compared with the student's, and its TODOs' places."""
    lines = (_python_lines if python else _cpp_lines)(skeleton)
    return ([(l.code, l.level if python else 0) for l in lines if l.code],
            _skeleton_slots(lines, python))


def _common_lines(a: list, b: list) -> list[tuple[int, int]]:
    """The pairs (i, j) of a longest common subsequence of a and b (Hunt and Szymanski). Longest,
    not greedy: difflib matches the longest contiguous run first, and one line moved (a pointer
    declared after the loop instead of before it) can then cost a whole loop its match."""
    where: dict = {}
    for j, line in enumerate(b):
        where.setdefault(line, []).append(j)
    ends: list[int] = []      # ends[k]: the smallest j that ends a common run of length k + 1
    tails: list = []          # tails[k]: that run, as nested (i, j, rest) links
    for i, line in enumerate(a):
        for j in reversed(where.get(line, ())):
            k = bisect.bisect_left(ends, j)
            link = (i, j, tails[k - 1] if k else None)
            if k == len(ends):
                ends.append(j)
                tails.append(link)
            else:
                ends[k], tails[k] = j, link
    pairs, link = [], tails[-1] if tails else None
    while link is not None:
        pairs.append(link[:2])
        link = link[2]
    return pairs[::-1]


def _own_levels(levels: list[int], own: dict[int, object]) -> list[int]:
    """Each code line's nesting, except that a line inside a block the student opened (their own
    loop) is counted at that block's level: it sits in the skeleton where that block sits."""
    out, stack = [], []          # stack: (level, counted level, the student's own line)
    for j, level in enumerate(levels):
        while stack and stack[-1][0] >= level:
            stack.pop()
        mine = j in own
        counted = stack[-1][1] if mine and stack and stack[-1][2] else level
        stack.append((level, counted, mine))
        out.append(counted)
    return out


@dataclasses.dataclass(frozen=True)
class _Added:
    """A code line of the student's that is not the skeleton's: it replaces (or, first == last,
    is inserted before) the skeleton's code lines [first, last)."""
    first: int
    last: int
    level: int
    code: str


def _state(slot: _Slot, kept: set[int], added: list[_Added],
           placed: dict[tuple[int, int], list[str]], does: tuple | None) -> str:
    """'open', 'done' or 'gone' (Todo.state)."""
    first, last = slot.under
    if slot.inline:               # a TODO written on its line (KERNEL_VERSION = 1): that line
        if first in kept:
            return "open"
        code = [a.code for a in added if a.first <= first < a.last]
        return "done" if code and (does is None or _does(code, does)) else "gone"
    bounds = set(range(first, last)) | {i for i in (slot.before, slot.after) if i is not None}
    if bounds and not bounds & kept:
        return "gone"
    code = placed.get(_region(slot), [])
    if does is not None:          # what its work needs, in the student's code in its place
        return "done" if _does(code, does) else "open"
    # A TODO of a skeleton _DOES does not know: open while its place is untouched, its
    # placeholder (or, where it has none, the line that follows it) still there.
    anchors = set(range(first, last)) | ({slot.after} if slot.after is not None else set())
    return "open" if anchors <= kept and not code else "done"


def _placed(slots: list[_Slot], added: list[_Added]) -> dict[tuple[int, int], list[str]]:
    """The student's code lines in each place (a region, _region). Where places meet (code that
    replaces a placeholder ending one block may start the next one's), a line goes to the deepest
    place that its own nesting allows, and of those to the first after the code above it. The
    TODOs of one comment block share their place, and all its lines."""
    places = sorted({(_region(s), s.level) for s in slots if not s.inline})
    out: dict[tuple[int, int], list[str]] = {}
    for line in added:
        here = [(region, level) for region, level in places
                if line.first <= region[1] and line.last >= region[0]]
        if not here:
            continue
        fits = [level for _, level in here if level <= line.level] or [min(l for _, l in here)]
        place = min(region for region, level in here if level == max(fits))
        out.setdefault(place, []).append(line.code)
    return out


def _does(code: list[str], needs: tuple) -> bool:
    """Whether the code lines hold every one of `needs`: a name ('m_i', or 'o|O' for either) as
    a whole word, or a compiled pattern."""
    text = "\n".join(code)
    return all((need if isinstance(need, re.Pattern) else _words(need)).search(text)
               for need in needs)


@functools.lru_cache(maxsize=None)
def _words(names: str) -> re.Pattern:
    return re.compile(r"\b(?:" + "|".join(map(re.escape, names.split("|"))) + r")\b")


def _region(slot: _Slot) -> tuple[int, int]:
    """The positions (an insertion before skeleton code line p is at p) that are this TODO's:
    from just below the code line above it to its placeholder's end, not past a closing line."""
    lo = slot.before + 1 if slot.before is not None else 0
    hi = slot.under[1] - 1 if slot.closes else slot.under[1]
    return lo, max(lo, hi)


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
        if build.message.startswith("this machine"):   # a student's check (build.machine_words)
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
        if "Raise the limit" in build.message:   # a student's check (build.slow_build_message)
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
        if first.hidden:   # its message is withheld from students (grader/privacy.py)
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
