"""What a student may see of a result: no hidden case's id, shape or seed, no absolute path,
no other student's id.

Every student-visible output (the students' page, the feedback files, Gradescope's results)
is rendered from `Redactor.student_result(r)`, never from the raw result; the instructor's
outputs (leaderboard.html, grades.csv, logs) keep full detail.

How much of the hidden cases' results a student sees depends on when the output is released:
the feedback files and Gradescope's `after_published` tests, released with the grades, list
each hidden case as "hidden case k" with its status; the students' page, which may be shared
at any time, has no per-hidden-case verdict at all (`hidden_detail=False`): only the status and
the count of hidden cases passed, which the score implies anyway.

Two rules, because text has two sources:

- Text produced while a hidden case ran (its message, its finding, what it launched) is
  withheld whole; the student sees "hidden case k", the status, and the fraction of elements
  outside the tolerance. A submission can print anything it saw, in any form, so no
  pattern-based scrub of that text could be trusted.
- Other text (build logs, public cases' messages, the verdict, notes, hints) is scrubbed:
  hidden case ids become "hidden case k"; hidden shapes in the forms Python and C++ print them,
  `key: value` pairs of hidden values and hidden seeds are masked; absolute paths keep only
  their last component; real ids become pseudonyms. A submission that saw a hidden case's
  inputs before a public case ran could print them there in those forms.

Not stopped: a submission that encodes what it saw (base64, digits spelled out) in its output.
"""

from __future__ import annotations

import dataclasses
import functools
import re

from grader.common.status import Status
from grader.course.results import SubmissionResult
from grader.course.verdicts import CaseResult

MASK = "[hidden]"
_DIMS = ("batch_size", "num_heads", "seq_len", "head_dim")
# What a printed key of each dimension may look like: `seq_len: 77`, `"seq_len": 77`, `S=77`.
_KEY_ALIASES = {"batch_size": ("batch_size", "batch", "bsz", "b"),
                "num_heads": ("num_heads", "nheads", "heads", "h"),
                "seq_len": ("seq_len", "seqlen", "seq", "s", "n"),
                "head_dim": ("head_dim", "headdim", "d")}
_SEG = r"[^\s/'\"`:;,()<>\[\]{}|]"
_ABS_PATH = re.compile(rf"(?:file://(?=/)|(?<![\w.~:/\\-]))(?:~/(?:{_SEG}+/)*|/(?:{_SEG}+/)+)({_SEG}*)")


@dataclasses.dataclass(frozen=True)
class HiddenCase:
    """A hidden case as the run file lists it: its number among the hidden cases, from 1."""
    number: int
    id: str
    shape: tuple[int, int, int, int]     # (batch, heads, seq, head_dim)
    seed: int | None

    @property
    def name(self) -> str:
        return f"hidden case {self.number}"


def hidden_cases(run_cases: list[dict]) -> tuple[HiddenCase, ...]:
    """The hidden cases of a run file's `cases`, read from each case's `line` (or its id)."""
    out = []
    for entry in (c for c in run_cases if c.get("hidden")):
        fields = dict(re.findall(r"(\w+):\s*(-?\d+)", entry.get("line", "")))
        dims = re.fullmatch(r"b(\d+)_h(\d+)_s(\d+)_d(\d+)(?:_qk[\w-]+)?", entry["id"])
        shape = tuple(int(fields[k]) for k in _DIMS) if all(k in fields for k in _DIMS) else \
            tuple(int(x) for x in dims.groups()) if dims else (0, 0, 0, 0)
        seed = int(fields["seed"]) if "seed" in fields else None
        out.append(HiddenCase(len(out) + 1, entry["id"], shape, seed))
    return tuple(out)


def _num(n: int) -> str:
    return rf"(?<![\w.]){n}(?![\w.])"


