"""The student release: exactly the allowed files, nothing instructor-only, and it works."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

from grader.common import config

from .conftest import has_nvcc

ROOT = config.REPO_ROOT
spec = importlib.util.spec_from_file_location("release", ROOT / "scripts" / "release.py")
release = importlib.util.module_from_spec(spec)
spec.loader.exec_module(release)

EXPECTED = {
    "README.md", "Makefile", "client.mk", "pyproject.toml", "scripts/bootstrap.sh",
    "test_cases/test.txt", "test_cases/cpu.txt",
    "templates/leaderboard.html.j2", "student/README.md", "student/Makefile",
    "student/submission.cu", "student/triton/submission.py", "student/tilelang/submission.py",
    "student/cute/submission.cu",
    "grader/skeleton/submission.cu", "grader/skeleton/submission.py",
    "grader/skeleton/tilelang_submission.py",
    "grader/skeleton/cute_submission.cu",
} | {str(p.relative_to(ROOT)) for p in (ROOT / "grader").rglob("*.py") if "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """`make release` in a checkout with no .venv (a fresh clone: what release.py reads and the
    Makefile): the checkout, and the archive it built."""
    repo = tmp_path_factory.mktemp("course")
    needed = [src for src, _ in release.release_files()] + [
        ROOT / p for p in ("Makefile", "scripts/release.py", "solution/submission.cu",
                           "test_cases/hidden.txt")]
    for src in needed:
        (repo / src.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, repo / src.relative_to(ROOT))
    proc = subprocess.run(["make", "release", f"DIST={repo / 'dist'}"], cwd=repo, env=kit_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return repo, repo / "dist" / f"{release.NAME}.tar.gz"


@pytest.fixture(scope="module")
def unpacked(released, tmp_path_factory):
    _, archive = released
    dest = tmp_path_factory.mktemp("unpacked")
    with tarfile.open(archive) as tar:
        # the 'data' filter (safe extraction) exists from Python 3.11.4 / 3.12 on
        tar.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return dest / release.NAME


def test_archive_holds_exactly_the_student_files(unpacked):
    files = {str(p.relative_to(unpacked)) for p in unpacked.rglob("*") if p.is_file()}
    assert files == EXPECTED


def test_nothing_instructor_only_leaks(unpacked):
    solution = (ROOT / "solution" / "submission.cu").read_text()
    # (the PTX instructions' own names, mma.sync.aligned and ldmatrix.sync.aligned, are in the
    # handout's appendix on purpose: these are the solution's own names)
    markers = ["Reference solution (instructors only", "attention_kernel3", "ldmatrix_x4_trans",
               "swizzle<D>(", "fast_exp2"]
    assert all(m in solution for m in markers)   # the markers really are the solution's
    hidden = [l.strip() for l in (ROOT / "test_cases" / "hidden.txt").read_text().splitlines()
              if l.strip() and not l.startswith("#")]
    example = (ROOT / "examples" / "tiled_cuda" / "submission.cu").read_text()
    example_line = next(l.strip() for l in example.splitlines() if "__shfl_sync(0xffffffff, p, j)" in l)
    # the CuTe example's softmax and P·V: the CuTe template ships their TODOs, never these lines
    cute_example = (ROOT / "examples" / "cute_flash" / "submission.cu").read_text()
    cute_lines = ["const float p = exp2f(fmaf(s_rc(r, c), scale_log2, -m_scaled));",
                  "gemm(tiled_mma, tOrP(_, _, kk), tOrVt(_, _, kk), acc_o);"]
    assert all(l in cute_example for l in cute_lines)
    for path in unpacked.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert not any(m in text for m in markers), path
            assert not any(h in text for h in hidden), path
            assert example_line not in text, path   # a correct kernel from examples/
            assert not any(l in text for l in cute_lines), path


def test_leak_check_refuses_planted_content(tmp_path):
    (tmp_path / "student").mkdir()
    solution_line = next(l for l in (ROOT / "solution" / "submission.cu").read_text().splitlines()
                         if "cp.async.cg.shared.global" in l)
    (tmp_path / "student" / "submission.cu").write_text("// mine\n" + solution_line + "\n")
    (tmp_path / "notes.txt").write_text("hello")
    problems = release.find_leaks(tmp_path)
    assert any("notes.txt: not on the allow-list" in p for p in problems)
    assert any("student/submission.cu: contains instructor-only content" in p for p in problems)


HIDDEN = [dict((k.strip(), int(v)) for k, v in (f.split(":") for f in line.split(";")))
          for line in (l.split("#", 1)[0].strip() for l in
                       (ROOT / "test_cases" / "hidden.txt").read_text().splitlines()) if line]
# What the handout says of the hidden cases on purpose: "sequence lengths that are not a multiple
# of the tile, as small as 1; head_dim 64". Any other hidden sequence length is a leak.
DISCLOSED_SEQ_LENS = {1}


def hidden_shape_hits(text: str) -> list[str]:
    """Every place `text` names a hidden case: a hidden sequence length after a key or in a list
    after one (`seq_len: 77`, `S = 1, 77`, `"seq_len": 77`, `S=77`, `seqlen 77`), in a case id
    (`_s77_d64`) or a shape tuple; a hidden case's id; a hidden seed after `seed`."""
    hits = []
    for c in HIDDEN:
        b, h, s, d, seed = c["batch_size"], c["num_heads"], c["seq_len"], c["head_dim"], c["seed"]
        found = [re.search(rf"b{b}_h{h}_s{s}_d{d}", text),
                 re.search(rf"\(\s*{b}\s*,\s*{h}\s*,\s*{s}\s*,\s*{d}\s*\)", text),
                 re.search(rf"\bseed\W{{0,3}}{seed}\b", text, re.I)]
        if s not in DISCLOSED_SEQ_LENS:
            found += [re.search(rf"\b(?:seq_?len|seqlen|sequence lengths?|S|N)\W{{0,4}}"
                                rf"(?:(?:of|is)\s+)?(?:\d+\W{{1,3}})*{s}\b", text, re.I),
                      re.search(rf"_s{s}_d", text)]
        hits += [m.group(0) for m in found if m]
    return hits


