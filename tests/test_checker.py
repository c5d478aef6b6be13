"""The warm checker (grader/trusted/checks/server.py, correctness.WarmChecker): one trusted process checks
submission after submission with the same verdicts a fresh one gives, keeps each case's reference,
and a checker that dies or hangs is replaced without losing the next check."""

from __future__ import annotations

import dataclasses
import os
import signal

import pytest
import torch

from grader.common import config

from grader.trusted import correctness
from grader.problem import Case
from grader.trusted.correctness import WarmChecker, check_outputs
from grader.trusted.outputs import load_output, output_path, save_output
from grader.problem import make_inputs
from grader.isolation.procs import child_env
from grader.problem import attention_reference
from grader.common.status import Status

CASES = [Case(batch_size=1, num_heads=2, seq_len=77, head_dim=64, seed=11),
         Case(batch_size=2, num_heads=1, seq_len=5, head_dim=128, seed=3)]


def _outputs(folder, *, wrong: str | None = None) -> dict:
    """Save each case's output as the harness does (the right one, or zeros for `wrong`); the
    runs as the harness reports them."""
    folder.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        out = attention_reference(*make_inputs(case, "cpu")).half()
        save_output(torch.zeros_like(out) if case.id == wrong else out, output_path(folder, case.id))
    return {c.id: dict(status="pass", message="", elapsed_s=0.01) for c in CASES}


def _check(folder, runs, limits=config.Limits()):
    return check_outputs(CASES, runs, out_dir=folder, device="cpu", limits=limits,
                         env=child_env(cuda=False))


@pytest.fixture
def checker_pid():
    """The pid of the warm checker for the CPU environment, after a check."""
    def pid() -> int:
        checker = WarmChecker.for_stage(child_env(cuda=False),
                                        correctness.split_cpus(config.Limits().gpu_stage_cpus).gpu)
        assert checker.alive
        return checker.proc.pid
    yield pid
    for checker in list(WarmChecker._kept.values()):
        checker._stop()


def test_one_checker_process_checks_submission_after_submission(tmp_path, checker_pid):
    first = _check(tmp_path / "a", _outputs(tmp_path / "a"))
    pid = checker_pid()
    second = _check(tmp_path / "b", _outputs(tmp_path / "b", wrong=CASES[1].id))
    assert checker_pid() == pid
    assert [r.status for r in first] == [Status.PASS, Status.PASS]
    assert [r.status for r in second] == [Status.PASS, Status.MISMATCH]
    assert second[1].finding.all_zero and second[1].finding.mismatches > 0
    # The kept reference gives the same numbers as a fresh one: the same output, the same finding.
    again = _check(tmp_path / "c", _outputs(tmp_path / "c"))
    assert [dataclasses.asdict(r.finding) for r in again] == [dataclasses.asdict(r.finding) for r in first]


def test_a_checker_that_died_is_replaced_at_the_next_check(tmp_path, checker_pid):
    _check(tmp_path / "a", _outputs(tmp_path / "a"))
    dead = checker_pid()
    os.kill(dead, signal.SIGKILL)
    results = _check(tmp_path / "b", _outputs(tmp_path / "b", wrong=CASES[0].id))
    assert [r.status for r in results] == [Status.MISMATCH, Status.PASS], results[0].message
    assert checker_pid() != dead


def test_a_check_past_its_limit_is_the_graders_error_and_the_next_one_is_checked(tmp_path, checker_pid):
    _check(tmp_path / "a", _outputs(tmp_path / "a"))
    hung = checker_pid()
    os.kill(hung, signal.SIGSTOP)   # a checker that never answers
    results = _check(tmp_path / "b", _outputs(tmp_path / "b"), limits=config.Limits(check_s=3))
    assert all(r.status is Status.RUNTIME_ERROR and "the checker timed out" in r.message
               for r in results)
    results = _check(tmp_path / "c", _outputs(tmp_path / "c"))
    assert [r.status for r in results] == [Status.PASS, Status.PASS]
    assert checker_pid() != hung


def test_a_cases_reference_is_computed_once_and_the_oldest_goes_past_the_cap(monkeypatch):
    from grader.trusted.checks import test_outputs
    monkeypatch.setattr(test_outputs, "_REFERENCES", type(test_outputs._REFERENCES)())
    computed = []
    real = test_outputs.attention_reference
    monkeypatch.setattr(test_outputs, "attention_reference",
                        lambda *qkv: computed.append(qkv[0].shape) or real(*qkv))
    inputs = [make_inputs(c, "cpu") for c in CASES]
    first = test_outputs.reference(CASES[0], inputs[0], "cpu")
    assert test_outputs.reference(CASES[0], inputs[0], "cpu")[0] is first[0]
    assert len(computed) == 1
    # Room for the first case's reference only: the second pushes it out.
    size = first[0].numel() * first[0].element_size()
    monkeypatch.setattr(config, "CHECK_REFERENCE_BYTES", size)
    test_outputs.reference(CASES[1], inputs[1], "cpu")
    test_outputs.reference(CASES[0], inputs[0], "cpu")
    assert len(computed) == 3
    assert first[1] == test_outputs.reference(CASES[0], inputs[0], "cpu")[1] > 0


