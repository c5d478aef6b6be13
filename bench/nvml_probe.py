"""What NVML's utilization samples can tell the grader (issue 30, item 8): host time from hidden
GPU work.

    python bench/nvml_probe.py                 # on the GPU machine, about 30 s; no arguments
    python bench/nvml_probe.py --json out.json # also writes what it measured

Standalone: torch and pynvml (the nvidia-ml-py package) only, none of the grader. It runs three
patterns of work, each for PATTERN_S seconds in a child process (the parent never touches CUDA, as
the grader's harness reads NVML about a subject), and reads NVML meanwhile, as grader/trusted/harness.py
BusyWatch does: the whole GPU's samples (nvmlDeviceGetSamples, NVML_GPU_UTILIZATION_SAMPLES) and
each process's (nvmlDeviceGetProcessUtilization), from a cursor, every READ_EVERY_S.

  a  the timed case's attention (SDPA, fp16, (4, 64, 8192, 128)), back to back;
  b  the same with a 20 ms host sleep after each call (a slow host: must rank as time);
  c  the same work launched by a second process, while the first, the one "called", only sleeps
     (work in another process: per-process samples must put it on the second one).

For each, over the samples wholly inside the pattern's window (the grader's rule, timing.gpu_busy):
the sampling period, the share of the window the GPU was busy as the work's own CUDA events
measured it (expected), as the whole GPU's samples say, and as each process's samples say, and
how far per-process and whole-GPU samples agree. Also: whether per-process samples exist at all,
how many samples NVML keeps (how often the grader must read them), and whether their timestamps
are on the host's wall clock (time.time(), in µs).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import subprocess
import sys
import time

PATTERN_S = 5.0
READ_EVERY_S = 0.5
SLEEP_S = 0.020
SHAPE = (4, 64, 8192, 128)   # the largest public case, the one the grader times
PATTERNS = (("a", "back to back", "busy"), ("b", "+ 20 ms host sleep", "sleep"),
            ("c", "from a 2nd process", "caller"))


# ---------------------------------------------------------------- the children: the GPU work

def child(mode: str, seconds: float) -> None:
    """Runs one pattern and prints one JSON line: its pid, its window on the wall clock and the
    GPU time its own CUDA events measured. "caller" starts a "busy" child and only sleeps."""
    if mode == "caller":   # pattern c: no CUDA here at all; the work is the child's
        worker = subprocess.run([sys.executable, __file__, "--child", "busy", "--seconds",
                                 str(seconds)], capture_output=True, text=True, check=True)
        print(json.dumps(dict(json.loads(worker.stdout.splitlines()[-1]), caller=os.getpid())))
        return
    import torch
    import torch.nn.functional as F
    q, k, v = (torch.randn(SHAPE, device="cuda", dtype=torch.float16) for _ in range(3))
    for _ in range(3):   # warm-up: the kernel chosen, the clocks up
        F.scaled_dot_product_attention(q, k, v)
    torch.cuda.synchronize()
    before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gpu_ms, calls, start = 0.0, 0, time.time()
    while time.time() - start < seconds:
        before.record()
        F.scaled_dot_product_attention(q, k, v)
        after.record()
        after.synchronize()
        gpu_ms += before.elapsed_time(after)
        calls += 1
        if mode == "sleep":
            time.sleep(SLEEP_S)
    end = time.time()
    print(json.dumps(dict(pid=os.getpid(), start_us=int(start * 1e6), end_us=int(end * 1e6),
                          calls=calls, gpu_ms=gpu_ms)))


# ---------------------------------------------------------------- the parent: reading NVML

class Reader:
    """NVML's samples of one GPU taken after a cursor, accumulated (deduplicated by timestamp)."""

    def __init__(self, pynvml, handle):
        self.nvml, self.handle = pynvml, handle
        self.device: dict[int, float] = {}
        self.processes: dict[tuple[int, int], float] = {}
        self.per_read: list[int] = []          # per-process samples returned by each read
        self.errors: dict[str, str] = {}
        self.cursor = int(time.time() * 1e6)
        self.lag_s: list[float] = []           # wall clock now - newest whole-GPU sample
        self.raw: list[dict] = []              # every read: its cursor, its time, what it returned

    def read(self) -> None:
        nvml = self.nvml
        raw = dict(cursor=self.cursor, at_us=int(time.time() * 1e6), device=[], processes=[])
        self.raw.append(raw)
        try:
            kind, samples = nvml.nvmlDeviceGetSamples(self.handle, nvml.NVML_GPU_UTILIZATION_SAMPLES,
                                                      self.cursor)
            member = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")[kind]
            for s in samples:
                self.device[int(s.timeStamp)] = float(getattr(s.sampleValue, member))
                raw["device"].append([int(s.timeStamp), float(getattr(s.sampleValue, member))])
            if samples:
                self.lag_s.append(time.time() - max(int(s.timeStamp) for s in samples) / 1e6)
        except nvml.NVMLError as e:
            if e.value != nvml.NVML_ERROR_NOT_FOUND:
                self.errors["device"] = str(e)
        try:
            got = nvml.nvmlDeviceGetProcessUtilization(self.handle, self.cursor)
            self.per_read.append(len(got))
            for s in got:
                self.processes[(int(s.timeStamp), int(s.pid))] = float(s.smUtil)
                raw["processes"].append([int(s.timeStamp), int(s.pid), float(s.smUtil)])
        except nvml.NVMLError as e:
            self.per_read.append(0)
            if e.value != nvml.NVML_ERROR_NOT_FOUND:
                self.errors["process"] = str(e)
        self.cursor = max([self.cursor, *self.device])


