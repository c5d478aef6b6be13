"""Gradescope: its results.json format, and an autograder that reports what the GPU box computed.

Gradescope's autograder containers have no GPU, so grading happens on the course's GPU machine
(`make grade`), and the autograder uploaded to Gradescope only looks results up:

    python -m grader.report.gradescope RESULTS_DIR --roster roster.csv [--zip autograder.zip]

packs `scripts/gradescope/run_autograder` and `setup.sh`, every student's
`gradescope/<folder>/results.json`, and an index from roster email and SID to folder into a zip
for the assignment's "Configure Autograder" page. Then "Regrade all submissions": for each
submission, run_autograder reads /autograder/submission_metadata.json, finds the submitter by
email or SID, and copies their results to /autograder/results/results.json.

Format: https://gradescope-autograders.readthedocs.io/en/latest/specs/ (checked by
`problems`, which the tests run on every results.json the grader writes).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import zipfile
from pathlib import Path

from grader.common import config
from grader.course.roster import RosterError, load_roster

SCRIPTS = config.REPO_ROOT / "scripts" / "gradescope"
VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}
FORMATS = {"text", "html", "simple_format", "md", "ansi"}
TOP_KEYS = {"score", "execution_time", "output", "output_format", "test_output_format",
            "test_name_format", "visibility", "stdout_visibility", "extra_data", "tests", "leaderboard"}
TEST_KEYS = {"score", "max_score", "status", "name", "name_format", "number", "output",
             "output_format", "tags", "visibility", "extra_data"}
INDEX = "index.json"


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def problems(doc: dict) -> list[str]:
    """What in `doc` breaks Gradescope's published results format; empty when nothing does."""
    out = []
    if not isinstance(doc, dict):
        return ["the document is not a JSON object"]
    out += [f"unknown top-level key {k!r}" for k in doc if k not in TOP_KEYS]
    tests = doc.get("tests")
    if "score" not in doc and not (isinstance(tests, list) and tests and all("score" in t for t in tests)):
        out.append("no top-level score and not every test has one")
    if "score" in doc and not _number(doc["score"]):
        out.append(f"score {doc['score']!r} is not a finite number")
    for key in ("visibility", "stdout_visibility"):
        if key in doc and doc[key] not in VISIBILITY:
            out.append(f"{key} {doc[key]!r} is not one of {sorted(VISIBILITY)}")
    for key in ("output_format", "test_output_format", "test_name_format"):
        if key in doc and doc[key] not in FORMATS:
            out.append(f"{key} {doc[key]!r} is not one of {sorted(FORMATS)}")
    if "output" in doc and not isinstance(doc["output"], str):
        out.append("output is not a string")
    for i, t in enumerate(tests if isinstance(tests, list) else []):
        where = f"tests[{i}]"
        out += [f"{where}: unknown key {k!r}" for k in t if k not in TEST_KEYS]
        for key in ("score", "max_score"):
            if key in t and not _number(t[key]):
                out.append(f"{where}.{key} {t[key]!r} is not a finite number")
        if t.get("status", "passed") not in {"passed", "failed"}:
            out.append(f"{where}.status {t['status']!r} is not 'passed' or 'failed'")
        if t.get("visibility", "visible") not in VISIBILITY:
            out.append(f"{where}.visibility {t['visibility']!r} is not one of {sorted(VISIBILITY)}")
        for key in ("name", "output", "number"):
            if key in t and not isinstance(t[key], str):
                out.append(f"{where}.{key} is not a string")
    if "tests" in doc and not isinstance(tests, list):
        out.append("tests is not a list")
    for i, entry in enumerate(doc.get("leaderboard", [])):
        if set(entry) - {"name", "value", "order"} or "name" not in entry or "value" not in entry:
            out.append(f"leaderboard[{i}] needs name and value (and optional order) only")
        if entry.get("order", "desc") not in {"asc", "desc"}:
            out.append(f"leaderboard[{i}].order {entry['order']!r} is not 'asc' or 'desc'")
    try:
        json.dumps(doc, allow_nan=False)
    except ValueError as e:
        out.append(f"not strict JSON: {e}")
    return out


def lookup_index(roster_path: Path) -> dict[str, str]:
    """Lower-cased email and SID -> submission folder, from the roster."""
    index = {}
    for s in load_roster(roster_path).students:
        for column in ("email", "sid"):
            key = s.get(column).strip().lower()
            if key:
                index[f"{column}:{key}"] = s.folder
    return index


def bundle(results_dir: Path, roster_path: Path, dest: Path) -> tuple[Path, list[str]]:
    """The autograder zip; the roster's folders that have no results.json (not in the zip)."""
    index = lookup_index(roster_path)
    folders = sorted(set(index.values()))
    missing = []
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as z:
        for name in ("run_autograder", "setup.sh"):
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o755 << 16           # executable once unpacked
            z.writestr(info, (SCRIPTS / name).read_text())
        z.writestr(INDEX, json.dumps(index, indent=1, sort_keys=True))
        for folder in folders:
            src = results_dir / "gradescope" / folder / "results.json"
            if src.exists():
                z.write(src, f"results/{folder}/results.json")
            else:
                missing.append(folder)
    return dest, missing


def _why_no_grades(results_dir: Path) -> str | None:
    from grader.report.rows import why_no_grades
    try:
        return why_no_grades(json.loads((results_dir / "_run.json").read_text()))
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader.report.gradescope", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path, help="the results folder of a grading run")
    p.add_argument("--roster", type=Path, required=True, help="the course roster CSV (email or sid)")
    p.add_argument("--zip", type=Path, help="where to write it (default RESULTS/gradescope_autograder.zip)")
    a = p.parse_args(argv)
    if not (a.results / "gradescope").is_dir():
        why = _why_no_grades(a.results)
        print(f"error: {a.results}/gradescope/ does not exist; " +
              (f"that run wrote no grades: {why}" if why else "run 'make grade' first"), file=sys.stderr)
        return 2
    try:
        dest, missing = bundle(a.results, a.roster, a.zip or a.results / "gradescope_autograder.zip")
    except RosterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"autograder: {dest} (upload it on the assignment's Configure Autograder page, then "
          f"Regrade all submissions)")
    if missing:
        print(f"no results for {len(missing)} roster folder(s): {', '.join(missing)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
