"""The subject: the only process that imports a submission. It runs what it is told and reports.

    python grader/subject/loop.py --setup JSON          (started by grader/trusted/harness.py)
    python grader/subject/loop.py --check-load TARGET_JSON   (the build stage's import check)
    python grader/subject/loop.py --compile-ahead JSON       (Triton's kernels compiled with no GPU:
                                                              grader/subject/ahead.py)

The harness starts it with two pipes and four shared buffers (Q, K, V, O) as inherited file
descriptors. After loading the submission it answers each request, one JSON line each way:

    {"op": "call", "n": 7, "shape": [B, H, S, D], "profile": true}
        -> {"event": "done", "n": 7, "returned": {...}, "launched": [...], "peak_memory_bytes": ...}
         | {"event": "error", "n": 7, "error": "ValueError", "message": ..., "context_alive": true}
    {"op": "arm", "n": 9, "shape": [B, H, S, D]}      (no reply: the next "go"'s views made)
    {"op": "go", "n": 10}
        -> {"event": "done", "n": 10, "returned": {...}}, then {"event": "diagnostics", "n": 10, ...}
    {"op": "profile", "on": true}  /  {"op": "profile", "on": false} -> {"event": "profile", "kernels": [...]}
    {"op": "ping", "n": 8} -> {"event": "pong", "n": 8}
    {"op": "exit"}

A prepared subject (setup "prepare": true) first starts the profiler once, replies
{"event": "prepared"} and reads one line, "load"; it replies {"event": "loading"} and then loads
the submission.

A call reads Q, K, V from the shared buffers, calls the submission, copies what it returned into
the shared O, synchronizes the device and replies. A timed call is armed first ("arm": its views
of the buffers made before the harness's clock starts) and started by "go", so that between "go"
and the launch this process does no more than read one short line. The harness times it with its
own clock, reads O itself, and treats every reply as a claim: this process decides nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from grader.protocol.lines import read_line
from grader.protocol.buffers import map_buffer
# Its sibling modules by their full names: this file runs as a script, not as grader.subject.loop.
from grader.subject.libraries import (TILELANG_NO_DISK_CACHE, TILELANG_TARGET_ENV, NotRunHere, _arch,
                                      _mentions_tilelang, tilelang_without_gpu, warm_triton,
                                      warms_triton, without_cudnn_attention)
from grader.subject.load import PY_ENTRY_POINT, LoadError, load, submission_folder
from grader.subject.tracebacks import _error, student_traceback


def launched_names(prof, device: str) -> list[list]:
    """[name, count, total GPU µs] of the kernels (GPU) or aten operators (CPU) a profiler saw."""
    totals: dict[str, list] = {}
    for event in prof.events():
        on_gpu = getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA
        if (device == "cuda" and on_gpu) or (device != "cuda" and not on_gpu
                                             and event.name.startswith("aten::")):
            entry = totals.setdefault(event.name[:300], [0, 0.0])
            entry[0] += 1
            entry[1] += event.time_range.elapsed_us() if on_gpu else 0.0
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:200]
    return [[name, count, round(us, 3)] for name, (count, us) in ranked]


def call_activities(device: str) -> list:
    """What a profiled "call" records: the CPU's operators, and the GPU's kernels on a GPU."""
    from torch.profiler import ProfilerActivity
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])


class Subject:
    def __init__(self, setup: dict):
        self.device = setup["device"]
        self.requests = os.fdopen(setup["requests_fd"], "r", buffering=1)
        self.replies = os.fdopen(setup["replies_fd"], "w", buffering=1)
        self.buffers = {name: map_buffer(fd, nbytes, self.device)
                        for name, (fd, nbytes) in setup["buffers"].items()}
        self.folder = submission_folder(setup["target"])   # its errors keep frames there only
        self.fn = None
        self.profiler = None
        self.tilelang_nvcc: str | None = None   # set once TileLang is told there is no GPU
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(3)] if self.device == "cuda" else []
        self.t_line = 0.0
        self.clocks = (0.0, 0.0, 0.0, 0.0)
        self.armed = None   # (shape, views) of the next timed call, or why not: Subject.arm

    def reply(self, record: dict) -> None:
        self.replies.write(json.dumps(record) + "\n")
        self.replies.flush()

    def send(self, line: bytes) -> None:
        """An encoded reply, written at once (every earlier one was flushed)."""
        os.write(self.replies.fileno(), line)

    def synchronize(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def context_alive(self) -> bool:
        try:
            self.synchronize()
            return True
        except Exception:
            return False

    def views(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
        return tuple(self.buffers[name].view(shape) for name in "qkvo")

    def arm(self, request: dict) -> None:
        """The next timed call's views of the buffers, made before its "go" (no reply: the
        harness waits for nothing outside a timed call's clock). A shape the buffers cannot
        hold is go's error."""
        try:
            shape = tuple(request["shape"])
            self.armed = (shape, self.views(shape))
        except (KeyError, TypeError, ValueError) as e:
            self.armed = e

    def go(self, n: int) -> dict:
        """The armed call, timed: nothing between the request and the reply but the call itself
        (no memory statistics, its events made in advance, its reply encoded while the GPU works
        and written as soon as the device is synchronized); what this process measured about
        itself is sent in a second line after the reply (diagnostics)."""
        armed, self.armed = self.armed, None
        if armed is None:
            raise RuntimeError("the grader sent go with no call armed")
        if isinstance(armed, Exception):
            raise armed
        shape, views = armed
        return self.call(dict(shape=list(shape), n=n), views)

    def call(self, request: dict, armed: tuple[torch.Tensor, ...] | None = None) -> dict:
        """One call on the shared buffers: an untimed one ("call"), or the armed timed one,
        which replies itself."""
        shape, timed = tuple(request["shape"]), armed is not None
        q, k, v, o = armed or self.views(shape)
        if self.device == "cuda" and not timed:
            torch.cuda.reset_peak_memory_stats()
        received = time.perf_counter()
        profiler = None
        if request.get("profile"):
            from torch.profiler import profile
            profiler = profile(activities=call_activities(self.device))
            profiler.__enter__()
        events = self.events
        if self.device != "cuda" and "tilelang" in sys.modules and self.tilelang_nvcc is None:
            self.tilelang_nvcc = tilelang_without_gpu()
        not_run = ""   # why the call stopped short of a launch (TileLang without a GPU)
        try:
            if events:
                events[0].record()
            try:
                out = self.fn(q, k, v)
            except NotRunHere as compiled:
                arch = os.environ.get(TILELANG_TARGET_ENV, "")
                not_run = (f"not run: TileLang lowered {compiled} to CUDA and nvcc compiled it for "
                           f"{_arch(arch)}; there is no GPU here to launch it, so nothing about "
                           f"its results is known")
            except Exception:
                if self.tilelang_nvcc != "":
                    raise
                not_run = ("not compiled, not run: TileLang compiles with nvcc, which this machine "
                           "lacks, and there is no GPU; nothing about the kernel is known")
            if not not_run:
                if events:
                    events[1].record()
                returned = describe(out, shape)
                if returned["usable"]:
                    o.copy_(out)
                if events:
                    events[2].record()
                if timed:
                    done = (json.dumps(dict(event="done", returned=returned, n=request["n"]))
                            + "\n").encode()
                self.synchronize()
                synced = replied = time.perf_counter()
                if timed:
                    self.send(done)
                    replied = time.perf_counter()
        finally:
            if profiler is not None:
                profiler.__exit__(None, None, None)
        if not_run:   # with what ran before the launch: a library call there is flagged
            return dict(event="not_run", message=not_run,
                        launched=launched_names(profiler, self.device) if profiler else [])
        self.clocks = (self.t_line, received, synced, replied)
        if timed:
            return dict(event="done", returned=returned)
        peak = torch.cuda.max_memory_allocated() if self.device == "cuda" else 0
        return dict(event="done", returned=returned, peak_memory_bytes=peak,
                    launched=launched_names(profiler, self.device) if profiler else [],
                    **self.diagnostics())

    def diagnostics(self) -> dict:
        """Diagnostics only, never used to rank: this process's own clocks around the last call
        (its CUDA events around the call and around the copy into O; the host clock when the
        request line arrived, when it was taken up and when the work was done). The protocol's
        overhead is measured with them (bench/timing_trust.py, bench/protocol_probe.py)."""
        line, received, synced, replied = self.clocks
        return dict(subject_ms=(synced - received) * 1e3, subject_gpu_ms=_elapsed_ms(self.events[:2]),
                    subject_copy_ms=_elapsed_ms(self.events[1:]), t_line=line,
                    t_received=received, t_synced=synced, t_replied=replied)

    def profile(self, on: bool) -> dict:
        from torch.profiler import ProfilerActivity, profile
        if on:
            activities = [ProfilerActivity.CUDA] if self.device == "cuda" else [ProfilerActivity.CPU]
            self.profiler = profile(activities=activities, acc_events=True)
            self.profiler.__enter__()
            return dict(event="profile", on=True)
        kernels = []
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)
            kernels = launched_names(self.profiler, self.device)
            self.profiler = None
        return dict(event="profile", on=False, kernels=kernels)

    def lines(self):
        """Requests, one line each. On a GPU they are polled, not waited for: waking from a sleep
        costs a few hundred microseconds on a virtual machine, and every timed call pays it."""
        if self.device != "cuda":
            yield from self.requests
            return
        fd, pending = self.requests.fileno(), b""
        os.set_blocking(fd, False)
        while True:
            line, sep, rest = pending.partition(b"\n")
            if sep:
                pending = rest
                self.t_line = time.perf_counter()
                yield line.decode()
                continue
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                return
            pending += chunk

    def serve(self) -> None:
        for line in self.lines():
            request = json.loads(line)
            op, n = request["op"], request.get("n")
            if op == "exit":
                return
            if op == "ping":
                self.reply(dict(event="pong", n=n))
                continue
            if op == "profile":
                self.reply(dict(self.profile(request["on"]), n=n))
                continue
            if op == "arm":
                self.arm(request)
                continue
            try:
                record = self.go(n) if op == "go" else self.call(request)
            except Exception as e:   # the submission's fault: reported, then the next request
                self.reply(dict(event="error", context_alive=self.context_alive(),
                                **_error(e, self.folder), n=n))
                continue
            if op == "go" and record.get("event") == "done":   # its reply is written: Subject.call
                self.reply(dict(event="diagnostics", n=n, **self.diagnostics()))   # outside the clock
            else:
                self.reply(dict(record, n=n))