def test_the_leak_scan_finds_hidden_shapes_however_written():
    planted = ["test with S = 1, 77, 1000, 2049 in mind", "seq_len: 113", '{"seq_len": 4097}',
               "b1_h2_s77_d64", "(2, 3, 2049, 128)", "`S` = 2049", "seed: 19", "a seq_len of 1000"]
    for text in planted:
        assert hidden_shape_hits(text), text
    fine = ["sequence lengths that are not a multiple of the tile, as small as 1; head_dim 64",
            "(4, 64, 8192, 128)", "seq_len: 1024; head_dim: 128; seed: 1118", "numel >= 1000",
            "S = 1"]
    for text in fine:
        assert not hidden_shape_hits(text), text


def test_the_release_names_no_hidden_shape_and_no_instructor_path(unpacked):
    for path in sorted(p for p in unpacked.rglob("*") if p.is_file()):
        rel = path.relative_to(unpacked)
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            where = f"{rel}:{lineno}: {line.strip()}"
            assert not hidden_shape_hits(line), where
            assert not re.search(r"hidden\.txt|\bsolution/|/\s*\"solution\"", line), where
    handout = (unpacked / "student" / "README.md").read_text()
    assert "sequence lengths that are not a multiple of the tile, as small\n  as 1; `head_dim` 64" in handout
    # the shipped grader still runs: the scrubbed settings are paths that do not exist
    proc = subprocess.run([sys.executable, "-c", "from grader.common import config; import grader.cli.main; "
                           "print(config.HIDDEN_CASES.exists(), config.SOLUTION_DIR.is_dir())"],
                          cwd=unpacked, capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["False", "False"], proc.stderr[-2000:]


def test_the_release_is_refused_when_the_handout_names_a_hidden_shape(tmp_path):
    (tmp_path / "student").mkdir()
    (tmp_path / "student" / "README.md").write_text("Mind the tails: S = 1, 77, 1000, 2049.\n")
    (tmp_path / "README.md").write_text("the cases live in test_cases/hidden.txt\n")
    problems = release.find_leaks(tmp_path)
    assert any(p.startswith("student/README.md:1: names a hidden case (seq_len 77)") for p in problems)
    assert any(p.startswith("README.md:1: names an instructor-only path") for p in problems)


def kit_env() -> dict:
    """The environment of a student's `make` in the unpacked kit: the set-up reuses this
    interpreter's packages (as on a machine that has them: no download), and no Makefile
    variables leak in from the make that runs the tests."""
    env = dict(os.environ, PYTHON_BASE=sys.executable, TORCH_SPEC="torch")
    env["GRADER_CUDA_INCLUDE"] = env.get("GRADER_CUDA_INCLUDE", str(ROOT / ".venv" / "cuda-include"))
    for name in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "SUBMISSION", "VERBOSE", "WITH_TRITON",
                 "WITH_TILELANG"):
        env.pop(name, None)
    return env


