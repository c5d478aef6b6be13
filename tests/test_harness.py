"""The trusted harness driving a subject on the CPU: per-case records, deaths pinned to their
case, deadlines, and a subject that writes on the grader's pipe (no sandbox needed here)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import statistics
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from grader.common import config

from grader.trusted import (calibration, call_checks, gpu_watch, replies, run_stage, time_stage,
                            timed_calls)
from grader.trusted.link import Link
from grader.trusted.outputs import load_output, output_path

from grader.isolation import tree as tree_mod
from grader.problem import Case
from grader.problem import make_random_inputs
from grader.stages.folders import SUBJECT
from grader.isolation.procs import child_env
from grader.course.results import LOOP_PARTS, TIME_PHASES
from grader.course.verdicts import ProtocolCost
from grader.common.text import clean
from .devices import GPU

CASES = [Case(1, 2, s, 64, seed=s) for s in (1, 7, 9)]


def run_spec(tmp_path, source: str, deadline_s: float = 60, **fields) -> dict:
    folder = tmp_path / "sub"
    folder.mkdir(parents=True)
    (folder / "submission.py").write_text(textwrap.dedent(source))
    return dict(mode="run", device="cpu", target=dict(kind="python", source=str(folder / "submission.py")),
                subject_cmd=[sys.executable, str(SUBJECT)], cwd=str(folder), head_bytes=4096,
                tail_bytes=4096, file_bytes=1 << 30, deadline_s=deadline_s, out_dir=str(tmp_path),
                result=str(tmp_path / "run.json"), env=child_env(cuda=False),
                cases=[c.to_dict() for c in CASES], **fields)


def run(tmp_path, source: str, deadline_s: float = 60, **fields) -> dict:
    return run_stage.run_cases(run_spec(tmp_path, source, deadline_s, **fields))


def statuses(result: dict) -> list[str]:
    return [result["cases"][c.id]["status"] for c in CASES]


def test_outputs_are_read_by_the_harness_and_death_is_pinned_to_its_case(tmp_path):
    result = run(tmp_path, """
        import os, torch
        def custom_kernel(data):
            q, k, v = data
            if q.shape[2] == 9:
                os._exit(7)
            return v.clone()
    """)
    assert statuses(result) == ["pass", "pass", "runtime_error"]
    assert "exited with code 7" in result["cases"][CASES[2].id]["message"]
    saved = load_output(output_path(tmp_path, CASES[1].id), CASES[1].shape, "cpu")
    assert saved.shape == CASES[1].shape and saved.dtype == torch.float16


def test_the_run_record_says_where_the_stage_s_time_went(tmp_path):
    """results.RUN_PHASES, measured on the one machine-wide monotonic clock from the spawn the
    pipeline stamped: the subject's load (here a 1.5 s import) lands in its own phase."""
    spawned = time.monotonic()
    result = run(tmp_path, """
        import time
        time.sleep(1.5)
        def custom_kernel(data):
            return data[2].clone()
    """, spawned=spawned)
    took = time.monotonic() - spawned
    phases = result["phases_s"]
    assert list(phases) == ["harness", "buffers", "subject", "cases"] and all(s >= 0 for s in phases.values())
    assert 1.5 <= phases["subject"] < took and sum(phases.values()) <= took
    assert phases["harness"] < 1   # started in this process: no start or import to wait for
    assert run_stage.phases(None, [("harness", 1.0), ("buffers", 3.5), ("subject", 4.0)]) == {
        "buffers": 2.5, "subject": 0.5}   # no spawn stamp: the first phase's start is unknown


def test_an_error_is_that_case_s_and_the_next_case_still_runs(tmp_path):
    result = run(tmp_path, """
        def custom_kernel(data):
            if data[0].shape[2] == 7:
                raise ValueError("not finished")
            return data[0][..., :32]
    """)
    assert statuses(result) == ["pass", "runtime_error", "pass"]
    assert "ValueError: not finished" in result["cases"][CASES[1].id]["message"]
    assert "expected (1, 2, 1, 64)" in result["cases"][CASES[0].id]["problem"]


def test_a_hang_ends_at_the_deadline_and_the_rest_are_not_run(tmp_path):
    result = run(tmp_path, """
        import time
        def custom_kernel(data):
            time.sleep(600)
    """, deadline_s=15)
    assert statuses(result) == ["timeout", "runtime_error", "runtime_error"]
    assert "not run: the process ended during case" in result["cases"][CASES[2].id]["message"]


def test_a_hang_ends_at_its_case_s_own_limit_long_before_the_run_s(tmp_path):
    # On a GPU each case's first call has a limit from its size (Limits.case_s); the run's limit
    # (here 300 s) still caps them all.
    result = run(tmp_path, """
        import time
        def custom_kernel(data):
            if data[0].shape[2] == 7:
                time.sleep(600)
            return data[2].clone()
    """, deadline_s=300, case_limits={c.id: 15.0 for c in CASES})
    assert statuses(result) == ["pass", "timeout", "runtime_error"]
    assert "still running after 15 s, the limit for a case of this size; killed while running this case" in \
        result["cases"][CASES[1].id]["message"]


def test_a_case_s_limit_from_its_size():
    limits = config.Limits()
    largest = Case(4, 64, 8192, 128, seed=1)
    assert limits.case_s(largest.flops) == limits.case_grace_s + largest.flops / 1e11
    assert 100 < limits.case_s(largest.flops) < limits.run_s
    assert limits.case_s(Case(1, 2, 77, 64, seed=1).flops) < limits.case_grace_s + 1


def test_writing_on_the_grader_s_pipe_is_a_protocol_violation_not_a_result(tmp_path):
    # A forged "done" for a call that has not happened yet, then a real call.
    result = run(tmp_path, """
        import json, os, sys
        setup = json.loads(sys.argv[sys.argv.index("--setup") + 1])
        os.write(setup["replies_fd"], b'{"event": "done", "n": 99, "returned": {}}\\n')
        def custom_kernel(data):
            return data[2].clone()
    """)
    assert statuses(result)[0] == "runtime_error"
    assert "broke the protocol" in result["cases"][CASES[0].id]["message"]


def test_a_load_error_is_the_first_case_s_verdict(tmp_path):
    result = run(tmp_path, "raise SystemExit(3)\n")
    assert statuses(result) == ["runtime_error"] * 3
    assert "SystemExit" in result["cases"][CASES[0].id]["message"]
    assert "did not load" in result["cases"][CASES[1].id]["message"]


def test_reported_kernel_names_are_cleaned():
    cleaned = replies.launched([["\x1b[2Jevil\nname", 3, 12.5], ["ok", 1, 0]], "launched", 5.0)
    assert cleaned == [[clean("\x1b[2Jevil\nname").replace("\n", " "), 3, 12.5], ["ok", 1, 0.0]]


def protocol_error(fn, *args, **kwargs) -> str:
    """The message of the protocol violation `fn` raises (and fails the test if it raises none)."""
    with pytest.raises(replies.SubjectGone) as raised:
        fn(*args, **kwargs)
    assert raised.value.status == "runtime_error"
    assert raised.value.message.startswith("the subject broke the protocol"), raised.value.message
    return raised.value.message


# Issue 30, item 5: each report that cannot be true, beside its honest twin. A launched list
# [name, count, GPU µs] for calls that took 20 ms by the harness's clock.
BAD_LAUNCHES = {
    "an infinite time": (["k", 3, float("inf")], ["k", 3, 19_000.0], "GPU µs (k) is Infinity"),
    "a NaN time": (["k", 3, float("nan")], ["k", 3, 0.0], "GPU µs (k) is NaN"),
    "a negative count": (["k", -1, 10.0], ["k", 0, 0.0], "count (k) is -1"),
    "a huge count": (["k", 10 ** 12, 10.0], ["k", 30_000, 10.0], "count (k) is 1000000000000"),
    "a 400-digit count": (["k", 10 ** 400, 10.0], ["k", 30_000, 10.0], "count (k) is 1000000"),
    "a float count": (["k", 3.0, 10.0], ["k", 3, 10.0], "count (k) is 3.0: not an integer"),
    "a string count": (["k", "3", 10.0], ["k", 3, 10.0], "count (k) is '3': not an integer"),
    "a bool count": (["k", True, 10.0], ["k", 1, 10.0], "count (k) is true: not an integer"),
    "a string time": (["k", 3, "10"], ["k", 3, 10], "GPU µs (k) is '10': not a number"),
    "longer than its calls": (["k", 3, 25_000.0], ["k", 3, 20_100.0], "GPU µs (k) is 25000.0"),
    "not a triple": (["k", 3], ["k", 3, 1.0], "launched[1] is [\"k\", 3]"),
}


@pytest.mark.parametrize("what", sorted(BAD_LAUNCHES))
def test_a_report_that_cannot_be_true_is_a_protocol_violation_naming_the_field(what):
    bad, honest, said = BAD_LAUNCHES[what]
    first = ["attention_kernel", 2, 100.0]
    assert replies.launched([first, honest], "launched", 20.0)[1][:2] == honest[:2]
    message = protocol_error(replies.launched, [first, bad], "launched", 20.0)
    assert said in message and "launched[1]" in message, message


