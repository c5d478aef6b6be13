"""grader/course/locks.py: a run refused by a results folder's lock is told the way around it."""

from __future__ import annotations

import sys

import pytest

from grader.course.locks import LockHeld, folder_lock, gpu_lock, with_out


def test_a_refused_run_is_given_this_command_with_a_results_folder_of_its_own(tmp_path, monkeypatch):
    out = tmp_path / "results" / "check" / "triton"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["/kit/grader/__main__.py", "check", "student/triton",
                                      "--out", str(out), "--cpu"])
    held = folder_lock(out)
    held.acquire()
    try:
        with pytest.raises(LockHeld) as refused:
            folder_lock(out).acquire()
    finally:
        held.release()
    message = str(refused.value)
    assert f"the results folder {out} is in use by another grading run (pid " in message
    # the same command, its --out replaced, as a shell could run it again
    assert "; wait for it to end, or give this run a results folder of its own with --out: " in message
    assert message.split("with --out: ")[1].split(". Lock file")[0].endswith(
        " -m grader check student/triton --cpu --out results/check/triton-2")
    assert folder_lock(out).acquire() == ""   # released: free again


def test_with_out_drops_every_out_it_had(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["/x/grader/__main__.py", "grade", "course", "--out=old",
                                      "--jobs", "2", "--out", "older"])
    assert with_out(tmp_path / "new").endswith("-m grader grade course --jobs 2 --out new")


def test_a_gpu_lock_names_no_way_around(tmp_path, monkeypatch):
    """Two runs on one GPU would disturb each other's timings: waiting is the only way."""
    monkeypatch.setenv("GRADER_LOCK_DIR", str(tmp_path / "locks"))
    first = gpu_lock("GPU-1")
    first.acquire()
    try:
        with pytest.raises(LockHeld, match=r"wait for it to end\. Lock file"):
            gpu_lock("GPU-1").acquire()
    finally:
        first.release()
