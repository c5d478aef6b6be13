"""The pipe to the subject (grader/subject/loop.py) on the trusted side: Link starts its process,
writes requests and reads replies with deadlines, sets aside each timed call's diagnostics line,
and closes it with every process it started; the shared Q, K, V, O buffers (allocate) and the
device synchronization the harness waits on."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
import torch

from grader.isolation.procs import spawn_capped
from grader.isolation.tree import adopted, end_processes, process_tree, started_at
from grader.protocol.buffers import SharedBuffer, create_buffer
from grader.trusted.replies import SubjectGone, _protocol, parse_reply


REPLY_LIMIT = 4 << 20    # bytes in one reply line; a longer one is a protocol violation
# What is kept of a timed call's diagnostics line (numbers only; grader/subject/loop.py,
# Subject.diagnostics): the subject's own clocks, for the overhead figures, never ranked.
DIAGNOSTICS = ("subject_ms", "subject_gpu_ms", "subject_copy_ms", "t_line", "t_received",
               "t_synced", "t_replied")
DIAGNOSTIC_LIMIT = 1e12   # beyond any perf_counter reading (s) or time (ms) it holds


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
        """The subject's processes, with when each started (tree.started_at): its tree, and the
        orphans the harness adopted (tree.adopted) that no other open Link's subject started."""
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
        # (tree.become_subreaper) and is found again here; a process that will not die is said.
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