INSTRUCTOR_ONLY = ("NOT SANDBOXED", "hidden.txt", "the solution", "Failed to initialize NumPy",
                   "GRADER_SANDBOX")


@pytest.mark.slow
@pytest.mark.skipif(not has_nvcc(), reason="the compile check needs nvcc")
def test_make_check_from_the_unpacked_release(unpacked):
    proc = subprocess.run(["make", "check", "VERBOSE=1"], cwd=unpacked, env=kit_env(),
                          capture_output=True, text=True, timeout=900)
    out = proc.stdout
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "student: NOT_RUN" in out and "compiled; not run: no CUDA device" in out
    assert "The first TODO still on the skeleton's code is TODO(1.1): the score" in out
    assert "Compiled for sm_90a, the course GPU's architecture" in out
    assert re.search(r"attention_kernel1<64>\s+\d+ registers\s+0 B spill stores", out), out[-2000:]
    assert not [w for w in INSTRUCTOR_ONLY if w in out + proc.stderr]


@pytest.mark.slow
@pytest.mark.skipif(not has_nvcc(), reason="the compile check needs nvcc")
def test_make_check_of_the_cute_track_from_the_unpacked_release(unpacked):
    """A fresh kit's CuTe template compiles as shipped on a machine without a GPU: the set-up
    provides the CUTLASS/CuTe headers (the nvidia-cutlass wheel) and every CUDA build has them on
    its include path (grader/build/flags.py)."""
    proc = subprocess.run(["make", "check", "SUBMISSION=student/cute"], cwd=unpacked,
                          env=kit_env(), capture_output=True, text=True, timeout=900)
    out = proc.stdout
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "cute: NOT_RUN" in out and "compiled; not run: no CUDA device" in out, out[-3000:]
    assert "cutlass_library/source/include" in (unpacked / "results" / "check" / "cute" / "logs"
                                                / "cute.build.log").read_text()
    assert not [w for w in INSTRUCTOR_ONLY if w in out + proc.stderr]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="this machine has no Triton wheel (the kit's set-up says so too)")
