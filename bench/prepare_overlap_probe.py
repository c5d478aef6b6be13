"""Does a run begun early disturb a timed call beside it? (issue 13)

    python bench/prepare_overlap_probe.py [--cycles 4] [--out bench/prepare_overlap_probe.json]

A GPU worker begins its next submission's run while one runs (pipeline.Lookahead). What that
preparation does is the grader's own code and torch's: a Python start and torch's import, CUDA's
start, the shared buffers (CUDA virtual memory, exported and mapped), and the profiler's first
start (CUPTI's, 5.5 s on an H100). Until now every time stage waits for a preparation to end first,
so none of it runs beside a timed call; this measures what it would do to one.

One process here runs the timed case's attention (SDPA, cuDNN where it is picked: about a
solution's time) call after call, each between two device synchronisations, with CUDA events and
the host clock around it. Beside it, in turns, a second process does what a preparation does,
phase by phase, and says when each phase ended (one CLOCK_MONOTONIC for both processes). Each
call is put in the phase that was under way when it started; calls with no preparation beside
them are the quiet ones. The table gives each phase's calls against the quiet ones: median,
99th percentile and maximum of the events and of the host time.

A trusted kernel only; nothing is sandboxed. Writes the figures with the device and the date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# What the second process runs: a preparation's phases, each end printed as "phase <name> <t>".
PREPARATION = r"""
import os, resource, sys, time
def said(name):
    print("phase", name, repr(time.monotonic()), flush=True)
def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
said("start")
import torch
sys.path.insert(0, sys.argv[1])
from grader.protocol import buffers as shared_memory
from grader.subject.loop import call_activities
said("import")
torch.cuda.init(); torch.empty(1, device="cuda"); torch.cuda.synchronize()
said("cuda")
numel = int(sys.argv[2])
buffers = [shared_memory.create_buffer(numel * 2, "cuda") for _ in range(4)]
mapped = [shared_memory.map_buffer(b.fd, b.nbytes, "cuda") for b in buffers]
said("buffers")
from torch.profiler import profile
before = cpu_s()
with profile(activities=call_activities("cuda")):
    pass
print("profiler_cpu_s", repr(cpu_s() - before), flush=True)
said("profiler")
"""

PHASES = ("import", "cuda", "buffers", "profiler")   # each: from the one before's end to its own


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def figures(calls: list[dict]) -> dict:
    events = [c["events_ms"] for c in calls]
    host = [c["host_ms"] for c in calls]
    return dict(n=len(calls), events_median=statistics.median(events),
                events_p99=percentile(events, 0.99), events_max=max(events),
                host_median=statistics.median(host), host_p99=percentile(host, 0.99),
                host_max=max(host))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cycles", type=int, default=4, help="preparations, one after another")
    p.add_argument("--quiet-s", type=float, default=5.0, help="calls alone, before and after")
    p.add_argument("--shape", type=int, nargs=4, default=(4, 64, 8192, 128))
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "prepare_overlap_probe.json")
    a = p.parse_args()

    import torch
    torch.backends.cuda.enable_cudnn_sdp(True)
    shape = tuple(a.shape)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.float16) for _ in range(3))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    calls: list[dict] = []

    def call() -> None:
        torch.cuda.synchronize()
        t0 = time.monotonic()
        start.record()
        torch.nn.functional.scaled_dot_product_attention(q, k, v)
        end.record()
        torch.cuda.synchronize()
        t1 = time.monotonic()
        calls.append(dict(t0=t0, events_ms=start.elapsed_time(end), host_ms=(t1 - t0) * 1e3))

    def alone(seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            call()

    for _ in range(20):   # warm-up, not kept
        call()
    calls.clear()
    alone(a.quiet_s)
    cycles = []
    numel = shape[0] * shape[1] * shape[2] * shape[3]
    for _ in range(a.cycles):
        proc = subprocess.Popen([sys.executable, "-c", PREPARATION, str(ROOT), str(numel)],
                                stdout=subprocess.PIPE, cwd=ROOT)
        fd = proc.stdout.fileno()
        os.set_blocking(fd, False)
        said = b""
        while proc.poll() is None:
            call()
            try:
                said += os.read(fd, 1 << 16)
            except BlockingIOError:
                pass
        os.set_blocking(fd, True)
        said += proc.stdout.read()
        text = said.decode()
        ends = {line.split()[1]: float(line.split()[2]) for line in text.splitlines()
                if line.startswith("phase ")}
        cpu = [float(line.split()[1]) for line in text.splitlines() if line.startswith("profiler_cpu_s")]
        cycles.append(dict(ends=ends, returncode=proc.returncode,
                           profiler_cpu_s=cpu[0] if cpu else None,
                           phase_s={name: ends[name] - ends[before]
                                    for before, name in zip(("start",) + PHASES, PHASES)
                                    if name in ends and before in ends}))
        alone(1.0)   # calls alone between two preparations
    alone(a.quiet_s)

    def phase_of(t0: float) -> str:
        for cycle in cycles:
            ends = cycle["ends"]
            if "start" in ends and ends["start"] <= t0 <= ends.get("profiler", ends["start"]):
                for before, name in zip(("start",) + PHASES, PHASES):
                    if ends.get(before, 0) <= t0 < ends.get(name, float("inf")):
                        return name
        return "quiet"

    by_phase: dict[str, list[dict]] = {}
    for c in calls:
        by_phase.setdefault(phase_of(c["t0"]), []).append(c)
    table = {name: figures(by_phase[name]) for name in ("quiet",) + PHASES if by_phase.get(name)}
    quiet = table["quiet"]
    for name, row in table.items():
        row["events_vs_quiet"] = row["events_median"] / quiet["events_median"] - 1
        row["host_vs_quiet"] = row["host_median"] / quiet["host_median"] - 1
    props = torch.cuda.get_device_properties(0)
    result = dict(device=props.name, uuid=str(getattr(props, "uuid", "")),
                  date=datetime.date.today().isoformat(), torch=torch.__version__, shape=shape,
                  kernel="SDPA (torch's choice on this GPU)", cycles=cycles, table=table)
    a.out.write_text(json.dumps(result, indent=1))
    print(f"{props.name}; {len(calls)} calls of SDPA on {shape}; {len(cycles)} preparations beside them")
    print(f"{'phase':<10}{'n':>6}{'events med':>12}{'p99':>9}{'max':>9}{'vs quiet':>10}"
          f"{'host med':>10}{'p99':>9}{'max':>9}{'vs quiet':>10}")
    for name, r in table.items():
        print(f"{name:<10}{r['n']:>6}{r['events_median']:>12.3f}{r['events_p99']:>9.3f}"
              f"{r['events_max']:>9.3f}{r['events_vs_quiet']:>+10.2%}{r['host_median']:>10.3f}"
              f"{r['host_p99']:>9.3f}{r['host_max']:>9.3f}{r['host_vs_quiet']:>+10.2%}")
    for c in cycles:
        print("preparation:", {k: round(v, 2) for k, v in c["phase_s"].items()},
              "profiler CPU s:", c["profiler_cpu_s"], "rc", c["returncode"])


if __name__ == "__main__":
    main()
