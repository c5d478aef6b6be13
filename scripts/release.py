"""Build the student release: dist/flash-attention-student.tar.gz.

What students get, and nothing else: the skeleton and handout (student/), the public test
cases, the grader (to check locally), the set-up script, a student Makefile and README. Never
solution/, the hidden cases, the examples (correct kernels), the tests, the notes or the bench.

The build is refused when any file outside ALLOWED would be packed, or when a packed file holds
a line of the solution or of the hidden cases, names an instructor-only path, or names a hidden
case's shape (a hidden sequence length, head dimension or seed in any of the ways shapes are
written: `seq_len: N`, `S = N`, `(B, H, N, D)`, a case id). The handout's own sentence about the
hidden cases ("sequence lengths that are not a multiple of the tile, as small as 1; head_dim 64")
is what students are told, on purpose. The grader's own files name the course's instructor-only
settings; SCRUB rewrites those lines in the copy that ships, and the scan checks the result.
"""

from __future__ import annotations

import argparse
import fnmatch
import re
import shutil
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = "flash-attention-student"

# (source in the repository, destination in the release)
FILES = [
    ("release/README.md", "README.md"),
    ("release/Makefile", "Makefile"),
    ("release/client.mk", "client.mk"),
    ("pyproject.toml", "pyproject.toml"),
    ("scripts/bootstrap.sh", "scripts/bootstrap.sh"),
    ("test_cases/test.txt", "test_cases/test.txt"),
    ("test_cases/cpu.txt", "test_cases/cpu.txt"),
    ("templates/leaderboard.html.j2", "templates/leaderboard.html.j2"),
    ("student/README.md", "student/README.md"),
    ("student/Makefile", "student/Makefile"),
    ("student/submission.cu", "student/submission.cu"),
    ("student/triton/submission.py", "student/triton/submission.py"),
    ("student/tilelang/submission.py", "student/tilelang/submission.py"),
    ("student/cute/submission.cu", "student/cute/submission.cu"),
]
PACKAGES = ["grader"]   # every .py below these
# The pristine skeletons, which grader/report/hints.py compares a student's file with: students edit
# student/ itself, so the kit keeps a copy of its own inside the grader.
SKELETONS = [("student/submission.cu", "grader/skeleton/submission.cu"),
             ("student/triton/submission.py", "grader/skeleton/submission.py"),
             ("student/tilelang/submission.py", "grader/skeleton/tilelang_submission.py"),
             ("student/cute/submission.cu", "grader/skeleton/cute_submission.cu")]

# Lines of the grader that name instructor-only paths or describe the hidden cases, rewritten in
# the copy that ships: (file in the release, text, replacement). A line that changed upstream is
# left as it is; find_leaks then refuses the release, which names the file and the line.
NOT_IN_KIT = 'REPO_ROOT / "not-in-the-student-kit"   # the course keeps this outside the kit'
SCRUB = [
    ("grader/common/config.py", 'HIDDEN_CASES = REPO_ROOT / "test_cases" / "hidden.txt"',
     f"HIDDEN_CASES = {NOT_IN_KIT}"),
    ("grader/common/config.py", 'SOLUTION_DIR = REPO_ROOT / "solution"', f"SOLUTION_DIR = {NOT_IN_KIT}"),
    ("grader/common/config.py", "# (4·B·H·S²·D): the hidden awkward shapes, not the large public ones.",
     "# (4·B·H·S²·D)."),
    ("grader/problem/attention/baselines.py", "The reference\nsolution in solution/ is a baseline too",
     "The reference\nsolution is a baseline too"),
    ("grader/report/privacy.py", "`seq_len: 77`, `\"seq_len\": 77`, `S=77`",
     "`seq_len: 100`, `\"seq_len\": 100`, `S=100`"),
]

# Instructor-only paths, as a shipped file could name them.
INSTRUCTOR_PATHS = [re.compile(p) for p in (r"hidden\.txt", r"\bsolution/", r'/\s*"solution"',
                                            r"test_cases/hidden")]
# What the handout tells students about the hidden cases, on purpose: not a leak.
DISCLOSED = dict(seq_len={1}, head_dim={64, 128})

# Every path in the archive must match one of these.
ALLOWED = ["README.md", "Makefile", "client.mk", "pyproject.toml", "scripts/bootstrap.sh",
           "test_cases/test.txt", "test_cases/cpu.txt",
           "templates/*.j2", "student/README.md", "student/Makefile", "student/submission.cu",
           "student/cute/submission.cu", "student/triton/submission.py",
           "student/tilelang/submission.py", "grader/*.py", "grader/trusted/checks/*.py",
           "grader/skeleton/submission.cu", "grader/skeleton/submission.py",
           "grader/skeleton/tilelang_submission.py", "grader/skeleton/cute_submission.cu"]


def release_files() -> list[tuple[Path, str]]:
    files = [(ROOT / src, dst) for src, dst in FILES + SKELETONS]
    for pkg in PACKAGES:
        files += [(p, str(p.relative_to(ROOT))) for p in sorted((ROOT / pkg).rglob("*.py"))
                  if "__pycache__" not in p.parts]
    return files


