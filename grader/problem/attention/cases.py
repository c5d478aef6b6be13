"""Test cases: parse the CS149 line format into frozen dataclasses.

    batch_size: 4; num_heads: 64; seq_len: 8192; head_dim: 128; seed: 1118
    batch_size: 1; num_heads: 64; seq_len: 1024; head_dim: 128; seed: 1118; qk_std: 6

Blank lines and lines starting with '#' are ignored; a trailing '# comment' is allowed.
Optional fields: `rtol`, `atol` (the tolerance of this case) and `qk_std` (the standard
deviation of Q and K; V stays N(0, 1)): with `qk_std: 6` the scores q·k/sqrt(D) have a standard
deviation of 36 and pass 100, so a softmax without its running maximum overflows exp.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from grader.common.text import read_utf8

FIELDS = ("batch_size", "num_heads", "seq_len", "head_dim", "seed")
TOLERANCE_FIELDS = ("rtol", "atol")
OPTIONAL_FIELDS = TOLERANCE_FIELDS + ("qk_std",)
# The widest spread a case may ask for. The scores' standard deviation is qk_std², so 8 gives
# scores of about ±400, already far past exp's range (88.7); and the plain fp16 implementation
# the precision budget compares with (reference.attention_plain_fp16), which rounds its scores
# to fp16, keeps them finite: |q·k|/sqrt(D) <= sqrt(D)·max|q|·max|k| stays far below fp16's
# 65504 (about 52 000 for D = 128 even if every element were 8.5 standard deviations out).
QK_STD_MAX = 8.0


class CaseFileError(ValueError):
    """A malformed test-case line: the message names the file, the line and the fix."""


@dataclasses.dataclass(frozen=True)
class Case:
    batch_size: int
    num_heads: int
    seq_len: int
    head_dim: int
    seed: int
    hidden: bool = False
    rtol: float | None = None   # per-case override of config.RTOL, kept with the case
    atol: float | None = None
    qk_std: float = 1.0         # standard deviation of Q and K (inputs.make_inputs); V's is 1

    @property
    def id(self) -> str:
        """`b1_h64_s1024_d128`; a case with another spread says so (`..._d128_qk6`): the same
        shape drawn wider is another case, with other inputs and another reference."""
        shape = f"b{self.batch_size}_h{self.num_heads}_s{self.seq_len}_d{self.head_dim}"
        return shape if not self.scaled_qk else f"{shape}_qk{_number(self.qk_std).replace('.', 'p')}"

    @property
    def scaled_qk(self) -> bool:
        """Q and K drawn with another standard deviation than torch.randn's 1."""
        return self.qk_std != 1.0

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(batch, heads, seq, head_dim)"""
        return (self.batch_size, self.num_heads, self.seq_len, self.head_dim)

    @property
    def flops(self) -> int:
        """Two matmuls of 2·S·S·D each, per (batch, head)."""
        return 4 * self.batch_size * self.num_heads * self.seq_len ** 2 * self.head_dim

    @property
    def numel(self) -> int:
        return self.batch_size * self.num_heads * self.seq_len * self.head_dim

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Case":
        return cls(**d)

    def line(self) -> str:
        """The case as a case file writes it (the tolerance overrides left out)."""
        spread = f"; qk_std: {_number(self.qk_std)}" if self.scaled_qk else ""
        return "; ".join(f"{f}: {getattr(self, f)}" for f in FIELDS) + spread


def _number(x: float) -> str:
    """6.0 as '6', 2.5 as '2.5', exactly: two spreads never print the same."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def parse_case_line(text: str, *, where: str, hidden: bool = False) -> Case:
    """Parse one line; `where` is 'file:line' for error messages."""
    values: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        key, sep, value = part.partition(":")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise CaseFileError(
                f"{where}: '{part}' is not 'name: value'. Expected a line like "
                f"'batch_size: 1; num_heads: 64; seq_len: 1024; head_dim: 128; seed: 1118'.")
        if key not in FIELDS + OPTIONAL_FIELDS:
            raise CaseFileError(
                f"{where}: unknown field '{key}'. Allowed fields: {', '.join(FIELDS + OPTIONAL_FIELDS)}.")
        if key in values:
            raise CaseFileError(f"{where}: field '{key}' is given twice; keep one.")
        values[key] = value
    missing = [f for f in FIELDS if f not in values]
    if missing:
        raise CaseFileError(f"{where}: missing {', '.join(missing)}. Every line needs "
                            f"{'; '.join(f + ': N' for f in FIELDS)}.")
    parsed: dict[str, object] = {}
    for key, value in values.items():
        try:
            parsed[key] = float(value) if key in OPTIONAL_FIELDS else int(value)
        except ValueError:
            kind = "a number" if key in OPTIONAL_FIELDS else "a whole number"
            raise CaseFileError(f"{where}: {key} must be {kind}; got '{value}'.") from None
    for key in FIELDS[:4]:
        if parsed[key] < 1:
            raise CaseFileError(f"{where}: {key} must be at least 1; got {parsed[key]}.")
    if not 0 <= parsed["seed"] < 2 ** 63:
        raise CaseFileError(f"{where}: seed must be a whole number from 0 to 2^63-1; got "
                            f"{parsed['seed']}.")
    for key in TOLERANCE_FIELDS:   # a negative tolerance fails every kernel, and blames students
        if key in parsed and not (math.isfinite(parsed[key]) and parsed[key] >= 0):
            raise CaseFileError(f"{where}: {key} must be a finite number >= 0 (the default is "
                                f"1e-2); got {values[key]}.")
    spread = parsed.get("qk_std", 1.0)
    if not (math.isfinite(spread) and 0 < spread <= QK_STD_MAX):
        raise CaseFileError(f"{where}: qk_std must be a number above 0 and at most {QK_STD_MAX:g} "
                            f"(the standard deviation of Q and K; the default is 1, and 6 puts the "
                            f"scores past exp's range); got {values['qk_std']}.")
    return Case(hidden=hidden, **parsed)