def test_every_number_a_call_s_reply_holds_is_checked():
    """run_stage.call_record reads "done", "error" and "not_run" replies: each field it keeps has
    its type and its bounds, or the reply is a protocol violation that names it."""
    done = dict(event="done", n=1, returned=dict(type="Tensor", shape=[1, 2, 7, 64], dtype="float16",
                                                 usable=True, device="cpu"),
                launched=[["aten::copy_", 2, 0.0]], peak_memory_bytes=4096)
    record = run_stage.call_record(done, "cpu", elapsed=0.02)
    assert record["status"] == "pass" and record["peak_memory_bytes"] == 4096
    assert record["returned"] == dict(type="Tensor", shape=[1, 2, 7, 64], dtype="float16")
    limit = replies.memory_bytes("cpu")
    for field, value, said in [
            ("peak_memory_bytes", limit + 1, "peak_memory_bytes is"),
            ("peak_memory_bytes", -5, "peak_memory_bytes is -5"),
            ("peak_memory_bytes", 1.5, "not an integer"),
            ("returned", "Tensor", "returned is 'Tensor'"),
            ("returned", dict(type="Tensor", shape=5, dtype="float16"), "returned.shape is 5"),
            ("returned", dict(type="Tensor", shape=[1, -2, 7, 64], dtype="float16"),
             "returned.shape[1] is -2"),
            ("returned", dict(type="Tensor", shape=[1, 2, 7, 64], dtype=16), "returned.dtype is 16"),
            ("launched", {"k": 1}, "launched is"),
            ("launched", [["k", 1, 0.0]] * 201, "a list of 201"),
            ("event", "finished", "event is 'finished'")]:
        message = protocol_error(run_stage.call_record, dict(done, **{field: value}), "cpu", 0.02)
        assert said in message, (field, value, message)
    # an error reply: its context_alive is true or false, nothing else
    error = dict(event="error", n=1, error="ValueError", message="no", context_alive=False)
    assert run_stage.call_record(error, "cpu", 0.02)["context_lost"] is True
    assert "context_alive is 'no'" in protocol_error(
        run_stage.call_record, dict(error, context_alive="no"), "cpu", 0.02)
    not_run = dict(event="not_run", n=1, message="compiled", launched=[["k", 1, 0.0]])
    assert run_stage.call_record(not_run, "cpu", 0.02)["status"] == "not_run"
    protocol_error(run_stage.call_record, dict(not_run, launched=[["k", 1, 1e300]]), "cpu", 0.02)


def test_a_reply_is_json_with_finite_numbers_only():
    """json.loads takes NaN, Infinity and 1e999 (as inf) unless told not to, and raises errors
    that are not JSONDecodeError on a 5000-digit integer or deep nesting: each is a protocol
    violation here, not a number kept or a crash of the trusted process."""
    assert replies.parse_reply(b'{"event": "done", "n": 3, "x": [1.5, -2, 1e300]}')["x"][2] == 1e300
    for line in (b'{"x": NaN}', b'{"x": Infinity}', b'{"x": -Infinity}', b'{"x": 1e999}',
                 b'{"x": -1e999}'):
        assert "its reply's x is" in protocol_error(replies.parse_reply, line), line
    # the field is named, wherever it is
    said = protocol_error(replies.parse_reply, b'{"launched": [["k", 1, 2.5], ["x", 3, Infinity]]}')
    assert said.endswith("its reply's launched[1][2] is Infinity: not a finite number"), said
    # a NaN followed by what the parser cannot take is still a protocol violation, not a crash
    assert "its reply's number is NaN" in protocol_error(
        replies.parse_reply, b'[NaN, ' + b"[" * 100_000 + b"]" * 100_000 + b"]")
    for line in (b'{"x": 1' + b"0" * 5000 + b"}", b"[" * 100_000 + b"]" * 100_000,
                 b"\xff\xfe", b'{"x": 1', b"[1, 2]"):
        protocol_error(replies.parse_reply, line)


def test_sequence_numbers_are_integers_and_a_bad_one_never_crashes_the_harness():
    link = Link.__new__(Link)
    link.awaiting, link.diagnostics = {4}, {}
    # n = [4] is not hashable: it once raised TypeError in the harness itself
    assert not link._set_aside(dict(event="diagnostics", n=[4], subject_ms=1.0))
    assert not link._set_aside(dict(event="diagnostics", n=4.0, subject_ms=1.0))
    assert link._set_aside(dict(event="diagnostics", n=4, subject_ms=2, t_line=10 ** 40,
                                t_synced=float("1e300"), junk=3))
    # a diagnostic is only shown: what cannot be a time is dropped, the rest kept as floats
    assert link.diagnostics == {4: {"subject_ms": 2.0}}
    assert Link._in_sequence(dict(n=1), 1) == dict(n=1)
    for n in (True, 1.0, "1", None):
        protocol_error(Link._in_sequence, dict(n=n), 1)


REPORTS_INFINITY = """
    import sys
    loop = sys.modules["__main__"]          # grader/subject/loop.py, run as a script
    honest = loop.launched_names
    def forged(prof, device):               # its kernels' times, one made infinite
        return [[name, count, float("inf")] for name, count, us in honest(prof, device)]
    loop.launched_names = forged
    def custom_kernel(data):
        return data[2] * 1
"""


def test_an_infinite_time_from_the_subject_is_a_runtime_error_naming_the_field(tmp_path):
    """End to end through the pipe: json.dumps writes inf as Infinity; the harness's parser
    refuses it and the case is a runtime_error that says why. Its honest twin, the same
    submission with the subject's list untouched, passes."""
    result = run(tmp_path / "forged", REPORTS_INFINITY)
    assert statuses(result) == ["runtime_error"] * 3
    message = result["cases"][CASES[0].id]["message"]
    assert "broke the protocol: its reply's launched[0][2] is Infinity: not a finite number" in message
    assert "not run: the subject broke the protocol during case" in result["cases"][CASES[1].id]["message"]
    twin = run(tmp_path / "twin", "def custom_kernel(data):\n    return data[2] * 1\n")
    assert statuses(twin) == ["pass"] * 3


LONGER_THAN_ITS_CALLS = """
    import sys
    loop = sys.modules["__main__"]
    profile = loop.Subject.profile
    def forged(self, on):                   # the timed loop's kernels, each said to take 1 hour
        reply = profile(self, on)
        if not on:
            reply["kernels"] = [[k[0], k[1], 3.6e9] for k in reply["kernels"]]
        return reply
    loop.Subject.profile = forged
    def custom_kernel(data):
        return data[2] * 1
"""


def test_a_kernel_said_to_run_longer_than_the_timed_calls_is_a_runtime_error(tmp_path):
    """The timed loop's kernels can explain no more time than the calls took by the harness's
    clock: an hour of GPU time over seconds of calls ends the time stage as a runtime_error
    naming the field; the honest twin is test_a_timed_call_is_answered_first_and_described_after."""
    record = time_stage.time_case(time_spec(tmp_path, LONGER_THAN_ITS_CALLS, max_calls=3))
    assert record["failed"]["status"] == "runtime_error", record
    message = record["failed"]["message"]
    assert "its reply's kernels[0] GPU µs" in message and "3600000000.0" in message, message
    assert "no kernel runs longer than the" in message and "that the report covers" in message


def test_output_problem_names_type_shape_and_dtype():
    case = CASES[1]
    assert "returned NoneType" in run_stage.output_problem({"type": "NoneType"}, case)
    assert "shape (1, 2, 7, 32)" in run_stage.output_problem(
        {"type": "Tensor", "shape": [1, 2, 7, 32], "dtype": "float16"}, case)
    assert "torch.float32" in run_stage.output_problem(
        {"type": "Tensor", "shape": list(case.shape), "dtype": "float32"}, case)
    assert run_stage.output_problem({"type": "Tensor", "shape": list(case.shape), "dtype": "float16"}, case) == ""


def test_corrected_times_take_the_later_clock_less_the_protocol():
    from grader.course.verdicts import ProtocolCost
    assert timed_calls.corrected([10.0, 12.0], [10.5, 11.0], ProtocolCost(idle_ms=1.0)) == [9.5, 11.0]


def test_the_harness_result_is_json(tmp_path):
    result = run(tmp_path, "def custom_kernel(data):\n    return data[2].clone()\n")
    json.dumps(result)


def test_the_protocol_cost_never_ranks_a_slower_call_faster():
    from grader.trusted.timed_calls import corrected
    from grader.course.verdicts import ProtocolCost
    cost = ProtocolCost(idle_ms=1.0, busy_ms=1.45, busy_work_ms=5.0)
    assert cost.for_call(0.5) == 1.0 and cost.for_call(1.0) == 1.0
    assert abs(cost.for_call(3.5) - 1.225) < 1e-9 and cost.for_call(40.0) == 1.45
    raws = [i / 10 for i in range(0, 400)]
    times = corrected(raws, [0.0] * len(raws), cost)
    assert all(b > a for a, b in zip(times, times[1:]))          # strictly increasing in the raw time
    # a calibration whose busy cost is below the idle one, or absurdly large, cannot make it worse
    assert ProtocolCost(idle_ms=1.0, busy_ms=0.2, busy_work_ms=5.0).for_call(20.0) == 1.0
    steep = ProtocolCost(idle_ms=1.0, busy_ms=50.0, busy_work_ms=5.0)
    steep_times = corrected(raws, [0.0] * len(raws), steep)
    assert all(b > a for a, b in zip(steep_times, steep_times[1:]))
    assert ProtocolCost.from_dict(None) == ProtocolCost()
    assert ProtocolCost.from_dict(dict(idle_ms=1, unknown=3)).idle_ms == 1.0


