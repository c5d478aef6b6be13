"""Where a timed call's time goes, call by call, on the largest case (issue 10's overhead figure).

    python bench/protocol_probe.py [--calls 25] [--solution]     # on the GPU machine

For trusted subjects only (the harness's null subjects, the SDPA rows and, with --solution, the
reference solution built here), each with the subject's profiler off and then on (the timed loop
runs with it on), it drives calls exactly as grader/harness.py's timing loop does and prints,
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
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grader import config, harness  # noqa: E402
from grader.cases import Case  # noqa: E402
from grader.procs import child_env, split_cpus  # noqa: E402
from grader.sandbox import Sandbox, default_layout  # noqa: E402

SUBJECT = ROOT / "grader" / "subject" / "loop.py"
LARGEST = Case(batch_size=4, num_heads=64, seq_len=8192, head_dim=128, seed=1)


def gpu_state() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def probe(target: dict, *, profiled: bool, calls: int, sandbox: Sandbox, l2_bytes: int) -> dict:
    spec = dict(device="cuda", target=target,
                subject_cmd=sandbox.wrap([sys.executable, str(SUBJECT)],
                                         readonly=[str(Path(target["artifact"]).parent)]
                                         if "artifact" in target else []),
                cwd=str(ROOT), head_bytes=1 << 16, tail_bytes=1 << 16, file_bytes=1 << 30,
                deadline_s=600, case=LARGEST.to_dict(), l2_bytes=l2_bytes, env=child_env(cuda=True))
    deadline = time.monotonic() + 600
    link, call, failed = harness.open_call(spec, deadline)
    if failed is not None:
        return dict(failed=failed)
    rows = []
    try:
        for i in range(config.TIMING_WARMUP_CALLS + 1):
            if profiled and i == config.TIMING_WARMUP_CALLS:
                link.receive(deadline, expect=link.send(dict(op="profile", on=True)))
            call.run(seed=i)
        for i in range(calls):
            clock, _ = call.run(seed=100 + i)
            r = call.reply
            rows.append(dict(wall=clock.wall_ms, fence=clock.fence_ms(),
                             events=r.get("subject_gpu_ms"), copy=r.get("subject_copy_ms"),
                             to_subject=(r["t_line"] - r["t_go"]) * 1e3,
                             taken_up=(r["t_received"] - r["t_line"]) * 1e3,
                             replying=(r["t_replied"] - r["t_synced"]) * 1e3,
                             to_harness=(r["t_reply"] - r["t_replied"]) * 1e3))
        if profiled:
            link.receive(deadline, expect=link.send(dict(op="profile", on=False)))
    finally:
        link.close()
    for row in rows:
        row["raw"] = max(row["wall"], row["fence"])
        row["beyond_events"] = row["raw"] - (row["events"] or 0.0)
    return dict(rows=rows, **{f"median_{k}": statistics.median(r[k] for r in rows)
                              for k in ("raw", "wall", "fence", "events", "copy", "to_subject",
                                        "taken_up", "replying", "to_harness", "beyond_events")},
                **{f"std_{k}": statistics.stdev(r[k] for r in rows)
                   for k in ("raw", "events", "beyond_events")})


def build_solution(arch: str) -> dict:
    from grader.build import build_extension
    out = ROOT / "build" / "probe"
    path = build_extension(ROOT / "solution" / "submission.cu", "probe_solution", out, arch)
    return dict(kind="cuda", artifact=str(path), module_name="probe_solution")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=25)
    p.add_argument("--solution", action="store_true", help="also the reference solution (builds it)")
    a = p.parse_args()
    from grader.device import detect
    device = detect()
    sandbox = Sandbox.probe(**default_layout())
    targets = [("null", dict(kind="builtin", name="null")),
               ("null_busy", dict(kind="builtin", name="null_busy")),
               ("sdpa_flash", dict(kind="builtin", name="sdpa_flash")),
               ("sdpa_cudnn", dict(kind="builtin", name="sdpa_cudnn"))]
    if a.solution:
        solution = build_solution(device.arch)
        targets = [("solution", solution)] + targets + [("solution again", solution)]
    figures = dict(device=device.name, date=datetime.date.today().isoformat(),
                   sandbox=sandbox.describe(), case=LARGEST.id, calls=a.calls, probes={})
    cpus = split_cpus(config.Limits().gpu_stage_cpus).gpu
    if cpus:   # where grading runs the GPU stages: CPUs no build uses (procs.split_cpus)
        os.sched_setaffinity(0, cpus)
    figures["cpus"] = list(cpus)
    print(f"{'subject':16s} {'prof':4s} {'raw':>8s} {'wall':>8s} {'fence':>8s} {'events':>8s} "
          f"{'copy':>6s} {'->subj':>6s} {'taken':>6s} {'reply':>6s} {'->harn':>6s} {'beyond':>7s} "
          f"{'sd raw':>6s} {'sd ev':>6s} {'sd bey':>6s}  gpu")
    for name, target in targets:
        for profiled in (False, True):
            state = gpu_state()
            r = probe(target, profiled=profiled, calls=a.calls, sandbox=sandbox,
                      l2_bytes=device.l2_bytes)
            figures["probes"][f"{name} profiler={'on' if profiled else 'off'}"] = dict(r, gpu_before=state)
            if "failed" in r:
                print(f"{name:16s} failed: {r['failed']}")
                continue
            m = {k[7:]: v for k, v in r.items() if k.startswith("median_")}
            print(f"{name:16s} {'on' if profiled else 'off':4s} {m['raw']:8.3f} {m['wall']:8.3f} "
                  f"{m['fence']:8.3f} {m['events']:8.3f} {m['copy']:6.3f} {m['to_subject']:6.3f} "
                  f"{m['taken_up']:6.3f} {m['replying']:6.3f} "
                  f"{m['to_harness']:6.3f} {m['beyond_events']:7.3f} {r['std_raw']:6.3f} "
                  f"{r['std_events']:6.3f} {r['std_beyond_events']:6.3f}  {state}", flush=True)
    (ROOT / "bench" / "protocol_probe.json").write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
