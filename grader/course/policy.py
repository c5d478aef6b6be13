"""The grading policy (grading.toml): points per case, performance points, display options, and
how many ranked students the review queue holds."""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import hashlib
import math
import re
import tomllib
from pathlib import Path

from grader.common import config
from grader.common.status import Status
from grader.common.text import read_utf8
from grader.course.results import SubmissionResult

POLICY_FILE = config.REPO_ROOT / "grading.toml"

_ADJECTIVES = ("amber", "brisk", "calm", "daring", "eager", "fabled", "gentle", "hasty", "ivory",
               "jolly", "keen", "lucid", "mellow", "nimble", "opal", "plucky", "quiet", "rapid",
               "sable", "tidy", "umber", "vivid", "witty", "young", "zesty", "bold", "coral",
               "dusky", "frosty", "golden", "hazel", "indigo")
_ANIMALS = ("aardvark", "badger", "cheetah", "dingo", "egret", "ferret", "gecko", "heron", "ibis",
            "jackal", "koala", "lemur", "marten", "newt", "ocelot", "puffin", "quokka", "raven",
            "stoat", "tapir", "urchin", "vole", "walrus", "yak", "zebra", "bison", "crane",
            "dolphin", "falcon", "gibbon", "hare", "impala")


class PolicyError(ValueError):
    """grading.toml is malformed: the message names the file, the key and the fix."""


@dataclasses.dataclass(frozen=True)
class Policy:
    public_case_points: float = 10.0
    hidden_case_points: float = 5.0
    performance_points: float = 30.0
    zero_at: str | float = "baseline:torch_reference"
    full_at: str | float = "baseline:sdpa_flash"
    pseudonyms: bool = True
    hide_solution: bool = True
    pseudonym_salt: str = "change-me-per-course"
    precision_factor: float = config.PRECISION_FACTOR
    precision_floor: float = config.PRECISION_FLOOR
    # The review queue (grader/course/review.py) holds, besides every `review` result and every ranked
    # one at or faster than a library baseline, the `review_top` fastest ranked students.
    review_top: int = 10
    # The course check service (issue 33, grader/service/): per-student limits, which of a
    # student's graded submissions counts, and the deadline after which none is accepted.
    service_checks_per_hour: int = 20
    service_submissions_per_day: int = 5
    service_upload_mb: float = 4.0
    service_counts: str = "best"
    service_deadline: datetime.datetime | None = None

    def threshold_ms(self, spec: str | float, baselines: dict[str, float]) -> float | None:
        if isinstance(spec, (int, float)):
            return float(spec)
        return baselines.get(spec.removeprefix("baseline:"))

    def max_score(self, cases: list[dict]) -> float:
        return sum(self.hidden_case_points if c["hidden"] else self.public_case_points
                   for c in cases) + self.performance_points

    def score(self, r: SubmissionResult, cases: list[dict], baselines: dict[str, float]) -> "Score":
        """Points for one submission. Cases that were not run (no GPU) earn nothing."""
        hidden = {c["id"]: c["hidden"] for c in cases}
        correctness = sum((self.hidden_case_points if hidden.get(c.case, c.hidden) else
                           self.public_case_points) for c in r.cases if c.status is Status.PASS)
        perf, why = 0.0, "not timed"
        if r.status is Status.REVIEW:   # its time is real, the work may not be the student's
            why = "no performance points until an instructor's review clears it"
        slow = self.threshold_ms(self.zero_at, baselines)
        fast = self.threshold_ms(self.full_at, baselines)
        if r.ranked:
            if slow is None or fast is None or slow <= fast:
                why = f"thresholds unavailable ({self.zero_at} -> {self.full_at})"
            else:
                t = r.timing.median_ms
                frac = (math.log(slow) - math.log(t)) / (math.log(slow) - math.log(fast))
                perf = self.performance_points * min(1.0, max(0.0, frac))
                why = f"{t:.3f} ms between {slow:.3f} ms (0) and {fast:.3f} ms (full)"
        return Score(round(correctness, 2), round(perf, 2), round(correctness + perf, 2),
                     self.max_score(cases), why)

    def pseudonym(self, sub_id: str) -> str:
        h = hashlib.sha256(f"{self.pseudonym_salt}\0{sub_id}".encode()).digest()
        return f"{_ADJECTIVES[h[0] % len(_ADJECTIVES)]}-{_ANIMALS[h[1] % len(_ANIMALS)]}-{h[2]:02x}"