def test_what_the_subject_says_about_its_own_time_is_parsed_defensively():
    from grader.trusted.timed_calls import _diagnostic_ms
    assert _diagnostic_ms(3.5) == 3.5 and _diagnostic_ms(0) == 0.0
    for bad in (None, True, "3", -1.0, float("nan"), float("inf"), 1e12, [1]):
        assert _diagnostic_ms(bad) is None


def time_spec(tmp_path, source: str, max_calls: int = 6, name: str = "sub") -> dict:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "submission.py").write_text(textwrap.dedent(source))
    return dict(mode="time", device="cpu", target=dict(kind="python", source=str(folder / "submission.py")),
                subject_cmd=[sys.executable, str(SUBJECT)], cwd=str(folder), head_bytes=4096,
                tail_bytes=4096, file_bytes=1 << 30, deadline_s=120, env=child_env(cuda=False),
                case=Case(1, 2, 16, 64, seed=3).to_dict(), cases=[CASES[0].to_dict()],
                budget_s=60, l2_bytes=0,
                max_calls=max_calls, precision=dict(precision_factor=2.0, precision_floor=1e-3))


def test_a_timed_call_is_answered_first_and_described_after(tmp_path):
    """The timed loop on the CPU: each call's reply carries nothing but what was returned, the
    subject's account of itself comes in a second line after the harness's clock stopped, every
    output is read and verified, and the profiler saw the timed calls and the last warm-up."""
    started = time.monotonic()
    record = time_stage.time_case(time_spec(tmp_path, "def custom_kernel(data):\n    return data[2] * 1\n"))
    elapsed = time.monotonic() - started
    assert "failed" not in record, record
    # where the stage's time went, each part in order (results.TIME_PHASES), within it
    assert list(record["phases_s"]) == list(TIME_PHASES)
    assert all(s >= 0 for s in record["phases_s"].values())
    assert sum(record["phases_s"].values()) <= elapsed
    assert record["phases_s"]["open"] > 0.2   # a fresh subject: its start and its imports
    stats = record["stats"]
    # V is not the attention of Q, K, V: every call's output was read and found wrong, and the
    # loop stopped at the third (config.TIMING_WRONG_STOP): such a time never counts
    assert stats["n"] == 3 and stats["profiled_calls"] == 4 and stats["stopped_by"] == "wrong"
    assert record["verify"]["checked"] == 3 and record["verify"]["wrong"] == 3
    assert len(record["calls"]) == 3 and all(raw > 0 for raw, _ in record["calls"])
    # each call's time as ranked, and where the loop's time went, part by part (LOOP_PARTS)
    assert len(record["times_ms"]) == 3 and all(t > 0 for t in record["times_ms"])
    assert list(record["loop_s"]) == list(LOOP_PARTS) and record["loop_s"]["call"] > 0
    assert sum(record["loop_s"].values()) <= record["phases_s"]["loop"] + 0.01
    assert stats["subject_host_ms"] > 0   # from the diagnostics line, after the reply
    assert len(record["spots"]) == 3 and not any(s["finding"]["ok"] for s in record["spots"])
    json.dumps(record)


def test_a_kernel_wrong_now_and_then_is_timed_on_and_one_wrong_as_a_rule_stops_the_loop(tmp_path):
    """A time stage comes before the check stage (stages/grade.py): outputs wrong as a rule end
    the loop within config.TIMING_WRONG_STOP calls, but a call wrong now and then does not (its
    count of wrong calls is what the instructor sees)."""
    assert config.TIMING_WRONG_STOP == 3
    assert time_stage.wrong_enough(dict(checked=3, wrong=3))
    assert not time_stage.wrong_enough(dict(checked=2, wrong=2))
    assert not time_stage.wrong_enough(dict(checked=6, wrong=3))
    assert time_stage.wrong_enough(dict(checked=7, wrong=4))
    flaky = """
        import torch
        calls = 0
        def custom_kernel(data):
            global calls
            calls += 1
            q, k, v = data
            out = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float()).half()
            return v * 1 if calls == 5 else out   # (the run stage's call, 2 warm-up calls first)
    """
    record = time_stage.time_case(time_spec(tmp_path, flaky))
    assert "failed" not in record, record
    assert record["stats"]["n"] == 6 and record["stats"]["stopped_by"] == "max_reps"
    assert record["verify"]["checked"] == 6 and record["verify"]["wrong"] == 1
    assert record["verify"]["first_wrong_call"] == 1


def _verified(got, inputs, case, calls: int = 40) -> dict:
    verify, pick = call_checks.new_verify(), random.Random(7)
    for i in range(calls):
        call_checks.verify_call(verify, i, got, inputs, case, pick, heads=4)
    return verify


def test_each_timed_output_is_checked_whole_for_writes_and_in_random_slices_for_values():
    """Issue 13: a timed call's output is no longer compared with SDPA whole (three times the
    call's own time on the largest case). Every element must have been written (O held NaN),
    and a few (batch, head) slices, picked after the reply, must match SDPA: one wrong slice of
    sixteen is found in some calls, named by its place in the whole output, not in every call."""
    case = Case(2, 8, 32, 16, seed=1)
    inputs = make_random_inputs(case.shape, seed=5, device="cpu")
    right = torch.nn.functional.scaled_dot_product_attention(*(t.float() for t in inputs)).half()
    assert _verified(right, inputs, case) == dict(call_checks.new_verify(), checked=40)
    # Every call compared, not a share of them: with the comparison on a quarter of the calls,
    # the reference solution ran 4.5% slower and its processes 2.7% apart, against 1.4% (H100,
    # session 29, bench/protocol_probe_share_s29.json): the work between calls is the same for all.
    assert _verified(torch.zeros_like(right), inputs, case)["wrong"] == 40

    unwritten = right.clone()
    unwritten[1, 6, 31, 15] = float("nan")     # one element the call never wrote
    verify = _verified(unwritten, inputs, case)
    assert verify["wrong"] == 40 and verify["first_wrong_call"] == 0
    assert verify["first_wrong"].startswith("1 of 8192 elements not written")

    stale = right.clone()
    stale[1, 5] = 0.0                           # one (batch, head) slice of 16 not computed
    verify = _verified(stale, inputs, case)
    assert 0 < verify["wrong"] < 40             # each call looks at 4 of the 16 slices
    assert "4 of its 16 (batch, head) slices" in verify["first_wrong"]
    assert "(1, 5, 0, " in verify["first_wrong"]   # where in the whole output, not in the sample


def test_a_spot_check_compares_slices_picked_after_the_calls_with_the_fp32_reference():
    """Issue 13: the time stage's three spot checks take the fp32 reference and the precision
    budget on TIMING_SPOT_HEADS (batch, head) slices each, not on the whole output (1.45 s of a
    5.25 s time stage on the largest case). A kept output wrong in one slice is found exactly
    when that slice is picked, and the finding names its place in the whole output."""
    case = Case(2, 4, 16, 64, seed=1)
    seed = 9
    inputs = make_random_inputs(case.shape, seed=seed, device="cpu")
    right = torch.nn.functional.scaled_dot_product_attention(*(t.float() for t in inputs)).half()
    wrong = right.clone()
    wrong[1, 2] += 0.5                      # slice 1 * 4 + 2 = 6 of 8
    spec = dict(precision=dict(precision_factor=2.0, precision_floor=1e-3))
    found = set()
    for draw in range(12):
        picked = call_checks.pick_slices(random.Random(draw), case, 3)
        spots = call_checks.check_samples([(4, seed, right), (7, seed, wrong)], case, spec,
                                      random.Random(draw), heads=3)
        assert len(picked) == 3 and [s["call"] for s in spots] == [4, 7]
        assert all(s["slices"] == 3 for s in spots)
        assert spots[0]["finding"]["ok"]
        # the second output's slices are drawn after the first's, from the same generator
        second = random.Random(draw)
        call_checks.pick_slices(second, case, 3)
        has_six = 6 in call_checks.pick_slices(second, case, 3)
        assert spots[1]["finding"]["ok"] is not has_six
        if has_six:
            assert spots[1]["finding"]["first_bad"][0]["index"][:2] == [1, 2]
        found.add(has_six)
    assert found == {True, False}
    # with no more slices than asked for, all of them are compared
    assert call_checks.pick_slices(random.Random(0), Case(1, 2, 16, 64, seed=1), 32) == [0, 1]


