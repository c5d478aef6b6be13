"""The check service on the course's GPU (issue 33): students submitting at once through
`make submit`'s client get the verdicts `make grade` gives the same folders, with times within
the timing-trust limits, and how long each waited from submit to result.

    python bench/service_course.py [--students 20] [--checks 4] [--port 8017]
                                   [--cuda 4] [--stop-after 420] [--out bench/service_gpu.json]

A course of `--students` folders (Triton copies of examples/triton_flash and the bundled CUDA
examples: one right, one wrong, one crashing, one that does not compile), a roster and a token
each. `python -m grader serve` runs on loopback; every student sends a submission at once with
`python -m grader submit`, and the first `--checks` of them a check as well. When every job is
done (or `--stop-after` has passed), the service is stopped, and `python -m grader grade` grades
the same folders. Written: each job's verdict and its latency (the store's received_at to
finished_at: the service's own clock), the two runs' verdicts side by side, and the medians of
the Triton copies' times in each (the limit: within 1%, bench/timing_trust.py's for the same
kernel twice), with the device and the date.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import datetime
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OTHERS = ("tiled_cuda", "wrong_no_rescale", "crash_oob", "build_error")


def course(folder: Path, students: int, cuda: int) -> dict[str, str]:
    """`students` submission folders s01..sNN: the first `cuda` CUDA examples, then Triton
    copies. The example each one is a copy of, by folder."""
    made = {}
    for i in range(students):
        name = f"s{i + 1:02d}"
        example = OTHERS[i] if i < min(cuda, len(OTHERS)) else "triton_flash"
        shutil.copytree(ROOT / "examples" / example, folder / name)
        made[name] = example
    return made


def wait_for(url: str, timeout_s: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the service exited {proc.returncode} before it answered")
        try:
            with urllib.request.urlopen(url + "/leaderboard", timeout=5):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"the service did not answer within {timeout_s:.0f} s")


def jobs_of(store: Path) -> list[dict]:
    db = sqlite3.connect(f"file:{store / 'service.sqlite3'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT id, folder, kind, state, received_at, started_at, finished_at, "
                          "attempts, result FROM submissions").fetchall()
    finally:
        db.close()
    keys = ("id", "folder", "kind", "state", "received_at", "started_at", "finished_at",
            "attempts", "result")
    return [dict(zip(keys, r)) for r in rows]


def seconds(a: str | None, b: str | None) -> float | None:
    if not a or not b:
        return None
    return (datetime.datetime.fromisoformat(b) - datetime.datetime.fromisoformat(a)).total_seconds()


def median_ms(result: dict | None) -> float | None:
    timing = (result or {}).get("timing") or {}
    value = timing.get("median_ms")
    return float(value) if isinstance(value, (int, float)) else None


def summary(values: list[float]) -> dict:
    if not values:
        return dict(n=0)
    values = sorted(values)
    return dict(n=len(values), median=round(statistics.median(values), 2),
                p90=round(values[int(0.9 * (len(values) - 1))], 2), max=round(values[-1], 2))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--students", type=int, default=20)
    p.add_argument("--checks", type=int, default=4)
    p.add_argument("--cuda", type=int, default=len(OTHERS), help="how many of the CUDA examples")
    p.add_argument("--port", type=int, default=8017)
    p.add_argument("--stop-after", type=float, default=420.0)
    p.add_argument("--work", type=Path, default=ROOT / "build" / "service-course")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "service_gpu.json")
    a = p.parse_args()
    py = sys.executable
    shutil.rmtree(a.work, ignore_errors=True)
    folders, store = a.work / "course", a.work / "store"
    made = course(folders, a.students, a.cuda)
    roster = a.work / "roster.csv"
    roster.write_text("folder\n" + "".join(f"{name}\n" for name in made))
    subprocess.run([py, "-m", "grader", "serve", "tokens", "--roster", str(roster), "--store",
                    str(store)], check=True, cwd=ROOT)
    with open(store / "tokens.csv", newline="") as f:
        tokens = {row["folder"]: row["token"] for row in csv.DictReader(f)}
    url = f"http://127.0.0.1:{a.port}"
    log = open(a.work / "serve.log", "w")
    began = time.monotonic()
    service = subprocess.Popen([py, "-m", "grader", "serve", "--roster", str(roster), "--store",
                                str(store), "--port", str(a.port)], cwd=ROOT, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(url, 120, service)
        started_s = time.monotonic() - began

        def send(name: str, check: bool) -> tuple[str, bool, int, str]:
            cmd = [py, "-m", "grader", "submit", "--server", url, *(["--check"] if check else []),
                   str(folders / name)]
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120,
                                  env={**os.environ, "GRADER_TOKEN": tokens[name]})
            return name, check, proc.returncode, (proc.stdout + proc.stderr)[-400:]

        sends = [(name, False) for name in made] + [(name, True) for name in
                                                    [n for n, e in made.items() if e == "triton_flash"][:a.checks]]
        with concurrent.futures.ThreadPoolExecutor(len(sends)) as pool:
            sent = list(pool.map(lambda s: send(*s), sends))
        refused = [s for s in sent if s[2] != 0]
        deadline = time.monotonic() + a.stop_after
        while time.monotonic() < deadline:
            jobs = jobs_of(store)
            if len(jobs) >= len(sends) - len(refused) and all(j["state"] == "done" for j in jobs):
                break
            time.sleep(2)
        service_s = time.monotonic() - began
        board = urllib.request.urlopen(url + "/leaderboard", timeout=30).read()
        (a.work / "leaderboard.html").write_bytes(board)
    finally:
        os.killpg(service.pid, signal.SIGTERM)
        try:
            service.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(service.pid, signal.SIGKILL)
        log.close()
    jobs = jobs_of(store)
    # make grade on the same folders
    results = a.work / "results"
    t = time.monotonic()
    grade = subprocess.run([py, "-m", "grader", "grade", str(folders), "--out", str(results),
                            "--no-baselines", "--roster", str(roster)], cwd=ROOT,
                           capture_output=True, text=True)
    grade_s = time.monotonic() - t
    graded = {}
    for name in made:
        path = results / f"{name}.json"
        graded[name] = json.loads(path.read_text()) if path.exists() else None
    rows = []
    for j in sorted(jobs, key=lambda j: (j["kind"], j["folder"])):
        result = json.loads(j["result"]) if j["result"] else None
        other = graded.get(j["folder"]) if j["kind"] == "submission" else None
        rows.append(dict(id=j["id"], student=j["folder"], example=made[j["folder"]], kind=j["kind"],
                         state=j["state"], attempts=j["attempts"],
                         latency_s=seconds(j["received_at"], j["finished_at"]),
                         waited_s=seconds(j["received_at"], j["started_at"]),
                         status=(result or {}).get("status"),
                         grade_status=(other or {}).get("status") if other is not None else None,
                         median_ms=median_ms(result), grade_median_ms=median_ms(other)))
    subs = [r for r in rows if r["kind"] == "submission"]
    same = [r for r in subs if r["status"] == r["grade_status"]]
    triton_service = [r["median_ms"] for r in subs if r["example"] == "triton_flash" and r["median_ms"]]
    triton_grade = [r["grade_median_ms"] for r in subs if r["example"] == "triton_flash"
                    and r["grade_median_ms"]]
    agree = None
    if triton_service and triton_grade:
        ms, mg = statistics.median(triton_service), statistics.median(triton_grade)
        agree = dict(service_ms=round(ms, 4), grade_ms=round(mg, 4),
                     apart=round(abs(ms - mg) / mg, 5), limit=0.01)
    import torch
    record = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        device=torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        torch=torch.__version__, students=a.students, checks=a.checks,
        command=" ".join(sys.argv), service_started_s=round(started_s, 1),
        service_wall_s=round(service_s, 1), refused=refused, grade_wall_s=round(grade_s, 1),
        grade_exit=grade.returncode, grade_tail=grade.stderr[-1500:],
        latency_s=dict(check=summary([r["latency_s"] for r in rows if r["kind"] == "check"
                                      and r["latency_s"] is not None]),
                       submission=summary([r["latency_s"] for r in subs if r["latency_s"] is not None])),
        same_verdicts=f"{len(same)} of {len(subs)}", triton_medians=agree, jobs=rows)
    a.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{'student':<8}{'example':<18}{'kind':<11}{'service':<16}{'make grade':<16}"
          f"{'latency s':>10}{'ms':>9}{'grade ms':>10}")
    for r in rows:
        print(f"{r['student']:<8}{r['example']:<18}{r['kind']:<11}{str(r['status']):<16}"
              f"{str(r['grade_status'] or '-'):<16}{r['latency_s'] or 0:>10.1f}"
              f"{r['median_ms'] or 0:>9.3f}{r['grade_median_ms'] or 0:>10.3f}")
    print(f"same verdicts: {record['same_verdicts']}; latency {record['latency_s']}; "
          f"Triton medians {agree}; service {service_s:.0f} s, make grade {grade_s:.0f} s "
          f"(exit {grade.returncode}); refused {len(refused)}")


if __name__ == "__main__":
    main()