@dataclasses.dataclass(frozen=True)
class Score:
    correctness: float
    performance: float
    total: float
    max_total: float
    performance_basis: str


# The baselines a threshold may name: grader/problem/attention/baselines.py's rows and the reference solution.
KNOWN_BASELINES = ("torch_reference", "sdpa_flash", "sdpa_cudnn", "solution")
SLOWEST_BASELINE = "torch_reference"   # the plain PyTorch loop: never a sensible full_at

# Every section and key grading.toml may hold, with the type it must have and what is allowed.
_NUMBER = "a number"
_SCHEMA = {
    "correctness": {"public_case_points": ("points", "a number >= 0 (points per public case)"),
                    "hidden_case_points": ("points", "a number >= 0 (points per hidden case)"),
                    "precision_factor": ("factor", "a number >= 1 (error <= factor x a plain "
                                                   "fp16 implementation's + floor)"),
                    "precision_floor": ("points", "a number >= 0 (the precision budget's floor)")},
    "performance": {"points": ("points", "a number >= 0 (performance points)"),
                    "zero_at": ("threshold", "\"baseline:<name>\" or a number of milliseconds > 0"),
                    "full_at": ("threshold", "\"baseline:<name>\" or a number of milliseconds > 0")},
    "display": {"pseudonyms": ("bool", "true or false"),
                "hide_solution": ("bool", "true or false"),
                "pseudonym_salt": ("text", "a non-empty string (change it for each course)")},
    "review": {"top": ("count", "a whole number >= 0 (the fastest ranked students the review "
                                "queue holds; 0: none by rank)")},
    "service": {"checks_per_hour": ("count", "a whole number >= 0 (checks a student may send in "
                                             "an hour; 0: none)"),
                "submissions_per_day": ("count", "a whole number >= 0 (ranked submissions a "
                                                 "student may send in a day; 0: none)"),
                "upload_mb": ("size", "a number of megabytes > 0 (the largest upload)"),
                "counts": ("choice:best,last", "\"best\" or \"last\" (which of a student's graded "
                                                "submissions counts)"),
                "deadline": ("deadline", "a date and time with its offset, e.g. "
                                         "2026-12-11T23:59:00-08:00 (no submission is accepted "
                                         "after it)")},
}
_FIELD = {("performance", "points"): "performance_points", ("review", "top"): "review_top",
          **{("service", key): f"service_{key}" for key in ("checks_per_hour", "submissions_per_day",
                                                            "upload_mb", "counts", "deadline")}}


def load_policy(path: Path = POLICY_FILE, *, required: bool = False) -> Policy:
    """Read grading.toml; a missing file gives the defaults (unless `required`: a --policy the
    user named). Everything is checked before anything is graded: unknown sections and keys
    (with the nearest known name), types, signs, threshold names and order. A malformed file is
    a PolicyError with one line per problem, each naming the file, the line and key, and what
    is allowed."""
    path = Path(path)
    if not path.exists():
        if required:
            raise PolicyError(f"{path}: no such policy file (see grading.toml for the format)")
        return Policy()
    text = read_utf8(path, PolicyError, "the policy")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PolicyError(f"{path}: not valid TOML: {e}") from None
    problems: list[str] = []
    flat: dict = {}

    def bad(section: str | None, key: str | None, message: str) -> None:
        line = _line_of(text, section, key)
        where = f"{path}:{line}" if line else str(path)
        name = f"[{section}] {key}" if section and key else f"[{section}]" if section else key
        problems.append(f"{where}: {name}: {message}")

    for section, body in data.items():
        if section not in _SCHEMA:
            kind = "section" if isinstance(body, dict) else "key outside any section"
            bad(section if isinstance(body, dict) else None, None if isinstance(body, dict) else section,
                f"unknown {kind}{_did_you_mean(section, _SCHEMA)}; known sections: "
                f"{', '.join(f'[{s}]' for s in _SCHEMA)}")
            continue
        if not isinstance(body, dict):
            bad(None, section, f"must be a section [{section}], not a value")
            continue
        for key, value in body.items():
            spec = _SCHEMA[section].get(key)
            if spec is None:
                bad(section, key, f"unknown key{_did_you_mean(key, _SCHEMA[section])}; known: "
                                  f"{', '.join(_SCHEMA[section])}")
                continue
            kind, allowed = spec
            problem = _check(kind, value)
            if problem:
                bad(section, key, f"{value!r} {problem}; use {allowed}")
                continue
            flat[_FIELD.get((section, key), key)] = value
    policy = Policy(**flat)
    if not problems:
        for problem in threshold_problems(policy):
            bad("performance", "full_at" if "full_at" in problem else "zero_at", problem)
    if problems:
        raise PolicyError("\n".join(problems))
    return policy