def _patterns(hidden: tuple[HiddenCase, ...], public_shapes: list[tuple[int, ...]]) -> list[tuple[re.Pattern, str]]:
    """(pattern, replacement) pairs, case ids first so that they read as 'hidden case k'."""
    pats: list[tuple[re.Pattern, str]] = []
    for h in sorted(hidden, key=lambda h: -len(h.id)):
        pats.append((re.compile(rf"(?<![\w]){re.escape(h.id)}(?![\w])"), h.name))
    sep = r"\s*[,x×*]\s*"
    for h in hidden:
        b, hd, s, d = h.shape
        for dims in ((b, hd, s, d), (b * hd, s, d), (hd, s, d), (s, d), (s, s)):
            if any(dims == p[-len(dims):] for p in public_shapes) or len(set(dims)) == 1 and dims[0] < 10:
                continue
            pats.append((re.compile(r"(?<![\w.])" + sep.join(str(x) for x in dims) + r"(?![\w.])"), MASK))
        numel = b * hd * s * d
        if numel >= 1000 and all(numel != x for p in public_shapes for x in p):
            pats.append((re.compile(_num(numel)), MASK))          # the element count
        if h.seed is not None:
            pats.append((re.compile(rf"(seed[\"']?\s*[:=]?\s*){h.seed}(?![\w.])", re.I), rf"\g<1>{MASK}"))
        for i, dim in enumerate(_DIMS):
            value = h.shape[i]
            if any(p[i] == value for p in public_shapes if len(p) == 4):
                continue     # the same value as a public case's: nothing hidden about it
            keys = "|".join(_KEY_ALIASES[dim])
            pats.append((re.compile(rf"(?<![\w])((?:{keys})[\"']?\s*[:=]\s*){value}(?![\w.])", re.I),
                         rf"\g<1>{MASK}"))
    return pats