def _elapsed_ms(events: list) -> float | None:
    """The events' interval, or None when there are none or the work is not finished (a call
    that returned early): a diagnostic must never turn into the call's error."""
    try:
        return events[0].elapsed_time(events[1]) if events and events[1].query() else None
    except RuntimeError:
        return None


def describe(out, shape: tuple[int, ...]) -> dict:
    """What the call returned, and whether it can be copied into O (a tensor of Q's shape)."""
    if not isinstance(out, torch.Tensor):
        return dict(usable=False, type=type(out).__name__)
    return dict(usable=tuple(out.shape) == shape, type="Tensor", shape=list(out.shape),
                dtype=str(out.dtype).removeprefix("torch."), device=str(out.device))


def prepare(subject: Subject, triton: bool = False) -> None:
    """A subject started before its turn (issue 13: lookahead.Lookahead). Before any submission
    code is loaded: start the profiler once with nothing to see (its first start in a process
    costs seconds, CUPTI's: 5.5 s on an H100, bench/run_stage_probe.json), warm Triton for a
    submission that uses it (`triton`: libraries.warm_triton, its first use's seconds), say
    "prepared" (with what the warm-up took and any step that failed, for the log), and
    wait, blocked and not polling, for "load", and say "loading" (the harness then knows that a
    death from here on is the submission's). Anything else, or the pipe's end: exit."""
    from torch.profiler import profile
    with profile(activities=call_activities(subject.device)):
        pass
    said = dict(event="prepared")
    if triton:
        began = time.perf_counter()
        said.update(triton_failed=warm_triton(), triton_s=round(time.perf_counter() - began, 3))
    subject.reply(said)
    if read_line(subject.requests.fileno(), limit=64) != "load":
        sys.stdout.flush()
        os._exit(0)
    subject.reply(dict(event="loading"))   # from here on, what happens is the submission's


