#!/bin/sh
# One call on the GPU machine (the developers' device tool): set up what its image lacks, then
# run the named tasks in order, each one's log and files into $OUT. The machine has torch, nvcc,
# ninja, pytest, jinja2, rich and triton, and no internet; carry the rest:
#   .whl/  pytest_json_report, pytest_metadata, submitit (cloudpickle, typing_extensions):
#          without them the set-up stops; starlette, uvicorn, python-multipart (the check
#          service), nvidia_cutlass, tilelang (those tracks): without them those are left out
#          (docs/gpu-machine.md); downloaded as the device README says (python 3.12, manylinux)
#   .deb/  bubblewrap (apt-get download bubblewrap): integrity results count only sandboxed
#   .whl-*/ wheels too large for one call's 64 MiB with .whl (TileLang's: tilelang in one call,
#          its dependencies in the next); the task 'wheels' installs them into .venv, where
#          they stay while the machine is held
#
#   sh scripts/gpu_session.sh smoke test-gpu timing-trust          # in the foreground
#   sh scripts/gpu_session.sh --background adversarial bench-grader  # past one call's 10 minutes
#   sh scripts/gpu_session.sh --poll                                  # later calls, < 30 s apart
#
# Tasks: smoke (device, one example checked), solution (the reference solution checked, with
# the driver link it needs), tracks (the CuTe and TileLang examples checked), test-gpu (without
# the adversarial set), triton-warm (bench/triton_warm_probe.py), triton-key (bench/triton_key_probe.py),
# service-course (SERVICE_STOP: bench/service_course.py), examples (make grade of examples/ with the baselines), adversarial (ADV_GPUS: --gpus),
# timing-trust, bench, bench-grader (COPIES, BENCH_ARGS), kernel6 (bench/kernel6_check.py),
# lanes (COPIES, LANES, STOP_AFTER: a short course, then 1 GPU with lanes 3 and 1), lanes-warm
# (a cold course, then the same with its builds reused, lanes 3 and 1),
# wheels (.whl-*/ into .venv), ncu (kernel 6 and SDPA cuDNN profiled on the medium case),
# probe (bench/protocol_probe.py --solution $PROBE_ARGS), probe-path (a run stage's calls first
# or not), probe-spread (REPEAT: the solution's medians across processes), probe-beside (REPEAT:
# runs begun early beside the timed calls or not), verify-probe
# (bench/verify_probe.py), pause-twin (bench/pause_twin.py: the pause's attack twin), placement (PLACEMENT_ARGS: bench/placement_probe.py, one kernel's medians
# across buffer placements and processes), calibration-overlap (CALIBRATION_ARGS: bench/calibration_overlap_probe.py), course (COPIES, COURSE_STOP, COURSE_OUT: the 100-copy course on one
# GPU, cold), ahead (tests/test_ahead.py on the GPU), lanes-course (COPIES, LANES, LANES_STOP: the cold course
# with each lane count in turn), two-gpus (COPIES, TWO_STOP: one kernel's course on 1 and 2 GPUs).
# A background run works on a copy of the tree in /tmp/run, since every call replaces the tree
# it was started from.
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
RUN=/tmp/run

