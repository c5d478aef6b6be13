"""Build the student release: dist/flash-attention-student.tar.gz.

What students get, and nothing else: the skeleton and handout (student/), the public test
cases, the grader (to check locally), the set-up script, a student Makefile and README. Never
solution/, the hidden cases, the examples (correct kernels), the tests, the notes or the bench.
The build fails if any file outside ALLOWED would be packed, or if the archive contains a line of
the solution or of the hidden cases.
"""

from __future__ import annotations

import argparse
import fnmatch
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
    ("pyproject.toml", "pyproject.toml"),
    ("scripts/bootstrap.sh", "scripts/bootstrap.sh"),
    ("test_cases/test.txt", "test_cases/test.txt"),
    ("templates/leaderboard.html.j2", "templates/leaderboard.html.j2"),
    ("student/README.md", "student/README.md"),
    ("student/Makefile", "student/Makefile"),
    ("student/submission.cu", "student/submission.cu"),
    ("student/triton/submission.py", "student/triton/submission.py"),
]
PACKAGES = ["grader"]   # every .py below these

# Every path in the archive must match one of these.
ALLOWED = ["README.md", "Makefile", "pyproject.toml", "scripts/bootstrap.sh", "test_cases/test.txt",
           "templates/*.j2", "student/README.md", "student/Makefile", "student/submission.cu",
           "student/triton/submission.py", "grader/*.py", "grader/checks/*.py"]


def release_files() -> list[tuple[Path, str]]:
    files = [(ROOT / src, dst) for src, dst in FILES]
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


def find_leaks(tree: Path) -> list[str]:
    """Paths outside ALLOWED, and files containing a secret line."""
    problems, secrets = [], secret_lines()
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
    return problems


def build(out_dir: Path) -> Path:
    stage = out_dir / NAME
    shutil.rmtree(stage, ignore_errors=True)
    for src, dst in release_files():
        target = stage / dst
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
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
