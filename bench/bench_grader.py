"""The grader's throughput on a synthetic course, graded by the real grader (issue 13).

    python bench/bench_grader.py                          # 100 honest copies + failing ones, GPU
    python bench/bench_grader.py --copies 20 --budget 5 --gpus 0 0,1   # one run per GPU set
    python bench/bench_grader.py --warm                   # reuse the last run's build cache
    python bench/bench_grader.py --cpu --copies 3         # without a GPU (a smoke test)

The course: `--copies` copies of honest kernels (by default examples/triton_flash and the
reference solution, taken in turn), each with an id of its own and a comment naming its copy
appended to its source, so that no result is skipped and no build is reused; and a few failing
submissions (a build error, a wrong answer, a crash). It is graded with `python -m grader grade`
into a fresh results folder, with a cold build cache unless --warm (then the build folder of the
previous bench run is kept, and the results say how many builds were reused).

From the result files (never the console) it reports: submissions per minute; the per-submission
overhead, the GPU-serial wall time of a submission (its wall time less its build, timing loop
included) less the time its own calls took (each case's first call, and the timed and warm-up
calls); the time spent in each stage (build, run, check, time) and in each part of the run
stage (its harness's start, CUDA and buffers, the subject's start and load, the cases); and,
with several --gpus sets, the throughput of each against the first. It writes bench/grader_bench.json (--out), with the
device, the date and every figure. --stop-after stops the grader as Ctrl-C does after that many
seconds, and the figures cover what it finished.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grader.common import config  # noqa: E402
from grader.isolation.cpus import default_build_jobs, split_cpus  # noqa: E402
from grader.course.results import (LOOP_PARTS, RUN_PHASES, TIME_PHASES, RunFileError,  # noqa: E402
                            SubmissionResult, read_results, read_run)
from grader.course.submission import CUDA_FILE, PYTHON_FILE  # noqa: E402
from grader.report.summary import EXIT_NOT_FINAL as INCOMPLETE  # noqa: E402

WORK = ROOT / "build" / "bench-grader"
HONEST = (ROOT / "examples" / "triton_flash", ROOT / "solution")
FAILING_GPU = tuple(ROOT / "examples" / n for n in ("build_error", "wrong_no_rescale", "crash_oob"))
# Without a GPU a CUDA submission is only compile-checked (a wrong answer or a crash never shows),
# so the failing ones are Python: (source, the verdict it must get).
FAILING_PY = {
    "py_build_error": ("def custom_kernel(data)\n    return data[0]\n", "build_error"),
    "py_wrong_answer": ("import torch\n\ndef custom_kernel(data):\n"
                        "    return torch.zeros_like(data[0])\n", "mismatch"),
    "py_crash": ("def custom_kernel(data):\n    raise RuntimeError('my kernel crashed')\n",
                 "runtime_error"),
}
STAGES = ("build", "run", "check", "time")
RUN_PARTS = tuple(f"run.{p}" for p in RUN_PHASES)   # where the run stage's time goes
TIME_PARTS = tuple(f"time.{p}" for p in TIME_PHASES)   # and the time stage's
LOOP_KEYS = tuple(f"time.loop.{p}" for p in LOOP_PARTS)   # and its timed loop's, summed over calls
# How a copy's median settles with its number of timed calls (same_kernel): the median of its
# first n calls, for each n here that it reached.
FIRST_CALLS = (20, 30, 40, 50, 70, 100)


@dataclasses.dataclass(frozen=True)
class Planned:
    """One submission of the synthetic course."""
    id: str
    template: str       # the folder it was copied from, or the generated failure's name
    honest: bool
    expected: str | None   # the status it must get; None: not known (a --failing folder)


# ---------------------------------------------------------------- the course


def make_course(course: Path, *, honest: list[Path], failing: list[Path] | None, copies: int,
                gpu: bool) -> list[Planned]:
    """Write the synthetic course into `course`: honest copies taken in turn from `honest`, then
    the failing ones (`failing` folders, or FAILING_PY without a GPU when None)."""
    shutil.rmtree(course, ignore_errors=True)
    course.mkdir(parents=True)
    planned = []
    for i in range(copies):
        template = honest[i % len(honest)]
        sid = f"{template.name}_{i:03d}"
        _copy(template, course / sid, note=f"bench_grader copy {i}")
        planned.append(Planned(sid, template.name, True, _honest_verdict(template, gpu)))
    if failing is None and not gpu:
        for name, (source, verdict) in FAILING_PY.items():
            (course / name).mkdir()
            (course / name / PYTHON_FILE).write_text(source)
            planned.append(Planned(name, name, False, verdict))
        return planned
    expected = _example_verdicts()
    for template in (FAILING_GPU if failing is None else failing):
        sid = f"fail_{template.name}"
        _copy(template, course / sid, note="bench_grader failing submission")
        planned.append(Planned(sid, template.name, False,
                               expected.get(template.name, {}).get("gpu" if gpu else "cpu")))
    return planned


def _copy(template: Path, dest: Path, *, note: str) -> None:
    """The template's folder, its source with a comment appended: a source of its own."""
    if not template.is_dir():
        raise SystemExit(f"error: {template} is not a submission folder")
    shutil.copytree(template, dest, ignore=shutil.ignore_patterns("__pycache__"))
    source = dest / CUDA_FILE if (dest / CUDA_FILE).is_file() else dest / PYTHON_FILE
    if not source.is_file():
        raise SystemExit(f"error: {template} holds neither {CUDA_FILE} nor {PYTHON_FILE}")
    mark = "//" if source.name == CUDA_FILE else "#"
    with source.open("a") as f:
        f.write(f"\n{mark} {note}\n")


