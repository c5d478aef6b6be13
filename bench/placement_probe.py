"""Why one kernel's median differs between processes (notes/throughput.md, sessions 31-32).

Timing trust's two copies of one kernel differ by 0.87% rms over nineteen runs, against 0.69%
expected from their medians' sampling error alone; eight processes of the cuDNN subject spread
2.66% in their own events (bench/protocol_probe_beside_s32.json). Something differs between
processes. Where the buffers land in memory is one candidate: the harness writes every call's
fresh inputs into buffers allocated once per process, so a placement that is slow for a whole
process would show as a process's median, not as a call's noise.

Each of --processes processes allocates --placements sets of Q, K and V in turn (the earlier ones
kept alive, so each set's memory is new), then times the kernel on them in rounds: every round
makes --block calls on each set in turn (the order rotated each round), each call on fresh values
written into the set's own buffers, L2 flushed, CUDA events around the call. So the sets share the
GPU's drift through the process, and a set's median differs from the others' by its placement
(and chance) alone. Reported: the spread of the sets' medians within each process, the spread of
the processes' medians, and what chance alone would give each (the medians' 95% intervals).

With --gaps G1 G2 ..., each process also times the first set with the GPU left idle for G ms
(the host waiting after the inputs and the flush are done, or before them with --idle-first, as
the grader's timed calls do since session 33) before each call, the gaps taken in
turn in blocks: whether a kernel's time depends on what the GPU did just before it. In one
process, calls made back to back with new input tensors each (bench/inprocess.py) ran 6-9%
slower than the harness's calls, which write fixed buffers and check the last output between
calls (timing trust's in-process context rows, sessions 31-32).

    python bench/placement_probe.py                     # on the GPU machine; sdpa_cudnn, 4 x 4
    python bench/placement_probe.py --kernel sdpa_flash --processes 6 --placements 3
    python bench/placement_probe.py --processes 2 --placements 2 --gaps 0 2 5 10 20
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grader.trusted.timing import median_interval  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from timing_trust import median_error  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kernel", default="sdpa_cudnn", help="a baseline kernel's name (load_builtin)")
    p.add_argument("--shape", type=int, nargs=4, default=[4, 64, 8192, 128], metavar=("B", "H", "S", "D"),
                   help="the timed case's shape (default: the largest case, b4_h64_s8192_d128)")
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--placements", type=int, default=4)
    p.add_argument("--calls", type=int, default=100, help="timed calls per placement")
    p.add_argument("--block", type=int, default=10, help="calls on one placement before the next")
    p.add_argument("--gaps", type=float, nargs="*", default=[],
                   help="idle ms before each call to time too, on the first set (none: not timed)")
    p.add_argument("--idle-first", action="store_true",
                   help="the gaps' idle before the inputs are written and L2 flushed (as the "
                        "grader's Call.run since session 33), not after")
    p.add_argument("--out", default=str(ROOT / "bench" / "placement_probe.json"))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p


def child(args: argparse.Namespace) -> dict:
    """One process's timings: {"placements": [[ms, ...] per set, in call order], "addresses": ...}."""
    import torch
    from grader.subject.load import load_builtin
    fn = load_builtin(args.kernel)
    shape = tuple(args.shape)
    gen = torch.Generator(device="cuda")
    sets = [tuple(torch.empty(shape, dtype=torch.float16, device="cuda") for _ in range(3))
            for _ in range(args.placements)]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.empty(max(2 * l2, 64 << 20), dtype=torch.uint8, device="cuda")
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def idle(ms: float) -> None:
        torch.cuda.synchronize()
        until = time.perf_counter() + ms / 1e3
        while time.perf_counter() < until:   # a busy wait: a sleep overshoots by ~0.1 ms
            pass

    def timed(qkv, idle_ms: float = 0.0) -> float:
        if args.idle_first:
            idle(idle_ms)
        for t in qkv:
            t.normal_(generator=gen)
        flush.zero_()
        idle(0.0 if args.idle_first else idle_ms)
        begin.record()
        fn(*qkv)
        end.record()
        torch.cuda.synchronize()
        return begin.elapsed_time(end)

    for qkv in sets:                      # warm-up: each set's first call, untimed
        timed(qkv)
    times = interleaved(range(len(sets)), args.calls, args.block, lambda p: timed(sets[p]))
    gaps = interleaved(args.gaps, args.calls, args.block, lambda g: timed(sets[0], g))
    return dict(placements=list(times.values()), gaps={str(g): t for g, t in gaps.items()},
                addresses=[[t.data_ptr() for t in qkv] for qkv in sets])