def compile_ahead(request: dict) -> None:
    """The build stage's second child for a Triton submission (grader/build/ahead.py): load it,
    call it once per case shape with Triton compiling and launching nothing, print one line
    "compiled ahead: " and the records as JSON, exit."""
    from grader.subject.ahead import compile_cases
    try:
        fn = load(request["target"])
        records = compile_cases(fn, request["shapes"], int(request["capability"]),
                                float(request["deadline"]))
    except BaseException as e:   # its import failed after all, or Triton differs: nothing kept
        print(f"not compiled ahead: {type(e).__name__}: {str(e)[:300]}")
        sys.stdout.flush()
        os._exit(1)
    print("compiled ahead: " + json.dumps(records))
    sys.stdout.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="grader/subject/loop.py")
    p.add_argument("--setup", help="JSON from the harness: device, pipes, buffers, target")
    p.add_argument("--check-load", help="JSON target: load it, report, exit (the build stage)")
    p.add_argument("--compile-ahead", help="JSON: target, shapes, capability, deadline "
                   "(grader/subject/ahead.py)")
    a = p.parse_args(argv)
    if a.compile_ahead:
        compile_ahead(json.loads(a.compile_ahead))
    if a.check_load:
        target = json.loads(a.check_load)
        try:
            load(target)
        except LoadError as e:   # the grader's own finding: no traceback through grader code
            print(f"LoadError: {e}")
            sys.exit(1)
        except BaseException as e:   # the submission's own error while importing: where it is
            sys.stdout.flush()
            print(student_traceback(e, submission_folder(target)), end="", file=sys.stderr)
            sys.stderr.flush()
            os._exit(1)
        print(f"imported {target.get('source')}: {PY_ENTRY_POINT} found")
        sys.stdout.flush()
        os._exit(0)
    setup = json.loads(a.setup)
    subject = Subject(setup)   # maps the shared buffers: CUDA starts here
    if setup.get("prepare"):
        prepare(subject, triton=warms_triton(setup))
    if setup["target"].get("kind") == "python":   # before the submission imports TileLang
        os.environ.update(TILELANG_NO_DISK_CACHE)
    if setup["target"].get("kind") in ("cuda", "python"):
        without_cudnn_attention()
    if setup["device"] != "cuda":
        from grader.common import config
        os.environ[TILELANG_TARGET_ENV] = json.dumps(
            {"kind": "cuda", "arch": f"sm_{config.DEFAULT_CUDA_ARCH}"})
        if setup["target"].get("kind") == "python" and _mentions_tilelang(setup["target"]["source"]):
            try:
                subject.tilelang_nvcc = tilelang_without_gpu()
            except ImportError:   # not installed: the submission's own import says so
                pass
    try:
        subject.fn = load(setup["target"])
    except BaseException as e:   # SystemExit and KeyboardInterrupt from a submission included
        subject.reply(dict(event="load_error", **_error(e, subject.folder)))
        sys.stdout.flush()
        os._exit(0)
    subject.reply(dict(event="ready"))
    subject.serve()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: a broken extension can crash in its destructors after the work.
    os._exit(0)


if __name__ == "__main__":
    main()