def test_make_check_of_the_triton_track_from_the_unpacked_release(unpacked):
    """A fresh kit's two commands work for the Triton track on a machine without a GPU: the
    set-up provides Triton's interpreter and numpy, the skeleton runs on the kit's small CPU cases
    (the public ones are too large), and the check names the first open TODO."""
    proc = subprocess.run(["make", "check", "SUBMISSION=student/triton"], cwd=unpacked,
                          env=kit_env(), capture_output=True, text=True, timeout=900)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in text, text[-4000:]   # the skeleton is wrong
    # its cases ran on the CPU, and its first word says so; the public cases sized for a GPU did not
    assert ("\ntriton: CPU-MISMATCH (on the CPU: 4 of 7 cases ran; the 3 others need a GPU: not "
            "run)\n") in "\n" + proc.stdout, proc.stdout[-3000:]
    assert re.search(r"not run\s+b4_h64_s8192_d128\n", proc.stdout)
    assert "ran on the CPU: 4 of 7 cases (no CUDA device)" in proc.stdout
    assert ("O is all zeros: nothing was written to it. Start with TODO(1.1) (the scores) and "
            "TODO(1.4) (writing the output). The first TODO still on the skeleton's code is "
            "TODO(1.1): load the K tile") in proc.stdout
    assert "No module named" not in text and not [w for w in INSTRUCTOR_ONLY if w in text]
    # a file instead of its folder: a usage error that names the fix, not a verdict
    proc = subprocess.run(["make", "check", "SUBMISSION=student/triton/submission.py"],
                          cwd=unpacked, env=kit_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "BUILD_ERROR" not in proc.stdout
    assert ("student/triton/submission.py is a file; check takes the folder that holds it: "
            "make check SUBMISSION=student/triton") in proc.stderr


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("tilelang") is None or not has_nvcc(),
                    reason="TileLang compiles with nvcc; this machine lacks TileLang or nvcc")
def test_make_check_of_the_tilelang_track_from_the_unpacked_release(unpacked):
    """Without a GPU the TileLang skeleton is compiled for the course GPU and not run, and the
    check says exactly that: never a pass, never a case it did not run."""
    proc = subprocess.run(["make", "check", "SUBMISSION=student/tilelang"], cwd=unpacked,
                          env=kit_env(), capture_output=True, text=True, timeout=900)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in text, text[-4000:]
    # nothing ran, and nothing says a case ran (issue 34: "ran on the CPU: 4 of 7 cases")
    assert "\ntilelang: NOT_RUN (nothing ran: no CUDA device)\n" in "\n" + proc.stdout, \
        proc.stdout[-3000:]
    assert "ran on the CPU" not in proc.stdout and not re.search(r"\d+ of \d+ cases ran", proc.stdout)
    assert "PASS" not in proc.stdout and "pass" not in proc.stdout.split("Cases:")[1].split("Hint")[0]
    assert ("TileLang lowered your kernel to CUDA and nvcc compiled it for sm_90a on 4 small cases; "
            "none of them ran (TileLang has no CPU interpreter)") in proc.stdout
    assert "The first TODO still on the skeleton's code is TODO(1.1): the online softmax's state" \
        in proc.stdout
    assert not [w for w in INSTRUCTOR_ONLY if w in text]


def test_handout_performance_table_is_generated_from_the_bench_results():
    spec = importlib.util.spec_from_file_location("perf_table", ROOT / "scripts" / "perf_table.py")
    perf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(perf)
    results = perf.json.loads(perf.RESULTS.read_text())
    stale = [p.name for p, text in perf.regenerate(results).items() if p.read_text() != text]
    assert not stale, f"{stale}: performance figures stale or hand-edited: run scripts/perf_table.py"
    handout = perf.HANDOUT.read_text()
    assert results["device"] in handout and "SDPA FLASH" in handout