def test_what_the_subject_reports_is_matched_to_the_timed_call_it_is_about(tmp_path):
    """Diagnostics lines are taken up late, so each is matched to its call by number: the slow
    warm-up calls are not taken for timed ones."""
    record = time_stage.time_case(time_spec(tmp_path, """
        import time
        calls = []
        def custom_kernel(data):
            calls.append(1)
            if len(calls) > 3:       # after the run stage's and the two warm-up calls: the timed ones
                time.sleep(0.2)
            return __import__('torch').nn.functional.scaled_dot_product_attention(*(t.float() for t in data)).half()
    """, max_calls=2))
    assert "failed" not in record, record
    assert config.TIMING_WARMUP_CALLS == 2
    # the subject's account of the two timed calls (~200 ms each), not of the warm-up calls (~0)
    assert record["stats"]["subject_host_ms"] > 150, record["stats"]
    assert min(raw for raw, _ in record["calls"]) > 150, record["calls"]


def test_time_the_subject_takes_between_timed_calls_is_inside_the_next_call_s_clock(tmp_path):
    """An idle GPU between calls runs the next one cooler and faster, so the subject must not be
    able to pause outside the clock: the harness waits for nothing but the reply to "go". A
    subject (patched from the submission, as a student could) that sleeps on taking up "arm"
    and before its diagnostics line has each sleep counted in a timed call."""
    record = time_stage.time_case(time_spec(tmp_path, """
        import sys, time
        loop = sys.modules["__main__"]          # grader/subject/loop.py, run as a script
        arm, diagnostics = loop.Subject.arm, loop.Subject.diagnostics
        def slow_arm(self, request):
            time.sleep(0.15)
            return arm(self, request)
        def slow_diagnostics(self):
            time.sleep(0.15)
            return diagnostics(self)
        loop.Subject.arm, loop.Subject.diagnostics = slow_arm, slow_diagnostics
        def custom_kernel(data):
            return __import__('torch').nn.functional.scaled_dot_product_attention(*(t.float() for t in data)).half()
    """, max_calls=4))
    assert "failed" not in record, record
    raw = [t for t, _ in record["calls"]]
    # ms: the arm's sleep in every call; and of the diagnostics sleep, all but what hid behind
    # the harness's own work between calls (reading and checking the output, new inputs: ~10 ms
    # here, but the first call's check warms up and can take the whole 150 ms on a slow machine)
    assert len(raw) == 4 and min(raw) > 140 and statistics.median(raw) > 220, raw
    # its honest twin, the same kernel without the pauses, is timed at the kernel's own time
    twin = time_stage.time_case(time_spec(tmp_path, "def custom_kernel(data):\n    return __import__('torch').nn.functional.scaled_dot_product_attention(*(t.float() for t in data)).half()\n",
                                       max_calls=4, name="twin"))
    assert "failed" not in twin, twin
    assert max(t for t, _ in twin["calls"]) < 100, twin["calls"]


def test_a_call_far_slower_than_the_fast_ones_is_timed_coarsely():
    # Precision where it decides ranks: above coarse_ms (8% of the GPU's matmul peak), ten calls
    # within 2% place it; a fast call still needs the 0.5% of TIMING_MIN_REPS calls.
    from grader.stages.time import coarse_ms
    largest = Case(4, 64, 8192, 128, seed=1)
    gpu = dataclasses.replace(GPU, matmul_tflops=740.0)
    limit = coarse_ms(largest, gpu)
    assert 140 < limit < 160   # 10x cuDNN's ~14.5 ms on this case
    assert coarse_ms(largest, dataclasses.replace(gpu, matmul_tflops=0.0)) is None
    slow = [716.0 + 0.5 * (i % 3) for i in range(config.TIMING_COARSE_MIN_REPS)]
    assert timed_calls.coarse_enough(slow, limit)
    assert not timed_calls.coarse_enough(slow[:-1], limit)              # too few calls
    assert not timed_calls.coarse_enough([17.5] * 20, limit)             # a fast kernel: full precision
    assert not timed_calls.coarse_enough([300.0, 900.0] * 5, limit)      # too noisy to place
    assert not timed_calls.coarse_enough(slow, None)                    # no peak measured


def test_a_slow_call_holds_the_gpu_for_a_bounded_time_and_is_still_ranked(tmp_path):
    """Issue 32, a bounded cost: a call slower than slow_ms gets one warm-up and is placed on
    config.TIMING_SLOW_CALLS calls; and however slow, the loop stops ('bound') while one more call
    and the spot checks still fit in the stage's limit, ranking what it timed, not a timeout.
    Its twin, a fast call, gets the usual warm-up and loop."""
    slow = "import time\ndef custom_kernel(data):\n    time.sleep(0.4)\n    return __import__('torch').nn.functional.scaled_dot_product_attention(*(t.float() for t in data)).half()\n"
    record = time_stage.time_case(dict(time_spec(tmp_path, slow, max_calls=50), slow_ms=200.0))
    assert "failed" not in record, record
    stats = record["stats"]
    assert (stats["warmup_calls"], stats["n"], stats["stopped_by"]) == (1, config.TIMING_SLOW_CALLS,
                                                                        "coarse"), stats
    # A limit that leaves room for about three calls and the spot checks' reserve: 'bound'
    spec = dict(time_spec(tmp_path, slow, max_calls=50, name="bounded"),
                deadline_s=config.TIMING_SPOT_RESERVE_S + 5.0)
    record = time_stage.time_case(spec)
    assert "failed" not in record, record
    assert record["stats"]["stopped_by"] == "bound" and 1 <= record["stats"]["n"] < 10, record["stats"]
    twin = time_stage.time_case(dict(time_spec(tmp_path, "def custom_kernel(data):\n    return __import__('torch').nn.functional.scaled_dot_product_attention(*(t.float() for t in data)).half()\n",
                                               max_calls=6, name="twin"), slow_ms=200.0))
    assert (twin["stats"]["warmup_calls"], twin["stats"]["n"]) == (config.TIMING_WARMUP_CALLS, 6)
    assert timed_calls.slow_enough([500.0] * config.TIMING_SLOW_CALLS, 200.0)
    assert not timed_calls.slow_enough([500.0] * (config.TIMING_SLOW_CALLS - 1), 200.0)
    assert not timed_calls.slow_enough([150.0] * 10, 200.0) and not timed_calls.slow_enough([500.0] * 5, None)


def test_one_long_call_cannot_end_the_timed_loop_of_a_fast_kernel(tmp_path):
    """Attack twin of the budget and the bounded cost: a kernel fast in its first calls, then one
    call longer than the loop's budget, would be ranked on those few calls of a cool GPU if the
    budget could end the loop. Before TIMING_MIN_REPS calls (here max_calls) the budget ends only
    a loop of slow calls (median above coarse_ms): the attack is called on to the end."""
    attack = """
        import time
        calls = []
        def custom_kernel(data):
            calls.append(1)
            if len(calls) == 6:      # the third timed call (after the run stage's and 2 warm-up calls)
                time.sleep(1.5)
            return __import__('torch').nn.functional.scaled_dot_product_attention(*(t.float() for t in data)).half()
    """
    spec = dict(time_spec(tmp_path, attack, max_calls=20), budget_s=1.0, coarse_ms=100.0)
    record = time_stage.time_case(spec)
    assert "failed" not in record, record
    assert record["stats"]["n"] == 20, record["stats"]   # called on to the end: not placed on 5
    # its twin, slow in every call (above coarse_ms): the budget places it on a few calls
    slow = "import time\ndef custom_kernel(data):\n    time.sleep(0.3)\n    return __import__('torch').nn.functional.scaled_dot_product_attention(*(t.float() for t in data)).half()\n"
    twin = time_stage.time_case(dict(time_spec(tmp_path, slow, max_calls=20, name="twin"),
                                     budget_s=1.0, coarse_ms=100.0))
    assert twin["stats"]["stopped_by"] == "budget" and twin["stats"]["n"] < 10, twin["stats"]


def test_the_calibration_does_what_the_timed_loop_does_between_calls(tmp_path):
    """The protocol's cost is measured on calls followed by the same trusted work as a timed
    call's (its output read and checked against SDPA), so the cost subtracted from a timed call
    includes what that work does to the next call (session 9: 0.2-0.35 ms a call on an H100)."""
    case = Case(1, 2, 16, 64, seed=3)
    spec = dict(mode="calibrate", device="cpu", target=dict(kind="builtin", name="null"),
                subject_cmd=[sys.executable, str(SUBJECT)], cwd=str(tmp_path), head_bytes=4096,
                tail_bytes=4096, file_bytes=1 << 30, deadline_s=120, env=child_env(cuda=False),
                case=case.to_dict(), cases=[CASES[0].to_dict()], l2_bytes=0, reps=5, warmup=1)
    record = calibration._calibration_calls(spec, "null")
    assert "failed" not in record, record
    assert len(record["raw"]) == 5 and all(t > 0 for t in record["raw"])
    assert record["verify"]["checked"] == 5   # null returns Q: each output read, checked, wrong
    assert record["verify"]["wrong"] == 5


