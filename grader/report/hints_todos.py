"""Which TODOs a student's code has done: the student's code lines paired with the skeleton's, the
code in each TODO's place, and what that code must do per TODO (_DOES). How and why:
grader/report/hints.py."""

from __future__ import annotations

import bisect
import dataclasses
import functools
import re

from grader.report.hints_code import _cpp_lines, _is_python, _python_lines
from grader.report.hints_skeleton import _Slot, _skeleton_slots, read_skeleton, track


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


def whole_sentences(text: str, limit: int) -> str:
    """`text` whole if it fits in `limit` characters, else as many whole sentences from its start
    as fit (at least one, however long). A sentence ends at . ! or ? before a space, not in an
    ellipsis or an abbreviation such as e.g."""
    if len(text) <= limit:
        return text
    ends = [m.end() for m in re.finditer(r"(?<!\.)(?<!\be\.g)(?<!\bi\.e)(?<!\betc)[.!?](?=\s)", text)]
    cut = max((e for e in ends if e <= limit), default=ends[0] if ends else len(text))
    return text[:cut]
