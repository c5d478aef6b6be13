"""The trusted side of running and timing a submission. It never imports submission code.

    python -m grader.trusted.harness --spec SPEC.json      (started by grader/schedule/workers.py)
    python -m grader.trusted.harness --wait READY DECIDE   (a warm harness: harnesses.WarmHarness)

It starts the subject (grader/subject/loop.py, in the sandbox, as an unprivileged user) and drives
it call by call over a pipe. It owns everything a call touches and everything that is measured:

- **Inputs and outputs.** Q, K, V and O live in buffers this process creates and shares with the
  subject as file descriptors (grader/protocol/buffers.py). It writes fresh inputs, poisons O with
  NaN, and reads O itself when the call's reply arrives, before the next call starts.
- **The clock.** Each timed call is measured here, between this process's own device
  synchronizations: the host clock from "go" to the reply, and this process's GPU events from
  before "go" to its first GPU work after the reply (which cannot run before the subject's
  queued work on the device yields to it). The larger one counts. The median is computed here.
- **What is checked.** Every timed call's output, as it stood when this process first touched
  the GPU after the reply, is checked on this process's own copy of the inputs: every element
  written, and slices picked after the reply against SDPA; a few calls, chosen from os.urandom
  after each call returned, are compared whole with the fp32 reference under the precision
  budget.
- **Who used the GPU.** During the timed calls it lists the processes that hold a CUDA context
  (NVML): only one process of the submission's may. And it reads NVML's utilization samples
  (BusyWatch: per process, and for the whole GPU), which tell time the host spent while the GPU
  sat idle (ranked) from GPU work the subject's profiler did not report (flagged).

The subject's replies are claims: a "done" before the work is done shows in the clocks and the
poisoned output; the kernels it says it launched are evidence that the trusted side weighs
(grader/trusted/integrity.py), once every number in them has been checked (finite, of its type, within
what this process measured: "what the subject reports, checked"). This process makes itself
non-dumpable, so a process of the same user cannot read or write its memory.

This module is the entry point (main, the modes, the record written); the work is in its
siblings in grader/trusted/: replies.py (what the subject reports, checked), link.py (the pipe
and the shared buffers), subject_start.py (starting and loading the subject), run_stage.py,
time_stage.py, timed_calls.py (one timed call and its clocks), call_checks.py (each timed
call's output checked), gpu_watch.py (NVML) and calibration.py (the protocol's cost).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
from pathlib import Path

from grader.isolation.tree import become_subreaper
from grader.protocol.lines import read_line
from grader.trusted.calibration import calibrate
from grader.trusted.run_stage import _run_all, run_cases
from grader.trusted.subject_start import take_cpus
from grader.trusted.time_stage import time_case, time_prepared


def make_non_dumpable() -> None:
    """PR_SET_DUMPABLE 0: no ptrace and no /proc/<pid>/mem for processes of the same user."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


# ---------------------------------------------------------------- run, then time: one subject


def run_then_time(spec: dict) -> None:
    """The run stage, then the time stage on the same subject process (issue 13: no second
    harness, subject, import or JIT compile for a submission). The run's record goes to
    spec["result"] and "ran" down the control pipe; the pipeline answers "time" (every case
    ran) or "stop"; "timed" goes down the pipe once the timed calls are over and the subject is
    gone (the pipeline may start the next submission's run stage then: what is left here is
    trusted work, the statistics and the spot checks), and the time stage's record goes to
    spec["time"]["result"]. The subject waits for its next request meanwhile, as between any two
    calls; the timed loop (time_case) is every timed row's, warm-up included (the others' subjects
    make a run stage's calls first: run_stage.run_stage_calls)."""
    ready_fd, decide_fd = spec["control"]
    link, buffers, records, phases = _run_all(spec)
    write_result(spec["result"], dict(cases=records, output=link.reader.text(), phases_s=phases))
    timing = dict(spec, **spec["time"])
    try:
        os.write(ready_fd, b"ran\n")
        decision = os.read(decide_fd, 64)
    except OSError:
        decision = b""
    alive = link.proc.poll() is None and all(r.get("status") == "pass" for r in records.values())
    if decision.startswith(b"time") and alive:
        write_result(timing["result"], time_case(timing, opened=(link, buffers), after_run_stage=True,
                                                 on_timed=lambda: _say(ready_fd, b"timed\n")))
    else:
        link.close()


def _say(fd: int, word: bytes) -> None:
    try:
        os.write(fd, word)
    except OSError:   # the pipeline is gone: the record says the rest
        pass


# ---------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> None:
    make_non_dumpable()
    become_subreaper()
    p = argparse.ArgumentParser(prog="python -m grader.trusted.harness")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--spec", type=Path)
    how.add_argument("--wait", type=int, nargs=2, metavar=("READY_FD", "DECIDE_FD"),
                     help="started before its work is known (a warm harness): with its imports "
                          "done and no GPU touched, wait for 'spec PATH' on DECIDE_FD")
    a = p.parse_args(argv)
    if a.wait:
        line = read_line(a.wait[1])
        if not line.startswith("spec "):   # let go before any work (or the grader is gone)
            os._exit(0)
        spec = dict(json.loads(Path(line[len("spec "):]).read_text()), control=a.wait)
    else:
        spec = json.loads(a.spec.read_text())
    if not spec.get("prepare"):   # a run begun early moves on its turn (start_prepared)
        take_cpus(spec, {os.getpid()})
    if spec["mode"] == "run_then_time":
        run_then_time(spec)
    else:
        modes = dict(run=run_cases, time=time_prepared if spec.get("prepare") else time_case,
                     calibrate=calibrate)
        write_result(spec["result"], modes[spec["mode"]](spec))
    sys.stdout.flush()
    os._exit(0)


def write_result(path: str, result: dict) -> None:
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(result, allow_nan=True))
    tmp.replace(path)


if __name__ == "__main__":
    main()
