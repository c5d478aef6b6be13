"""The trusted side of running and timing a submission. It never imports submission code.

    python -m grader.harness --spec SPEC.json      (started by grader/pipeline.py)
    python -m grader.harness --wait READY DECIDE   (a warm harness: pipeline.WarmHarness)

It starts the subject (grader/subject/loop.py, in the sandbox, as an unprivileged user) and drives
it call by call over a pipe. It owns everything a call touches and everything that is measured:

- **Inputs and outputs.** Q, K, V and O live in buffers this process creates and shares with the
  subject as file descriptors (grader/shared_memory.py). It writes fresh inputs, poisons O with
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
(grader/integrity.py), once every number in them has been checked (finite, of its type, within
what this process measured: "what the subject reports, checked"). This process makes itself
non-dumpable, so a process of the same user cannot read or write its memory.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import math
import os
import random
import select
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from . import config
from .cases import Case
from .compare import Finding, compare_outputs
from .inputs import make_inputs, make_random_inputs
from .procs import (adopted, become_subreaper, end_processes, move_to_cpus, process_tree,
                    read_line, spawn_capped, started_at)
from .reference import attention_plain_fp16, attention_reference
from .results import LOOP_PARTS, RUN_PHASES, TIME_PHASES
from .shared_memory import SharedBuffer, create_buffer
from .text import clean
from .timing import (GpuBusy, GpuSamples, ProtocolCost, gpu_busy, relative_standard_error,
                     summarize)

# Captured before anything else runs in this process (nothing else does: this is the trusted side).
_perf_counter = time.perf_counter
_urandom = os.urandom
REPLY_LIMIT = 4 << 20    # bytes in one reply line; a longer one is a protocol violation
# What is kept of a timed call's diagnostics line (numbers only; grader/subject/loop.py,
# Subject.diagnostics): the subject's own clocks, for the overhead figures, never ranked.
DIAGNOSTICS = ("subject_ms", "subject_gpu_ms", "subject_copy_ms", "t_line", "t_received",
               "t_synced", "t_replied")
DIAGNOSTIC_LIMIT = 1e12   # beyond any perf_counter reading (s) or time (ms) it holds


class SubjectGone(Exception):
    """The subject died, hung past its deadline, or broke the protocol."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status, self.message = status, message


# ---------------------------------------------------------------- what the subject reports, checked
#
# Invariant: nothing the subject reports is kept unchecked. A reply is JSON with no NaN, Infinity
# or overflowing number (1e999 would parse as inf), and every field the harness reads has its
# type and its bounds: a count is an integer (never a bool) from 0 to a cap, a time is finite, at
# least 0 and no longer than the calls it covers took by this process's clock, a size no larger
# than the device's memory. Anything else is a protocol violation: runtime_error, naming the
# field and the value. (An infinite GPU time once explained any time at all:
# integrity._accounting subtracted it from the measured one.) The diagnostics line of a timed
# call is the one exception: it is only shown, never ranked or judged, so a bad number in it is
# dropped (Link._set_aside, _diagnostic_ms) rather than failing the call.


class _NotFinite(ValueError):
    """A NaN, an Infinity or a float literal that overflows, in a reply."""


def _no_constant(word: str):
    raise _NotFinite(word)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


def parse_reply(line: bytes) -> dict:
    """One reply line as a JSON object with finite numbers only; SubjectGone otherwise. Python's
    json takes NaN and Infinity, and "1e999" as inf, unless told not to; a 5000-digit integer
    or 100 000 nested lists raise errors that are not JSONDecodeError."""
    try:
        reply = json.loads(line, parse_constant=_no_constant, parse_float=_finite_float)
    except _NotFinite as e:
        try:   # which field: the line again, every float kept as written
            field = _not_finite_at(json.loads(line, parse_constant=_NotFinite, parse_float=_NotFinite))
        except (ValueError, RecursionError):
            field = ""
        raise _protocol(f"its reply's {field or 'number'} is {clean(str(e), 40)}: not a finite "
                        f"number") from None
    except (ValueError, RecursionError):   # JSONDecodeError, UnicodeDecodeError, digit limits
        raise _protocol("a reply that is not JSON (something wrote to the grader's pipe)") from None
    if not isinstance(reply, dict):
        raise _protocol("a reply that is not a JSON object (something wrote to the grader's pipe)")
    return reply


def _not_finite_at(value, path: str = "") -> str:
    """Where in a reply parsed with every float and constant kept as _NotFinite the first one
    that is not finite is ('launched[0][2]'); a float that is finite is let pass."""
    if isinstance(value, _NotFinite):
        try:
            return "" if math.isfinite(float(str(value))) else path
        except ValueError:   # NaN, Infinity and -Infinity are constants float() also reads
            return path
    items = (value.items() if isinstance(value, dict) else enumerate(value)
             if isinstance(value, list) else ())
    for key, item in items:
        where = _not_finite_at(item, f"{path}.{key}" if isinstance(key, str) and path
                               else key if isinstance(key, str) else f"{path}[{key}]")
        if where:
            return where
    return ""


def _protocol(what: str) -> SubjectGone:
    return SubjectGone("runtime_error", f"the subject broke the protocol: {what}")


def malformed(field: str, value, why: str) -> SubjectGone:
    """The protocol violation of a reply whose `field` holds `value`, which it may not (`why`)."""
    shown = clean(json.dumps(value) if not isinstance(value, str) else repr(value), 120)
    return _protocol(f"its reply's {field} is {shown}: {why}")


def number(value, field: str, *, high: float, integer: bool = False, unit: str = ""):
    """`value` when it is a number (an integer where `integer`; never a bool), finite and within
    [0, high]; else a protocol violation naming the field."""
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise malformed(field, value, f"not {kind}")
    if isinstance(value, float) and not math.isfinite(value) or not 0 <= value <= high:
        raise malformed(field, value, f"not {kind} from 0 to {high:.6g}{unit}")
    return value


def launched(raw, field: str, window_ms: float) -> list[list]:
    """The subject's list of [name, count, GPU µs], checked (number) and its names cleaned. It
    covers `window_ms` by this process's clock: a call (from the request to its reply), or the
    timed loop (from "profile on" to the reply to "profile off"), and no kernel runs longer than
    that, nor launches more often than config.REPORT_LAUNCHES_PER_MS. A claim:
    grader/integrity.py weighs it."""
    if not isinstance(raw, list) or len(raw) > config.REPORT_KERNELS:
        raise malformed(field, raw if not isinstance(raw, list) else f"a list of {len(raw)}",
                        f"not a list of at most {config.REPORT_KERNELS} [name, count, GPU µs]")
    launches = config.REPORT_LAUNCH_FLOOR + config.REPORT_LAUNCHES_PER_MS * window_ms
    longest_us = 1e3 * (window_ms * (1 + config.REPORT_CLOCK_SLACK) + config.REPORT_CLOCK_SLACK_MS)
    out = []
    for i, item in enumerate(raw):
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)):
            raise malformed(f"{field}[{i}]", item, "not a [name, count, GPU µs]")
        name = clean(item[0], 300).replace("\n", " ")
        count = number(item[1], f"{field}[{i}] count ({name[:80]})", high=launches, integer=True,
                       unit=f" (launches in the {window_ms:.1f} ms the report covers)")
        us = number(item[2], f"{field}[{i}] GPU µs ({name[:80]})", high=longest_us,
                    unit=f" µs: no kernel runs longer than the {window_ms:.3f} ms, by the "
                         f"grader's clock, that the report covers")
        out.append([name, count, float(us)])
    return out


