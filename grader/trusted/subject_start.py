"""Starting and loading the subject: a plain start (start, loaded), or a run begun before its
turn (start_prepared: "prepared" said on the control pipe, the submission loaded on "run"); the
harness's CPUs (take_cpus), and the records of a subject that died or hung while loading or
running a case."""

from __future__ import annotations

import json
import os
import sys
import time

from grader.common.text import clean
from grader.isolation.cpus import move_to_cpus
from grader.isolation.tree import process_tree
from grader.protocol.buffers import SharedBuffer
from grader.protocol.lines import read_line
from grader.trusted.link import Link
from grader.trusted.replies import SubjectGone, _error_text


def start(spec: dict, buffers: dict[str, SharedBuffer], deadline: float) -> tuple[Link, dict | None]:
    """The subject, loaded; or (link, error record) when loading failed or timed out."""
    link = Link(spec, buffers)
    return link, loaded(link, spec, deadline)


def loaded(link: Link, spec: dict, deadline: float) -> dict | None:
    """None once the subject says it has loaded the submission; else the error record."""
    try:
        reply = link.receive(deadline)
    except SubjectGone as gone:
        return _gone_record(gone, link, spec, loading=True)
    if reply.get("event") == "load_error":
        return dict(status="runtime_error", message=_error_text(reply, "import failed"))
    if reply.get("event") != "ready":
        return dict(status="runtime_error", message=(
            f"the subject broke the protocol: it said {clean(json.dumps(reply), 200)} instead of "
            f"'ready' while loading the submission"))
    return None


def start_prepared(spec: dict, buffers: dict[str, SharedBuffer],
                   ends: list) -> tuple[Link, dict | None, float]:
    """A run begun before its turn (spec "prepare"; lookahead.Lookahead): the subject started,
    with CUDA and its profiler, but no submission code; "prepared" said on the control pipe; then,
    on "run", the submission loaded. Only the grader's code and torch have run when "prepared" is
    said, so that it may happen while another submission's run stage has the GPU. A subject that
    does not get there (or is gone by its turn), or a word other than "run": this process ends
    with no record, its work undone, and the pipeline runs the submission the usual way. Returns
    the link, the loading's error record (or None) and the run's deadline: loading and every
    case share one limit from "run", as they do in a run not begun early."""
    ready_fd, decide_fd = spec["control"]
    link = Link(spec, buffers)
    said: dict = {}
    why = _not_said(link, time.monotonic() + spec["deadline_s"], "prepared", said=said)
    if why:
        _give_up(link, why)
    if "triton_s" in said:   # subject/loop.py prepare: Triton's first use, before the turn
        print(f"harness: Triton warmed before the turn in {said['triton_s']} s"
              + (f" (not done: {', '.join(map(str, said['triton_failed']))})"
                 if said.get("triton_failed") else ""), flush=True)
    ends.append(("prepare", time.monotonic()))
    try:
        os.write(ready_fd, b"prepared\n")
        word = read_line(decide_fd)
    except OSError:
        word = ""
    verb, _, told = word.partition(" ")
    if verb != "run":
        _give_up(link, f"the grader said {word!r} instead of 'run'")
    if told:
        take_turn_fields(spec, told, link)
    take_cpus(spec, {os.getpid()} | process_tree(link.proc.pid))
    ends.append(("waiting", time.monotonic()))
    deadline = time.monotonic() + spec["deadline_s"]
    # "loading" comes before any submission code: a death before it is not the submission's
    why = _not_said(link, deadline, "loading", send=b"load\n")
    if why:
        _give_up(link, f"on its turn {why}")
    return link, loaded(link, spec, deadline), deadline


def take_turn_fields(spec: dict, told: str, link: Link) -> None:
    """What the grader says with "run" (harnesses.turn_word): the protocol's cost, calibrated on
    the GPU while this run was being prepared (a worker's first runs are begun beside its
    calibration), for the time stage, in place of the spec's. Only the grader writes the control
    pipe; a word it cannot read is the grader's bug: given up (run anew, the usual way)."""
    try:
        protocol = json.loads(told)["protocol"]
        if not isinstance(protocol, dict):
            raise TypeError(type(protocol).__name__)
    except (ValueError, KeyError, TypeError) as e:
        _give_up(link, f"the grader's word on its turn is not run {{\"protocol\": ...}} ({e!r})")
    (spec["time"] if "time" in spec else spec)["protocol"] = protocol


def _not_said(link: Link, deadline: float, event: str, send: bytes = b"",
              said: dict | None = None) -> str:
    """"" when the subject's next reply (after `send`, if any) is `event`, as a prepared subject's
    are (subject/loop.py prepare); else what it said instead. The reply goes into `said`."""
    try:
        if send:
            link.write(send)
        reply = link.receive(deadline)
    except SubjectGone as gone:
        reply = dict(event=gone.message)
    if said is not None:
        said.update(reply)
    if reply.get("event") == event:
        return ""
    return f"the subject said {clean(json.dumps(reply), 300)} instead of {event!r}"


def take_cpus(spec: dict, pids: set[int]) -> None:
    """This process and `pids` onto the spec's CPUs (the GPU stages'), from the ones it was
    started or prepared on (the builds': harnesses.take_harness), before its work begins."""
    if spec.get("cpus"):
        failed = move_to_cpus(pids, spec["cpus"])
        if failed:
            print(f"harness: {failed} threads could not be moved to CPUs {spec['cpus']}", flush=True)


def _give_up(link: Link, why: str) -> None:
    """A run begun early ends here with no record (the pipeline runs it anew and notes this
    process's output, so why, with the subject's last lines)."""
    link.close()
    tail = "\n".join(link.output().rstrip().splitlines()[-10:])
    print(f"harness: the run begun early gives up: {why}" + (f"\nits subject's last lines:\n{tail}"
                                                             if tail else ""), flush=True)
    sys.stdout.flush()
    os._exit(0)


def _gone_record(gone: SubjectGone, link: Link, spec: dict, *, loading: bool,
                 limit: str = "") -> dict:
    doing = "loading the submission" if loading else "running this case"
    if gone.status == "timeout":
        return dict(status="timeout", message=f"still running after {limit or _run_limit(spec)}; "
                                              f"killed while {doing}")
    tail = "\n".join(link.output().rstrip().splitlines()[-25:])
    return dict(status="runtime_error", message=f"{gone.message} while {doing}\n{tail}")


def _run_limit(spec: dict) -> str:
    return f"{spec['deadline_s']:.0f} s, the limit for loading and running every case"