def interleaved(keys, calls: int, block: int, time_one) -> dict:
    """`calls` times of time_one(key) for each of `keys`, taken in blocks of `block` calls a key,
    the keys' order rotated each round, so that every key shares the GPU's drift through the
    process: {key: [ms, ...] in call order}."""
    keys = list(keys)
    times: dict = {k: [] for k in keys}
    for r in range(-(-calls // block) if keys else 0):
        for i in range(len(keys)):
            k = keys[(r + i) % len(keys)]
            for _ in range(min(block, calls - len(times[k]))):
                times[k].append(time_one(k))
    return times


def error(times: list[float]) -> float:
    """A median's standard error, relative, from its distribution-free 95% interval."""
    low, high = median_interval(times)
    return median_error(low, high, statistics.median(times))


def spread(medians: list[float]) -> float:
    """The relative standard deviation of some times (0 for fewer than two)."""
    return statistics.stdev(medians) / statistics.fmean(medians) if len(medians) > 1 else 0.0


def figures(processes: list[dict]) -> dict:
    """Within each process: the spread of its sets' medians and what chance alone gives (their
    errors' root mean square); between processes: the spread of the processes' medians (each
    over all its calls) and chance's. A spread well over chance's is a real difference."""
    within, within_chance, process_medians, process_errors = [], [], [], []
    for proc in processes:
        sets = proc["placements"]
        within.append(spread([statistics.median(t) for t in sets]))
        within_chance.append((statistics.fmean(error(t) ** 2 for t in sets)) ** 0.5)
        every = [x for t in sets for x in t]
        process_medians.append(statistics.median(every))
        process_errors.append(error(every))
    gaps: dict[str, dict] = {}
    for g in (processes[0].get("gaps") or {}) if processes else ():
        every = [x for proc in processes for x in proc["gaps"][g]]
        gaps[g] = dict(median_ms=statistics.median(every), spread=spread(every),
                       process_medians_ms=[statistics.median(proc["gaps"][g]) for proc in processes])
    return dict(
        gaps=gaps,
        within_process=dict(spread=statistics.fmean(within), chance=statistics.fmean(within_chance),
                            each=within),
        between_processes=dict(spread=spread(process_medians),
                               chance=(statistics.fmean(e ** 2 for e in process_errors)) ** 0.5,
                               medians_ms=process_medians),
        set_medians_ms=[[statistics.median(t) for t in proc["placements"]] for proc in processes])


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    processes = []
    for i in range(args.processes):
        cmd = [sys.executable, __file__, "--child", "--kernel", args.kernel, "--shape", *map(str, args.shape),
               "--placements", str(args.placements), "--calls", str(args.calls), "--block", str(args.block),
               "--gaps", *map(str, args.gaps), *(["--idle-first"] if args.idle_first else [])]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        processes.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"process {i}: set medians (ms) "
              + ", ".join(f"{statistics.median(t):.3f}" for t in processes[-1]["placements"]))
    result = figures(processes)
    import torch
    report = dict(device=torch.cuda.get_device_name(0), date=datetime.date.today().isoformat(),
                  kernel=args.kernel, shape=args.shape, calls=args.calls, block=args.block,
                  idle_first=args.idle_first, figures=result, processes=processes)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    w, b = result["within_process"], result["between_processes"]
    print(f"{report['device']}, {args.kernel} {tuple(args.shape)}, {args.processes} processes x "
          f"{args.placements} placements x {args.calls} calls (blocks of {args.block})")
    print(f"placements within a process: medians spread {100 * w['spread']:.2f}% "
          f"(chance alone {100 * w['chance']:.2f}%)")
    print(f"between processes:           medians spread {100 * b['spread']:.2f}% "
          f"(chance alone {100 * b['chance']:.2f}%)")
    where = "before the inputs" if args.idle_first else "before each call"
    for g, f in result["gaps"].items():
        print(f"idle {float(g):5.1f} ms {where}: median {f['median_ms']:.3f} ms, calls spread "
              f"{100 * f['spread']:.2f}%, processes' medians "
              + ", ".join(f"{m:.3f}" for m in f["process_medians_ms"]))
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