def returned_description(raw) -> dict:
    """What a call returned, as the subject describes it (subject/loop.py describe): its type's
    name, and for a tensor its shape (at most 8 dimensions) and dtype; checked."""
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise malformed("returned", raw, "not a description of what the call returned")
    if raw["type"] != "Tensor":
        return dict(type=raw["type"])
    shape = raw.get("shape")
    if not isinstance(shape, list) or len(shape) > 8:
        raise malformed("returned.shape", shape, "not a list of at most 8 sizes")
    sizes = [number(x, f"returned.shape[{i}]", high=2 ** 40, integer=True) for i, x in enumerate(shape)]
    if not isinstance(raw.get("dtype"), str):
        raise malformed("returned.dtype", raw.get("dtype"), "not a dtype's name")
    return dict(type="Tensor", shape=sizes, dtype=raw["dtype"])


def memory_bytes(device: str) -> int:
    """The most memory a process can have used on `device`: the GPU's, or this machine's."""
    if device == "cuda":
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def make_non_dumpable() -> None:
    """PR_SET_DUMPABLE 0: no ptrace and no /proc/<pid>/mem for processes of the same user."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Link:
    """The subject process: requests out, replies in, one JSON line each, with deadlines."""

    live: set[int] = set()   # every open Link's subject pid in this process (the calibration's three)

    def __init__(self, spec: dict, buffers: dict[str, SharedBuffer]):
        self.device = spec["device"]
        req_r, self.req_w = os.pipe()
        self.rep_r, rep_w = os.pipe()
        setup = dict(device=self.device, requests_fd=req_r, replies_fd=rep_w, target=spec["target"],
                     buffers={name: [b.fd, b.nbytes] for name, b in buffers.items()},
                     prepare=bool(spec.get("prepare")))
        cmd = [*spec["subject_cmd"], "--setup", json.dumps(setup)]
        self.proc, self.reader = spawn_capped(
            cmd, env=spec.get("env") or None, cwd=spec["cwd"], head_bytes=spec["head_bytes"],
            tail_bytes=spec["tail_bytes"], file_bytes=spec["file_bytes"],
            pass_fds=(req_r, rep_w, *(b.fd for b in buffers.values())))
        os.close(req_r)
        os.close(rep_w)
        Link.live.add(self.proc.pid)
        self.pending = b""
        self.sequence = 0
        self.closed = False
        # Each timed call's diagnostics line (grader/subject/loop.py) comes after its reply and is
        # never waited for: it is taken up whenever it has arrived (receive, drain), so that no
        # time the subject takes outside a timed call's clock can hold up the next call.
        self.diagnostics: dict[int, dict] = {}
        self.awaiting: set[int] = set()
        # On a GPU a timed call's reply is polled, not waited for: waking from a sleep costs a
        # few hundred microseconds on a virtual machine, and every timed call would pay it.
        # open_call turns it on; until then (loading, the run stage's cases) the harness sleeps
        # and leaves its CPU to the subject's imports and JIT compiles.
        self.spin = False
        os.set_blocking(self.rep_r, self.device != "cuda")

    def send(self, request: dict) -> int:
        n, line = self.encode(request)
        self.write(line)
        return n

    def encode(self, request: dict) -> tuple[int, bytes]:
        """The next request as the bytes to write, and its sequence number (made before a timed
        call's clock starts)."""
        self.sequence += 1
        return self.sequence, (json.dumps(dict(request, n=self.sequence)) + "\n").encode()

    def write(self, line: bytes) -> None:
        try:
            os.write(self.req_w, line)
        except OSError:
            raise SubjectGone("runtime_error", self._death("the subject stopped reading")) from None

    def receive(self, deadline: float, expect: int | None = None) -> dict:
        """The next reply (diagnostics lines set aside); SubjectGone on death, protocol
        violation or the deadline."""
        while True:
            line, sep, rest = self.pending.partition(b"\n")
            if sep:
                self.pending = rest
                reply = self._parse(line)
                if not self._set_aside(reply):
                    return self._in_sequence(reply, expect)
                continue
            if len(self.pending) > REPLY_LIMIT:
                raise SubjectGone("runtime_error", "the subject broke the protocol: a reply over "
                                  f"{REPLY_LIMIT} bytes")
            left = deadline - time.monotonic()
            if left <= 0:
                raise SubjectGone("timeout", "")
            if not self.spin:
                ready, _, _ = select.select([self.rep_r], [], [], min(left, 1.0))
                if not ready:
                    continue
            try:
                chunk = os.read(self.rep_r, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                raise SubjectGone("runtime_error", self._death("the process ended"))
            self.pending += chunk

    def drain(self) -> None:
        """Take up the diagnostics lines that have arrived, without waiting for any."""
        while self.awaiting:
            line, sep, rest = self.pending.partition(b"\n")
            if sep:
                if not self._set_aside(self._parse(line)):
                    return   # a reply of another kind: receive's to judge
                self.pending = rest
                continue
            if len(self.pending) > REPLY_LIMIT or not select.select([self.rep_r], [], [], 0)[0]:
                return   # an overlong line is receive's to judge
            try:
                chunk = os.read(self.rep_r, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                return
            self.pending += chunk

    def expect_diagnostics(self, n: int) -> None:
        """Request n was a timed call: its diagnostics line is to be set aside when it comes."""
        self.awaiting.add(n)

    def _set_aside(self, reply: dict) -> bool:
        """A diagnostics line awaited is kept, its numbers only, each a float of a sane size
        (the subject's perf_counter readings and ms): it is only shown, so a bad one is dropped."""
        n = reply.get("n")
        if reply.get("event") != "diagnostics" or type(n) is not int or n not in self.awaiting:
            return False
        self.awaiting.discard(n)
        self.diagnostics[n] = {k: float(v) for k, v in reply.items() if k in DIAGNOSTICS
                               and isinstance(v, (int, float)) and not isinstance(v, bool)
                               and abs(v) < DIAGNOSTIC_LIMIT}
        return True

    @staticmethod
    def _parse(line: bytes) -> dict:
        return parse_reply(line)

    @staticmethod
    def _in_sequence(reply: dict, expect: int | None) -> dict:
        if expect is not None and (type(reply.get("n")) is not int or reply["n"] != expect):
            raise _protocol("a reply out of sequence (something wrote to the grader's pipe)")
        return reply

    def _death(self, what: str) -> str:
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        code = self.proc.returncode
        how = f"exited with code {code}" if code is not None and code >= 0 else f"was killed ({code})"
        if code is not None and (code < 0 or 128 < code < 160):
            import signal
            number = -code if code < 0 else code - 128
            try:
                how = f"was killed by {signal.Signals(number).name}"
            except ValueError:
                how = f"was killed by signal {number}"
        return f"{what}: the process {how}"

    def output(self) -> str:
        self.reader.join(timeout=10)
        return self.reader.text()

    def processes(self) -> dict[int, int | None]:
        """The subject's processes, with when each started (procs.started_at): its tree, and the
        orphans the harness adopted (procs.adopted) that no other open Link's subject started."""
        others = set().union(*(process_tree(p) for p in Link.live - {self.proc.pid}))
        pids = process_tree(self.proc.pid) | (adopted() - others)
        return {pid: started_at(pid) for pid in pids}

    def close(self) -> None:
        """Ask it to exit, then its process group killed; once (a second call could otherwise
        write to, and close, descriptors another Link has been given since)."""
        if self.closed:
            return
        self.closed = True
        tree = self.processes()   # what it started too, before any of it ends
        try:
            os.write(self.req_w, b'{"op": "exit"}\n')
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        # Every process of it gone before this returns. In the sandbox the rest of its pid
        # namespace dies with the group. Without one, what left the group (setsid) is killed by
        # pid, and what left the tree (a double fork) was adopted by this process
        # (procs.become_subreaper) and is found again here; a process that will not die is said.
        left = end_processes(self.proc, tree, find=self.processes)
        Link.live.discard(self.proc.pid)
        if left:
            print(f"harness: processes {sorted(left)} of the subject still ran 30 s after it was "
                  f"killed", flush=True)
        for fd in (self.req_w, self.rep_r):
            try:
                os.close(fd)
            except OSError:
                pass


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def allocate(device: str, numel: int) -> dict[str, SharedBuffer]:
    return {name: create_buffer(2 * numel, device) for name in "qkvo"}


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
    """A run begun before its turn (spec "prepare"; pipeline.Lookahead): the subject started,
    with CUDA and its profiler, but no submission code; "prepared" said on the control pipe; then,
    on "run", the submission loaded. Only the grader's code and torch have run when "prepared" is
    said, so that it may happen while another submission's run stage has the GPU. A subject that
    does not get there (or is gone by its turn), or a word other than "run": this process ends
    with no record, its work undone, and the pipeline runs the submission the usual way. Returns
    the link, the loading's error record (or None) and the run's deadline: loading and every
    case share one limit from "run", as they do in a run not begun early."""
    ready_fd, decide_fd = spec["control"]
    link = Link(spec, buffers)
    why = _not_said(link, time.monotonic() + spec["deadline_s"], "prepared")
    if why:
        _give_up(link, why)
    ends.append(("prepare", time.monotonic()))
    try:
        os.write(ready_fd, b"prepared\n")
        word = read_line(decide_fd)
    except OSError:
        word = ""
    if word != "run":
        _give_up(link, f"the grader said {word!r} instead of 'run'")
    take_cpus(spec, {os.getpid()} | process_tree(link.proc.pid))
    ends.append(("waiting", time.monotonic()))
    deadline = time.monotonic() + spec["deadline_s"]
    # "loading" comes before any submission code: a death before it is not the submission's
    why = _not_said(link, deadline, "loading", send=b"load\n")
    if why:
        _give_up(link, f"on its turn {why}")
    return link, loaded(link, spec, deadline), deadline


def _not_said(link: Link, deadline: float, event: str, send: bytes = b"") -> str:
    """"" when the subject's next reply (after `send`, if any) is `event`, as a prepared subject's
    are (subject/loop.py prepare); else what it said instead."""
    try:
        if send:
            link.write(send)
        reply = link.receive(deadline)
    except SubjectGone as gone:
        reply = dict(event=gone.message)
    if reply.get("event") == event:
        return ""
    return f"the subject said {clean(json.dumps(reply), 300)} instead of {event!r}"


def take_cpus(spec: dict, pids: set[int]) -> None:
    """This process and `pids` onto the spec's CPUs (the GPU stages'), from the ones it was
    started or prepared on (the builds': pipeline.take_harness), before its work begins."""
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


def _error_text(reply: dict, doing: str = "") -> str:
    """An error the subject reported, as the student reads it: '[doing: ]Type: message', then
    its traceback, which the subject cut to the student's own frames (subject/loop.py,
    student_traceback). All of it the subject's claim: cleaned and capped, never parsed."""
    text = f"{clean(reply.get('error'), 200)}: {clean(reply.get('message'), 4000)}"
    if doing:
        text = f"{doing}: {text}"
    if reply.get("traceback"):
        text += "\n" + clean(reply["traceback"], 6000)
    return text


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


# ---------------------------------------------------------------- run: every case, outputs kept


def run_cases(spec: dict) -> dict:
    """Each case once, profiled; O saved to <out_dir>/<case>.pt for the checker."""
    link, buffers, records, phases = _run_all(spec)
    link.close()
    return dict(cases=records, output=link.output(), phases_s=phases)


def run_then_time(spec: dict) -> None:
    """The run stage, then the time stage on the same subject process (issue 13: no second
    harness, subject, import or JIT compile for a submission). The run's record goes to
    spec["result"] and "ran" down the control pipe; the pipeline, having checked the outputs,
    answers "time" or "stop"; the time stage's record goes to spec["time"]["result"]. The
    subject waits for its next request meanwhile, as between any two calls; the timed loop
    (time_case) is the one a fresh subject gets, warm-up included."""
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
        write_result(timing["result"], time_case(timing, opened=(link, buffers)))
    else:
        link.close()


def _run_all(spec: dict) -> tuple[Link, dict[str, SharedBuffer], dict[str, dict], dict]:
    """The subject started on buffers for the largest case and every case run once: its link
    (still open), the buffers, a record per case and where the time went (RUN_PHASES)."""
    device, out_dir = spec["device"], Path(spec["out_dir"])
    cases = [Case.from_dict(c) for c in spec["cases"]]
    ends = [("harness", time.monotonic())]
    deadline = time.monotonic() + spec["deadline_s"]
    buffers = allocate(device, max(c.numel for c in cases))
    synchronize(device)
    ends.append(("buffers", time.monotonic()))
    if spec.get("prepare"):
        link, failed, deadline = start_prepared(spec, buffers, ends)
        ends.append(("load", time.monotonic()))
    else:
        link, failed = start(spec, buffers, deadline)
        ends.append(("subject", time.monotonic()))
    records: dict[str, dict] = {}
    rest = None   # the record of every case after one that ended the process
    try:
        for case in cases:
            if rest is not None:
                records[case.id] = rest
            elif failed is not None:   # it did not load: the first case says why
                records[case.id] = failed
                rest = dict(status="runtime_error", message="not run: the submission did not load")
            else:
                records[case.id], rest = run_one(link, case, buffers, out_dir, device, deadline, spec)
    except BaseException:
        link.close()
        raise
    ends.append(("cases", time.monotonic()))
    return link, buffers, records, phases(spec.get("spawned"), ends)


def phases(start: float | None, ends: list[tuple[str, float]],
           names: tuple[str, ...] = RUN_PHASES) -> dict[str, float]:
    """Seconds of each phase (results.RUN_PHASES, or `names`), from (phase, monotonic time it
    ended) in order, each beginning where the one before ended and the first at `start`: the
    spec's "spawned", the pipeline's CLOCK_MONOTONIC time on handing this process its spec (one
    clock machine-wide), or None when unknown, and then that phase is left out."""
    out = {}
    for name, end in ends:
        assert name in names, name
        if start is not None:
            out[name] = round(end - start, 3)
        start = end
    return out


def run_one(link: Link, case: Case, buffers, out_dir: Path, device: str, deadline: float,
            spec: dict) -> tuple[dict, dict | None]:
    """(record of this case, record for the cases after it if none of them can run)."""
    q, k, v, o = (buffers[n].view(case.shape) for n in "qkvo")
    for dst, src in zip((q, k, v), make_inputs(case, device)):
        dst.copy_(src)
    o.fill_(float("nan"))
    synchronize(device)
    start_s = _perf_counter()
    case_s = spec.get("case_limits", {}).get(case.id)   # on a GPU: from the case's size
    limit = ""
    if case_s is not None and time.monotonic() + case_s < deadline:
        deadline = time.monotonic() + case_s
        limit = f"{case_s:.0f} s, the limit for a case of this size"
    try:
        reply = link.receive(deadline, expect=link.send(dict(op="call", shape=list(case.shape),
                                                             profile=True)))
        elapsed = _perf_counter() - start_s
        record = call_record(reply, device, elapsed)
    except SubjectGone as gone:
        record = _gone_record(gone, link, spec, loading=False, limit=limit)
        why = ("the subject broke the protocol" if gone.message.startswith("the subject broke")
               else "the process ended")
        return record, dict(status="runtime_error", message=f"not run: {why} during case {case.id}")
    if record["status"] != "pass":
        if record.pop("context_lost", False):
            return record, dict(status="runtime_error",
                                message=f"not run: the CUDA context was lost in case {case.id}")
        return record, None
    problem = output_problem(record.pop("returned"), case)
    if problem:
        record["problem"] = problem
    else:
        # A copy of its own (a CUDA tensor's copy to the host already is one; a CPU view of the
        # shared buffer would save the whole buffer).
        saved = o.detach().cpu() if o.is_cuda else o.detach().clone()
        torch.save(saved, out_dir / f"{case.id}.pt")
    return record, None


def call_record(reply: dict, device: str, elapsed: float) -> dict:
    """A "call" reply, checked (every field read: "what the subject reports, checked"), as this
    case's record: "pass" with what it launched and what it returned (for output_problem), or
    the error it raised ("context_lost" when its CUDA context is gone), or not_run."""
    event, window_ms = reply.get("event"), elapsed * 1e3
    if event == "not_run":   # TileLang compiled, with no GPU to launch on (subject/loop.py)
        if device == "cuda":
            return dict(status="runtime_error", message="the subject claimed there is no GPU to "
                        "run on, on a GPU")
        return dict(status="not_run", message=clean(reply.get("message"), 1000),
                    launched=launched(reply.get("launched"), "launched", window_ms))
    if event == "error":
        if not isinstance(reply.get("context_alive"), bool):
            raise malformed("context_alive", reply.get("context_alive"), "not true or false")
        return dict(status="runtime_error", message=_error_text(reply),
                    context_lost=not reply["context_alive"])
    if event != "done":
        raise malformed("event", event, "not done, error or not_run")
    return dict(status="pass", message="", elapsed_s=elapsed,
                launched=launched(reply.get("launched"), "launched", window_ms),
                peak_memory_bytes=number(reply.get("peak_memory_bytes"), "peak_memory_bytes",
                                         high=memory_bytes(device), integer=True,
                                         unit=" bytes, the device's memory"),
                returned=returned_description(reply.get("returned")))


def output_problem(returned: dict, case: Case) -> str:
    """Why what the call returned cannot be O, from the subject's description; '' if it can."""
    if returned.get("type") != "Tensor":
        return (f"returned {clean(returned.get('type'), 80)}, expected a torch.Tensor of shape "
                f"{tuple(case.shape)}")
    shape = tuple(returned.get("shape") or ())
    if shape != tuple(case.shape):
        return f"output has shape {shape}, expected {tuple(case.shape)} (batch, heads, seq, head_dim)"
    if returned.get("dtype") != "float16":
        return f"output dtype is torch.{clean(returned.get('dtype'), 40)}, expected torch.float16"
    return ""


# ---------------------------------------------------------------- time: the largest case


def gpu_context_pids() -> set[int] | None:
    """Host pids of the processes holding a CUDA context on any GPU; None when NVML and
    nvidia-smi cannot say."""
    try:
        import pynvml
        pynvml.nvmlInit()
        pids = set()
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            pids |= {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        return pids
    except Exception:
        pass
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-compute-apps=pid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
        return {int(x) for x in out.split() if x.strip().isdigit()}
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def read_gpu_samples(since_us: int) -> GpuSamples:
    """NVML's utilization samples of this process's GPU taken after `since_us` (µs on the host's
    wall clock): the whole GPU's (NVML_GPU_UTILIZATION_SAMPLES) and each process's
    (nvmlDeviceGetProcessUtilization, by host pid). The one place that reads them: BusyWatch
    calls it, and a test or another source replaces it. Never raises: what it cannot read, it
    says why."""
    try:
        import pynvml
    except ImportError:
        return GpuSamples(why="pynvml (the nvidia-ml-py package) is not installed")
    try:
        handle = _nvml_handle(pynvml)
    except Exception as e:   # pynvml.NVMLError and its kin, no GPU, no driver
        return GpuSamples(why=f"NVML cannot be read here ({clean(str(e), 200)})")
    device, device_why = _nvml_read(lambda: _nvml_device_samples(pynvml, handle, since_us), pynvml)
    processes, process_why = _nvml_read(
        lambda: tuple((int(p.timeStamp), int(p.pid), float(p.smUtil))
                      for p in pynvml.nvmlDeviceGetProcessUtilization(handle, since_us)), pynvml)
    return GpuSamples(device=device, processes=processes,
                      why="; ".join(w for w in (device_why, process_why) if w))


_NVML: dict = {}   # the handle of this process's GPU, found once


def _nvml_handle(pynvml):
    """NVML's handle of the GPU this process uses: NVML numbers GPUs its own way (it ignores
    CUDA_VISIBLE_DEVICES), so the GPU is found by its UUID."""
    if "handle" not in _NVML:
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device")
        pynvml.nvmlInit()
        uuid = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", None)
        if uuid is not None:
            _NVML["handle"] = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        elif pynvml.nvmlDeviceGetCount() == 1:
            _NVML["handle"] = pynvml.nvmlDeviceGetHandleByIndex(0)
        else:
            raise RuntimeError("this torch does not say which of NVML's GPUs is this process's")
    return _NVML["handle"]


def _nvml_read(read, pynvml) -> tuple[tuple | None, str]:
    """(what `read` returned, '') or (None, why); NVML's "not found" (no sample since the time
    asked for) is no samples, not a failure."""
    try:
        return read(), ""
    except Exception as e:
        # pynvml raises NVMLError(NVML_SUCCESS) when a first call finds no sample to size for
        if getattr(e, "value", None) in (0, getattr(pynvml, "NVML_ERROR_NOT_FOUND", 6)):
            return (), ""
        return None, f"NVML: {clean(str(e), 200)}"


# pynvml's c_nvmlValue_t member for each nvmlValueType_t
_NVML_VALUE = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def _nvml_device_samples(pynvml, handle, since_us: int) -> tuple[tuple[int, float], ...]:
    kind, samples = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, since_us)
    member = _NVML_VALUE[kind] if 0 <= kind < len(_NVML_VALUE) else "uiVal"
    return tuple((int(x.timeStamp), float(getattr(x.sampleValue, member))) for x in samples)


def _wall_us() -> int:
    """Now on the clock NVML stamps its samples with: the host's wall clock, in µs."""
    return int(time.time() * 1e6)


class BusyWatch:
    """How busy NVML saw the GPU during the timed loop, and for whom (timing.gpu_busy): its
    samples taken up between calls at least every config.TIMING_NVML_READ_S, and after the loop,
    with the subject's host pids as they were then. NVML keeps 14 s of whole-GPU samples (one
    per 200 ms on an H100) but only each process's newest: read every 0.5 s, 3 of 5 per-process
    samples were lost and the subject's busy share read 40% for 99%; read every 0.15 s, every
    one arrived and agreed with the whole GPU's within a point (notes/gpu_runs.md, session 19).

    Invariant: what tells host time from hidden GPU work is observed here, outside the subject.
    The subject can fake its own account of itself (a CUDA event synchronized with blocking=True
    sleeps while hidden GPU work runs); NVML's samples, read by this process, it cannot."""

    def __init__(self, link: Link):
        self.link = link
        self.start_us = self.end_us = 0
        self.device: dict[int, float] = {}
        self.processes: dict[tuple[int, int], float] = {}
        self.pids: set[int] = set()
        self.why: list[str] = []
        self.read_device = self.read_processes = False   # has any read of each kind worked

    def start(self) -> None:
        self.start_us = self.last_us = _wall_us()

    def due(self) -> bool:
        """Whether the next read is due (TIMING_NVML_READ_S since the last)."""
        return _wall_us() - self.last_us >= config.TIMING_NVML_READ_S * 1e6

    def read(self) -> None:
        """The samples since the last look (from the older of the two kinds' newest, so that
        neither misses one stamped before the other's newest), and the subject's processes now."""
        self.last_us = _wall_us()
        self.pids |= set(self.link.processes())
        got = read_gpu_samples(min(max([self.start_us, *self.device]),
                                   max([self.start_us, *(t for t, _ in self.processes)])))
        if got.why and got.why not in self.why:
            self.why.append(got.why)
        self.read_device |= got.device is not None
        self.read_processes |= got.processes is not None
        for t, percent in got.device or ():
            if 0 <= percent <= 100:
                self.device[t] = percent
        for t, pid, percent in got.processes or ():
            if 0 <= percent <= 100:
                self.processes[(t, pid)] = percent

    def stop(self, calls: int) -> GpuBusy:
        """The loop has ended: the last samples, and what they say about it."""
        self.end_us = _wall_us()
        self.read()
        return gpu_busy(self.device if self.read_device else None,
                        self.processes if self.read_processes else None,
                        start_us=self.start_us, end_us=self.end_us, calls=calls,
                        subject=self.pids, grader={os.getpid()}, why="; ".join(self.why))


class Clock:
    """This process's two clocks for one call: the host clock from "go" to the reply, and its GPU
    events from before "go" to its first GPU work after the reply."""

    def __init__(self, device: str):
        self.device = device
        if device == "cuda":
            self.before = torch.cuda.Event(enable_timing=True)
            self.after = torch.cuda.Event(enable_timing=True)

    def go(self) -> None:
        if self.device == "cuda":
            self.before.record()
        self.t0 = _perf_counter()

    def returned(self) -> None:
        self.t_reply = _perf_counter()
        self.wall_ms = (self.t_reply - self.t0) * 1e3
        if self.device == "cuda":
            self.after.record()

    def fence_ms(self) -> float:
        """After synchronize: the GPU clock's reading (the host clock's without a GPU)."""
        return self.before.elapsed_time(self.after) if self.device == "cuda" else self.wall_ms


def round_trip_ms(link: Link, deadline: float, reps: int = 20) -> float:
    """Median request/reply round trip with the subject (no GPU work)."""
    rtts = []
    for _ in range(reps):
        t0 = _perf_counter()
        link.receive(deadline, expect=link.send(dict(op="ping")))
        rtts.append((_perf_counter() - t0) * 1e3)
    return statistics.median(rtts)


# Trusted subjects whose calls stand for a submission's in the calibration: real attention
# kernels on the timed case (a library's, loaded by the subject loop with no submission), whose
# own CUDA events can be believed. Their protocol costs differ by about 0.1-0.2 ms (how long the
# host takes to take up and answer a call and the GPU's context switches vary with the kernel:
# bench/protocol_probe.py); the mean of the two is what a submission's call is charged.
CALIBRATION_KERNELS = ("sdpa_cudnn", "sdpa_flash")


def calibrate(spec: dict) -> dict:
    """The protocol's own cost per timed call (timing.ProtocolCost), measured on subjects that run
    no submission, called as a timed call is (warm-up, the profiler on, each call's output then
    checked on this side as time_case checks it): `null` returns Q, so its call is the round
    trip, the GPU context switches and the copy of an output into the shared buffer;
    CALIBRATION_KERNELS do a timed call's work, which their own events time. Every timed call of
    the run has its share subtracted.

    The subjects all start at once, each starting CUDA and its profiler as a run begun early
    prepares (subject/loop.py prepare), and are then called in turn, the others waiting: a
    subject's start is most of its time, and three in turn took 54 s while a course's builds ran
    (session 15). They run no submission's code."""
    subjects: dict[str, tuple[Link, dict[str, SharedBuffer]]] = {}
    try:
        for name in ("null", *CALIBRATION_KERNELS):
            subjects[name] = _spawn_prepared_builtin(spec, name)
        # Every subject's start (CUDA's, the profiler's) ends before the first calibrated call;
        # one that does not get there in time is closed at once. One deadline for all: a reply
        # that came while an earlier one was awaited is read within a few seconds more.
        deadline = time.monotonic() + spec["deadline_s"]
        waited = {}
        for name, (link, _) in subjects.items():
            waited[name] = _not_said(link, max(deadline, time.monotonic() + 5), "prepared")
            if waited[name]:
                link.close()

        def calls(name: str) -> dict:
            if waited[name]:
                return dict(failed=dict(status="runtime_error", message=waited[name]),
                            output=subjects[name][0].output())
            return _calibration_calls(spec, name, subjects[name])

        idle = calls("null")
        if "failed" in idle:
            return idle
        busy = {name: calls(name) for name in CALIBRATION_KERNELS}
    finally:
        for link, _ in subjects.values():
            link.close()
    cost = ProtocolCost(idle_ms=statistics.median(idle["raw"]))
    medians = [(statistics.median(raw - events for raw, events in b["pairs"]),
                statistics.median(events for _, events in b["pairs"]))
               for b in busy.values() if "failed" not in b and b["pairs"]]
    if len(medians) == len(CALIBRATION_KERNELS):
        cost = ProtocolCost(idle_ms=cost.idle_ms, busy_ms=statistics.fmean(m[0] for m in medians),
                            busy_work_ms=min(m[1] for m in medians))
    return dict(floor_ms=cost.idle_ms, protocol=cost.to_dict(), rtt_ms=idle["rtt_ms"],
                breakdown={name: r.get("breakdown") or clean(r["failed"].get("message"), 500)
                           for name, r in dict(null=idle, **busy).items()},
                output="".join(r.get("output", "") for r in (idle, *busy.values())))


def _spawn_prepared_builtin(spec: dict, name: str) -> tuple[Link, dict[str, SharedBuffer]]:
    """A subject for the builtin `name`, started on buffers of its own for the spec's case, that
    prepares (CUDA, the profiler's first start), says "prepared" and then waits for "load"."""
    buffers = allocate(spec["device"], Case.from_dict(spec["case"]).numel)
    return Link(dict(spec, target=dict(kind="builtin", name=name), prepare=True), buffers), buffers


def _calibration_calls(spec: dict, name: str,
                       prepared: tuple[Link, dict[str, SharedBuffer]] | None = None) -> dict:
    """The calibration's calls on the builtin `name`: on `prepared` (_spawn_prepared_builtin),
    or on a subject started here."""
    deadline = time.monotonic() + spec["deadline_s"]
    case = Case.from_dict(spec["case"])
    target_spec = dict(spec, target=dict(kind="builtin", name=name))
    failed = None
    if prepared is not None:   # it said "prepared": load its target now
        why = _not_said(prepared[0], deadline, "loading", send=b"load\n")
        failed = (dict(status="runtime_error", message=why) if why
                  else loaded(prepared[0], target_spec, deadline))
    if failed is not None:
        prepared[0].close()
        return dict(failed=failed, output=prepared[0].output())
    link, call, failed = open_call(target_spec, deadline, prepared)
    if failed is not None:
        return failed
    verify, pick = new_verify(), random.Random(_urandom(16))
    try:
        # Longer than a timed loop's warm-up: one cost serves the whole run, and the first calls
        # of a run find the GPU and its clocks cold.
        first = warm_up(link, call, deadline, calls=config.TIMING_WARMUP_CALLS
                        + spec.get("warmup", config.CALIBRATION_WARMUP_CALLS))
        clocks = []
        for i in range(spec.get("reps", config.CALIBRATION_CALLS)):
            clock, inputs = call.run(seed=i)
            clocks.append((clock.wall_ms, clock.fence_ms()))
            # What time_case does on the GPU between two timed calls, done here too: the cost
            # measured must include what that work does to the next call (the GPU switching to
            # this process's context and back, its clocks). Without it, session 9's timed calls
            # paid 0.2-0.35 ms a call more than the calibration had measured (notes/gpu_runs.md).
            # (`null` returns Q: its outputs are wrong by design; the work is what counts.)
            verify_call(verify, i, call.snapshot, inputs, case, pick)
            del inputs
        link.receive(deadline, expect=link.send(dict(op="profile", on=False)))
        rtt = round_trip_ms(link, deadline)
    except SubjectGone as gone:
        return dict(failed=dict(status=gone.status, message=gone.message), output=link.output())
    finally:
        link.close()
    parts = [(max(wall, fence), wall, fence, _reported_figures(r))
             for (wall, fence), r in zip(clocks, call.reported()[first:])]
    return dict(raw=[p[0] for p in parts], pairs=[(p[0], p[3]["events"]) for p in parts
                                                  if p[3]["events"] is not None],
                rtt_ms=rtt, output=link.output(), verify=verify,
                breakdown=dict(wall_ms=_median_of([p[1] for p in parts]),
                               fence_ms=_median_of([p[2] for p in parts]),
                               subject_events_ms=_median_of([p[3]["events"] for p in parts]),
                               subject_host_ms=_median_of([p[3]["host"] for p in parts])))


def open_call(spec: dict, deadline: float,
              opened: tuple[Link, dict[str, SharedBuffer]] | None = None
              ) -> tuple["Link", "Call | None", dict | None]:
    """The case's shared buffers, the subject started on them and the Call that drives it; or,
    when the subject did not come up, (link, None, the failure record). `opened`: a subject
    already running on buffers large enough (run_then_time's), used instead of a new one."""
    device, case = spec["device"], Case.from_dict(spec["case"])
    if opened is None:
        buffers = allocate(device, case.numel)
        link, failed = start(spec, buffers, deadline)
        if failed is not None:
            link.close()
            return link, None, dict(failed=failed, output=link.output())
    else:
        link, buffers = opened
    link.spin = device == "cuda"   # from here every reply is a timed or calibrated call's
    q, k, v, o = (buffers[n].view(case.shape) for n in "qkvo")
    flush = torch.empty(max(2 * spec["l2_bytes"], 64 << 20), dtype=torch.uint8, device=device)
    return link, Call(link, q, k, v, o, flush, case.shape, device, deadline, case.qk_std), None


def warm_up(link: Link, call: "Call", deadline: float,
            calls: int = config.TIMING_WARMUP_CALLS) -> int:
    """The warm-up calls before timed ones, the profiler turned on before the last of them (the
    first call under the profiler pays for its start). Timed calls run with it on. Returns the
    number of calls made so far: the first timed call's place in Call.reported()."""
    for i in range(calls):
        if i == calls - 1:
            call.profiled_from = _perf_counter()   # what the profiler covers starts after this
            link.receive(deadline, expect=link.send(dict(op="profile", on=True)))
        call.run(seed=int.from_bytes(_urandom(8), "little") >> 1)
    return len(call.sent)


def coarse_enough(times: list[float], coarse_ms: float | None) -> bool:
    """A call far slower than the fast ones (median above `coarse_ms`) is placed once
    TIMING_COARSE_MIN_REPS calls agree to TIMING_COARSE_RSE: that precision does not decide ranks."""
    return (coarse_ms is not None and len(times) >= config.TIMING_COARSE_MIN_REPS
            and statistics.median(times) > coarse_ms
            and relative_standard_error(times) < config.TIMING_COARSE_RSE)


def time_case(spec: dict, opened: tuple[Link, dict[str, SharedBuffer]] | None = None,
              begun: float | None = None) -> dict:
    """Timing statistics of one case, measured here, with what each call's output and the GPU's
    processes showed; on `opened`'s subject (open_call) if given. `begun`: when the stage began,
    if before this call (time_prepared's turn: its "open" part is the submission's load)."""
    device, case = spec["device"], Case.from_dict(spec["case"])
    begun = time.monotonic() if begun is None else begun
    deadline = begun + spec["deadline_s"]
    link, call, failed = open_call(spec, deadline, opened)
    if failed is not None:
        return failed
    ends = [("open", time.monotonic())]   # where the stage's time goes: results.TIME_PHASES
    pick = random.Random(_urandom(16))   # which calls and heads are checked: decided here
    result: dict = dict(verify=new_verify())
    try:
        rtt_ms = round_trip_ms(link, deadline)
        ends.append(("rtt", time.monotonic()))
        cost = ProtocolCost.from_dict(spec.get("protocol"))
        first = warm_up(link, call, deadline)
        ends.append(("warmup", time.monotonic()))
        walls, fences, times, samples, helpers = [], [], [], [], []
        watch = BusyWatch(link)
        stopped_by, loop_start = "max_reps", _perf_counter()
        watch.start()
        call.parts = dict.fromkeys(LOOP_PARTS, 0.0)
        while len(walls) < spec.get("max_calls", config.TIMING_MAX_REPS):
            seed = int.from_bytes(_urandom(8), "little") >> 1
            clock, inputs = call.run(seed)
            walls.append(clock.wall_ms)
            fences.append(clock.fence_ms())
            times += corrected(walls[-1:], fences[-1:], cost)
            t = _perf_counter()
            verify_call(result["verify"], len(walls) - 1, call.snapshot, inputs, case, pick)
            call.parts["verify"] += _perf_counter() - t
            _keep_sample(samples, pick, len(walls) - 1, seed, call.snapshot, config.TIMING_SPOT_SAMPLES)
            t = _perf_counter()
            if device == "cuda" and (len(walls) - 1) % config.TIMING_PROCESS_CHECK_EVERY == 0:
                helpers.append(gpu_helpers(link))
            if watch.due():
                watch.read()
            call.parts["helpers"] += _perf_counter() - t
            del inputs
            if len(times) >= config.TIMING_MIN_REPS and relative_standard_error(times) < config.TIMING_TARGET_RSE:
                stopped_by = "rse"
                break
            if coarse_enough(times, spec.get("coarse_ms")):
                stopped_by = "coarse"
                break
            if _perf_counter() - loop_start > spec["budget_s"] and len(times) >= 2:
                stopped_by = "budget"
                break
        t = _perf_counter()
        busy = watch.stop(calls=len(walls))
        call.parts["helpers"] += _perf_counter() - t
        ends.append(("loop", time.monotonic()))
        call.parts["rest"] = (_perf_counter() - loop_start) - sum(call.parts.values())
        report = link.receive(deadline, expect=link.send(dict(op="profile", on=False)))
        kernels = launched(report.get("kernels"), "kernels",
                           (_perf_counter() - call.profiled_from) * 1e3)
    except SubjectGone as gone:
        record = _gone_record(gone, link, spec, loading=False,
                              limit=f"{spec['deadline_s']:.0f} s, the limit for timing")
        link.close()
        return dict(failed=dict(record, message=f"timing {case.id}: {record['message']}"),
                    output=link.output())
    link.close()
    reported = [_reported_figures(r) for r in call.reported()[first:]]
    stats = summarize(times, flops=case.flops, warmup_calls=config.TIMING_WARMUP_CALLS,
                      budget_s=spec["budget_s"], stopped_by=stopped_by,
                      wall_s=_perf_counter() - loop_start,
                      wall_median_ms=statistics.median(walls),
                      fence_median_ms=statistics.median(fences),
                      raw_mean_ms=statistics.fmean(max(w, f) for w, f in zip(walls, fences)),
                      protocol_ms=statistics.fmean(max(w, f) - t for w, f, t in zip(walls, fences, times)),
                      rtt_ms=rtt_ms,
                      subject_events_ms=_median_of([r["events"] for r in reported]),
                      subject_host_ms=_median_of([r["host"] for r in reported]),
                      subject_copy_ms=_median_of([r["copy"] for r in reported]),
                      pipe_ms=_median_of([r["pipes"] for r in reported]),
                      launched=tuple(tuple(x) for x in kernels),
                      profiled_calls=len(walls) + 1)
    ends.append(("report", time.monotonic()))
    spots = check_samples(samples, case, spec, pick)
    ends.append(("spots", time.monotonic()))
    result.update(stats=stats.to_dict(), spots=spots, phases_s=phases(begun, ends, TIME_PHASES),
                  loop_s={k: round(v, 4) for k, v in call.parts.items()}, times_ms=times,
                  calls=[[max(w, f), r["events"]] for w, f, r in zip(walls, fences, reported)],
                  helpers=[h for h in helpers if h], gpu_processes_seen=any(h is not None for h in helpers),
                  gpu_busy=busy.to_dict(),
                  output=link.output())
    return result


def time_prepared(spec: dict) -> dict:
    """A time stage on a subject prepared before its turn (spec "prepare"; pipeline.TimeSubject,
    when run stages share the GPU, config.GPU_LANES): the subject starts with CUDA and its
    profiler and no submission code, "prepared" is said, and on "run" the submission is loaded
    (its JIT cache filled by its run stage, on another subject since killed) and timed as on any
    fresh subject (time_case). A subject that does not get to its turn: this process ends with
    no record (_give_up), and the pipeline times the submission on a new harness."""
    case = Case.from_dict(spec["case"])
    buffers = allocate(spec["device"], case.numel)
    ends: list = []
    link, failed, _ = start_prepared(spec, buffers, ends)
    turn = ends[-1][1]   # "waiting" ended: the turn began, on the GPU stages' CPUs
    if failed is not None:
        link.close()
        return dict(failed=failed, output=link.output())
    return time_case(spec, opened=(link, buffers), begun=turn)


class Call:
    """One timed call: fresh inputs from `seed` (this process keeps its own copy), L2 flushed,
    O poisoned, the device idle; then go, the reply, and the clocks."""

    def __init__(self, link: Link, q, k, v, o, flush, shape, device: str, deadline: float,
                 qk_std: float = 1.0):
        self.link, self.q, self.k, self.v, self.o = link, q, k, v, o
        self.flush, self.shape, self.device, self.deadline = flush, shape, device, deadline
        self.qk_std = qk_std   # the case's spread of Q and K (cases.Case.qk_std)
        self.sent: list[tuple[int, float, float]] = []   # (request number, go, reply) per call
        self.parts = dict.fromkeys(LOOP_PARTS, 0.0)   # seconds in each part (results.LOOP_PARTS)
        self.profiled_from = _perf_counter()   # when "profile on" was sent (warm_up)

    def run(self, seed: int) -> tuple[Clock, tuple[torch.Tensor, ...]]:
        began = _perf_counter()
        # Armed before this call's inputs exist, so that "arm" tells the subject nothing it could
        # start on: it makes its views of the buffers then, and after "go" reads one short line
        # and launches (grader/subject/loop.py). Nothing is waited for here but the reply to
        # "go": a subject slow to take up "arm" is slow inside the clock.
        self.link.send(dict(op="arm", shape=list(self.shape)))
        inputs = make_random_inputs(self.shape, seed=seed, device=self.device, qk_std=self.qk_std)
        for dst, src in zip((self.q, self.k, self.v), inputs):
            dst.copy_(src)
        self.o.fill_(float("nan"))
        self.flush.zero_()
        self.link.drain()
        synchronize(self.device)
        clock = Clock(self.device)
        n, request = self.link.encode(dict(op="go"))
        clock.go()
        self.link.write(request)
        reply = self.link.receive(self.deadline, expect=n)
        clock.returned()
        if reply.get("event") == "error":
            raise SubjectGone("runtime_error", "a timed call raised " + _error_text(reply))
        if reply.get("event") != "done":
            raise malformed("event", reply.get("event"), "not done or error")
        # Read O now: this process's first GPU work after the reply, right behind the fence event.
        self.snapshot = self.o.clone()
        synchronize(self.device)
        self.link.expect_diagnostics(n)
        self.sent.append((n, clock.t0, clock.t_reply))
        self.parts["prep"] += clock.t0 - began
        self.parts["call"] += clock.t_reply - clock.t0
        self.parts["readback"] += _perf_counter() - clock.t_reply
        return clock, inputs

    def reported(self) -> list[dict]:
        """What the subject measured about each call (its diagnostics line, sent after the
        reply; diagnostics, never ranked), in call order, with this process's go and reply
        times. Complete once a later reply has been received (the profiler's, at the end)."""
        return [dict(self.link.diagnostics.get(n, {}), t_go=t_go, t_reply=t_reply)
                for n, t_go, t_reply in self.sent]


def _reported_figures(r: dict) -> dict:
    """What one call's entry of Call.reported() says, in ms (None where it says nothing usable):
    the subject's events around the call and around its copy into O, its host clock from taking
    the request up to the work done, and the call's two trips through the pipes ("go" written
    here to its line read there, the reply written there to its reading here: one host clock,
    CLOCK_MONOTONIC, in both processes; the subject reads no line time off a GPU)."""
    pipes = None
    if all(isinstance(r.get(k), (int, float)) for k in ("t_go", "t_line", "t_replied", "t_reply")) \
            and r["t_line"]:
        pipes = _diagnostic_ms((r["t_line"] - r["t_go"] + r["t_reply"] - r["t_replied"]) * 1e3)
    return dict(events=_diagnostic_ms(r.get("subject_gpu_ms")),
                host=_diagnostic_ms(r.get("subject_ms")),
                copy=_diagnostic_ms(r.get("subject_copy_ms")), pipes=pipes)


def _diagnostic_ms(value) -> float | None:
    """A time the subject reported about itself: kept for the overhead figures, never ranked."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e7:
        return float(value)
    return None


def _median_of(values: list) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else 0.0


def corrected(walls: list[float], fences: list[float], cost: ProtocolCost) -> list[float]:
    """Per-call times: the later of the two clocks, less the protocol's calibrated cost."""
    return [max(w, f) - cost.for_call(max(w, f)) for w, f in zip(walls, fences)]


def new_verify() -> dict:
    """verify_call's tally: calls checked, wrong ones, the first wrong one and what was wrong."""
    return dict(checked=0, wrong=0, first_wrong="", first_wrong_call=None)


def verify_call(verify: dict, call: int, got: torch.Tensor, inputs, case: Case,
                pick: random.Random, heads: int = config.TIMING_VERIFY_HEADS) -> None:
    """This call's output, as read right after its reply, checked two ways against this
    process's own copy of the inputs. Every element was written: O was filled with NaN before the
    call, so an element that is not finite was not written (or is wrong). And `heads` of its
    (batch, head) slices, picked here from `pick` (os.urandom's) after the reply, when nothing the
    subject does can change O any more, are compared with SDPA: a subject cannot tell which will
    be looked at, so a stale, replayed, lazy or partly computed output is found in the first
    calls whatever part of it is wrong. The tolerance is twice the cases': precision is the full
    checks' job (check_samples, with the fp32 reference and the precision budget)."""
    sample = pick_slices(pick, case, heads)
    q, k, v = (slices(t, sample) for t in inputs)
    try:
        expected = torch.nn.functional.scaled_dot_product_attention(q, k, v).float()
    except RuntimeError:
        expected = attention_reference(q, k, v)
    rtol, atol = 2 * (case.rtol or config.RTOL), 2 * (case.atol or config.ATOL)
    got_slices = slices(got, sample)
    verify["checked"] += 1
    # The usual case in one reduction and one wait for the GPU: every element finite, and every
    # sampled one within the tolerance (a NaN is within nothing). compare_outputs' dozen
    # reductions, each read back, took most of the check's ~10 ms a call (H100, session 17).
    within = (got_slices.float() - expected).abs_() <= atol + rtol * expected.abs()
    if bool(within.all() & torch.isfinite(got).all()):
        return
    if verify["first_wrong_call"] is not None:   # what was wrong is said once, for the first
        verify["wrong"] += 1
        return
    finding = compare_outputs(got_slices, expected, rtol=rtol, atol=atol)
    unwritten = int(got.numel() - torch.isfinite(got).sum())
    if finding.ok and not unwritten:
        return
    verify["wrong"] += 1
    text = (f"{unwritten} of {got.numel()} elements not written (still NaN, as O was filled "
            f"before the call) or not finite\n" if unwritten else "")
    if not finding.ok:
        text += (f"{len(sample)} of its {case.shape[0] * case.shape[1]} (batch, head) slices, "
                 f"picked after the call returned, compared with SDPA: "
                 + in_slices(finding, sample, case).summary())
    verify["first_wrong_call"], verify["first_wrong"] = call, text.rstrip()


def pick_slices(pick: random.Random, case: Case, heads: int) -> list[int]:
    """`heads` of the case's batch x heads (batch, head) slices, flat indices in order, drawn
    from `pick` (the harness's os.urandom-seeded generator); all of them when there are no more."""
    n = case.shape[0] * case.shape[1]
    return sorted(pick.sample(range(n), heads)) if n > heads else list(range(n))


def slices(t: torch.Tensor, sample: list[int]) -> torch.Tensor:
    """The (batch, head) slices `sample` of a (batch, heads, seq, head_dim) tensor, as one batch
    of len(sample) heads."""
    return t.flatten(0, 1).index_select(0, torch.tensor(sample, device=t.device)).unsqueeze(0)


def in_slices(finding: Finding, sample: list[int], case: Case) -> Finding:
    """A finding on slices(..., sample), its bad elements' indices put back as (batch, head,
    row, column) of the whole output."""
    h = case.shape[1]
    return dataclasses.replace(finding, first_bad=tuple(
        dataclasses.replace(bad, index=(*divmod(sample[bad.index[1]], h), *bad.index[2:]))
        for bad in finding.first_bad))


def _keep_sample(samples: list, pick: random.Random, call: int, seed: int, o: torch.Tensor,
                 size: int) -> None:
    """Reservoir sampling after call `call` returned: each call so far is kept with equal chance."""
    slot = call if call < size else pick.randrange(call + 1)
    if slot >= size:
        return
    sample = (call, seed, o)
    if slot < len(samples):
        samples[slot] = sample
    else:
        samples.append(sample)


def check_samples(samples: list, case: Case, spec: dict, pick: random.Random,
                  heads: int = config.TIMING_SPOT_HEADS) -> list[dict]:
    """The kept calls against the fp32 reference, with the precision budget, each on `heads` of
    its (batch, head) slices picked from `pick` now, after the last call returned."""
    results = []
    for call, seed, got in samples:
        sample = pick_slices(pick, case, heads)
        q, k, v = (slices(t, sample) for t in make_random_inputs(case.shape, seed=seed, device=got.device,
                                                                  qk_std=case.qk_std))
        finding = compare_outputs(slices(got, sample), attention_reference(q, k, v),
                                  rtol=case.rtol or config.RTOL, atol=case.atol or config.ATOL,
                                  plain=attention_plain_fp16(q, k, v), **spec["precision"])
        results.append(dict(call=call, slices=len(sample),
                            finding=in_slices(finding, sample, case).to_dict()))
        del q, k, v, got
    return results


def gpu_helpers(link: Link) -> dict | None:
    """{'pids': [...]} when more than one process of the submission's holds a CUDA context now;
    {} when only one does; None when that cannot be seen here."""
    pids = gpu_context_pids()
    if pids is None:
        return None
    mine = pids & process_tree(link.proc.pid)
    if not mine:
        return None    # the subject's context is not visible from here (another pid namespace)
    return dict(pids=sorted(mine)) if len(mine) > 1 else {}


# ---------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> None:
    make_non_dumpable()
    become_subreaper()
    p = argparse.ArgumentParser(prog="python -m grader.harness")
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
