"""grading.toml is checked whole at start-up: every bad value is one line with file, line, key
and what is allowed; nothing is accepted silently."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grader.common import config
from grader.course.policy import POLICY_FILE, Policy, PolicyError, load_policy, missing_baselines

GOOD = POLICY_FILE.read_text(encoding="utf-8")
FIXTURES = Path(__file__).parent / "fixtures" / "gpu_run"


def _policy(tmp_path, text: str, *, raw: bytes | None = None):
    path = tmp_path / "grading.toml"
    path.write_bytes(raw if raw is not None else text.encode("utf-8"))
    return path


def test_the_shipped_policy_loads():
    policy = load_policy()
    assert policy.public_case_points == 10 and policy.full_at == "baseline:sdpa_flash"
    assert policy.review_top == 10 == Policy().review_top


def test_a_bom_is_accepted(tmp_path):
    path = _policy(tmp_path, "", raw=b"\xef\xbb\xbf" + GOOD.encode())
    assert load_policy(path) == load_policy()


@pytest.mark.parametrize("old, new, expected", [
    ("[correctness]", "[corectness]",
     "[corectness]: unknown section (did you mean 'correctness'?)"),
    ("public_case_points = 10", "public_cases_points = 10",
     "[correctness] public_cases_points: unknown key (did you mean 'public_case_points'?)"),
    ("public_case_points = 10", "public_case_points = -10",
     "[correctness] public_case_points: -10 is too small; use a number >= 0"),
    ("hidden_case_points = 5", 'hidden_case_points = "5"',
     "[correctness] hidden_case_points: '5' is not a number"),
    ("points = 30", "points = true", "[performance] points: True is not a number"),
    ("precision_factor = 2.0", "precision_factor = 0.5", "precision_factor: 0.5 is too small; use a number >= 1"),
    ("precision_floor = 0.001", "precision_floor = -0.001", "precision_floor: -0.001 is too small"),
    ('full_at = "baseline:sdpa_flash"', "full_at = 0",
     "[performance] full_at: 0 must be more than 0 ms"),
    ('full_at = "baseline:sdpa_flash"', 'full_at = "baseline:sdpa_flsh"',
     "names no baseline (did you mean 'sdpa_flash'?)"),
    ('full_at = "baseline:sdpa_flash"', 'full_at = "sdpa_flash"',
     "is neither \"baseline:<name>\" nor a number"),
    ('zero_at = "baseline:torch_reference"\nfull_at = "baseline:sdpa_flash"',
     'zero_at = 2.0\nfull_at = 5.0', "zero_at = 2.0 ms is not slower than full_at = 5.0 ms: swap them"),
    ('zero_at = "baseline:torch_reference"\nfull_at = "baseline:sdpa_flash"',
     'zero_at = "baseline:sdpa_flash"\nfull_at = "baseline:torch_reference"', "swap them"),
    ('full_at = "baseline:sdpa_flash"', 'full_at = "baseline:torch_reference"', "both 'baseline:torch_reference'"),
    ("pseudonyms = true", 'pseudonyms = "yes"', "[display] pseudonyms: 'yes' is not true or false"),
    ('pseudonym_salt = "change-me-per-course"', 'pseudonym_salt = ""', "is not a non-empty string"),
    ("[correctness]", "colour = 1\n[correctness]", "colour: unknown key outside any section"),
    ("top = 10", "top = -1", "[review] top: -1 is too small; use a whole number >= 0"),
    ("top = 10", "top = 2.5", "[review] top: 2.5 is not a whole number"),
    ("top = 10", "top = true", "[review] top: True is not a whole number"),
    ("top = 10", "tops = 10", "[review] tops: unknown key (did you mean 'top'?)"),
    ("[review]", "[reveiw]", "[reveiw]: unknown section (did you mean 'review'?)"),
    ("checks_per_hour = 20", "checks_per_hour = -1",
     "[service] checks_per_hour: -1 is too small; use a whole number >= 0"),
    ("upload_mb = 4", "upload_mb = 0", "[service] upload_mb: 0 is not a number > 0"),
    ('counts = "best"', 'counts = "first"',
     "[service] counts: 'first' is not one of them; use \"best\" or \"last\""),
    ("upload_mb = 4", 'upload_mb = 4\ndeadline = "2026-12-11"',
     "[service] deadline: '2026-12-11' is not a date and time (TOML's, unquoted)"),
    ("upload_mb = 4", "upload_mb = 4\ndeadline = 2026-12-11T23:59:00",
     "has no offset from UTC (e.g. -08:00 or Z)"),
])
def test_each_bad_value_is_one_line_naming_file_key_and_fix(tmp_path, old, new, expected):
    assert old in GOOD
    path = _policy(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(PolicyError) as e:
        load_policy(path)
    lines = str(e.value).splitlines()
    assert any(expected in line for line in lines), lines
    assert all(line.startswith(str(path)) for line in lines), lines
    # the line named is one of the lines changed
    text = GOOD.replace(old, new, 1).splitlines()
    changed = {i for i, line in enumerate(text, start=1) if line in new.splitlines()}
    assert any(line.startswith(f"{path}:{n}: ") for n in changed for line in lines), (changed, lines)


def test_the_service_s_limits_choice_and_deadline_are_read(tmp_path):
    import datetime
    policy = load_policy()
    assert (policy.service_checks_per_hour, policy.service_submissions_per_day,
            policy.service_upload_mb, policy.service_counts, policy.service_deadline) == \
        (20, 5, 4, "best", None)
    text = GOOD.replace('counts = "best"', 'counts = "last"\ndeadline = 2026-12-11T23:59:00-08:00')
    policy = load_policy(_policy(tmp_path, text))
    assert policy.service_counts == "last"
    assert policy.service_deadline == datetime.datetime(
        2026, 12, 12, 7, 59, tzinfo=datetime.timezone.utc)


def test_the_review_queue_size_is_read(tmp_path):
    assert load_policy(_policy(tmp_path, GOOD.replace("top = 10", "top = 0"))).review_top == 0
    assert load_policy(_policy(tmp_path, GOOD.replace("top = 10", "top = 25"))).review_top == 25


def test_a_section_given_as_a_value_is_named(tmp_path):
    with pytest.raises(PolicyError, match=r"grading.toml:1: display: must be a section \[display\]"):
        load_policy(_policy(tmp_path, "display = 3\n"))


def test_every_problem_is_reported_at_once(tmp_path):
    text = GOOD.replace("public_case_points = 10", "public_case_points = -1").replace(
        "pseudonyms = true", "pseudonyms = 1").replace("[performance]", "[perfomance]")
    with pytest.raises(PolicyError) as e:
        load_policy(_policy(tmp_path, text))
    assert len(str(e.value).splitlines()) == 3


def test_bad_bytes_and_bad_toml_name_the_file_and_line(tmp_path):
    path = _policy(tmp_path, "", raw=GOOD.encode().replace(b"pseudonyms", b"pseud\xe9nyms"))
    with pytest.raises(PolicyError, match=r"grading.toml:\d+: byte 0xe9 is not UTF-8"):
        load_policy(path)
    with pytest.raises(PolicyError, match=r"grading.toml: not valid TOML: .*line 2"):
        load_policy(_policy(tmp_path, "[display]\npseudonyms = \n"))


def test_a_missing_policy_is_the_default_unless_named(tmp_path):
    assert load_policy(tmp_path / "absent.toml") == Policy()
    with pytest.raises(PolicyError, match="no such policy file"):
        load_policy(tmp_path / "absent.toml", required=True)


def test_thresholds_that_name_an_untimed_baseline_are_reported():
    policy = Policy()
    assert missing_baselines(policy, {"torch_reference", "sdpa_flash"}) == []
    [problem] = missing_baselines(policy, {"torch_reference"})
    assert "full_at = 'baseline:sdpa_flash'" in problem and "number of ms" in problem
    assert missing_baselines(Policy(zero_at=9.0, full_at=1.0), set()) == []


def _grader(*args):
    return subprocess.run([sys.executable, "-m", "grader", *args], capture_output=True, text=True,
                          cwd=config.REPO_ROOT, timeout=300)


def test_a_bad_policy_stops_grade_and_leaderboard_before_anything_runs(tmp_path):
    bad = _policy(tmp_path, GOOD.replace("[performance]", "[perfomance]"))
    sub = tmp_path / "subs" / "a"
    sub.mkdir(parents=True)
    (sub / "submission.py").write_text("def custom_kernel(d):\n    return d[0]\n")
    proc = _grader("grade", str(sub.parent), "--policy", str(bad), "--out", str(tmp_path / "r"),
                   "--build-dir", str(tmp_path / "b"), "--cpu")
    assert proc.returncode == 2 and "did you mean 'performance'" in proc.stderr
    assert not (tmp_path / "b").exists() and not (tmp_path / "r" / "a.json").exists()
    out = tmp_path / "results"
    shutil.copytree(FIXTURES, out)
    proc = _grader("leaderboard", "--policy", str(bad), "--out", str(out))
    assert proc.returncode == 2 and "did you mean 'performance'" in proc.stderr
    assert "Traceback" not in proc.stderr and not (out / "leaderboard.html").exists()


def test_leaderboard_refuses_when_a_thresholds_baseline_result_is_gone(tmp_path):
    out = tmp_path / "results"
    shutil.copytree(FIXTURES, out)
    (out / "baselines" / "sdpa_flash.json").unlink()
    proc = _grader("leaderboard", "--out", str(out))
    assert proc.returncode == 2, proc.stderr
    assert "full_at = 'baseline:sdpa_flash'" in proc.stderr and "number of ms" in proc.stderr
    numbers = _policy(tmp_path, GOOD.replace('"baseline:torch_reference"', "20.0").replace(
        '"baseline:sdpa_flash"', "2.0"))
    proc = _grader("leaderboard", "--out", str(out), "--policy", str(numbers))
    assert proc.returncode == 0, proc.stderr