@pytest.mark.slow
@pytest.mark.skipif(not has_nvcc(), reason="the compile check needs nvcc")
def test_a_slow_compile_in_the_unpacked_release_names_the_limit_to_raise(unpacked, tmp_path):
    """Issue 34: on a busy laptop the skeleton's compile check ran past its limit and the check
    said ENVIRONMENT_ERROR, "the instructor fixes the machine", and "Compiled for sm_90a". From
    the kit's student/ folder, `make check GRADER_BUILD_S=40` with an nvcc that compiles and then
    hangs (sleep: slow for certain on any machine) must: reach the grader (the limit it names is
    40 s), show the compile's progress while it runs, and end with a timeout of this machine
    that names the variable to raise, never a "Compiled for" line. A student's laptop has no
    bubblewrap (GRADER_SANDBOX=off): the wrapper lives outside the folders a sandbox shows."""
    import shlex
    from grader.build.watch import BUILD_PHASES, STARTING
    from grader.isolation.device import find_nvcc
    cuda = tmp_path / "slow-cuda"
    (cuda / "bin").mkdir(parents=True)
    nvcc = cuda / "bin" / "nvcc"
    # no exec: the hang stays this "nvcc" process (its sleep a child), as a hanging nvcc would be;
    # an exec'd sleep left only Python in the tree (then called STARTING), once the real
    # compile ended within the 40 s (a fast machine)
    nvcc.write_text(f'#!/bin/sh\n{shlex.quote(find_nvcc())} "$@" || exit\nsleep 600\n')
    nvcc.chmod(0o755)
    env = dict(kit_env(), CUDA_HOME=str(cuda), GRADER_SANDBOX="off")
    proc = subprocess.run(["make", "check", "GRADER_BUILD_S=40"], cwd=unpacked / "student",
                          env=env, capture_output=True, text=True, timeout=1200)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode != 0, out[-3000:] + err[-3000:]   # make's 2: the check's 1
    assert "student: TIMEOUT" in out, out[-3000:]
    assert "the compile of submission.cu did not finish in 40 s" in out, out[-3000:]
    assert "this machine may be slow or busy" in out and "make check GRADER_BUILD_S=900" in out
    progress = re.findall(r"student: build: compiling submission\.cu(?:: ([^,]+))?, (\d+) s "
                          r"\(limit 40 s: GRADER_BUILD_S\)", err)
    assert len(progress) >= 2, err[-3000:]   # one every 12 s of the 40
    phases = {p for p, _ in progress}
    assert phases & {*BUILD_PHASES, "nvcc", STARTING}, err[-3000:]
    # where it was when the limit stopped it: one of nvcc's tools, or the wrapper's sleep
    stopped_in = re.search(r"did not finish in 40 s \(it was in: (.+?)\): this machine", out)
    assert stopped_in and stopped_in.group(1) in {*BUILD_PHASES, "nvcc"}, out[-3000:] + err[-2000:]
    assert "check] Error 1" in err   # the grader's own exit status: a verdict, not a usage error
    for wrong in ("Compiled for", "ENVIRONMENT_ERROR", "environment_error", "instructor",
                  "tried twice", *INSTRUCTOR_ONLY):
        assert wrong not in out + err, wrong


# ---------------------------------------------------------------- issue 34: one set-up, parallel checks


def test_make_release_makes_no_venv(released):
    """`make release` needs only the base Python (release.py uses its standard library): it made
    a .venv the kit could not use (a venv cannot move), and the kit's first `make check` then made
    its own. Now it sets up nothing, and the archive holds no venv."""
    repo, archive = released
    assert not (repo / ".venv").exists()
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert names and not [n for n in names if ".venv" in n.split("/")]