def test_the_calibration_starts_its_subjects_at_once_and_calls_them_in_turn(tmp_path, monkeypatch):
    """Issue 13: a subject's start (torch, CUDA, the profiler's first start) is most of its time,
    and the calibration's three subjects started in turn took 54 s while a course's builds ran
    (session 15). They are spawned together, prepared as a run begun early is, and called one
    after another; each is closed once."""
    events = []
    spawn, run, close = Link.__init__, timed_calls.Call.run, Link.close
    not_said = calibration._not_said

    def said(link, deadline, event, send=b""):
        failed = not_said(link, deadline, event, send)
        if event == "prepared":
            events.append(("prepared", link.proc.pid, failed))
        return failed

    def spawned(self, spec, buffers):
        events.append(("spawn", spec["target"]["name"], bool(spec.get("prepare"))))
        spawn(self, spec, buffers)

    def called(self, seed):
        events.append(("call", self.link.proc.pid))
        return run(self, seed)

    def closed(self):
        events.append(("close", self.proc.pid, self.closed))
        close(self)

    monkeypatch.setattr(Link, "__init__", spawned)
    monkeypatch.setattr(timed_calls.Call, "run", called)
    monkeypatch.setattr(Link, "close", closed)
    monkeypatch.setattr(calibration, "_not_said", said)
    case = Case(1, 2, 16, 64, seed=3)
    spec = dict(mode="calibrate", device="cpu", target=dict(kind="builtin", name="null"),
                subject_cmd=[sys.executable, str(SUBJECT)], cwd=str(tmp_path), head_bytes=4096,
                tail_bytes=4096, file_bytes=1 << 30, deadline_s=120, env=child_env(cuda=False),
                case=case.to_dict(), cases=[CASES[0].to_dict()], l2_bytes=0, reps=5, warmup=1)
    record = calibration.calibrate(spec)
    assert "protocol" in record and record["protocol"]["idle_ms"] > 0, record
    names = ("null", *calibration.CALIBRATION_KERNELS)
    assert events[:3] == [("spawn", n, True) for n in names]   # all started at once
    # each prepared (CUDA and the profiler started) before the first call: none overlaps a call
    assert [e[0] for e in events[3:6]] == ["prepared"] * 3 and not any(e[2] for e in events[3:6])
    calls = [e[1] for e in events if e[0] == "call"]
    assert calls == sorted(calls, key=calls.index)   # one subject's calls, then the next's
    assert set(calls) == {e[1] for e in events[3:6]}   # on the subjects prepared
    assert not any(e[0] in ("spawn", "prepared") for e in events[6:])
    closes = [e for e in events if e[0] == "close"]
    assert sorted({e[1] for e in closes}) == sorted(e[1] for e in closes if not e[2])   # closed once each
    assert len({e[1] for e in closes}) == 3


def stages_spec(tmp_path, source: str) -> tuple[dict, Path]:
    """A run_then_time spec on the CPU: the three CASES and the timed case, run; then timed."""
    timed = Case(1, 2, 16, 64, seed=3)
    tmp_path.mkdir(exist_ok=True)
    spec = time_spec(tmp_path, source, max_calls=5)
    time_fields = {k: spec.pop(k) for k in ("case", "budget_s", "l2_bytes", "max_calls", "precision")}
    spec.update(mode="run_then_time", out_dir=str(tmp_path), result=str(tmp_path / "run.json"),
                cases=[c.to_dict() for c in (*CASES, timed)],
                time=dict(time_fields, deadline_s=120, result=str(tmp_path / "time.json")))
    return spec, tmp_path / "spec.json"


PID_PRINTER = """
    import os, torch
    def custom_kernel(data):
        print("subject pid", os.getpid(), flush=True)
        q, k, v = data
        return torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float()).half()
"""


SDPA_KERNEL = """
    import torch
    def custom_kernel(data):
        q, k, v = data
        return torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float()).half()
"""


def test_every_timed_row_is_timed_after_the_calls_of_a_run_stage(tmp_path, monkeypatch):
    """One path for every timed row: a submission is timed on its run stage's subject, which has
    been called on every case under the profiler first; timed on fresh subjects, the baselines
    and the calibration were charged about 0.1-0.2 ms a call less than those calls cost (notes/
    throughput.md, sessions 26-28). So every subject that is timed, a submission's
    (run_then_time), a fresh one (a baseline's), one prepared before its turn (GPU lanes) and
    each of the calibration's, gets the same calls before its first timed one: every case of the
    run stage once, under the profiler, in order; and none after."""
    from grader.trusted import harness
    sent: dict[Link, list[dict]] = {}
    encode = Link.encode

    def recorded(self, request):
        sent.setdefault(self, []).append(request)
        return encode(self, request)

    monkeypatch.setattr(Link, "encode", recorded)
    timed = Case(1, 2, 16, 64, seed=3)
    cases = [c.to_dict() for c in (*CASES, timed)]

    def control(word: bytes) -> tuple[int, int]:
        ready_r, ready_w = os.pipe()
        decide_r, decide_w = os.pipe()
        os.write(decide_w, word)
        return ready_w, decide_r

    # a submission: its run stage, then its time stage on the same subject
    spec, _ = stages_spec(tmp_path / "submission", SDPA_KERNEL)
    harness.run_then_time(dict(spec, control=control(b"time\n")))
    records = [json.loads(Path(spec["time"]["result"]).read_text())]
    # a baseline's fresh subject, and a time stage's own, prepared before its turn
    records.append(time_stage.time_case(dict(time_spec(tmp_path, SDPA_KERNEL, max_calls=3, name="fresh"),
                                             cases=cases)))
    records.append(time_stage.time_prepared(dict(
        time_spec(tmp_path, SDPA_KERNEL, max_calls=3, name="prepared"), cases=cases, prepare=True,
        control=control(b'run {"protocol": {"idle_ms": 0.02}}\n'))))
    assert all("failed" not in r and r["stats"]["n"] > 0 for r in records), records
    # the cost said on its turn is the one its time stage subtracts (subject_start.take_turn_fields)
    assert records[-1]["stats"]["protocol_ms"] == pytest.approx(0.02), records[-1]["stats"]
    # the calibration's three subjects
    calibrated = calibration.calibrate(dict(mode="calibrate", device="cpu",
                                            target=dict(kind="builtin", name="null"),
                                            subject_cmd=[sys.executable, str(SUBJECT)], cwd=str(tmp_path),
                                            head_bytes=4096, tail_bytes=4096, file_bytes=1 << 30,
                                            deadline_s=120, env=child_env(cuda=False),
                                            case=timed.to_dict(), cases=cases, l2_bytes=0, reps=3, warmup=1))
    # (on the CPU, cuDNN's SDPA raises in every call: a run stage's call that raises is still made)
    assert calibrated["protocol"]["idle_ms"] > 0 and set(calibrated["breakdown"]) == {
        "null", *calibration.CALIBRATION_KERNELS}
    timed_links = [requests for requests in sent.values() if any(r["op"] == "arm" for r in requests)]
    assert len(timed_links) == 3 + len(("null", *calibration.CALIBRATION_KERNELS))
    for requests in timed_links:
        first_timed = next(i for i, r in enumerate(requests) if r["op"] == "arm")
        made = [(r["shape"], r.get("profile")) for r in requests if r["op"] == "call"]
        assert made == [(c["shape"] if "shape" in c else list(Case.from_dict(c).shape), True)
                        for c in cases], made
        assert not any(r["op"] == "call" for r in requests[first_timed:])


def test_the_baselines_and_the_calibration_are_given_the_run_stage_s_cases(monkeypatch, tmp_path):
    """The pipeline's side of one path: a baseline's time stage, a time stage's own subject (GPU
    lanes, time_subject) and the calibration are each given every case a run stage calls on a
    GPU, in order, with the run stage's limits, to call before their timed ones (the harness's
    side is the test above)."""
    from grader.report.progress import Progress
    from grader.stages import baseline, context, time as time_mod
    gpu = GPU
    ctx = context.GradeContext(cases=tuple(CASES), device=gpu, limits=config.Limits(), out_dir=tmp_path,
                               build_dir=tmp_path / "build", progress=Progress(1, live=False))
    asked = []
    monkeypatch.setattr(time_mod, "run_harness",
                        lambda mode, target, ctx, work, **fields: asked.append((mode, fields)) or (None, ""))
    monkeypatch.setattr(time_mod, "ensure_gpu_healthy", lambda ctx: None)
    baseline.grade_baseline("sdpa_flash", ctx)
    time_mod.calibrate_protocol(ctx)
    limits = config.Limits()
    run_stage = dict(cases=[c.to_dict() for c in CASES],
                     case_limits={c.id: limits.case_s(c.flops) for c in CASES}, run_deadline_s=limits.run_s)
    asked.append(("time_fields", time_mod.time_fields(CASES[-1], ctx, tmp_path)))
    assert [mode for mode, _ in asked] == ["time", "calibrate", "time_fields"]
    for mode, fields in asked:
        assert {k: fields[k] for k in run_stage} == run_stage, mode