def shares(reader: Reader, start_us: int, end_us: int) -> dict:
    """Over the whole-GPU sampling periods wholly inside [start_us, end_us]: the period, the
    device's busy share, each pid's (a pid absent from a period was idle in it), and the spacing
    of each pid's own samples."""
    grid = sorted(t for t in reader.device if start_us <= t <= end_us)
    if len(grid) < 2:
        return dict(periods=0)
    spans = [(b - a) / 1e3 for a, b in zip(grid, grid[1:])]
    sampled = sum(spans)
    device = sum(reader.device[t] / 100 * s for t, s in zip(grid[1:], spans)) / sampled
    per_pid: dict[int, float] = {}
    seen: dict[tuple[int, int], list[float]] = {}
    stamps: dict[int, list[int]] = {}
    for (t, pid), percent in reader.processes.items():
        j = bisect.bisect_left(grid, t) - 1
        if 0 <= j < len(spans):
            seen.setdefault((pid, j), []).append(percent)
            stamps.setdefault(pid, []).append(t)
    for (pid, j), percents in seen.items():
        per_pid[pid] = per_pid.get(pid, 0.0) + statistics.fmean(percents) / 100 * spans[j] / sampled
    on_grid = sum(1 for ts in stamps.values() for t in ts if t in reader.device)
    return dict(periods=len(spans), period_ms=statistics.median(spans), sampled_ms=sampled,
                device=device, per_pid=per_pid,
                pid_samples={pid: len(ts) for pid, ts in stamps.items()},
                pid_spacing_ms={pid: statistics.median([(b - a) / 1e3 for a, b in
                                                        zip(sorted(ts), sorted(ts)[1:])])
                                for pid, ts in stamps.items() if len(ts) > 1},
                on_grid=on_grid, samples_in_window=sum(len(ts) for ts in stamps.values()))


def run_pattern(reader: Reader, mode: str, seconds: float) -> tuple[dict, dict]:
    proc = subprocess.Popen([sys.executable, __file__, "--child", mode, "--seconds", str(seconds)],
                            stdout=subprocess.PIPE, text=True)
    while proc.poll() is None:
        reader.read()
        time.sleep(READ_EVERY_S)
    time.sleep(max(READ_EVERY_S, 0.25))   # the sample that closes the window
    reader.read()
    out = proc.stdout.read()
    if proc.returncode != 0:
        raise SystemExit(f"pattern {mode}: the child failed ({proc.returncode})")
    info = json.loads(out.splitlines()[-1])
    return info, shares(reader, info["start_us"], info["end_us"])