def tiny_wheel(folder, name: str):
    """A wheel of one empty module, for pip to install offline."""
    import zipfile
    info = f"{name}-1.0.dist-info"
    files = {f"{name}.py": "",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(folder / f"{name}-1.0-py3-none-any.whl", "w") as z:
        for path, text in files.items():
            z.writestr(path, text)


@pytest.mark.slow
def test_the_kits_set_up_keeps_pips_output_in_a_log(unpacked, tmp_path):
    """The kit's one set-up shows a line per step and keeps pip's own output (41 warnings in the
    trial of issue 34) in .venv/setup.log; a step pip fails names the log and shows its last
    lines. Offline (the kit's .whl folder): a dependency there installs, one nowhere fails."""
    kit = tmp_path / "kit"
    shutil.copytree(unpacked, kit, ignore=shutil.ignore_patterns(".venv", "results", "build"))
    (kit / ".whl").mkdir()
    tiny_wheel(kit / ".whl", "setup_log_probe")
    pyproject = kit / "pyproject.toml"
    original = pyproject.read_text()
    last = '    "nvidia-ml-py",\n'
    assert last in original

    def set_up(*deps: str) -> subprocess.CompletedProcess:
        pyproject.write_text(original.replace(last, last + "".join(f'    "{d}",\n' for d in deps)))
        return subprocess.run(["make", "env"], cwd=kit, env=kit_env(), capture_output=True,
                              text=True, timeout=1200)

    log = kit / ".venv" / "setup.log"
    failed = set_up("setup_log_probe", "no_such_package_for_this_test")
    assert failed.returncode != 0, failed.stdout[-3000:]
    assert ("bootstrap: pip install failed, so set-up stopped; the set-up's output is in "
            ".venv/setup.log, whose last lines are:") in failed.stderr, failed.stderr[-3000:]
    shown = [l for l in failed.stderr.splitlines() if "no_such_package_for_this_test" in l]
    assert any("No matching distribution found" in l for l in shown), failed.stderr[-3000:]
    assert all(l.startswith("    ") for l in shown)   # pip's lines only as the log's tail
    assert "No matching distribution found for no_such_package_for_this_test" in log.read_text()

    done = set_up("setup_log_probe")
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-3000:]
    assert "bootstrap: installing setup_log_probe" in done.stdout
    assert re.search(r"^bootstrap: ready in \d+ s \(torch .*\); the set-up's log: \.venv/setup\.log$",
                     done.stdout, re.M), done.stdout
    assert [l for l in text.splitlines() if l.strip() and not l.startswith("bootstrap: ")] == []
    assert len(text.splitlines()) <= 8
    logged = log.read_text()
    assert "Successfully installed setup_log_probe-1.0" in logged
    assert "no_such_package_for_this_test" not in logged   # the log is this set-up's


def test_checks_of_two_folders_run_at_once_and_one_folder_twice_names_out(unpacked, tmp_path):
    """Issue 34: a Triton check was refused while a CUDA compile held results/check. Each folder's
    check has a results folder of its own (results/check/<folder>): a check runs while another
    folder's check holds its lock, and a second check of the same folder is refused with the way
    around (--out). The first check is stood for by its lock, held here."""
    from grader.course.locks import folder_lock
    for name in ("mine_a", "mine_b"):
        (unpacked / name).mkdir(exist_ok=True)
        (unpacked / name / "submission.py").write_text("def custom_kernel(data):\n    return data[0]\n")
    cases = tmp_path / "cases.txt"
    cases.write_text("batch_size: 1; num_heads: 1; seq_len: 5; head_dim: 64; seed: 3\n")

    def check(name: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "grader", "check", name, "--cases", str(cases),
                               "--no-hidden", "--cpu", "--build-dir", str(tmp_path / "build")],
                              cwd=unpacked, env=dict(kit_env(), GRADER_SANDBOX="off"),
                              capture_output=True, text=True, timeout=900)

    running = folder_lock(unpacked / "results" / "check" / "mine_a")   # mine_a's check, running
    running.acquire()
    try:
        other = check("mine_b")
        same = check("mine_a")
    finally:
        running.release()
    assert other.returncode == 1, other.stdout[-3000:] + other.stderr[-3000:]   # returns Q: mismatch
    assert other.stdout.startswith("mine_b: CPU-MISMATCH") and "in use" not in other.stderr
    assert (unpacked / "results" / "check" / "mine_b" / "mine_b.json").is_file()
    assert same.returncode == 2 and same.stdout == ""
    assert "the results folder" in same.stderr and "is in use by another grading run" in same.stderr
    assert re.search(r"or give this run a results folder of its own with --out: \S*python\S* -m grader "
                     r"check mine_a .*--out results/check/mine_a-2\. Lock file", same.stderr), same.stderr
    assert not (unpacked / "results" / "check" / "mine_a" / "mine_a.json").exists()
