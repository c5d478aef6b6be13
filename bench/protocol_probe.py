"""Where a timed call's time goes, call by call, on the largest case (issue 10's overhead figure).

    python bench/protocol_probe.py [--calls 25] [--solution]     # on the GPU machine
    python bench/protocol_probe.py --solution --only solution,sdpa_cudnn --repeat 3 --profiler on
        # how far apart two processes of one kernel are
    python bench/protocol_probe.py --only sdpa_cudnn --repeat 3 --profiler on --run-first both
        # what a run stage's calls before the timed ones change (every timed row makes them)
    python bench/protocol_probe.py --only sdpa_cudnn --repeat 4 --profiler on --beside 0 2
        # what runs begun early beside the timed calls change (a course's lane keeps some
        # starting beside every timed call; its baselines are timed with none)

For trusted subjects only (the harness's null subjects, the SDPA rows and, with --solution, the
reference solution built here), each with the subject's profiler off and then on (the timed loop
runs with it on), it drives calls exactly as grader/trusted/harness.py's timing loop does and prints,
per subject, medians of: the harness's two clocks, the subject's CUDA events around the call and
around the copy into the shared output, the host latencies either side (request written -> its
line read, line read -> call taken up, work done -> reply written, reply written -> read; one
host clock, CLOCK_MONOTONIC, in both processes), and what the
harness saw beyond the subject's events (raw - events). The spread of each tells where the noise
of a timed call comes from. Writes bench/protocol_probe.json with the device and the date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grader.common import config

from grader.trusted import call_checks, run_stage, timed_calls  # noqa: E402
from grader.trusted.link import allocate  # noqa: E402
from grader.trusted.subject_start import start  # noqa: E402
from grader.problem import Case, load_all_cases  # noqa: E402
from grader.isolation.procs import child_env  # noqa: E402
from grader.isolation.cpus import split_cpus  # noqa: E402
from grader.isolation.sandbox import Sandbox, default_layout  # noqa: E402

SUBJECT = ROOT / "grader" / "subject" / "loop.py"
LARGEST = Case(batch_size=4, num_heads=64, seq_len=8192, head_dim=128, seed=1)


def gpu_state() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def probe(target: dict, *, profiled: bool, calls: int, sandbox: Sandbox, l2_bytes: int,
          run_first: list[Case]) -> dict:
    """One subject's timed calls; after a run stage's calls on `run_first` (as every timed row
    is in grading: run_stage.run_stage_calls), or with none before them (`run_first` [])."""
    spec = dict(device="cuda", target=target, cases=[c.to_dict() for c in run_first],
                subject_cmd=sandbox.wrap([sys.executable, str(SUBJECT)],
                                         readonly=[str(Path(target["artifact"]).parent)]
                                         if "artifact" in target else []),
                cwd=str(ROOT), head_bytes=1 << 16, tail_bytes=1 << 16, file_bytes=1 << 30,
                deadline_s=600, case=LARGEST.to_dict(), l2_bytes=l2_bytes, env=child_env(cuda=True))
    if run_first:
        opened, failed = run_stage.run_stage_calls(spec)
        failed = failed and failed["failed"]
    else:   # a subject that made no call
        buffers = allocate("cuda", LARGEST.numel)
        link, failed = start(spec, buffers, time.monotonic() + 600)
        opened = (link, buffers)
        if failed is not None:
            link.close()
    if failed is not None:
        return dict(failed=failed)
    deadline = time.monotonic() + 600
    link, call = timed_calls.open_call(spec, deadline, opened)
    clocks, verify, case, pick = [], call_checks.new_verify(), LARGEST, random.Random(0)
    try:
        for i in range(config.TIMING_WARMUP_CALLS + 1):
            if profiled and i == config.TIMING_WARMUP_CALLS:
                link.receive(deadline, expect=link.send(dict(op="profile", on=True)))
            call.run(seed=i)
        warm = len(call.sent)
        for i in range(calls):
            clock, inputs = call.run(seed=100 + i)
            clocks.append((clock.wall_ms, clock.fence_ms()))
            call_checks.verify_call(verify, i, call.snapshot, inputs, case, pick)   # as the timed loop does
            del inputs
        link.receive(deadline, expect=link.send(dict(op="profile", on=False)))
    finally:
        link.close()
    rows = []
    for (wall, fence), r in zip(clocks, call.reported()[warm:]):
        if "t_line" not in r:
            continue
        rows.append(dict(wall=wall, fence=fence,
                         events=r.get("subject_gpu_ms"), copy=r.get("subject_copy_ms"),
                         to_subject=(r["t_line"] - r["t_go"]) * 1e3,
                         taken_up=(r["t_received"] - r["t_line"]) * 1e3,
                         replying=(r["t_replied"] - r["t_synced"]) * 1e3,
                         to_harness=(r["t_reply"] - r["t_replied"]) * 1e3))
    for row in rows:
        row["raw"] = max(row["wall"], row["fence"])
        row["beyond_events"] = row["raw"] - (row["events"] or 0.0)
    return dict(rows=rows, wrong_outputs=verify["wrong"], **{f"median_{k}": statistics.median(r[k] for r in rows)
                              for k in ("raw", "wall", "fence", "events", "copy", "to_subject",
                                        "taken_up", "replying", "to_harness", "beyond_events")},
                **{f"std_{k}": statistics.stdev(r[k] for r in rows)
                   for k in ("raw", "events", "beyond_events")})


class Beside:
    """`n` preparations kept starting beside the timed calls, each begun again as it ends: what a
    course's lane does while it times a submission (schedule/lookahead.Lookahead begins the next
    runs as each run stage starts, 10-15 s each of torch's import, CUDA's start, the shared
    buffers and the profiler's first start). Their phases are prepare_overlap_probe's, run on the
    builds' CPUs as a preparation's are."""

    def __init__(self, n: int, cpus: list[int]):
        from prepare_overlap_probe import PREPARATION
        self.n, self.cpus, self.script = n, cpus, PREPARATION
        self.procs: list[subprocess.Popen] = []
        self.ended = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.keep, daemon=True)

    def begin(self) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", self.script, str(ROOT), str(LARGEST.numel)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                                preexec_fn=(lambda: os.sched_setaffinity(0, self.cpus)) if self.cpus else None)

    def keep(self) -> None:
        while not self.stop.is_set():
            for i, proc in enumerate(self.procs):
                if proc.poll() is not None:
                    self.ended += proc.returncode == 0
                    self.procs[i] = self.begin()
            self.stop.wait(0.1)

    def __enter__(self) -> "Beside":
        if self.n:
            self.procs = [self.begin() for _ in range(self.n)]
            time.sleep(5.0)   # past their Python start, so that the timed calls meet every phase
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()
        for proc in self.procs:
            proc.kill()
            proc.wait()


def build_solution(arch: str) -> dict:
    from grader.build.child import build_extension
    out = ROOT / "build" / "probe"
    path = build_extension(ROOT / "solution" / "submission.cu", "probe_solution", out, arch)
    return dict(kind="cuda", artifact=str(path), module_name="probe_solution")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=25)
    p.add_argument("--solution", action="store_true", help="also the reference solution (builds it)")
    p.add_argument("--only", help="comma-separated subjects (null, null_busy, sdpa_flash, "
                   "sdpa_cudnn, solution)")
    p.add_argument("--repeat", type=int, default=1,
                   help="each subject this many times, each in a fresh process (the spread between "
                        "processes is what separates two rows of one kernel)")
    p.add_argument("--profiler", choices=("on", "off", "both"), default="both")
    p.add_argument("--run-first", choices=("yes", "no", "both"), default="yes",
                   help="whether each subject first makes a run stage's calls on the course's "
                        "cases (test_cases/), as every timed row does in grading")
    p.add_argument("--beside", type=int, nargs="+", default=[0],
                   help="each subject with this many runs begun early kept starting beside its "
                        "calls (Beside), for each number given in turn")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "protocol_probe.json")
    a = p.parse_args()
    from grader.isolation.device import detect
    device = detect()
    sandbox = Sandbox.probe(**default_layout())
    targets = [("null", dict(kind="builtin", name="null")),
               ("null_busy", dict(kind="builtin", name="null_busy")),
               ("sdpa_flash", dict(kind="builtin", name="sdpa_flash")),
               ("sdpa_cudnn", dict(kind="builtin", name="sdpa_cudnn"))]
    if a.solution:
        solution = build_solution(device.arch)
        targets = [("solution", solution)] + targets + [("solution again", solution)]
    if a.only:
        keep = a.only.split(",")
        targets = [(n, t) for n, t in targets if n in keep]
    profilers = dict(on=(True,), off=(False,), both=(False, True))[a.profiler]
    cases = load_all_cases(ROOT / "test_cases" / "test.txt", ROOT / "test_cases" / "hidden.txt")
    firsts = dict(yes=(True,), no=(False,), both=(False, True))[a.run_first]
    figures = dict(device=device.name, date=datetime.date.today().isoformat(),
                   run_first=[c.id for c in cases] if True in firsts else [],
                   sandbox=sandbox.describe(), case=LARGEST.id, calls=a.calls, probes={})
    split = split_cpus(config.Limits().gpu_stage_cpus)
    cpus = split.gpu
    if cpus:   # where grading runs the GPU stages: CPUs no build uses (procs.split_cpus)
        os.sched_setaffinity(0, cpus)
    figures["cpus"] = list(cpus)
    print(f"{'subject':16s} {'prof':4s} {'raw':>8s} {'wall':>8s} {'fence':>8s} {'events':>8s} "
          f"{'copy':>6s} {'->subj':>6s} {'taken':>6s} {'reply':>6s} {'->harn':>6s} {'beyond':>7s} "
          f"{'sd raw':>6s} {'sd ev':>6s} {'sd bey':>6s}  gpu")
    # the --beside values in turn, their order reversed every other round: session 31's run had
    # each process with none beside before its twin with two, so the GPU's drift through the run
    # could not be told from what the preparations did
    runs = [(rep, name, target, profiled, first, beside) for rep in range(a.repeat)
            for name, target in targets for profiled in profilers for first in firsts
            for beside in (a.beside if rep % 2 == 0 else a.beside[::-1])]
    for rep, name, target, profiled, first, beside in runs:
        state = gpu_state()
        with Beside(beside, list(split.build) if split.reserved else []) as prepared:
            r = probe(target, profiled=profiled, calls=a.calls, sandbox=sandbox,
                      l2_bytes=device.l2_bytes, run_first=cases if first else [])
        key = (f"{name} profiler={'on' if profiled else 'off'} run_first={'yes' if first else 'no'}"
               + (f" beside={beside}" if len(a.beside) > 1 or beside else "")
               + (f" #{rep + 1}" if a.repeat > 1 else ""))
        figures["probes"][key] = dict(r, gpu_before=state, beside=beside,
                                      preparations_ended=prepared.ended)
        if "failed" in r:
            print(f"{name:16s} failed: {r['failed']}")
            continue
        m = {k[7:]: v for k, v in r.items() if k.startswith("median_")}
        print(f"{name[:9] + (' +rf' if first else '') + (f' b{beside}' if beside else ''):16s} {'on' if profiled else 'off':4s} {m['raw']:8.3f} {m['wall']:8.3f} "
              f"{m['fence']:8.3f} {m['events']:8.3f} {m['copy']:6.3f} {m['to_subject']:6.3f} "
              f"{m['taken_up']:6.3f} {m['replying']:6.3f} "
              f"{m['to_harness']:6.3f} {m['beyond_events']:7.3f} {r['std_raw']:6.3f} "
              f"{r['std_events']:6.3f} {r['std_beyond_events']:6.3f}  {state}", flush=True)
    spread(figures["probes"])
    a.out.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


def spread(probes: dict) -> None:
    """Per subject and setting over its processes: the range of their median raw - events, and
    of their medians (the harness's, raw, and the subject's events): how far apart two
    processes of one kernel are ranked."""
    groups: dict[str, list[dict]] = {}
    for key, r in probes.items():
        if "failed" not in r:
            groups.setdefault(key.split(" #")[0], []).append(r)
    for name, rs in groups.items():
        if len(rs) < 2:
            continue
        for field, label in (("median_beyond_events", "raw - events"), ("median_raw", "raw"),
                             ("median_events", "events")):
            values = [r[field] for r in rs]
            print(f"{name:48s} {label:12s} over {len(values)} processes: median "
                  f"{statistics.median(values):.3f}, {min(values):.3f} to "
                  f"{max(values):.3f} ms (range {max(values) - min(values):.3f}, "
                  f"{100 * (max(values) - min(values)) / statistics.median(values):.2f}%)")


if __name__ == "__main__":
    sys.exit(main())