def _check(kind: str, value) -> str:
    """'' when `value` fits `kind`, else what is wrong with it."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind in ("points", "factor"):
        if not number or not math.isfinite(value):
            return "is not a number"
        if value < (1 if kind == "factor" else 0):
            return "is too small"
        return ""
    if kind == "threshold":
        if isinstance(value, str):
            if not value.startswith("baseline:"):
                return "is neither \"baseline:<name>\" nor a number"
            name = value.removeprefix("baseline:")
            if name not in KNOWN_BASELINES:
                return (f"names no baseline{_did_you_mean(name, KNOWN_BASELINES)} (baselines: "
                        f"{', '.join(KNOWN_BASELINES)})")
            return ""
        if not number or not math.isfinite(value):
            return "is not a number"
        return "must be more than 0 ms" if value <= 0 else ""
    if kind == "count":
        if not isinstance(value, int) or isinstance(value, bool):
            return "is not a whole number"
        return "is too small" if value < 0 else ""
    if kind == "size":
        return "" if number and math.isfinite(value) and value > 0 else "is not a number > 0"
    if kind.startswith("choice:"):
        return "" if value in kind.removeprefix("choice:").split(",") else "is not one of them"
    if kind == "deadline":
        if not isinstance(value, datetime.datetime):
            return "is not a date and time (TOML's, unquoted)"
        return "" if value.tzinfo is not None else "has no offset from UTC (e.g. -08:00 or Z)"
    if kind == "bool":
        return "" if isinstance(value, bool) else "is not true or false"
    if kind == "text":
        return "" if isinstance(value, str) and value.strip() else "is not a non-empty string"
    raise AssertionError(kind)


def threshold_problems(policy: Policy) -> list[str]:
    """Thresholds that would give every ranked submission the same performance points."""
    slow, fast = policy.zero_at, policy.full_at
    if slow == fast:
        return [f"full_at and zero_at are both {fast!r}: performance points need two different "
                f"thresholds, zero_at slower than full_at"]
    if isinstance(slow, (int, float)) and isinstance(fast, (int, float)) and slow <= fast:
        return [f"zero_at = {slow} ms is not slower than full_at = {fast} ms: swap them (zero "
                f"points at zero_at or slower, full points at full_at or faster)"]
    if fast == f"baseline:{SLOWEST_BASELINE}":
        return [f"full_at = {fast!r} is the slowest baseline (the plain PyTorch loop), so "
                f"zero_at = {slow!r} is faster than it: swap them"]
    return []


def missing_baselines(policy: Policy, available: set[str]) -> list[str]:
    """The thresholds naming a baseline that is not in `available` (the baselines this run times,
    or the result files a re-render has): without it every ranked submission gets 0 points."""
    return [f"[performance] {key} = {spec!r}: no '{spec.removeprefix('baseline:')}' baseline "
            f"{'result' if available else 'is timed'} here; every ranked submission would get no "
            f"performance points. Grade with that baseline, or set {key} to a number of ms"
            for key, spec in (("zero_at", policy.zero_at), ("full_at", policy.full_at))
            if isinstance(spec, str) and spec.removeprefix("baseline:") not in available]


def _did_you_mean(name: str, known) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _line_of(text: str, section: str | None, key: str | None) -> int | None:
    """The line of `key` in `[section]` (or of the section header), for messages."""
    current = None
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        header = re.match(r"^\[\s*([^\]]+?)\s*\]", stripped)
        if header:
            current = header[1].strip().strip('"')
            if key is None and current == section:
                return number
            continue
        m = re.match(r"^([\w\-\"'. ]+?)\s*=", stripped)
        if m and key is not None and m[1].strip().strip('"\'') == key and current == section:
            return number
    return None