def open_gpu():
    """NVML's handle of the GPU the children use: CUDA_VISIBLE_DEVICES's first, else NVML's
    first (one GPU: the same one)."""
    import pynvml
    pynvml.nvmlInit()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if visible.startswith("GPU-"):
        handle = pynvml.nvmlDeviceGetHandleByUUID(visible)
    else:
        handle = pynvml.nvmlDeviceGetHandleByIndex(int(visible) if visible.isdigit() else 0)
    return pynvml, handle


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python bench/nvml_probe.py")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, default=PATTERN_S, help=argparse.SUPPRESS)
    p.add_argument("--json", help="also write what was measured to this file")
    p.add_argument("--read-every", type=float, default=READ_EVERY_S,
                   help="seconds between two reads of NVML (the grader reads every 10 calls)")
    a = p.parse_args(argv)
    globals()["READ_EVERY_S"] = a.read_every   # run_pattern reads it
    if a.child:
        child(a.child, a.seconds)
        return 0
    pynvml, handle = open_gpu()
    name, driver = (x.decode() if isinstance(x, bytes) else str(x) for x in
                    (pynvml.nvmlDeviceGetName(handle), pynvml.nvmlSystemGetDriverVersion()))
    print(f"NVML probe: {name}, driver {driver}, parent pid {os.getpid()}")
    # How much history NVML keeps: every whole-GPU sample it still has.
    kept = Reader(pynvml, handle)
    kept.cursor = 0
    kept.read()
    if kept.device:
        span_s = (max(kept.device) - min(kept.device)) / 1e6
        print(f"NVML keeps {len(kept.device)} whole-GPU samples, {span_s:.1f} s of them "
              f"(the grader must read more often than that)")
    reader = Reader(pynvml, handle)
    rows = []
    for key, label, mode in PATTERNS:
        info, seen = run_pattern(reader, mode, a.seconds)
        window_s = (info["end_us"] - info["start_us"]) / 1e6
        expected = info["gpu_ms"] / (window_s * 1e3)
        worker, caller = info["pid"], info.get("caller")
        per_pid = seen.get("per_pid", {})
        rows.append(dict(pattern=f"{key} {label}", window_s=window_s, calls=info["calls"],
                         expected=expected, worker=worker, caller=caller,
                         start_us=info["start_us"], end_us=info["end_us"], **seen))
        others = sum(v for pid, v in per_pid.items() if pid not in (worker, caller))
        print(f"  {key} {label:<20} window {window_s:4.1f} s, {info['calls']:4d} calls: "
              f"busy by its own events {expected:6.1%}; NVML whole GPU "
              f"{seen.get('device', float('nan')):6.1%}; per process: worker {worker} "
              f"{per_pid.get(worker, 0.0):6.1%}"
              + (f", caller {caller} {per_pid.get(caller, 0.0):6.1%}" if caller else "")
              + f", others {others:5.1%}")
    print()
    exists = bool(reader.processes)
    period = statistics.median([r["period_ms"] for r in rows if r.get("periods")] or [float("nan")])
    lag = statistics.median(reader.lag_s or [float("nan")])
    print(f"whole-GPU samples: every {period:.1f} ms (median period); newest sample "
          f"{lag * 1e3:.0f} ms behind the wall clock at each read (timestamps on time.time(): "
          f"{'yes' if 0 <= lag < 5 else 'NO'})")
    print(f"per-process samples: {'yes' if exists else 'NONE'}"
          + (f"; per pid in a window: {[r.get('pid_samples') for r in rows]}; their spacing (ms): "
             f"{[r.get('pid_spacing_ms') for r in rows]}; on the whole-GPU sample times: "
             f"{sum(r.get('on_grid', 0) for r in rows)} of {sum(r.get('samples_in_window', 0) for r in rows)}"
             if exists else ""))
    for r in rows:
        if r.get("periods"):
            total = sum(r["per_pid"].values())
            error = r["per_pid"].get(r["worker"], 0.0) - r["expected"]
            print(f"  {r['pattern']:<24} {r['periods']:3d} periods: per-process sum {total:6.1%} "
                  f"against whole GPU {r['device']:6.1%} (grader uses per-process within 5%); "
                  f"worker's error against its events {error:+6.1%}")
    if reader.errors:
        print(f"NVML errors: {reader.errors}")
    print(f"nvmlDeviceGetProcessesUtilizationInfo in this pynvml: "
          f"{'yes' if hasattr(pynvml, 'nvmlDeviceGetProcessesUtilizationInfo') else 'no'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=name, driver=driver, rows=rows, errors=reader.errors,
                           per_process_samples=exists, period_ms=period,
                           kept_samples=len(kept.device), date=time.strftime("%Y-%m-%d"),
                           reads=reader.raw),
                      f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
