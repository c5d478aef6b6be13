"""Kernel 6 (FlashAttention-3 schedule) on a GPU: build, check, time, in one run of a few minutes.

    python bench/kernel6_check.py                   # kernel 6 and kernel 5, check + time
    python bench/kernel6_check.py --debug           # kernel 6 built with -DATTN6_WATCHDOG=2 (a stuck
                                                    # mbarrier wait prints its block, thread, barrier)
    python bench/kernel6_check.py --flag=-DATTN6_BC=128 --no-timing
    python bench/kernel6_check.py --variant v6bc128=-DATTENTION_VERSION=6,-DATTN6_BC=128
    python bench/kernel6_check.py --versions 6 --variant tail=-DATTENTION_VERSION=6,-DATTN6_TAIL_PV=1
    python bench/kernel6_check.py --model           # CPU only: the pipeline protocol model (below)

Builds solution/submission.cu twice in parallel, with -DATTENTION_VERSION=6 and =5 (load_inline,
as the grader builds; ptxas's report printed). Each version then runs in a child process of its
own under a timeout, so a kernel that hangs (a wrong mbarrier parity) or traps (kernel 6's
watchdog: a barrier wait of more than ~4 s) costs one timeout, not the run:
  1. correctness against the fp32 reference on every public, hidden and CPU case plus a few
     tile-boundary shapes (S = 1, 127, 128, 129, 176, 177, 352; D = 64 and 128), smallest first,
     with the grader's comparison (tolerance and precision budget); a failure prints the first
     bad (b, h, s, d) indices and the max error;
  2. timing on the three public shapes: fixed inputs, L2 flushed before each call, CUDA events
     around the call, the median of --reps calls; TF/s = 4·B·H·S²·D / t.
SDPA cuDNN and FLASH are timed the same way in a child of their own. Prints one table and writes
bench/kernel6_check.json (device, driver, torch, date, ptxas lines, findings, timings).
"""

from __future__ import annotations

import argparse
import concurrent.futures
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

# Shapes that sit on kernel 6's tile boundaries (Br = 128 query rows, Bc = 176 keys) and make the
# persistent CTAs take several tiles each: (batch, heads, seq, head_dim).
EXTRA_SHAPES = [(1, 1, 127, 128), (1, 3, 128, 128), (2, 1, 129, 64), (1, 2, 176, 128),
                (1, 2, 177, 128), (2, 3, 352, 64), (3, 37, 353, 128), (2, 64, 1000, 128)]
SEED = 4242


def log(*a) -> None:
    print(*a, flush=True)


# ---------------------------------------------------------------- parent: build, run children, report

def build(name: str, flags: list[str], arch: str, build_root: Path) -> dict:
    module = f"kernel6_check_{name}"
    cmd = [sys.executable, "-m", "grader.build.stage", "extension", str(ROOT / "solution" / "submission.cu"),
           "--name", module, "--build-dir", str(build_root / module), "--arch", arch,
           "--cuda-flag=-Xptxas=-v", *[f"--cuda-flag={f}" for f in flags]]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    out = proc.stdout + proc.stderr
    ptxas = [l.strip() for l in out.splitlines()
             if "attention_kernel" in l or "registers" in l or "spill" in l or "warning" in l.lower()]
    return dict(name=name, flags=flags, ok=proc.returncode == 0, seconds=round(time.monotonic() - t0, 1),
                so=str(build_root / module / f"{module}.so") if proc.returncode == 0 else None,
                module=module, ptxas=ptxas, log_tail=None if proc.returncode == 0 else out[-4000:])