setup() {
    # Without the wheels, `make env` would try the network the GPU machine does not have, and
    # every task would fail after minutes of device time (session 13's first call): stop at once.
    if ! ls .whl/pytest_json_report-*.whl >/dev/null 2>&1; then
        echo "gpu_session: no .whl/ here: pass carry [\".whl\", \".deb\"] to the device call" >&2
        exit 3
    fi
    ls .deb/bubblewrap_*.deb >/dev/null 2>&1 || echo "gpu_session: WARNING: no .deb/bubblewrap: " \
        "runs are unsandboxed and their integrity results do not count" >&2
    if [ -d .whl ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl || exit 1
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    fi
    for deb in .deb/bubblewrap_*.deb; do
        [ -f "$deb" ] && dpkg -x "$deb" /tmp/bw && export PATH=/tmp/bw/usr/bin:$PATH
    done
    if command -v bwrap >/dev/null 2>&1; then export GRADER_SANDBOX=require; fi
    export PYTHONUNBUFFERED=1
    nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader
}

task() {
    name=$1
    log="$OUT/$name.log"   # a task named twice keeps both logs: name.log, name.2.log
    n=2; while [ -e "$log" ]; do log="$OUT/$name.$n.log"; n=$((n + 1)); done
    echo "== $name $(date -u +%H:%M:%S)"
    case $name in
        smoke) .venv/bin/python -m grader check examples/triton_flash ;;
        solution) make env && .venv/bin/python -c 'from grader.build.flags import driver_ldflags; print("driver link:", driver_ldflags())' \
                      && .venv/bin/python -m grader check solution ;;
        tracks) .venv/bin/python -m grader check examples/cute_flash \
                    && .venv/bin/python -m grader check examples/tilelang_flash ;;
        # the adversarial set's GPU test grades 48 submissions (about 18 minutes): its own task
        test-gpu) make test-gpu PYTEST_ARGS="-k 'not adversarial'" ;;
        examples) make grade RESULTS=results-examples && cp results-examples/grades.csv "$OUT/" ;;
        adversarial) make adversarial GPUS="${ADV_GPUS:-}"; python3 tests/adversarial/verdicts.py results-adversarial ;;
        # its figures are written whether or not the limits hold: bring them back either way
        timing-trust) make timing-trust; s=$?; cp bench/timing_trust.json "$OUT/timing_trust_$(date -u +%H%M%S).json" 2>/dev/null; (exit $s) ;;
        # where a timed call's time goes, per trusted kernel (the overhead figure's breakdown)
        probe) make env && .venv/bin/python bench/protocol_probe.py --solution ${PROBE_ARGS:-} \
                   && cp bench/protocol_probe.json "$OUT/" ;;
        # what a run stage's calls before the timed ones change in a trusted subject's (one
        # path for every timed row: run_stage.run_stage_calls), three processes each way
        probe-path) make env && .venv/bin/python bench/protocol_probe.py --only sdpa_cudnn,sdpa_flash \
                        --repeat 3 --profiler on --run-first both --calls 60 --out bench/protocol_probe_path.json \
                        && cp bench/protocol_probe_path.json "$OUT/" ;;
        # what runs begun early beside the timed calls change in a trusted subject's cost (issue 32)
        probe-beside) make env && .venv/bin/python bench/protocol_probe.py --only ${BESIDE_ONLY:-sdpa_cudnn} \
                        --repeat ${REPEAT:-5} --profiler on --run-first yes --calls 100 --beside 0 2 \
                        --out bench/protocol_probe_beside.json && cp bench/protocol_probe_beside.json "$OUT/" ;;
        # the reference solution's medians across processes (session 29's probe-share compared
        # a share of the calls with SDPA too; that option went with the change, commit 7aaa2cc)
        probe-spread) make env && .venv/bin/python bench/protocol_probe.py --solution --only solution \
                        --repeat ${REPEAT:-5} --profiler on --run-first yes --calls 100 \
                        --out bench/protocol_probe_processes.json && cp bench/protocol_probe_processes.json "$OUT/" ;;
        # the protocol's cost calibrated alone and with a lane's first runs begun beside it (issue 32)
        calibration-overlap) make env && .venv/bin/python bench/calibration_overlap_probe.py ${CALIBRATION_ARGS:-} \
                                 ; s=$?; cp bench/calibration_overlap_probe.json "$OUT/" 2>/dev/null; (exit $s) ;;
        # one kernel's medians across its buffers' placements in a process, and across processes
        placement) make env && .venv/bin/python bench/placement_probe.py ${PLACEMENT_ARGS:-} \
                       ; s=$?; cp bench/placement_probe.json "$OUT/" 2>/dev/null; (exit $s) ;;
        # the pause's attack twin (peek_inputs_py) beside honest_py, with the committed order and
        # with the idle moved after the inputs in a copy of the grader (bench/pause_twin.py)
        pause-twin) make env && .venv/bin/python bench/pause_twin.py \
                        ; s=$?; cp bench/pause_twin.json build/pause-twin/*.log "$OUT/" 2>/dev/null; (exit $s) ;;
        # what the timed loop's check of each output costs, part by part
        verify-probe) make env && .venv/bin/python bench/verify_probe.py && cp bench/verify_probe.json "$OUT/" ;;
        bench) make bench && cp bench/results.json "$OUT/" ;;
        # the figures' JSON is the newest bench/grader_bench*.json (BENCH_ARGS may name it: --out)
        bench-grader) make bench-grader COPIES="${COPIES:-100}" BENCH_ARGS="${BENCH_ARGS:-}" \
                          ; s=$?; cp "$(ls -t bench/grader_bench*.json | head -n 1)" "$OUT/"; (exit $s) ;;
        # issue 13's lanes: a short course first (stops here if any verdict is unexpected), then
        # 100 copies from a cold build cache with 3 lanes and with 1, side by side
        lanes) make bench-grader COPIES=6 BENCH_ARGS="--no-baselines --lanes 3 --out bench/grader_bench_lanes_smoke.json" \
                   && cp bench/grader_bench_lanes_smoke.json "$OUT/" \
                   && make bench-grader COPIES="${COPIES:-100}" BENCH_ARGS="--stop-after ${STOP_AFTER:-600} --no-baselines --lanes ${LANES:-3 1} --out bench/grader_bench_lanes.json" \
                   && cp bench/grader_bench_lanes.json "$OUT/" ;;
        # lanes on a regrade: a cold course of COPIES to fill the build cache (one lane), then
        # the same course with its builds reused, 3 lanes and 1 side by side
        lanes-warm) make bench-grader COPIES="${COPIES:-40}" BENCH_ARGS="--no-baselines --lanes 1 --out bench/grader_bench_lanes_cold.json" \
                        && cp bench/grader_bench_lanes_cold.json "$OUT/" \
                        && make bench-grader COPIES="${COPIES:-40}" BENCH_ARGS="--warm --no-baselines --lanes ${LANES:-3 1} --out bench/grader_bench_lanes_warm.json" \
                        && cp bench/grader_bench_lanes_warm.json "$OUT/" ;;
        # issue 32: the 100-copy course on one GPU from a cold build cache (COURSE_STOP: the most
        # seconds it is given), and one kernel's course on 1 GPU and on 2 (TWO_STOP each)
        course) out=${COURSE_OUT:-bench/grader_bench_course.json}
                # the builds' CPU priority as the kernel sees it, 90 s in (grader/isolation/priority.py)
                (sleep 90; cat /proc/sys/kernel/sched_autogroup_enabled; head -n 3 /proc/self/cgroup
                 for p in $(pgrep -f 'cicc|nvcc|ninja|loop.py|harness' | head -n 40); do
                     echo "$p $(ps -o ni=,comm= -p $p) $(cat /proc/$p/autogroup 2>/dev/null)"; done
                 uptime) > "$OUT/priority_sample.txt" 2>&1 &
                make bench-grader COPIES="${COPIES:-100}" BENCH_ARGS="--no-baselines --stop-after ${COURSE_STOP:-900} --out $out" \
                    ; s=$?; cp "$out" "$OUT/" 2>/dev/null
                # where each Triton copy's kernels were compiled (folders.jit_report), and what
                # each build compiled ahead (build/ahead.py)
                grep -H "grader: Triton kernels" build/bench-grader/results-*/logs/*.run.log > "$OUT/jit_report.txt" 2>/dev/null
                # the grading run's own log: its start (calibration, the first builds) and each result
                cp build/bench-grader/grade-*.log "$OUT/" 2>/dev/null
                grep -H -A3 "compiled ahead, with no GPU" build/bench-grader/results-*/logs/*.build.log > "$OUT/ahead_report.txt" 2>/dev/null
                # each Triton copy's first call on each case (CaseResult.run_s), and its run stage's parts
                python3 -c 'import glob, json
for f in sorted(glob.glob("build/bench-grader/results-*/**/triton_flash_*.json", recursive=True)):
    try: r = json.load(open(f))
    except Exception: continue
    print(f.rsplit("/", 1)[-1], [c.get("run_s") for c in r.get("cases", [])], r.get("stage_s"))' > "$OUT/case_run_s.txt" 2>&1
                (exit $s) ;;
        # Triton's kernels compiled ahead, with no GPU, found by a run on the GPU (tests/test_ahead.py)
        ahead) make env && .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_ahead.py -k "gpu or seed_its_run or warm" ;;
        # which part of Triton's cache key differs between the build's sandbox and the run's (issue 32)
        triton-key) make env && .venv/bin/python bench/triton_key_probe.py ;;
        # 20 students at once through the check service, then make grade on their folders (issue 33)
        service-course) make env && .venv/bin/python bench/service_course.py --stop-after ${SERVICE_STOP:-420} --out bench/service_gpu.json \
                      ; s=$?; cp bench/service_gpu.json build/service-course/leaderboard.html build/service-course/serve.log "$OUT/" 2>/dev/null; (exit $s) ;;
        # what a Triton copy's first calls still pay, cold, warmed, compiled ahead, both (issue 32)
        triton-warm) make env && .venv/bin/python bench/triton_warm_probe.py --out bench/triton_warm_probe.json \
                      ; s=$?; cp bench/triton_warm_probe.json "$OUT/" 2>/dev/null; (exit $s) ;;
        # issue 32's lanes on the cold 100-copy course, each lane count from its own cold build
        # cache, side by side on one machine (COPIES, LANES, LANES_STOP)
        lanes-course) make bench-grader COPIES="${COPIES:-100}" BENCH_ARGS="--no-baselines --lanes ${LANES:-3 2 1} --stop-after ${LANES_STOP:-270} --out bench/grader_bench_s23_lanes.json" \
                      && cp bench/grader_bench_s23_lanes.json "$OUT/" ;;
        two-gpus) two=${TWO_OUT:-bench/grader_bench_2gpus.json}
                  make bench-grader COPIES="${COPIES:-60}" GPUS="0 0,1" BENCH_ARGS="--honest examples/triton_flash --no-baselines --stop-after ${TWO_STOP:-300} --out $two" \
                      ; s=$?; cp "$two" "$OUT/" 2>/dev/null; cp build/bench-grader/grade-*.log "$OUT/" 2>/dev/null \
                      ; tar czf "$OUT/two_gpus_results.tgz" build/bench-grader/results-*/*.json \
                          build/bench-grader/results-*/logs/*.time.calls.json 2>/dev/null; (exit $s) ;;
        wheels) make env && for whl in .whl-*/*.whl; do
                    [ -f "$whl" ] && { .venv/bin/python -m pip install -q --no-index --no-deps "$whl" \
                                           || python3 -m pip --python .venv/bin/python install -q --no-index --no-deps "$whl"; }
                done; .venv/bin/python -c 'import tilelang; print("tilelang", tilelang.__version__)' ;;
        # kernel 6's second call and cuDNN's first, on the medium case (where 6 / cuDNN was 0.97x)
        ncu) make env && .venv/bin/python bench/profile_solution.py 2 64 4096 128 --cudnn \
                 && ncu --clock-control none --set full -k 'regex:attention_kernel6|cudnn|sdpa' \
                        --launch-skip 1 -c 2 -f -o "$OUT/ncu_medium" \
                        .venv/bin/python bench/profile_solution.py 2 64 4096 128 --cudnn \
                 && ncu --import "$OUT/ncu_medium.ncu-rep" --page details > "$OUT/ncu_medium_details.txt" \
                 && ncu --import "$OUT/ncu_medium.ncu-rep" --page raw --csv > "$OUT/ncu_medium_raw.csv" ;;
        kernel6) make env && .venv/bin/python bench/kernel6_check.py \
                     && cp bench/kernel6_check.json "$OUT/" ;;
        *) echo "unknown task: $name" >&2; return 2 ;;
    esac > "$log" 2>&1
    code=$?
    echo "== $name exited $code $(date -u +%H:%M:%S)"
    tail -n 25 "$log"
    return $code
}

case "${1:-}" in
    --poll)
        cat $RUN.status 2>/dev/null || echo "no background run"
        for log in $RUN-out/*.log; do [ -f "$log" ] && { echo "-- $log"; tail -n 5 "$log"; }; done
        cp $RUN-out/* "$OUT/" 2>/dev/null
        exit 0 ;;
    --background)
        shift
        rm -rf $RUN $RUN-out && mkdir -p $RUN-out && cp -a . $RUN
        (cd $RUN && OUT=$RUN-out setsid sh scripts/gpu_session.sh "$@" > $RUN.status 2>&1 &)
        echo "started in $RUN: $*"
        exit 0 ;;
esac

setup
status=0
for name in "$@"; do
    task "$name" || status=1
done
exit $status
