"""Does a run begun early beside the protocol's calibration move the cost it measures? (issue 32)

    python bench/calibration_overlap_probe.py [--rounds 3] [--beside 5] [--delays 0 10]
                                              [--out bench/calibration_overlap_probe.json]

A course's GPU worker calibrates the protocol (stages/time.calibrate_protocol) in a thread of
its own while its lane begins its first runs as their builds end (schedule/lookahead.first_turn):
up to config.LOOKAHEAD harnesses and subjects start torch, CUDA, their shared buffers and the
profiler beside the calibration's timed calls. The calibrated cost is subtracted from every timed
call of the run, so a cost moved by them would move every row alike.

This grades nothing. It builds `--beside` copies of examples/triton_flash as the course does,
then calibrates the protocol again and again on this machine's first GPU, in turns: alone, and
with the copies' runs begun (lookahead's own prepare, on the builds' CPUs, as in a course) each
`--delays` second after the calibration started. The order of the turns alternates round by
round (alone first, then beside first). The table gives each way's costs (idle and busy ms) and
how far their medians are from the calibrations alone, beside the spread of the calibrations
alone: a difference within that spread is not one a run could see.

Sandboxed as the grader is where bubblewrap works (GRADER_SANDBOX). A row says how many runs got
ready (their harness said "prepared") and, where one did not, its harness's output. Writes the figures with the
device and the date.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grader.build.stage import build_submission  # noqa: E402
from grader.common import config  # noqa: E402
from grader.common.status import Status  # noqa: E402
from grader.course.submission import inspect_folder  # noqa: E402
from grader.isolation.device import detect  # noqa: E402
from grader.isolation.sandbox import Sandbox, default_layout  # noqa: E402
from grader.problem import largest, load_all_cases  # noqa: E402
from grader.report.progress import Progress  # noqa: E402
from grader.stages.context import GradeContext  # noqa: E402
from grader.stages.early import prepare  # noqa: E402
from grader.stages.time import calibrate_protocol  # noqa: E402

EXAMPLE = ROOT / "examples" / "triton_flash"


def copies(n: int, scratch: Path, ctx: GradeContext) -> list:
    """`n` copies of the Triton example, each built as a course builds it: (sub, build)."""
    subs = []
    for i in range(n):
        folder = scratch / "subs" / f"triton_flash_{i:03d}"
        shutil.copytree(EXAMPLE, folder)
        subs.append(inspect_folder(folder))

    def built(sub):
        return build_submission(sub, build_dir=ctx.build_dir, device=ctx.device, limits=ctx.limits,
                                log_path=scratch / f"{sub.id}.build.log", sandbox=ctx.sandbox)

    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as pool:
        builds = list(pool.map(built, subs))
    failed = [f"{s.id}: {b.status.value}: {b.message} {b.log_tail[-600:]}" for s, b in zip(subs, builds) if b.status is not Status.PASS]
    if failed:
        raise SystemExit(f"calibration_overlap_probe: builds failed: {failed} (logs in {scratch})")
    return list(zip(subs, builds))


def settle(prepared) -> tuple[bool, str | None]:
    """Whether a run begun beside the calibration got ready (its harness said "prepared", as
    Prepared.settle asks); if not, what it said and printed (session 31's run: none got ready,
    and nothing said why)."""
    harness = prepared.stages.harness
    said = harness.said(config.PREPARE_S)
    if said.startswith(b"prepared"):
        prepared.ready = True
        return True, None
    harness.wait(5.0)
    time.sleep(1.0)   # its output is read by a thread of its own
    return False, f"said {said!r}, exit {harness.proc.poll()}; printed: {harness.reader.text()[-1500:]}"


def calibrate(ctx: GradeContext, runs: list, delay_s: float | None) -> dict:
    """One calibration; with `delay_s`, `runs` begun that many seconds after it started, on
    another thread, as a lane's first turn begins them. That thread lives until they are closed,
    after the calibration: a child the grader spawns is killed when the thread that spawned it
    ends (PR_SET_PDEATHSIG, grader/isolation/procs.py), as a course's lane thread never does
    while its runs wait. Session 31's run of this probe ended the thread once it had begun them,
    so every run was killed at once (`ready` 0 in every row): its figures are not what they say."""
    began: list = []
    began_s: list[float] = []
    # done: the calibration is over; begun: the runs are begun (or it ended first); closed: they are
    done, begun, closed = threading.Event(), threading.Event(), threading.Event()

    def begin() -> None:
        if not done.wait(delay_s):
            t = time.monotonic()
            timed = largest(list(ctx.cases))
            for sub, build in runs:
                try:
                    prepared = prepare(sub, build, ctx, timed)
                except Exception as e:   # counted below (begun), and said
                    print(f"{sub.id}: could not begin its run ({e!r})", file=sys.stderr, flush=True)
                    continue
                if prepared is not None:
                    began.append(prepared)
            began_s.append(time.monotonic() - t)
        begun.set()
        closed.wait()   # their parent until they are closed (PR_SET_PDEATHSIG)

    beside = threading.Thread(target=begin, daemon=True) if delay_s is not None else None
    t0 = time.monotonic()
    if beside is not None:
        beside.start()
    try:
        cost = calibrate_protocol(ctx)   # measured anew: its saved cost is never reused here
    finally:
        took = time.monotonic() - t0
        done.set()
        if beside is not None:
            begun.wait()
        settled = [settle(p) for p in began]
        ready = [ok for ok, _ in settled]
        why = next((said for ok, said in settled if not ok), None)
        for p in began:
            p.close()
        closed.set()
        if beside is not None:
            beside.join()
    return dict(delay_s=delay_s, idle_ms=cost.idle_ms, busy_ms=cost.busy_ms,
                busy_work_ms=cost.busy_work_ms, took_s=round(took, 2),
                begun=len(began), ready=sum(ready), begin_s=began_s[0] if began_s else None,
                not_ready_output=why)


def summary(rows: list[dict], alone: list[dict]) -> dict:
    out = dict(n=len(rows))
    for key in ("idle_ms", "busy_ms"):
        values = [r[key] for r in rows]
        base = [r[key] for r in alone]
        out[key] = dict(median=statistics.median(values), min=min(values), max=max(values),
                        vs_alone=statistics.median(values) - statistics.median(base),
                        alone_spread=max(base) - min(base))
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3, help="calibrations each way")
    p.add_argument("--beside", type=int, default=config.LOOKAHEAD, help="runs begun beside it")
    p.add_argument("--delays", type=float, nargs="+", default=[0.0, 10.0],
                   help="seconds after the calibration's start that they are begun")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "calibration_overlap_probe.json")
    a = p.parse_args()

    device = detect()
    if not device.cuda:
        print("calibration_overlap_probe: no CUDA device here", file=sys.stderr)
        return 2
    sandbox = Sandbox.probe(**default_layout())
    cases = load_all_cases(config.PUBLIC_CASES, config.HIDDEN_CASES)
    # in the repository's build folder, as bench_grader's course: readable by the sandbox's user
    scratch = ROOT / "build" / "calibration-overlap"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    ctx = GradeContext(cases=tuple(cases), device=device, limits=config.Limits.from_env(),
                       out_dir=scratch / "results", build_dir=scratch / "build",
                       progress=Progress(1, live=False), sandbox=sandbox)
    ctx.out_dir.mkdir(parents=True)
    print(f"{device.name}; {sandbox.describe()}; {ctx.cpus.describe()}", flush=True)
    t = time.monotonic()
    runs = copies(a.beside, scratch, ctx)
    print(f"{len(runs)} copies built in {time.monotonic() - t:.1f} s", flush=True)
    ways: list[float | None] = [None, *a.delays]
    rows = []
    for r in range(a.rounds):
        for delay in (ways if r % 2 == 0 else ways[::-1]):
            row = dict(round=r, **calibrate(ctx, runs, delay))
            rows.append(row)
            print(json.dumps(row), flush=True)
    alone = [r for r in rows if r["delay_s"] is None]
    table = {"alone": summary(alone, alone)}
    for delay in a.delays:
        table[f"beside, begun at {delay:g} s"] = summary([r for r in rows if r["delay_s"] == delay], alone)
    result = dict(device=device.name, uuid=device.uuid, date=datetime.date.today().isoformat(),
                  sandbox=sandbox.describe(), sandboxed=sandbox.active, beside=a.beside,
                  case=largest(cases).id, rows=rows, table=table)
    a.out.write_text(json.dumps(result, indent=1))
    print(f"\n{device.name}, {a.rounds} calibrations each way, {a.beside} runs begun beside")
    print(f"{'way':<26}{'idle med':>10}{'min':>8}{'max':>8}{'vs alone':>10}"
          f"{'busy med':>10}{'min':>8}{'max':>8}{'vs alone':>10}")
    for name, s in table.items():
        i, b = s["idle_ms"], s["busy_ms"]
        print(f"{name:<26}{i['median']:>10.3f}{i['min']:>8.3f}{i['max']:>8.3f}{i['vs_alone']:>+10.3f}"
              f"{b['median']:>10.3f}{b['min']:>8.3f}{b['max']:>8.3f}{b['vs_alone']:>+10.3f}")
    print(f"spread of the calibrations alone: idle {table['alone']['idle_ms']['alone_spread']:.3f} ms, "
          f"busy {table['alone']['busy_ms']['alone_spread']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