def run_child(args: list[str], timeout: float, result_path: Path) -> dict:
    """Runs this script as a child; its results are whatever it wrote to result_path (complete or
    not), with how it ended."""
    result_path.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", *args, "--result", str(result_path)]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, timeout=timeout, capture_output=True, text=True)
        ended, output = f"exit {proc.returncode}", proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        ended = f"TIMEOUT after {timeout:.0f} s (a hang: kernel 6's named barriers or an mbarrier)"
        output = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
                         for x in (e.stdout, e.stderr))
    for line in output.splitlines()[-60:]:
        log("    | " + line)
    res = json.loads(result_path.read_text()) if result_path.exists() else {}
    res.update(ended=ended, seconds=round(time.monotonic() - t0, 1))
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--so", help=argparse.SUPPRESS)
    p.add_argument("--module", help=argparse.SUPPRESS)
    p.add_argument("--sdpa", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--versions", default="6,5", help="ATTENTION_VERSIONs to build and compare (default 6,5)")
    p.add_argument("--flag", action="append", default=[], help="extra nvcc flag for kernel 6's build")
    p.add_argument("--variant", action="append", default=[],
                   help="NAME=FLAG[,FLAG...]: one more build, checked and timed like the others")
    p.add_argument("--name", help=argparse.SUPPRESS)
    p.add_argument("--debug", action="store_true", help="kernel 6 with -DATTN6_WATCHDOG=2 (prints where it hangs)")
    p.add_argument("--reps", type=int, default=60, help="timed calls per row and shape (median)")
    p.add_argument("--no-timing", action="store_true")
    p.add_argument("--no-sdpa", action="store_true")
    p.add_argument("--timeout", type=float, default=150, help="seconds per child process")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "kernel6_check.json")
    p.add_argument("--model", action="store_true", help="run the pipeline model (no GPU) and exit")
    args = p.parse_args()
    if args.child:
        return child(args)
    if args.model:
        return check_pipeline_model()

    import torch
    from grader.isolation.device import arch_for
    if not torch.cuda.is_available():
        log("kernel6_check needs a CUDA device")
        return 2
    cap = torch.cuda.get_device_capability()
    arch = arch_for(cap)
    device = torch.cuda.get_device_name()
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.strip() if shutilwhich("nvidia-smi") else ""
    log(f"{device} (sm_{arch}), driver {driver}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    if cap != (9, 0):
        log("note: kernels 5 and 6 run only on Hopper; elsewhere the solution falls back to kernel 3")

    versions = [v.strip() for v in args.versions.split(",") if v.strip()]
    variants = {}
    for v in versions:
        flags = [f"-DATTENTION_VERSION={v}"]
        if v == "6":
            flags += args.flag + (["-DATTN6_WATCHDOG=2"] if args.debug else [])
        variants[f"v{v}"] = flags
    for spec in args.variant:
        name, _, flags = spec.partition("=")
        variants[name] = [f for f in flags.split(",") if f]
    build_root = ROOT / "build" / "kernel6_check"
    build_root.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(len(variants)) as pool:
        builds = list(pool.map(lambda kv: build(kv[0], kv[1], arch, build_root), variants.items()))
    log(f"built in {time.monotonic() - t0:.0f} s")
    for b in builds:
        log(f"== {b['name']} {' '.join(b['flags'])}: {'ok' if b['ok'] else 'BUILD FAILED'} ({b['seconds']} s)")
        for l in b["ptxas"]:
            if "kernel6" in l or "kernel5" in l or "registers" in l or "spill" in l or "warning" in l.lower():
                log("   " + l)
        if not b["ok"]:
            log(b["log_tail"])

    results = {}
    timing_flag = ["--no-timing"] if args.no_timing else []
    for b in builds:
        if not b["ok"]:
            continue
        log(f"== running {b['name']} (child process, timeout {args.timeout:.0f} s)")
        results[b["name"]] = run_child(["--so", b["so"], "--module", b["module"], "--name", b["name"],
                                        "--reps", str(args.reps),
                                        *timing_flag], args.timeout, build_root / f"{b['name']}.json")
        log(f"   {b['name']}: {results[b['name']]['ended']} in {results[b['name']]['seconds']} s")
    if not args.no_timing and not args.no_sdpa:
        log("== running SDPA cuDNN and FLASH (child process)")
        results["sdpa"] = run_child(["--sdpa", "--reps", str(args.reps)], args.timeout, build_root / "sdpa.json")

    report = summarise(results, versions)
    log(report)
    args.out.write_text(json.dumps(dict(
        device=device, capability=list(cap), driver=driver, torch=torch.__version__, cuda=torch.version.cuda,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        builds=builds, results=results, report=report), indent=1))
    log(f"\nwritten: {args.out}")
    broken = [n for n, r in results.items() if n != "sdpa" and (not r.get("all_ok") or not r["ended"].startswith("exit 0"))]
    return 1 if broken or not all(b["ok"] for b in builds) else 0


def shutilwhich(name: str) -> bool:
    import shutil
    return shutil.which(name) is not None


def summarise(results: dict, versions: list[str]) -> str:
    out = ["", "correctness"]
    for name, r in results.items():
        if name == "sdpa":
            continue
        checks = r.get("checks", [])
        bad = [c for c in checks if not c["ok"]]
        out.append(f"  {name}: {len(checks) - len(bad)}/{len(checks)} cases pass ({r['ended']})"
                   + ("" if r.get("all_ok") else "  <-- NOT ALL CASES RAN OR PASSED"))
        for c in bad:
            out.append(f"    {c['case']}: {c['summary'].splitlines()[0]}")
    rows = {}
    for name, r in results.items():
        for t in r.get("timings", []):
            rows.setdefault(t["shape"], {})[t["row"]] = t
    if rows:
        out += ["", "timing (median of calls, L2 flushed; TF/s = 4·B·H·S²·D / t)"]
        for shape, by in rows.items():
            out.append(f"  {shape}")
            ref = by.get("v6")
            for row, t in by.items():
                ratio = f"{t['ms'] / ref['ms']:.2f}x" if ref else ""
                out.append(f"    {row:12} {t['ms']:9.3f} ms {t['tflops']:7.1f} TF/s   kernel 6 vs this: {ratio}")
    return "\n".join(out)


# ---------------------------------------------------------------- child: one version (or SDPA)

def child(args) -> int:
    import torch
    from grader.common import config
    from grader.problem import Case, load_all_cases, load_cases
    from grader.trusted.compare import compare_outputs
    from grader.problem import make_inputs
    from grader.problem import attention_plain_fp16, attention_reference

    res: dict = dict(checks=[], timings=[], all_ok=False)

    def save() -> None:
        args.result.write_text(json.dumps(res, indent=1))

    if args.sdpa:
        from grader.subject.load import load_builtin
        rows = {"SDPA cuDNN": load_builtin("sdpa_cudnn"), "SDPA FLASH": load_builtin("sdpa_flash")}
    else:
        from grader.subject.load import load_extension
        fn = load_extension(args.so, args.module)
        name = args.name
        rows = {name: fn}
        cases = load_all_cases(config.PUBLIC_CASES, config.HIDDEN_CASES)
        cpu = ROOT / "test_cases" / "cpu.txt"
        if cpu.exists():
            cases += load_cases(cpu)
        cases += [Case(*s, seed=SEED) for s in EXTRA_SHAPES]
        cases = sorted({c.shape: c for c in cases}.values(), key=lambda c: c.numel)
        for case in cases:
            q, k, v = make_inputs(case, "cuda")
            t0 = time.monotonic()
            try:
                out = fn(q, k, v)
                torch.cuda.synchronize()
            except RuntimeError as e:
                res["checks"].append(dict(case=case.id, ok=False, summary=f"raised: {e}"))
                save()
                log(f"{case.id}: raised {str(e).splitlines()[0]}")
                return 1   # the context may be gone (a trap): nothing after this is meaningful
            ms = (time.monotonic() - t0) * 1e3
            ref = attention_reference(q, k, v)
            plain = attention_plain_fp16(q, k, v) if case.seq_len <= 4097 else None
            f = compare_outputs(out, ref, rtol=case.rtol or config.RTOL, atol=case.atol or config.ATOL,
                                plain=plain)
            res["checks"].append(dict(case=case.id, ok=f.ok, summary=f.summary(), max_abs_error=f.max_abs_error,
                                      mismatches=f.mismatches, first_bad=[str(b) for b in f.first_bad],
                                      first_call_ms=round(ms, 2)))
            save()
            log(f"{case.id}: {'ok' if f.ok else 'MISMATCH'} max abs error {f.max_abs_error:.3g}"
                + ("" if f.ok else "\n  " + f.summary().replace("\n", "\n  ")))
            del q, k, v, out, ref, plain
            torch.cuda.empty_cache()
        res["all_ok"] = all(c["ok"] for c in res["checks"])
        save()
        if not res["all_ok"]:
            log("not timed: it is not correct on every case")
            return 1

    if args.no_timing:
        return 0
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for case in load_cases(config.PUBLIC_CASES):
        q, k, v = make_inputs(case, "cuda")
        for row, f in rows.items():
            try:
                f(q, k, v)   # warm-up (and the one-time set-up: attributes, tensor-map entry point)
                f(q, k, v)
                torch.cuda.synchronize()
            except RuntimeError as e:   # an SDPA backend this torch or GPU lacks
                log(f"{case.id} {row}: not timed: {str(e).splitlines()[0]}")
                if not args.sdpa:
                    return 1
                continue
            times = []
            for _ in range(args.reps):
                flush.zero_()
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                f(q, k, v)
                end.record()
                end.synchronize()
                times.append(begin.elapsed_time(end))
            ms = statistics.median(times)
            res["timings"].append(dict(shape=case.id, row=row, ms=ms, tflops=case.flops / ms / 1e9,
                                       min_ms=min(times), n=len(times)))
            save()
            log(f"{case.id} {row}: {ms:.3f} ms, {case.flops / ms / 1e9:.1f} TF/s")
        del q, k, v
        torch.cuda.empty_cache()
    res["all_ok"] = True if args.sdpa else res["all_ok"]
    save()
    return 0


# ---------------------------------------------------------------- the pipeline protocol, modelled
#
# attention_kernel6's synchronisation for one CTA, step by step: the producer thread, the two
# consumer warpgroups (each arriving for its 4 warps), mbarrier phases and parity waits, TMA
# completions at random later times, the ping-pong token on named barriers 1 and 2. Random
# interleavings; a run fails on a deadlock, on a read of a buffer that does not hold the expected
# tile (or has not landed), on a TMA write into a buffer a consumer is reading, or on a named
# barrier completed without its syncing warpgroup. It models the protocol, not the PTX: change it
# with the kernel.

class _MBarrier:
    def __init__(self, count):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0

    def arrive(self, expect_tx=0):
        assert self.pending > 0, "more arrivals than the barrier's count"
        self.tx += expect_tx
        self.pending -= 1
        self._complete()

    def complete_tx(self, nbytes):
        self.tx -= nbytes
        assert self.tx >= 0, "TMA bytes before their expect_tx"
        self._complete()

    def _complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def passed(self, parity):   # mbarrier.try_wait.parity
        return (self.phase & 1) != parity


class _NamedBarrier:
    def __init__(self):
        self.arrived, self.syncing, self.generation = 0, 0, 0

    def arrive(self, syncing):
        self.arrived += 1
        self.syncing += syncing
        if self.arrived == 2:   # 256 threads = two warpgroups
            assert self.syncing == 1, "a named barrier completed without exactly one syncing warpgroup"
            self.arrived, self.syncing = 0, 0
            self.generation += 1


def model_pipeline(S: int, tiles: int, *, Bc: int = 176, stages: int = 2, seed: int = 0) -> None:
    import random
    rng = random.Random(seed)
    n_kv = (S + Bc - 1) // Bc
    q_full, q_empty = _MBarrier(1), _MBarrier(8)
    k_full = [_MBarrier(1) for _ in range(stages)]
    k_empty = [_MBarrier(8) for _ in range(stages)]
    v_full = [_MBarrier(1) for _ in range(stages)]
    v_empty = [_MBarrier(8) for _ in range(stages)]
    ping = {1: _NamedBarrier(), 2: _NamedBarrier()}
    buffers: dict = {}   # ('K', stage) -> [tile tag, landed, readers]
    in_flight: list = []
    finished: list = []

    def tma(key, bar, tag):
        buf = buffers.setdefault(key, [None, True, set()])
        assert not buf[2], f"TMA overwrites {key} while {buf[2]} read it"
        buf[0], buf[1] = tag, False
        in_flight.append((key, bar))

    def read(key, tag, who):
        buf = buffers[key]
        assert buf[1] and buf[0] == tag, f"{who} reads {key}: holds {buf[0]} (landed {buf[1]}), wants {tag}"
        buf[2].add(who)

    def done_reading(key, who):
        buffers[key][2].discard(who)

    def wait(bar, parity):
        while not bar.passed(parity):
            yield

    def producer():
        for it in range(tiles):
            base = it * n_kv
            yield from wait(q_empty, (it & 1) ^ 1)
            q_full.arrive(expect_tx=1)
            tma(("Q", 0), q_full, ("Q", it))
            for j in range(n_kv + 1):
                if j < n_kv:   # K_j, then V_{j-1}
                    idx = base + j
                    st = idx % stages
                    yield from wait(k_empty[st], ((idx // stages) & 1) ^ 1)
                    k_full[st].arrive(expect_tx=1)
                    tma(("K", st), k_full[st], ("K", it, j))
                    yield
                if j > 0:
                    idx = base + j - 1
                    st = idx % stages
                    yield from wait(v_empty[st], ((idx // stages) & 1) ^ 1)
                    v_full[st].arrive(expect_tx=1)
                    tma(("V", st), v_full[st], ("V", it, j - 1))
                    yield

    def consumer(cw):
        who = f"consumer {cw}"

        def warps_arrive(bar):
            for _ in range(4):
                bar.arrive()

        if cw == 1 and n_kv > 1:                     # consumer 0 takes the first turn
            ping[1].arrive(False)
        for it in range(tiles):
            base = it * n_kv
            yield from wait(q_full, it & 1)
            st = base % stages
            yield from wait(k_full[st], (base // stages) & 1)
            read(("Q", 0), ("Q", it), who)
            read(("K", st), ("K", it, 0), who)
            yield                                    # S_0 = Q K_0ᵀ, wait<0>
            done_reading(("K", st), who)
            warps_arrive(k_empty[st])
            if n_kv == 1:
                done_reading(("Q", 0), who)
                warps_arrive(q_empty)
            for j in range(1, n_kv):
                idx, idx_v = base + j, base + j - 1
                st, st_v = idx % stages, idx_v % stages
                yield from wait(k_full[st], (idx // stages) & 1)
                yield from wait(v_full[st_v], (idx_v // stages) & 1)
                generation = ping[1 + cw].generation
                ping[1 + cw].arrive(True)            # bar.sync: our turn
                while ping[1 + cw].generation == generation:
                    yield
                read(("K", st), ("K", it, j), who)
                read(("V", st_v), ("V", it, j - 1), who)
                if cw == 0 or j < n_kv - 1 or it < tiles - 1:
                    ping[1 + (cw ^ 1)].arrive(False)  # bar.arrive: the other's turn
                yield                                # wait<1>: S_j is in
                done_reading(("K", st), who)
                yield                                # softmax
                warps_arrive(k_empty[st])
                if j == n_kv - 1:
                    done_reading(("Q", 0), who)
                    warps_arrive(q_empty)
                yield                                # wait<0>: P V is done
                done_reading(("V", st_v), who)
                warps_arrive(v_empty[st_v])
            idx = base + n_kv - 1
            st = idx % stages
            yield from wait(v_full[st], (idx // stages) & 1)
            read(("V", st), ("V", it, n_kv - 1), who)
            yield
            done_reading(("V", st), who)
            warps_arrive(v_empty[st])
            finished.append((cw, it))

    actors = {"producer": producer(), "consumer 0": consumer(0), "consumer 1": consumer(1)}
    for step in range(200_000):
        if not actors and not in_flight:
            break
        pick = rng.choice(list(actors) + (["tma"] if in_flight else []))
        if pick == "tma":
            key, bar = in_flight.pop(rng.randrange(len(in_flight)))
            buffers[key][1] = True
            bar.complete_tx(1)
            continue
        try:
            next(actors[pick])
        except StopIteration:
            del actors[pick]
    else:
        raise AssertionError(f"deadlock: {sorted(actors)} still waiting")
    assert sorted(finished) == [(cw, it) for cw in (0, 1) for it in range(tiles)]
    for bar in [q_full, q_empty, *k_full, *k_empty, *v_full, *v_empty]:
        assert bar.pending == bar.count and bar.tx == 0, "a barrier left mid-phase"
    assert all(b.arrived == 0 for b in ping.values()), "a named barrier left part-way"


def check_pipeline_model() -> int:
    runs = 0
    for S in [1, 77, 113, 175, 176, 177, 352, 353, 1000, 1024, 2049]:
        for tiles in [1, 2, 3, 5]:
            for seed in range(20):
                model_pipeline(S, tiles, seed=seed)
                runs += 1
    for S in [1, 64, 130, 1000]:
        for tiles in [1, 4]:
            for seed in range(10):
                model_pipeline(S, tiles, Bc=128, stages=3, seed=seed)
                runs += 1
    log(f"pipeline model: {runs} random interleavings, no deadlock, no stale read, no overwrite in use")
    return 0


if __name__ == "__main__":
    sys.exit(main())