# Two cases of one shape and seed, one drawn wide (qk_std: scores past ±100): other inputs, so
# another reference, in the checker's process as well as here.
SPREAD = [Case(batch_size=1, num_heads=2, seq_len=77, head_dim=64, seed=11),
          Case(batch_size=1, num_heads=2, seq_len=77, head_dim=64, seed=11, qk_std=6)]


def test_the_checker_draws_each_cases_spread(tmp_path, checker_pid):
    """The spec carries qk_std to the checker, which draws the same wide inputs as the harness:
    each case's right output passes, and the output of the same shape drawn N(0, 1) fails it."""
    outs = {c.id: attention_reference(*make_inputs(c, "cpu")).half() for c in SPREAD}
    runs = {c.id: dict(status="pass", message="", elapsed_s=0.01) for c in SPREAD}

    def check(folder, swapped: bool):
        folder.mkdir()
        for case, other in zip(SPREAD, SPREAD[::-1]):
            save_output(outs[other.id if swapped else case.id], output_path(folder, case.id))
        return check_outputs(SPREAD, runs, out_dir=folder, device="cpu", limits=config.Limits(),
                             env=child_env(cuda=False))
    right = check(tmp_path / "a", swapped=False)
    assert [(r.case, r.status) for r in right] == [("b1_h2_s77_d64", Status.PASS),
                                                   ("b1_h2_s77_d64_qk6", Status.PASS)]
    assert [r.status for r in check(tmp_path / "b", swapped=True)] == [Status.MISMATCH, Status.MISMATCH]


def test_a_kept_reference_is_the_one_of_the_cases_spread(monkeypatch):
    """The warm checker keeps references by what the inputs are made from: the same shape and
    seed with another qk_std is computed anew, never served the N(0, 1) one."""
    from grader.trusted.checks import test_outputs
    monkeypatch.setattr(test_outputs, "_REFERENCES", type(test_outputs._REFERENCES)())
    narrow, wide = (test_outputs.reference(c, make_inputs(c, "cpu"), "cpu") for c in SPREAD)
    assert len(test_outputs._REFERENCES) == 2
    assert not torch.equal(narrow[0], wide[0]) and wide[1] > narrow[1]
    expected = attention_reference(*make_inputs(SPREAD[1], "cpu"))
    assert torch.equal(test_outputs.reference(SPREAD[1], make_inputs(SPREAD[1], "cpu"), "cpu")[0], expected)


def test_an_output_is_handed_to_the_checker_as_its_raw_elements(tmp_path):
    """Issue 32: the run stage writes O's float16 elements raw (outputs.py), not a torch.save
    archive (0.36 s of each run stage and 0.5 s of each check on the largest case, H100). What is
    read is exactly what was written, a new write replaces an older, longer file whole, and a
    file of the wrong size is an error that names it and the fix."""
    o = torch.randn(2, 3, 5, 8).half()
    path = output_path(tmp_path, "b2_h3_s5_d8")
    assert path.name == "b2_h3_s5_d8.f16"
    save_output(torch.randn(4, 3, 5, 8).half(), path)   # an older, longer output
    save_output(o, path)
    assert path.stat().st_size == 2 * o.numel()
    assert torch.equal(load_output(path, o.shape, "cpu"), o)
    o.zero_()   # the saved elements are a copy: the buffer O is the subject's too
    assert load_output(path, o.shape, "cpu").abs().sum() > 0
    with pytest.raises(ValueError, match=r"b2_h3_s5_d8\.f16: 480 bytes, expected 960.*grade the "
                                         r"submission again"):
        load_output(path, (2, 6, 5, 8), "cpu")
    with pytest.raises(ValueError, match="float16"):
        save_output(o.float(), path)
    empty = output_path(tmp_path, "empty")
    save_output(torch.empty(1, 1, 0, 8, dtype=torch.float16), empty)
    assert load_output(empty, (1, 1, 0, 8), "cpu").shape == (1, 1, 0, 8)
    elsewhere, link = tmp_path / "elsewhere", output_path(tmp_path, "linked")
    link.symlink_to(elsewhere)   # a link where the output goes is replaced, never followed
    save_output(o, link)
    assert not elsewhere.exists() and not link.is_symlink() and link.stat().st_size == 2 * o.numel()


def test_an_output_the_checker_cannot_read_is_the_grader_s_problem(tmp_path, checker_pid):
    """A run stage's output file cut short (the harness writes it whole: a full disk, another
    grader version) is neither a mismatch nor the submission's runtime error: the checker says it
    broke (CHECKER_BROKE, which the check stage grades again as the machine's), and the message
    names neither the file nor the case's shape (hidden cases are checked too)."""
    from grader.stages.check import is_broken
    folder = tmp_path / "out"
    runs = _outputs(folder)
    path = output_path(folder, CASES[1].id)
    path.write_bytes(path.read_bytes()[:-2])
    results = {r.case: r for r in _check(folder, runs)}
    checker_pid()   # (the fixture stops the warm checker after the test: no process outlives it)
    assert results[CASES[0].id].status is Status.PASS
    broken = results[CASES[1].id]
    assert broken.status is Status.RUNTIME_ERROR and is_broken(broken), broken
    assert broken.message.startswith(correctness.CHECKER_BROKE + "could not read the run stage's")
    assert CASES[1].id not in broken.message and str(folder) not in broken.message