def test_a_subject_that_ends_or_hangs_in_the_repeated_calls_is_not_timed_and_says_no_more(tmp_path):
    """A subject timed on its own (a lane's, a baseline's) that dies or hangs while making a run
    stage's calls again is not timed. What it printed goes to the log, never to the message a
    student reads (its calls included hidden cases: it could print their inputs); a hidden case
    is not named, a public one is; each call has the run stage's limit for its case; no process
    of the subject is left."""
    hidden = Case(1, 2, 33, 64, seed=5, hidden=True)
    leaky = """
        import os, torch
        def custom_kernel(data):
            q, k, v = data
            if q.shape[2] == 33:
                print("LEAKED", q.flatten()[:4].tolist(), flush=True)
                os._exit(3)
            return torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float()).half()
    """
    before = set(tree_mod.process_tree(os.getpid()))
    spec = dict(time_spec(tmp_path, leaky, max_calls=3), cases=[CASES[0].to_dict(), hidden.to_dict()])
    record = time_stage.time_case(spec)
    message = record["failed"]["message"]
    assert record["failed"]["status"] == "runtime_error", record
    assert "a hidden case" in message and "33" not in message and "LEAKED" not in message, message
    assert "LEAKED" in record["output"]   # the instructor's log has it
    # a public case is named; a hang is a timeout at that case's own limit, not the stage's
    public = Case(1, 2, 33, 64, seed=5)
    hangs = leaky.replace('print("LEAKED", q.flatten()[:4].tolist(), flush=True)\n                os._exit(3)',
                          "__import__('time').sleep(60)")
    spec = dict(time_spec(tmp_path, hangs, max_calls=3, name="hangs"),
                cases=[public.to_dict()], case_limits={public.id: 2.0})
    started = time.monotonic()
    record = time_stage.time_case(spec)
    assert record["failed"]["status"] == "timeout" and f"case {public.id}" in record["failed"]["message"]
    assert time.monotonic() - started < 30
    assert set(tree_mod.process_tree(os.getpid())) <= before   # the subjects are gone


def test_every_element_is_finite_exactly_when_the_fp32_sum_is():
    """call_checks.all_finite, the timed loop's check that every element was written (O is
    filled with NaN before each call): one reduction, the same answer as isfinite().all() for
    every float16 output, whatever a kernel writes; other dtypes element by element."""
    biggest = torch.full((4096,), 65504.0, dtype=torch.float16)
    assert bool(call_checks.all_finite(biggest)) and bool(call_checks.all_finite(-biggest))
    # +inf, -inf, and NaNs of other payloads and signs, as bit patterns
    for bits in (0x7C00, 0xFC00 - 0x10000, 0x7E00, 0x7C01, 0xFE01 - 0x10000, 0x7FFF):
        for where in (0, 2047, 4095):
            t = biggest.clone()
            t.view(torch.int16)[where] = bits
            assert not bool(torch.isfinite(t).all())
            assert not bool(call_checks.all_finite(t)), (hex(bits), where)
    both = torch.tensor([float("inf"), float("-inf"), 1.0], dtype=torch.float16)   # sum NaN
    assert not bool(call_checks.all_finite(both))
    odd = torch.tensor([-0.0, 6e-8, -6e-8, 1e-7], dtype=torch.float16)   # zeros, subnormals
    assert bool(call_checks.all_finite(odd)) and bool(call_checks.all_finite(odd[::2]))
    assert bool(call_checks.all_finite(torch.empty(0, dtype=torch.float16)))
    for dtype in (torch.bfloat16, torch.float32):   # two finite values can sum past fp32's range
        big = torch.full((2,), 3e38, dtype=dtype)
        assert bool(call_checks.all_finite(big)) == bool(torch.isfinite(big).all())


def test_the_time_stage_runs_on_the_run_stage_s_subject(tmp_path):
    """Issue 13: one harness and one subject process for a submission's run and time stages; the
    pipeline decides between them (after the check) whether the time stage happens."""
    from grader.stages.harnesses import Stages
    spec, spec_path = stages_spec(tmp_path, PID_PRINTER)
    stages = Stages(spec, spec_path, env=child_env(cuda=False), cpus=None)
    try:
        ran, run_log = stages.ran(120)
        assert ran is not None and [r["status"] for r in ran["cases"].values()] == ["pass"] * 4
        timed, time_log = stages.time()
    finally:
        stages.close()
    assert timed is not None and "failed" not in timed, time_log
    assert timed["stats"]["n"] == 5 and timed["verify"] == dict(timed["verify"], checked=5, wrong=0)
    pids = {line.split()[-1] for line in time_log.splitlines() if line.startswith("subject pid")}
    run_pids = {line.split()[-1] for line in run_log.splitlines() if line.startswith("subject pid")}
    assert len(pids) == 1 and pids == run_pids, (run_pids, pids)
    assert stages.harness.proc.returncode == 0


def assert_saved_right(spec: dict) -> None:
    """Every case's output written for the checker (<out_dir>/<case>.f16, outputs.py), and it is
    that case's attention (PID_PRINTER's SDPA)."""
    from grader.problem import make_inputs
    cases = [Case.from_dict(c) for c in spec["cases"]]
    assert sorted(p.stem for p in Path(spec["out_dir"]).glob("*.f16")) == sorted(c.id for c in cases)
    saved = {c.id: load_output(output_path(spec["out_dir"], c.id), c.shape, "cpu") for c in cases}
    for case in cases:
        q, k, v = make_inputs(case, "cpu")
        want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float()).half()
        assert saved[case.id].shape == case.shape and torch.equal(saved[case.id], want), case.id


def test_the_harness_says_timed_once_its_subject_is_gone_and_finishes_its_checks_after(tmp_path):
    """Issue 32: "timed" comes once the timed calls are over and the subject has exited; only
    the harness's trusted work (statistics, spot checks) is left, which may run beside the next
    submission's run stage and its check. The check's outputs were written by the run stage,
    before "ran". The record then has all of it."""
    from grader.isolation.tree import process_tree
    from grader.stages.harnesses import Stages
    spec, spec_path = stages_spec(tmp_path, PID_PRINTER)
    stages = Stages(spec, spec_path, env=child_env(cuda=False), cpus=None)
    try:
        ran, run_log = stages.ran(120)
        assert ran is not None, run_log
        assert_saved_right(spec)   # what the check reads, written before "ran"
        subject = {line.split()[-1] for line in run_log.splitlines() if line.startswith("subject pid")}
        assert stages.time_calls()   # said "timed"
        left = {str(p) for p in process_tree(stages.harness.proc.pid)} - {str(stages.harness.proc.pid)}
        assert not left & subject, (left, subject)   # the subject is gone by then
        timed, time_log = stages.time_record()
    finally:
        stages.close()
    assert timed is not None and "failed" not in timed, time_log
    assert timed["stats"]["n"] == 5 and len(timed["spots"]) == 3   # the checks after "timed"
    assert list(timed["phases_s"])[-2:] == ["report", "spots"]


def test_a_run_that_is_not_timed_lets_its_subject_go(tmp_path):
    from grader.stages.harnesses import Stages
    spec, spec_path = stages_spec(tmp_path, PID_PRINTER)
    stages = Stages(spec, spec_path, env=child_env(cuda=False), cpus=None)
    ran, _ = stages.ran(120)
    assert ran is not None
    stages.close()
    assert stages.harness.proc.returncode == 0 and not (tmp_path / "time.json").exists()
    assert_saved_right(spec)   # its outputs written for the check all the same
    # a harness that never says "ran" in time is killed, and the run is the harness's failure
    spec, spec_path = stages_spec(tmp_path / "slow", "import time\ntime.sleep(600)\n")
    stages = Stages(spec, spec_path, env=child_env(cuda=False), cpus=None)
    ran, log = stages.ran(5)
    assert ran is None and stages.harness.closed and stages.harness.proc.returncode is not None


SLOW_IMPORT = "import time\ntime.sleep(1.5)\n" + textwrap.dedent(PID_PRINTER)


def test_a_run_begun_early_loads_the_submission_only_on_its_turn(tmp_path):
    """lookahead.Lookahead (issue 13): a prepared harness starts its subject, which starts the
    profiler and waits; no submission code runs before "run" (the 1.5 s import lands in "load",
    after the wait); then run and time go on as usual, on that one subject. The time stage
    subtracts the protocol's cost said with "run" (turn_word), not the spec's: a worker's first
    runs are begun while its GPU's protocol is still being calibrated."""
    from grader.stages.harnesses import Prepared
    from grader.stages.harnesses import Stages
    spec, spec_path = stages_spec(tmp_path, SLOW_IMPORT)
    assert ProtocolCost.from_dict(spec["time"].get("protocol")) == ProtocolCost()   # not known yet
    stages = Stages(dict(spec, prepare=True), spec_path, env=child_env(cuda=False), cpus=None)
    prepared = Prepared(sub=None, work=tmp_path, jit=None, stages=stages, folders=contextlib.ExitStack())
    try:
        assert prepared.settle(120) and prepared.settle(0)   # said once, remembered
        time.sleep(1.0)                                       # the submission before it runs
        assert not (tmp_path / "run.json").exists()
        stages.go(ProtocolCost(idle_ms=0.02))
        ran, run_log = stages.ran(120)
        assert ran is not None and [r["status"] for r in ran["cases"].values()] == ["pass"] * 4, run_log
        timed, time_log = stages.time()
    finally:
        prepared.close()
    assert timed["stats"]["protocol_ms"] == pytest.approx(0.02), timed["stats"]
    phases = ran["phases_s"]
    assert list(phases) == ["harness", "buffers", "prepare", "waiting", "load", "cases"]
    assert phases["waiting"] >= 1.0 and phases["load"] >= 1.5, phases
    assert timed is not None and timed["stats"]["n"] == 5, time_log
    pids = {line.split()[-1] for log in (run_log, time_log) for line in log.splitlines()
            if line.startswith("subject pid")}
    assert len(pids) == 1 and stages.harness.proc.returncode == 0