def _honest_verdict(template: Path, gpu: bool) -> str:
    """What an honest copy must get: pass (a CUDA one without a GPU: compiled, not run), or, for
    Python the audit cannot account for (a kernel in numpy, as the CPU tests' copies are:
    grader/trusted/audit/allowlist.py), review: graded, not ranked."""
    if (template / CUDA_FILE).is_file():
        return "pass" if gpu else "not_run"
    from grader.trusted.audit.allowlist import audit_folder
    from grader.course.submission import read_sources
    found = audit_folder(read_sources(template), template)
    return "flagged" if found.flagged else "review" if found.review else "pass"


def _example_verdicts() -> dict:
    data = json.loads((ROOT / "examples" / "expected.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


# ---------------------------------------------------------------- one grading run


@dataclasses.dataclass(frozen=True)
class GradeRun:
    label: str
    gpus: str | None
    lanes: int | None      # the grader's --lanes (None: its default)
    out: Path
    wall_s: float          # the whole `grade` command: device probe to the last page
    returncode: int
    stopped: bool          # by --stop-after
    log: Path


def grader_has_option(option: str) -> bool:
    """Whether this grader's `grade` takes `option` (--gpus comes with issue 13's GPU workers)."""
    proc = subprocess.run([sys.executable, "-m", "grader", "grade", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    return option in proc.stdout


def grade_course(course: Path, *, work: Path, label: str, gpus: str | None, cpu: bool,
                 budget: float | None, jobs: int | None, warm: bool, baselines: bool,
                 stop_after: float | None, extra: list[str], lanes: int | None = None) -> GradeRun:
    """`python -m grader grade` on the course into a fresh results folder; the build folder is
    emptied first (a cold build cache) unless `warm`."""
    out, build = work / f"results-{label}", work / "build"
    shutil.rmtree(out, ignore_errors=True)
    if not warm:
        shutil.rmtree(build, ignore_errors=True)
    cmd = [sys.executable, "-m", "grader", "grade", str(course), "--out", str(out),
           "--build-dir", str(build)]
    cmd += ["--cpu"] if cpu else []
    cmd += ["--gpus", gpus] if gpus else []
    cmd += ["--lanes", str(lanes)] if lanes else []
    cmd += ["--jobs", str(jobs)] if jobs else []
    cmd += [] if baselines else ["--no-baselines", "--no-solution"]
    cmd += extra
    env = dict(os.environ)
    if budget is not None:
        env["GRADER_TIME_BUDGET_S"] = str(budget)
    log = work / f"grade-{label}.log"
    print(f"[{label}] {' '.join(cmd[1:])}  (log: {log})", file=sys.stderr, flush=True)
    started = time.monotonic()
    with log.open("w") as sink:
        # SIGINT as a terminal gives it: a bench started in the background by a non-interactive
        # shell (scripts/gpu_session.sh --background) inherits it ignored, and then --stop-after's
        # Ctrl-C never reached the grader (session 8: killed after 300 s more, no figures).
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        stopped = False
        try:
            proc.wait(timeout=stop_after)
        except subprocess.TimeoutExpired:   # as Ctrl-C: finished results stay, the page renders
            stopped = True
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    wall = time.monotonic() - started
    # INCOMPLETE: the run finished with entries that have no final verdict (environment errors):
    # its figures stand, and the report lists those rows
    finished = (0, 130, INCOMPLETE)
    if (proc.returncode not in finished and not stopped) or not (out / "_run.json").exists():
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"error: the grader exited with {proc.returncode}; its output ends:\n{tail}")
    if proc.returncode == INCOMPLETE:
        print(f"[{label}] warning: the grader exited with {INCOMPLETE}: some entries have no final "
              f"verdict (see its log, {log})", file=sys.stderr, flush=True)
    elif proc.returncode not in (0, 130):   # stopped, and killed when Ctrl-C was not enough
        print(f"[{label}] warning: the grader did not end within 300 s of its Ctrl-C and was "
              f"killed ({proc.returncode}); the figures cover the results it had written",
              file=sys.stderr, flush=True)
    return GradeRun(label, gpus, lanes, out, round(wall, 2), proc.returncode, stopped, log)


# ---------------------------------------------------------------- figures


@dataclasses.dataclass(frozen=True)
class Figures:
    """One submission's times (seconds), from its result file."""
    build_s: float
    gpu_serial_s: float     # its wall time less its build: what it held the GPU stages for
    kernel_s: float         # its own calls: each case's first call, the timed and warm-up calls
    stages: dict            # stage -> seconds (the result's stage_s)

    @property
    def overhead_s(self) -> float:
        return self.gpu_serial_s - self.kernel_s

    @property
    def turn_s(self) -> float:
        """What it held its lane for: waiting for its preparation, its run and time stages. Its
        check and the time stage's spot checks go on behind its turn, beside the next one's run
        stage (stages/behind.py), and count in gpu_serial_s, not here."""
        return sum(self.stages.get(k, 0.0) for k in ("wait", "run", "time"))


def figures_of(result: SubmissionResult) -> Figures:
    stages = dict(result.stage_s)
    build = result.build.elapsed_s if result.build else 0.0
    stages.setdefault("build", build)
    kernel = sum(c.run_s or 0.0 for c in result.cases)
    if result.timing is not None:
        t = result.timing
        kernel += (t.n + t.warmup_calls) * t.mean_ms / 1000
    return Figures(build_s=build, gpu_serial_s=max(result.wall_s - build, 0.0), kernel_s=kernel,
                   stages=stages)


def spread(values: list[float]) -> dict:
    """n, median, mean, p90, max, sum of `values` (seconds), rounded; {} when empty."""
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return dict(n=len(values), median=round(statistics.median(ordered), 3),
                mean=round(statistics.fmean(ordered), 3),
                p90=round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 3),
                max=round(ordered[-1], 3), sum=round(sum(ordered), 2))


def summarize(run: GradeRun, planned: list[Planned], *, warm: bool) -> dict:
    """The figures of one grading run, from its run file and result files."""
    try:
        meta = read_run(run.out, complete=False)
    except RunFileError as e:
        raise SystemExit(f"error: {e}")
    results = read_results(run.out, meta)
    plan = {p.id: p for p in planned}
    students = [r for r in results if r.role == "student" and not r.no_result and r.id in plan]
    figures = {r.id: figures_of(r) for r in students}
    ran = [r for r in students if r.build is not None and r.build.status.value == "pass"]
    honest = [r for r in ran if plan[r.id].honest]
    unexpected = [dict(id=r.id, expected=plan[r.id].expected, got=r.status.value,
                       message=r.message.splitlines()[0] if r.message else "")
                  for r in students if plan[r.id].expected not in (None, r.status.value)]
    stages = {}
    for stage in STAGES + RUN_PARTS + TIME_PARTS + LOOP_KEYS + ("wait",):
        values = [f.stages[stage] for f in figures.values() if stage in f.stages]
        stages[stage] = spread(values)
    # every row's GPU-serial time, baselines and the solution row included
    gpu_serial = sum(figures_of(r).gpu_serial_s for r in results if not r.no_result)
    graded = len(students)
    return dict(
        label=run.label, gpus=run.gpus, lanes=meta.get("lanes"),
        build_cache="warm" if warm else "cold",
        wall_s=run.wall_s, grading_s=meta.get("wall_s"), stopped=run.stopped,
        planned=len(planned), graded=graded, missing=len(planned) - graded,
        submissions_per_min=round(graded / run.wall_s * 60, 2) if run.wall_s else None,
        statuses=dict(collections.Counter(r.status.value for r in students).most_common()),
        unexpected=unexpected,
        builds_reused=sum(1 for r in students if r.build is not None and r.build.reused),
        overhead_s=spread([figures[r.id].overhead_s for r in ran]),
        overhead_honest_s=spread([figures[r.id].overhead_s for r in honest]),
        gpu_serial_s=spread([figures[r.id].gpu_serial_s for r in ran]),
        turn_s=spread([figures[r.id].turn_s for r in ran]),
        kernel_s=spread([figures[r.id].kernel_s for r in ran]),
        stages_s=stages,
        gpu_serial_share=round(gpu_serial / run.wall_s, 3) if run.wall_s else None,
        same_kernel=same_kernel(run.out, [r for r in honest if r.timing is not None], plan),
        not_started=_not_started(run.log),
        device=meta.get("device", {}), log=str(run.log), results=str(run.out))


def same_kernel(out: Path, timed: list[SubmissionResult], plan: dict) -> dict:
    """Per honest template, how far its copies' medians (one kernel, graded again and again in
    one run on one GPU) lie from the median of them all: as graded, and from each copy's first n
    timed calls (its logs' time.calls.json) for n in FIRST_CALLS. `pairs_over_1pct`: the share of
    pairs of copies whose medians differ by more than 1%, timing trust's limit for one kernel
    graded twice."""
    by_template = collections.defaultdict(list)
    for r in timed:
        by_template[plan[r.id].template].append(r)
    figures = {}
    for template, results in sorted(by_template.items()):
        calls = {}
        for r in results:
            try:
                calls[r.id] = json.loads((out / "logs" / f"{r.id}.time.calls.json").read_text())["times_ms"]
            except (OSError, ValueError, KeyError, TypeError):
                pass
        rows = {"graded": [r.timing.median_ms for r in results]}
        for n in FIRST_CALLS:
            rows[f"first_{n}"] = [statistics.median(t[:n]) for t in calls.values() if len(t) >= n]
        figures[template] = {name: _agreement(medians) for name, medians in rows.items()}
        figures[template]["calls"] = spread([len(t) for t in calls.values()])
        figures[template]["gpus"] = across_gpus(results)
    return figures


def across_gpus(results: list[SubmissionResult]) -> dict:
    """One kernel on several GPUs (issue 32): the median of its copies' medians on each GPU that
    timed at least two, and how far the slowest GPU's lies from the fastest's."""
    by_gpu = collections.defaultdict(list)
    for r in results:
        if r.gpu is not None:
            by_gpu[r.gpu.index].append(r.timing.median_ms)
    medians = {str(k): round(statistics.median(v), 4) for k, v in sorted(by_gpu.items()) if len(v) >= 2}
    if len(medians) < 2:
        return dict(per_gpu_ms=medians)
    return dict(per_gpu_ms=medians, copies={str(k): len(v) for k, v in sorted(by_gpu.items())},
                apart=round(max(medians.values()) / min(medians.values()) - 1, 5))


def _agreement(medians: list[float]) -> dict:
    """n, the median of `medians` (ms), the p50/p90/max of |m / median - 1| and the share of pairs
    more than 1% apart."""
    if len(medians) < 2:
        return {"n": len(medians)}
    center = statistics.median(medians)
    off = sorted(abs(m / center - 1) for m in medians)
    pairs = [abs(a / b - 1) > 0.01 for a, b in itertools.combinations(medians, 2)]
    return dict(n=len(medians), median_ms=round(center, 4), p50=round(statistics.median(off), 5),
                p90=round(off[min(len(off) - 1, int(0.9 * len(off)))], 5), max=round(off[-1], 5),
                pairs_over_1pct=round(sum(pairs) / len(pairs), 4))


def _not_started(log: Path) -> int:
    """Runs begun early that failed on their turn and were graded anew (pipeline.NotStarted):
    the grade log's notes, which say why."""
    try:
        return log.read_text(errors="replace").count("its run begun early did not start")
    except OSError:
        return 0


def scaling(runs: list[dict]) -> list[dict]:
    """Each run's throughput against the first's, with the GPUs it had."""
    if len(runs) < 2 or not runs[0]["submissions_per_min"]:
        return []
    base = runs[0]["submissions_per_min"]
    return [dict(label=r["label"], gpus=r["gpus"], lanes=r.get("lanes"),
                 gpu_count=len(r["gpus"].split(",")) if r["gpus"] else None,
                 submissions_per_min=r["submissions_per_min"],
                 speedup=round(r["submissions_per_min"] / base, 3)) for r in runs]


# ---------------------------------------------------------------- report


def format_report(report: dict) -> str:
    lines = [f"grader throughput: {report['course']['describe']}",
             f"device: {report['device']}  ({report['date']}, {report['host']['cpus']} CPUs, "
             f"build jobs {report['options']['jobs']})", ""]
    head = (f"{'run':10} {'cache':5} {'graded':>7} {'wall s':>8} {'subs/min':>9}  "
            f"{'overhead s: median':>18} {'p90':>7} {'max':>7}   "
            + "  ".join(f"{s + ' s':>11}" for s in STAGES))
    lines += [head, "-" * len(head)]
    for r in report["runs"]:
        o = r["overhead_s"]
        stage_cells = "  ".join(
            f"{r['stages_s'][s].get('sum', 0):11.1f}" if r["stages_s"][s]["n"] else f"{'-':>11}"
            for s in STAGES)
        lines.append(f"{r['label']:10} {r['build_cache']:5} {r['graded']:>4}/{r['planned']:<3}"
                     f"{r['wall_s']:8.1f} {r['submissions_per_min'] or 0:9.2f}  "
                     f"{o.get('median', float('nan')):18.2f} {o.get('p90', float('nan')):7.2f} "
                     f"{o.get('max', float('nan')):7.2f}   {stage_cells}")
    lines.append("")
    lines.append("overhead: a submission's GPU-serial wall time (its wall time less its build, "
                 "timing loop included) less its own calls; stage columns: seconds summed over "
                 "the course (builds run in parallel)")
    for r in report["runs"]:
        honest = r["overhead_honest_s"]
        lines.append(f"{r['label']}: statuses {r['statuses']}; builds reused {r['builds_reused']}; "
                     f"honest overhead median {honest.get('median', float('nan')):.2f} s; "
                     f"GPU stages busy {100 * (r['gpu_serial_share'] or 0):.0f}% of the wall time"
                     + (f"; a lane's turn (wait, run, time) median "
                        f"{r['turn_s']['median']:.2f} s" if r.get("turn_s", {}).get("n") else "")
                     + ("; STOPPED by --stop-after" if r["stopped"] else ""))
        parts = [(p.split(".")[1], r["stages_s"].get(p, {})) for p in RUN_PARTS]
        if any(s.get("n") for _, s in parts):
            lines.append("  run stage's parts, median s: " + ", ".join(
                f"{name} {s['median']:.2f} (n={s['n']})" for name, s in parts if s.get("n"))
                + f"; run stage {r['stages_s']['run'].get('median', float('nan')):.2f} (of a run "
                "begun early, only load and cases are in it: pipeline.Lookahead)")
        parts = [(p.split(".")[1], r["stages_s"].get(p, {})) for p in TIME_PARTS]
        if any(s.get("n") for _, s in parts):
            lines.append("  time stage's parts, median s: " + ", ".join(
                f"{name} {s['median']:.2f} (n={s['n']})" for name, s in parts if s.get("n"))
                + f"; time stage {r['stages_s']['time'].get('median', float('nan')):.2f}")
        parts = [(p.split(".")[2], r["stages_s"].get(p, {})) for p in LOOP_KEYS]
        if any(s.get("n") for _, s in parts):
            lines.append("  timed loop's parts, median s: " + ", ".join(
                f"{name} {s['median']:.2f}" for name, s in parts if s.get("n")))
        for template, rows in (r.get("same_kernel") or {}).items():
            lines.append(f"  same kernel, {template}: medians off their median (p90, share of "
                         "pairs > 1% apart): " + ", ".join(
                             f"{name} {a['p90'] * 100:.2f}% {a['pairs_over_1pct'] * 100:.0f}% (n={a['n']})"
                             for name, a in rows.items() if name not in ("calls", "gpus") and "p90" in a))
            if "apart" in rows.get("gpus", {}):
                g = rows["gpus"]
                lines.append(f"  same kernel across GPUs, {template}: median of copies per GPU " + ", ".join(
                    f"gpu{k} {ms:.3f} ms (n={g['copies'][k]})" for k, ms in g["per_gpu_ms"].items())
                    + f": {g['apart'] * 100:.2f}% apart (issue 32: within 2%)")
        wait = r["stages_s"].get("wait", {})
        if wait.get("n"):
            lines.append(f"  waited for its preparation at its turn (with lanes, for the GPU's gate too): "
                         f"median {wait['median']:.2f} s, sum {wait['sum']:.1f} s (n={wait['n']})")
        if r.get("not_started"):
            lines.append(f"  NOT STARTED: {r['not_started']} runs begun early failed on their turn and "
                         f"were graded anew (why: {r['log']})")
        for u in r["unexpected"]:
            lines.append(f"  UNEXPECTED {u['id']}: {u['got']} (expected {u['expected']}): {u['message']}")
    for s in report["scaling"]:
        lines.append(f"scaling: {s.get('label', s['gpus'])}: {s['submissions_per_min']:.2f} submissions/min, "
                     f"{s['speedup']:.2f}x the first run")
    return "\n".join(lines)


# ---------------------------------------------------------------- main


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench/bench_grader.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--copies", type=int, default=100, help="honest copies (default 100)")
    p.add_argument("--budget", type=float, help="timing budget per submission, seconds "
                   "(GRADER_TIME_BUDGET_S; default: the grader's)")
    p.add_argument("--out", type=Path, help="the figures' JSON (default bench/grader_bench.json; "
                   "with --cpu bench/grader_bench_cpu.json)")
    p.add_argument("--cpu", action="store_true", help="grade as if there were no GPU (smoke test)")
    p.add_argument("--warm", action="store_true",
                   help="keep the build folder of the previous bench run (its build cache)")
    p.add_argument("--gpus", nargs="+", metavar="SET",
                   help="one grading run per GPU set, passed to the grader's --gpus "
                        "(e.g. --gpus 0 0,1); the report compares their throughput")
    p.add_argument("--lanes", nargs="+", type=int, metavar="N",
                   help="one grading run per value (and per --gpus set), passed to the grader's "
                        "--lanes: run stages of N submissions share a GPU (e.g. --lanes 1 3)")
    p.add_argument("--jobs", type=int, help="builds at once (the grader's --jobs; default: its own)")
    p.add_argument("--honest", type=Path, action="append",
                   help="an honest submission folder to copy (repeatable; default: "
                        "examples/triton_flash and solution)")
    p.add_argument("--failing", type=Path, action="append",
                   help="a failing submission folder (repeatable; default: examples/build_error, "
                        "wrong_no_rescale, crash_oob; with --cpu, three Python ones); "
                        "--failing none for none")
    p.add_argument("--no-baselines", action="store_true",
                   help="grade without the PyTorch baselines and the solution row")
    p.add_argument("--stop-after", type=float, metavar="S",
                   help="stop the grader as Ctrl-C does after S seconds; report what it finished")
    p.add_argument("--work", type=Path, default=WORK, help=f"scratch folder (default {WORK})")
    p.add_argument("grader_args", nargs="*", metavar="-- GRADER_ARG",
                   help="more arguments for `python -m grader grade` (after --)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.copies < 0:
        raise SystemExit("error: --copies must be 0 or more")
    if args.gpus and not grader_has_option("--gpus"):
        raise SystemExit("error: this grader's `grade` has no --gpus option yet (issue 13's GPU "
                         "workers add it); run without --gpus for one run on the default GPU")
    failing = None if args.failing is None else [f for f in args.failing if str(f) != "none"]
    honest = [h.resolve() for h in (args.honest or HONEST)]
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    course = work / "course"
    planned = make_course(course, honest=honest, failing=failing, copies=args.copies,
                          gpu=not args.cpu)
    if not planned:
        raise SystemExit("error: the course is empty (--copies 0 and no failing submission)")
    jobs = args.jobs or default_build_jobs(split_cpus(config.Limits.from_env().gpu_stage_cpus))
    runs = []
    for gpus, lanes in itertools.product(args.gpus or [None], args.lanes or [None]):
        label = f"gpus-{gpus.replace(',', '_')}" if gpus else ("cpu" if args.cpu else "default")
        label += f"-lanes{lanes}" if lanes else ""
        run = grade_course(course, work=work, label=label, gpus=gpus, cpu=args.cpu,
                           budget=args.budget, jobs=args.jobs, warm=args.warm,
                           baselines=not args.no_baselines, stop_after=args.stop_after,
                           extra=args.grader_args, lanes=lanes)
        runs.append(summarize(run, planned, warm=args.warm))
    device = runs[0]["device"]
    counts = collections.Counter(p.template for p in planned if p.honest)
    report = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        device=device.get("name", "unknown"), driver=device.get("driver"),
        torch=device.get("torch_version"), cuda=device.get("cuda_version"),
        host=dict(cpus=len(os.sched_getaffinity(0)), load_1min=round(os.getloadavg()[0], 2)),
        command=" ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        options=dict(copies=args.copies, budget_s=args.budget, jobs=jobs,
                     jobs_from="--jobs" if args.jobs else "the grader's default",
                     warm=args.warm, cpu=args.cpu, baselines=not args.no_baselines,
                     stop_after_s=args.stop_after, grader_args=args.grader_args),
        course=dict(honest=dict(counts), failing=[p.id for p in planned if not p.honest],
                    describe=(f"{len(planned)} submissions: {args.copies} honest copies ("
                              + ", ".join(f"{n} {t}" for t, n in counts.items())
                              + f"), {sum(not p.honest for p in planned)} failing")),
        overhead_definition=(
            "overhead_s = wall_s - build_s - kernel_s per submission whose build passed: its "
            "GPU-serial wall time (timing loop included) less its own calls (each case's first "
            "call, run_s, and (n + warm-up) x mean_ms of the timed calls)"),
        runs=runs, scaling=scaling(runs))
    out = args.out or ROOT / "bench" / ("grader_bench_cpu.json" if args.cpu else "grader_bench.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(format_report(report))
    print(f"\nwritten: {out}")
    return 1 if any(r["unexpected"] for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