def load_cases(path: Path | str, *, hidden: bool = False) -> list[Case]:
    """All cases of one file, in file order. Raises CaseFileError naming file and line."""
    path = Path(path)
    text = read_utf8(path, CaseFileError, "test cases")
    cases, seen, problems = [], {}, []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:   # every bad line is reported, one line each, not only the first
            case = parse_case_line(line, where=f"{path}:{lineno}", hidden=hidden)
        except CaseFileError as e:
            problems.append(str(e))
            continue
        if case.id in seen:   # the id is the shape and the spread: another qk_std is another case
            what = "shape and qk_std" if case.scaled_qk else "shape"
            problems.append(f"{path}:{lineno}: same {what} as line {seen[case.id]} ({case.id}); "
                            f"remove one of them, or give one another qk_std.")
            continue
        seen[case.id] = lineno
        cases.append(case)
    if problems:
        raise CaseFileError("\n".join(problems))
    if not cases:
        raise CaseFileError(f"{path}: no test cases found; add at least one line.")
    return cases


def load_all_cases(public: Path, hidden: Path | None) -> list[Case]:
    """Public and (if the file exists) hidden cases, smallest first, so cheap failures come early."""
    cases = load_cases(public)
    if hidden is not None and Path(hidden).exists():
        cases = with_cases(cases, load_cases(hidden, hidden=True))
    return sorted(cases, key=lambda c: (c.flops, c.id))


def with_cases(cases: list[Case], more: list[Case]) -> list[Case]:
    """`cases` and those of `more` whose id (shape and qk_std) none of them has, smallest first."""
    have = {c.id for c in cases}
    return sorted(cases + [c for c in more if c.id not in have], key=lambda c: (c.flops, c.id))


def largest(cases: list[Case]) -> Case:
    """The case that is timed: the most FLOPs among the public cases (hidden ones if none)."""
    pool = [c for c in cases if not c.hidden] or cases
    return max(pool, key=lambda c: c.flops)