AFFINITY_PRINTER = """
    import os
    print("loaded on", sorted(os.sched_getaffinity(0)), flush=True)
    def custom_kernel(data):
        print("called on", sorted(os.sched_getaffinity(0)), flush=True)
        return data[2].clone()
"""


def test_a_run_begun_early_waits_on_the_builds_cpus_and_runs_on_the_gpu_stages(tmp_path):
    """Issue 13: a run begun early does its imports and starts beside another submission's
    timed calls, so it waits on the builds' CPUs, never the GPU stages' (whose harness and
    subject must get a core at once); on its turn every thread of its harness and subject moves
    to the GPU stages' CPUs before the submission is loaded."""
    from grader.stages.harnesses import Prepared
    from grader.stages.harnesses import Stages
    from grader.isolation.cpus import CpuSplit
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        pytest.skip("needs two CPUs")
    split = CpuSplit(gpu=(mine[-1],), build=tuple(mine[:-1]))
    spec, spec_path = stages_spec(tmp_path, AFFINITY_PRINTER)
    stages = Stages(dict(spec, prepare=True), spec_path, env=child_env(cuda=False), cpus=split)
    prepared = Prepared(sub=None, work=tmp_path, jit=None, stages=stages, folders=contextlib.ExitStack())
    try:
        assert prepared.settle(120)
        tree = tree_mod.process_tree(stages.harness.proc.pid)
        assert len(tree) >= 2   # the harness and its subject (and bubblewrap's, where it runs)
        for pid in tree:
            for task in os.listdir(f"/proc/{pid}/task"):
                assert os.sched_getaffinity(int(task)) == set(split.build), (pid, task)
        stages.go(ProtocolCost())
        ran, run_log = stages.ran(120)
    finally:
        prepared.close()
    assert ran is not None and [r["status"] for r in ran["cases"].values()] == ["pass"] * 4, run_log
    places = {line for line in run_log.splitlines() if line.startswith(("loaded on", "called on"))}
    assert places == {f"loaded on {[mine[-1]]}", f"called on {[mine[-1]]}"}, run_log
    # a run not begun early: its harness waited on the builds' CPUs too, and moved on its spec
    stages = Stages(spec, spec_path, env=child_env(cuda=False), cpus=split)
    try:
        ran, run_log = stages.ran(120)
    finally:
        stages.close()
    assert ran is not None and f"called on {[mine[-1]]}" in run_log, run_log


def test_a_run_begun_early_and_not_wanted_ends_having_loaded_nothing(tmp_path):
    from grader.stages.harnesses import Prepared
    from grader.stages.harnesses import Stages
    marker = tmp_path / "imported"
    spec, spec_path = stages_spec(tmp_path, f"open({str(marker)!r}, 'w').close()\n")
    stages = Stages(dict(spec, prepare=True), spec_path, env=child_env(cuda=False), cpus=None)
    prepared = Prepared(sub=None, work=tmp_path, jit=None, stages=stages, folders=contextlib.ExitStack())
    assert prepared.settle(120)
    prepared.close()   # its turn never comes (the worker stopped, the one before crashed)
    assert stages.harness.proc.returncode == 0 and not (tmp_path / "run.json").exists()
    assert not marker.exists()   # the submission was never imported
    # one still preparing (not reading its control pipe) is killed at once, not waited for
    stages = Stages(dict(spec, prepare=True), spec_path, env=child_env(cuda=False), cpus=None)
    prepared = Prepared(sub=None, work=tmp_path, jit=None, stages=stages, folders=contextlib.ExitStack())
    began = time.monotonic()
    prepared.close()
    assert time.monotonic() - began < 10 and stages.harness.proc.returncode is not None
    assert not marker.exists()
    # a harness that is never prepared is given up: the submission then runs the usual way
    stages = Stages(dict(spec, prepare=True, deadline_s=0.001), spec_path, env=child_env(cuda=False), cpus=None)
    prepared = Prepared(sub=None, work=tmp_path, jit=None, stages=stages, folders=contextlib.ExitStack())
    assert not prepared.settle(120) and stages.harness.closed


def test_a_run_begun_early_whose_subject_died_while_it_waited_says_so_on_its_turn(tmp_path):
    """No record, so the pipeline grades the submission anew (harnesses.NotStarted); the harness's
    output, which the pipeline notes, says why."""
    from grader.stages.harnesses import Prepared
    from grader.stages.harnesses import Stages
    spec, spec_path = stages_spec(tmp_path, "def custom_kernel(data):\n    return data[2].clone()\n")
    stages = Stages(dict(spec, prepare=True), spec_path, env=child_env(cuda=False), cpus=None)
    prepared = Prepared(sub=None, work=tmp_path, jit=None, stages=stages, folders=contextlib.ExitStack())
    try:
        assert prepared.settle(120)
        own = stages.harness.proc.pid
        for pid in tree_mod.process_tree(own) - {own}:
            os.kill(pid, signal.SIGKILL)
        stages.go(ProtocolCost())
        ran, log = stages.ran(120)
    finally:
        prepared.close()
    assert ran is None
    assert "the run begun early gives up: on its turn the subject said" in log, log


def test_a_run_begun_early_told_a_word_it_cannot_read_gives_up(tmp_path):
    """subject_start.take_turn_fields: the turn's word comes from the grader only; one the harness
    cannot read (a grader bug) ends the run begun early with no record, before the submission is
    loaded (harnesses.NotStarted: graded anew), and the harness's output says why."""
    from grader.stages.harnesses import Prepared
    from grader.stages.harnesses import Stages
    spec, spec_path = stages_spec(tmp_path, "print('LOADED', flush=True)\n"
                                            "def custom_kernel(data):\n    return data[2].clone()\n")
    stages = Stages(dict(spec, prepare=True), spec_path, env=child_env(cuda=False), cpus=None)
    prepared = Prepared(sub=None, work=tmp_path, jit=None, stages=stages, folders=contextlib.ExitStack())
    try:
        assert prepared.settle(120)
        stages.harness.say(b'run {"protocol": 3}\n')
        ran, log = stages.ran(120)
    finally:
        prepared.close()
    assert ran is None and "LOADED" not in log
    assert "the grader's word on its turn is not run" in log, log


def test_a_run_begun_early_has_one_limit_for_loading_and_its_cases(tmp_path):
    """As in a run not begun early, the submission's import and every case's call share the run
    limit, counted from its turn: a 5 s import and four 1.5 s calls do not fit in 9 s, although
    each part alone would."""
    from grader.stages.harnesses import Prepared
    from grader.stages.harnesses import Stages
    source = ("import time\ntime.sleep(5)\ndef custom_kernel(data):\n"
              "    time.sleep(1.5)\n    return data[2].clone()\n")
    spec, spec_path = stages_spec(tmp_path, source)
    stages = Stages(dict(spec, prepare=True, deadline_s=9), spec_path, env=child_env(cuda=False), cpus=None)
    prepared = Prepared(sub=None, work=tmp_path, jit=None, stages=stages, folders=contextlib.ExitStack())
    try:
        assert prepared.settle(120)
        stages.go(ProtocolCost())
        ran, log = stages.ran(120)
    finally:
        prepared.close()
    assert ran is not None, log
    statuses = [r["status"] for r in ran["cases"].values()]
    assert statuses[0] == "pass" and "timeout" in statuses, statuses


def test_a_gpu_worker_s_next_harness_is_started_while_the_last_one_works(tmp_path):
    """harnesses.take_harness in a GPU worker (keep_warm): the harness a run stage gets was started
    when the worker took the one before, so its start and imports are off the critical path
    ("run.harness"); one of another environment is replaced; the spare goes with the worker."""
    from grader.schedule import lookahead
    from grader.stages import harnesses
    env = child_env(cuda=False)
    source = "def custom_kernel(data):\n    return data[2].clone()\n"

    def stage(name: str) -> dict:
        spec = run_spec(tmp_path / name, source)
        record, log = harnesses.run_once(spec, tmp_path / name / "spec.json", env=env, cpus=None)
        assert record is not None and statuses(record) == ["pass"] * 3, log
        return record["phases_s"]

    with lookahead.keep_warm():
        cold = stage("first")          # nothing was waiting: started now
        spare = harnesses._SPARE.harness
        assert spare is not None and spare.proc.poll() is None
        time.sleep(3)                  # the spare's imports, while a submission would be checked
        warm = stage("second")
        assert spare.closed and spare.proc.returncode == 0   # it did the second's work
        assert warm["harness"] < 0.5 * cold["harness"], (warm, cold)
        other = harnesses._SPARE.harness
        got = harnesses.take_harness(dict(env, OTHER="1"), None)   # another environment
        assert got is not other and other.closed
        got.close()
        last = harnesses._SPARE.harness
    assert last.closed and last.proc.returncode == 0 and harnesses._SPARE.harness is None
    # outside a GPU worker nothing is kept
    harnesses.take_harness(env, None).close()
    assert harnesses._SPARE.harness is None