@dataclasses.dataclass(frozen=True)
class Redactor:
    """Masks what a student must not see. `names`: real id -> the name to show instead."""
    hidden: tuple[HiddenCase, ...]
    public_shapes: tuple[tuple[int, int, int, int], ...] = ()
    names: tuple[tuple[str, str], ...] = ()

    @classmethod
    def for_run(cls, run: dict, names: dict[str, str] | None = None) -> "Redactor":
        public = []
        for entry in (c for c in run.get("cases", []) if not c.get("hidden")):
            m = re.fullmatch(r"b(\d+)_h(\d+)_s(\d+)_d(\d+)(?:_qk[\w-]+)?", entry["id"])
            if m:
                public.append(tuple(int(x) for x in m.groups()))
        # an id that is also a status word ('pass', 'build_error') names no one: keep the word
        names = {k: v for k, v in (names or {}).items() if k not in {s.value for s in Status}}
        return cls(hidden_cases(run.get("cases", [])), tuple(public),
                   tuple(sorted(names.items(), key=lambda kv: -len(kv[0]))))

    @functools.cached_property
    def patterns(self) -> list[tuple[re.Pattern, str]]:
        return _patterns(self.hidden, list(self.public_shapes))

    @functools.cached_property
    def names_pattern(self) -> re.Pattern | None:
        """Every real id to replace, longest first, as one alternation."""
        ids = [re.escape(real) for real, shown in self.names if real != shown]
        return re.compile(rf"(?<![A-Za-z0-9])(?:{'|'.join(ids)})(?![A-Za-z0-9])") if ids else None

    def case(self, case_id: str) -> HiddenCase | None:
        return next((h for h in self.hidden if h.id == case_id), None)

    def case_name(self, case_id: str) -> str:
        h = self.case(case_id)
        return h.name if h else case_id

    def text(self, text: str) -> str:
        """Scrub text that was not produced while a hidden case ran (see the module's doc)."""
        if not text:
            return text
        text = _ABS_PATH.sub(lambda m: "…/" + m.group(1), text)
        for pattern, repl in self.patterns:
            text = pattern.sub(repl, text)
        if self.names_pattern is not None:
            shown = dict(self.names)
            text = self.names_pattern.sub(lambda m: shown[m.group(0)], text)
        return text

    def hidden_case_result(self, c: CaseResult) -> CaseResult:
        """A hidden case as a student sees it: its number, status and share of wrong elements."""
        h = self.case(c.case)
        return CaseResult(case=h.name if h else "hidden case", status=c.status, hidden=True,
                          message=withheld_message(c))

    def is_hidden(self, c: CaseResult) -> bool:
        return c.hidden or self.case(c.case) is not None

    def student_result(self, r: SubmissionResult, *, label: str | None = None,
                       hidden_detail: bool = True) -> SubmissionResult:
        """The result as every student-visible output shows it. `hidden_detail=False` (the
        students' page): no hidden case at all, and no text that names one."""
        text = self.text if hidden_detail else (lambda t: unnumber(self.text(t)))
        cases = tuple(self.hidden_case_result(c) if self.is_hidden(c) else
                      dataclasses.replace(c, message=text(c.message))
                      for c in r.cases if hidden_detail or not self.is_hidden(c))
        build = r.build and dataclasses.replace(r.build, artifact=None, message=text(r.build.message),
                                                log_tail=text(r.build.log_tail))
        # The audit's findings name lines of the student's own code (grader/course/review.py): shown,
        # scrubbed like any text; its notes on unusual constructs are for instructors only.
        return dataclasses.replace(
            r, label=label or r.label, message=self.verdict(r, hidden_detail=hidden_detail),
            hint=text(r.hint), build=build, cases=cases, notes=tuple(text(n) for n in r.notes),
            timed_case=self.case_name(r.timed_case) if r.timed_case else None,
            review=tuple(text(x) for x in r.review), audit_notes=())

    def verdict(self, r: SubmissionResult, *, hidden_detail: bool = True) -> str:
        """The one-paragraph verdict; rebuilt from the statuses when it is about a hidden case,
        since its detail was printed while that case ran."""
        first = next((c for c in r.cases if c.status is r.status and c.status is not Status.PASS), None)
        if first is not None and self.is_hidden(first):
            ran = [c for c in r.cases if c.status is not Status.NOT_RUN]
            passed = sum(c.status is Status.PASS for c in ran)
            where = self.case_name(first.case) if hidden_detail else "a hidden case"
            return (f"{r.status.value} on {where} ({passed} of {len(ran)} "
                    f"cases pass; details of hidden cases are not shown)")
        return self.text(r.message) if hidden_detail else unnumber(self.text(r.message))


def unnumber(text: str, replacement: str = "a hidden case") -> str:
    """'hidden case 3' -> 'a hidden case': for outputs that must not tell hidden cases apart
    (Gradescope's always-visible fields pass 'another case': they do not speak of hidden ones)."""
    return re.sub(r"(?:\bcase )?\bhidden case \d+", replacement, text) if text else text


def withheld_message(c: CaseResult) -> str:
    """What may be said of a hidden case: numbers that do not depend on its shape."""
    if c.status is Status.PASS:
        return "ok"
    f = c.finding
    if c.status is Status.MISMATCH and f is not None and f.numel and not f.problem:
        share = 100 * f.mismatches / f.numel
        parts = [f"{share:.0f}% of elements outside the tolerance" if share >= 1 else
                 "under 1% of elements outside the tolerance",
                 f"max abs error {f.max_abs_error:.3g}"]
        if f.nan_count or f.inf_count:
            parts.append("NaN or inf in the output")
        if f.all_zero:
            parts.append("the output is all zeros")
        return "; ".join(parts)
    return {Status.MISMATCH: "the output is wrong (its shape, dtype or values)",
            Status.RUNTIME_ERROR: "the submission raised, crashed or returned something unusable; "
                                  "its output on hidden cases is not shown",
            Status.TIMEOUT: "ran past the time limit",
            Status.FLAGGED: "flagged: see the verdict",
            Status.NOT_RUN: "not run"}.get(c.status, c.status.value)
