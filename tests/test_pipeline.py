"""How the worker's event log and exit become per-case records (no processes started here)."""

from grader.cases import Case
from grader.pipeline import interpret_events
from grader.procs import ProcResult

CASES = [Case(1, 1, s, 64, seed=1) for s in (1, 2, 3)]


def proc(rc=0, timed_out=False, output=""):
    return ProcResult(returncode=rc, timed_out=timed_out, elapsed_s=1.0, output=output,
                      output_bytes=len(output))


def test_all_done():
    events = [e for c in CASES for e in ({"case": c.id, "event": "start"},
                                         {"case": c.id, "event": "done", "elapsed_s": 0.1})]
    recs = interpret_events(CASES, events, proc(), 60)
    assert [r["status"] for r in recs.values()] == ["pass"] * 3


def test_error_then_context_lost():
    a, b, c = (x.id for x in CASES)
    events = [{"case": a, "event": "start"}, {"case": a, "event": "done", "elapsed_s": 0.1},
              {"case": b, "event": "start"},
              {"case": b, "event": "error", "error": "RuntimeError",
               "message": "CUDA error: an illegal memory access was encountered",
               "traceback": "tb", "context_alive": False},
              {"case": c, "event": "skipped", "message": f"not run: the CUDA context was lost in case {b}"}]
    recs = interpret_events(CASES, events, proc(), 60)
    assert recs[a]["status"] == "pass"
    assert recs[b]["status"] == "runtime_error" and "illegal memory access" in recs[b]["message"]
    assert recs[c]["status"] == "runtime_error" and "context was lost" in recs[c]["message"]


def test_hang_in_second_case_is_a_timeout_there():
    a, b, c = (x.id for x in CASES)
    events = [{"case": a, "event": "start"}, {"case": a, "event": "done", "elapsed_s": 0.1},
              {"case": b, "event": "start"}]
    recs = interpret_events(CASES, events, proc(rc=None, timed_out=True), 60)
    assert recs[b]["status"] == "timeout" and "60 s" in recs[b]["message"]
    assert recs[c]["status"] == "runtime_error" and f"during case {b}" in recs[c]["message"]


def test_death_while_loading_names_loading_and_signal():
    recs = interpret_events(CASES, [], proc(rc=-11, output="boom"), 60)
    first = recs[CASES[0].id]
    assert first["status"] == "runtime_error"
    assert "SIGSEGV" in first["message"] and "loading the submission" in first["message"]
    assert "boom" in first["message"]


def test_torn_last_line_is_ignored(tmp_path):
    from grader.pipeline import _read_events
    f = tmp_path / "e.jsonl"
    f.write_text('{"case": "x", "event": "start"}\n{"case": "x", "ev')
    assert _read_events(f) == [{"case": "x", "event": "start"}]