# ---------------------------------------------------------------- how busy the GPU was (NVML)

GRADER, SUBJECT_PID, HELPER, STRANGER = 100, 200, 201, 300


def grid_samples(busy: dict[int, float], periods: int = 10, start_us: int = 1_000_000,
                 period_us: int = 100_000) -> tuple[dict, dict]:
    """NVML-like samples over `periods` periods from start_us: each pid in `busy` at its
    percent in every period, the whole GPU at their sum (the processes take turns on it)."""
    device, processes = {}, {}
    for i in range(periods + 1):
        t = start_us + i * period_us
        device[t] = min(sum(busy.values()), 100.0)
        processes.update({(t, pid): percent for pid, percent in busy.items() if percent})
    return device, processes


def test_gpu_busy_turns_samples_into_shares_of_the_loop():
    from grader.trusted.timing import gpu_busy
    device, processes = grid_samples({GRADER: 10.0, SUBJECT_PID: 30.0, HELPER: 5.0, STRANGER: 20.0})
    busy = gpu_busy(device, processes, start_us=1_000_000, end_us=2_000_000, calls=20,
                    subject={SUBJECT_PID, HELPER}, grader={GRADER})
    assert busy.source == "process" and busy.periods == 10 and busy.period_ms == 100.0
    assert busy.window_ms == 1000.0 and busy.calls == 20
    assert abs(busy.device_share - 0.65) < 1e-9 and abs(busy.subject_share - 0.35) < 1e-9
    assert abs(busy.others_share - 0.20) < 1e-9 and busy.others_pids == (STRANGER,)
    # a process NVML leaves out of a period was idle in it: the subject busy in half the periods
    device, processes = grid_samples({GRADER: 10.0, SUBJECT_PID: 30.0})
    half = {k: v for k, v in processes.items() if k[1] != SUBJECT_PID or (k[0] // 100_000) % 2}
    device = {t: 10.0 + (30.0 if (t, SUBJECT_PID) in half else 0.0) for t in device}
    busy = gpu_busy(device, half, start_us=1_000_000, end_us=2_000_000, calls=20,
                    subject={SUBJECT_PID}, grader={GRADER})
    assert busy.source == "process" and abs(busy.subject_share - 0.15) < 1e-9


def test_gpu_busy_falls_back_to_the_whole_gpu_or_says_it_cannot_tell():
    from grader.trusted.timing import gpu_busy
    device, processes = grid_samples({GRADER: 10.0, SUBJECT_PID: 30.0})
    common = dict(start_us=1_000_000, end_us=2_000_000, calls=20, subject={SUBJECT_PID})
    # no per-process samples: the whole GPU's, and why
    busy = gpu_busy(device, None, grader={GRADER}, why="NVML: Not Supported", **common)
    assert busy.source == "device" and abs(busy.device_share - 0.4) < 1e-9 and "Not Supported" in busy.why
    # per-process samples naming none of the grader's pids: another pid namespace
    busy = gpu_busy(device, processes, grader={999}, **dict(common, subject={998}))
    assert busy.source == "device" and "pid namespace" in busy.why
    busy = gpu_busy(device, {}, grader={GRADER}, **common)   # none at all, on a busy GPU
    assert busy.source == "device" and "no per-process sample while the GPU was busy" in busy.why
    idle = gpu_busy({t: 0.0 for t in device}, {}, grader={GRADER}, **common)   # an idle GPU
    assert idle.source == "process" and idle.subject_share == idle.device_share == 0.0
    # per-process samples that do not add up to the whole GPU's are not used
    sparse = {k: v for k, v in processes.items() if k[0] < 1_300_000}
    busy = gpu_busy(device, sparse, grader={GRADER}, **common)
    assert busy.source == "device" and "disagree" in busy.why
    # too few periods within the loop, or no whole-GPU samples at all: nothing can be told
    short = gpu_busy(device, processes, grader={GRADER}, **dict(common, end_us=1_350_000))
    assert short.source == "" and "only 3 of NVML's whole-GPU sampling periods" in short.why
    none = gpu_busy(None, None, grader={GRADER}, why="pynvml is not installed", **common)
    assert none.source == "" and none.why.startswith("pynvml is not installed")
    # samples outside the loop do not count; a period that lost its samples (a gap) is left out
    device[2_500_000] = 100.0
    gapped = {t: p for t, p in device.items() if not 1_400_000 < t < 1_800_000}
    busy = gpu_busy(gapped, None, grader={GRADER}, **common)
    assert busy.periods == 6 and busy.sampled_ms == 600.0 and abs(busy.device_share - 0.4) < 1e-9


def fake_nvml(pids_of, busy_of):
    """A sampling source for gpu_watch.read_gpu_samples: a sample every 20 ms of the wall clock up
    to now, after `since_us`; each pid that pids_of() gives is busy at busy_of(pid) percent."""
    def read(since_us: int):
        device, processes = [], []
        t = (since_us // 20_000 + 1) * 20_000
        while t <= gpu_watch._wall_us():
            shares = {pid: busy_of(pid) for pid in pids_of()}
            device.append((t, min(sum(shares.values()), 100.0)))
            processes += [(t, pid, p) for pid, p in shares.items() if p]
            t += 20_000
        return gpu_watch.GpuSamples(device=tuple(device), processes=tuple(processes))
    return read


def test_the_timed_loop_records_how_busy_nvml_saw_the_gpu_and_for_whom(tmp_path, monkeypatch):
    """gpu_watch.BusyWatch, with a sampling source standing in for NVML: the loop's window, its
    calls, and the shares of the subject's processes (host pids found from the harness) and of
    the harness itself, which is not the submission's."""
    me = os.getpid()
    monkeypatch.setattr(gpu_watch, "read_gpu_samples", fake_nvml(
        lambda: tree_mod.process_tree(me), lambda pid: 10.0 if pid == me else 60.0))
    source = "import time\ndef custom_kernel(data):\n    time.sleep(0.05)\n    return __import__('torch').nn.functional.scaled_dot_product_attention(*(t.float() for t in data)).half()\n"
    record = time_stage.time_case(time_spec(tmp_path, source, max_calls=8))
    assert "failed" not in record, record
    busy = record["gpu_busy"]
    assert busy["source"] == "process" and busy["calls"] == 8, busy
    assert busy["window_ms"] >= 8 * 50 and busy["periods"] >= 10, busy
    assert abs(busy["subject_share"] - 0.6) < 0.01 and busy["others_share"] == 0.0, busy
    # a source that cannot read anything says why, and the record says nothing can be told
    monkeypatch.setattr(gpu_watch, "read_gpu_samples",
                        lambda since_us: gpu_watch.GpuSamples(why="NVML: Not Supported"))
    record = time_stage.time_case(time_spec(tmp_path, source, max_calls=3, name="unread"))
    assert record["gpu_busy"]["source"] == "" and "Not Supported" in record["gpu_busy"]["why"]


def test_reading_nvml_never_raises(monkeypatch):
    """read_gpu_samples without pynvml, and with an NVML that fails or has no samples yet."""
    import builtins
    import types
    real_import = builtins.__import__

    def without_pynvml(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_pynvml)
    assert "not installed" in gpu_watch.read_gpu_samples(0).why
    monkeypatch.setattr(builtins, "__import__", real_import)

    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__(f"NVML error {value}")
            self.value = value

    def fails(*args):
        raise NVMLError(3)   # NVML_ERROR_NOT_SUPPORTED

    def nothing_yet(*args):
        raise NVMLError(6)   # NVML_ERROR_NOT_FOUND: no sample since the time asked for

    fake = types.SimpleNamespace(NVML_ERROR_NOT_FOUND=6, NVML_GPU_UTILIZATION_SAMPLES=1,
                                 nvmlDeviceGetSamples=fails, nvmlDeviceGetProcessUtilization=nothing_yet)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setitem(gpu_watch._NVML, "handle", "gpu0")
    got = gpu_watch.read_gpu_samples(0)
    assert got.device is None and got.processes == () and "NVML error 3" in got.why
    fake.nvmlDeviceGetSamples = lambda h, kind, since: (1, [types.SimpleNamespace(
        timeStamp=since + 5, sampleValue=types.SimpleNamespace(uiVal=42))])
    fake.nvmlDeviceGetProcessUtilization = lambda h, since: [types.SimpleNamespace(
        timeStamp=since + 5, pid=7, smUtil=40)]
    got = gpu_watch.read_gpu_samples(10)
    assert got == gpu_watch.GpuSamples(device=((15, 42.0),), processes=((15, 7, 40.0),))
    monkeypatch.delitem(gpu_watch._NVML, "handle")
    fake.nvmlInit = fails
    if not torch.cuda.is_available():   # no GPU: said, not raised
        assert "no CUDA device" in gpu_watch.read_gpu_samples(0).why
