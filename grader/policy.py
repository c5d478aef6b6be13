"""The grading policy (grading.toml): points per case, performance points, display options."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import tomllib
from pathlib import Path

from . import config
from .results import SubmissionResult
from .status import Status

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


def load_policy(path: Path = POLICY_FILE) -> Policy:
    """Read grading.toml; a missing file gives the defaults, a malformed one a clear error."""
    if not Path(path).exists():
        return Policy()
    try:
        data = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as e:
        raise PolicyError(f"{path}: {e}") from None
    flat = {}
    sections = {"correctness": ("public_case_points", "hidden_case_points", "precision_factor",
                                "precision_floor"),
                "performance": ("points", "zero_at", "full_at"),
                "display": ("pseudonyms", "hide_solution", "pseudonym_salt")}
    for section, keys in sections.items():
        for key, value in data.get(section, {}).items():
            if key not in keys:
                raise PolicyError(f"{path}: unknown key [{section}] {key}; known: {', '.join(keys)}")
            flat["performance_points" if (section, key) == ("performance", "points") else key] = value
    for key in ("zero_at", "full_at"):
        value = flat.get(key)
        if isinstance(value, str) and not value.startswith("baseline:"):
            raise PolicyError(f"{path}: [performance] {key} = {value!r}: use \"baseline:<name>\" "
                              f"or a number of milliseconds")
    for key in ("precision_factor", "precision_floor"):
        value = flat.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise PolicyError(f"{path}: [correctness] {key} = {value!r}: use a number >= 0 "
                              f"(the precision budget: error <= factor x a plain fp16 "
                              f"implementation's + floor)")
    if flat.get("precision_factor") is not None and flat["precision_factor"] < 1:
        raise PolicyError(f"{path}: [correctness] precision_factor = {flat['precision_factor']!r}: "
                          f"below 1 would fail kernels as precise as plain fp16; use 1 or more")
    return Policy(**flat)