def secret_lines() -> set[str]:
    """Lines that identify instructor-only content: every substantial line of the solution that
    the skeleton does not share, and every hidden test case."""
    skeleton = set(_norm_lines((ROOT / "student" / "submission.cu").read_text()))
    secrets = {l for l in _norm_lines((ROOT / "solution" / "submission.cu").read_text())
               if len(l) >= 30 and l not in skeleton}
    for line in (ROOT / "test_cases" / "hidden.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            secrets.add(line)
    return secrets


def _norm_lines(text: str) -> list[str]:
    return [" ".join(l.split()) for l in text.splitlines() if l.strip()]


def hidden_cases() -> list[dict[str, int]]:
    """The hidden cases' fields, from test_cases/hidden.txt (parsed here: the release script
    depends on nothing of the grader's)."""
    cases = []
    for line in (ROOT / "test_cases" / "hidden.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            fields = {k.strip(): v.strip() for k, v in (f.split(":") for f in line.split(";"))}
            # sizes and seeds are whole numbers; rtol, atol and qk_std need not be
            cases.append({k: float(v) if k in ("rtol", "atol", "qk_std") else int(v)
                          for k, v in fields.items()})
    return cases


def shape_patterns(cases: list[dict[str, int]]) -> list[tuple[str, re.Pattern]]:
    """(what, pattern) for every way a text could name a hidden case: its id, its shape as a
    tuple, a sequence length or seed after its key (`seq_len: 77`, `S = 1, 77`, `seqlen=77`,
    `sequence lengths 77 and`), a head dimension, batch or head count only inside an id or tuple."""
    pats = []
    for c in cases:
        b, h, s, d, seed = (c["batch_size"], c["num_heads"], c["seq_len"], c["head_dim"], c["seed"])
        pats.append((f"case id b{b}_h{h}_s{s}_d{d}", re.compile(rf"\bb{b}_h{h}_s{s}_d{d}(?![0-9])")))
        pats.append((f"shape ({b}, {h}, {s}, {d})",
                     re.compile(rf"\(\s*{b}\s*,\s*{h}\s*,\s*{s}\s*,\s*{d}\s*\)")))
        pats.append((f"seed {seed}", re.compile(rf"\bseed\b[\"'`]?\s*[:=]?\s*{seed}\b", re.I)))
        if s not in DISCLOSED["seq_len"]:
            key = r"(?:seq_?len|seqlen|sequence lengths?|S|N)"
            pats.append((f"seq_len {s}", re.compile(
                rf"\b{key}[\"'`]?\s*(?:[:=]|of|is)?\s*(?:\d+\s*,\s*)*{s}\b", re.I)))
            pats.append((f"seq_len {s} in an id", re.compile(rf"_s{s}_d\d+(?![0-9])")))
    return pats


def _instructor_paths(text: str) -> str | None:
    for pattern in INSTRUCTOR_PATHS:
        m = pattern.search(text)
        if m:
            return m.group(0)
    return None


def find_leaks(tree: Path) -> list[str]:
    """Paths outside ALLOWED, and files that hold a secret line, name an instructor-only path or
    name a hidden case's shape (file:line and what)."""
    problems, secrets = [], secret_lines()
    shapes = shape_patterns(hidden_cases())
    for path in sorted(p for p in tree.rglob("*") if p.is_file()):
        rel = str(path.relative_to(tree))
        if not any(fnmatch.fnmatch(rel, pattern) for pattern in ALLOWED):
            problems.append(f"{rel}: not on the allow-list")
            continue
        text = path.read_text(errors="replace")
        lines = set(_norm_lines(text))
        leaked = [s for s in secrets if s in lines]
        if leaked:
            problems.append(f"{rel}: contains instructor-only content, e.g. {leaked[0]!r}")
        for lineno, line in enumerate(text.splitlines(), 1):
            named = _instructor_paths(line)
            if named:
                problems.append(f"{rel}:{lineno}: names an instructor-only path ({named!r}): {line.strip()[:100]}")
            for what, pattern in shapes:
                if pattern.search(line):
                    problems.append(f"{rel}:{lineno}: names a hidden case ({what}): {line.strip()[:100]}")
    return problems


def scrub(stage: Path) -> None:
    """Rewrite SCRUB's lines in the staged copy."""
    for rel, old, new in SCRUB:
        path = stage / rel
        text = path.read_text()
        if old in text:
            path.write_text(text.replace(old, new))


def build(out_dir: Path) -> Path:
    stage = out_dir / NAME
    shutil.rmtree(stage, ignore_errors=True)
    for src, dst in release_files():
        target = stage / dst
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    scrub(stage)
    problems = find_leaks(stage)
    if problems:
        raise SystemExit("release refused:\n  " + "\n  ".join(problems))
    archive = out_dir / f"{NAME}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(stage, arcname=NAME)
    return archive


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, default=ROOT / "dist")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    archive = build(args.out)
    print(f"release: {archive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
