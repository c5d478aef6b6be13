"""The build cache (grader/build/cache.py): a hit gives back the exact files and the build stage's
result without compiling; a corrupted, partial or foreign entry is never used; nothing is cached
without a sandbox; the key changes with everything that decides a build and with the id."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grader.build import stage as build
from grader.build import flags as build_flags, headers as build_headers

from grader.common import config
from grader.build.stage import build_submission
from grader.build.inputs import build_inputs
from grader.course.verdicts import BuildResult
from grader.build.cache import MANIFEST, TMP_PREFIX, BuildCache, empty_folder
from grader.isolation.device import DeviceInfo
from grader.stages.judge import audit_build
from grader.isolation.cpus import CpuSplit, default_build_jobs
from grader.isolation.sandbox import Sandbox
from grader.common.status import Status
from grader.course.submission import inspect_folder

from .conftest import EXAMPLES, has_nvcc

# A CPU machine with an nvcc: CUDA submissions are compile-checked (mode 'compile_only').
CPU = DeviceInfo(cuda=False, name="cpu", capability=None, arch="90a", l2_bytes=0, memory_bytes=0,
                 sm_count=0, driver="none", torch_version="2.13.0+cpu", cuda_version=None,
                 nvcc=sys.executable, python="3.11.7")
GPU = dataclasses.replace(CPU, cuda=True, name="gpu", capability=(9, 0), cuda_version="13.0")
SANDBOX = Sandbox("/usr/bin/bwrap")   # active: what the cache is keyed and gated on


def inputs(**changes) -> dict:
    return {"mode": "compile_only", "module": "sub_a_0123456789", "source": "f" * 64, **changes}


def fake_build(tmp_path: Path, files: dict[str, bytes]) -> Path:
    folder = tmp_path / "built"
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def test_a_stored_build_is_restored_exactly_and_a_different_key_misses(tmp_path):
    cache = BuildCache(tmp_path / "cache", sandboxed=True)
    files = {"sub_a.so": os.urandom(300_000), "cuda.cuda.o": b"\x7fELF object"}
    built = fake_build(tmp_path, files)
    assert cache.store(inputs(), built, list(files), compile_s=41.5, log="nvcc ...\nok\n",
                       log_tail="warning: x") == ""
    into = tmp_path / "students" / "sub_a"
    fake_build(into.parent, {})
    into.mkdir()
    (into / "stale.o").write_bytes(b"an earlier build's object")   # never left beside a restore
    hit = cache.restore(inputs(), into)
    assert hit is not None and hit.compile_s == 41.5 and hit.log == "nvcc ...\nok\n"
    assert hit.log_tail == "warning: x" and set(hit.files) == set(files)
    assert {p.name: p.read_bytes() for p in into.iterdir()} == files
    assert cache.restore(inputs(source="e" * 64), into) is None
    assert cache.restore(inputs(module="sub_b_0123456789"), into) is None


@pytest.mark.parametrize("damage", ["flip_byte", "truncate", "delete_file", "bad_manifest",
                                    "foreign_manifest", "no_manifest"])
def test_a_damaged_entry_is_never_used_and_is_removed(tmp_path, damage, capsys):
    cache = BuildCache(tmp_path / "cache", sandboxed=True)
    files = {"m.so": os.urandom(70_000), "cuda.cuda.o": os.urandom(5_000)}
    cache.store(inputs(), fake_build(tmp_path, files), list(files), compile_s=1.0, log="", log_tail="")
    entry = next(p for p in (tmp_path / "cache").glob("*/*") if p.is_dir())
    so = entry / "m.so"
    if damage == "flip_byte":
        data = bytearray(so.read_bytes())
        data[1234] ^= 1
        so.write_bytes(bytes(data))
    elif damage == "truncate":   # a store killed mid-write would leave this, were it not renamed last
        so.write_bytes(so.read_bytes()[:1000])
    elif damage == "delete_file":
        so.unlink()
    elif damage == "bad_manifest":
        (entry / MANIFEST).write_text('{"schema": 1, "key": ')
    elif damage == "foreign_manifest":
        manifest = json.loads((entry / MANIFEST).read_text())
        manifest["inputs"]["source"] = "0" * 64
        (entry / MANIFEST).write_text(json.dumps(manifest))
    else:
        (entry / MANIFEST).unlink()
    into = tmp_path / "into"
    assert cache.restore(inputs(), into) is None
    assert not into.exists() or not any(into.iterdir())   # nothing half-restored is left
    if damage != "no_manifest":
        assert not entry.exists() and "build cache: removed entry" in capsys.readouterr().err
    # the next successful build is stored again and used
    cache.store(inputs(), fake_build(tmp_path, files), list(files), compile_s=1.0, log="", log_tail="")
    assert cache.restore(inputs(), into) is not None and (into / "m.so").read_bytes() == files["m.so"]


def test_a_store_that_was_killed_leaves_nothing_a_lookup_reads(tmp_path, monkeypatch):
    cache = BuildCache(tmp_path / "cache", sandboxed=True)
    files = {"m.so": b"module", "cuda.cuda.o": b"object"}

    def killed(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr("grader.build.cache._write_synced", killed)   # dies before the manifest
    why = cache.store(inputs(), fake_build(tmp_path, files), list(files), compile_s=1, log="", log_tail="")
    assert why.startswith("not stored:") and "No space left" in why
    assert cache.restore(inputs(), tmp_path / "into") is None
    assert not list((tmp_path / "cache").glob(f"{TMP_PREFIX}*"))
    # a temporary folder a kill -9 left behind is never read, and pruned once stale
    stale = tmp_path / "cache" / f"{TMP_PREFIX}deadbeef-0000"
    stale.mkdir()
    (stale / MANIFEST).write_text("{}")
    os.utime(stale, (0, 0))
    cache.prune()
    assert not stale.exists()


def test_no_cache_without_a_sandbox(tmp_path):
    cache = BuildCache(tmp_path / "cache", sandboxed=False)
    files = {"cuda.cuda.o": b"object"}
    assert not cache.usable and "not sandboxed" in cache.describe()
    assert "not sandboxed" in cache.store(inputs(), fake_build(tmp_path, files), list(files),
                                          compile_s=1, log="", log_tail="")
    assert not (tmp_path / "cache").exists()
    assert cache.restore(inputs(), tmp_path / "into") is None


def test_least_recently_used_entries_go_first_past_the_size_limit(tmp_path):
    cache = BuildCache(tmp_path / "cache", sandboxed=True, max_bytes=250_000)
    for i in range(3):   # about 100 kB each: the third store goes past the limit
        if i == 2:   # entry 0 is used again: entry 1 is now the least recently used
            assert cache.restore(inputs(source="0" * 64), tmp_path / "into") is not None
        cache.store(inputs(source=str(i) * 64), fake_build(tmp_path, {"m.so": os.urandom(100_000)}),
                    ["m.so"], compile_s=1, log="", log_tail="")
        if i < 2:
            manifest = tmp_path / "cache" / cache.key(inputs(source=str(i) * 64))[:2] / \
                cache.key(inputs(source=str(i) * 64)) / MANIFEST
            os.utime(manifest, (1000 + i, 1000 + i))
    kept = {json.loads(m.read_text())["inputs"]["source"][0]
            for m in (tmp_path / "cache").glob("*/*/" + MANIFEST)}
    assert kept == {"0", "2"}


def test_the_key_covers_what_decides_a_build_and_the_id(tmp_path, monkeypatch):
    for name in ("alice", "bob"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "submission.cu").write_text("// the same file\n")
    alice, bob = inspect_folder(tmp_path / "alice"), inspect_folder(tmp_path / "bob")
    key = lambda sub, device=CPU: BuildCache.key(build_inputs(sub, device))
    base = key(alice)
    assert key(alice) == base   # deterministic
    # identical files, different ids: the module name (PyInit_<name>) is compiled in
    assert key(bob) != base
    assert key(alice, GPU) != base                               # extension, not compile check
    assert key(alice, dataclasses.replace(CPU, arch="100a")) != base
    assert key(alice, dataclasses.replace(CPU, torch_version="2.14.0+cpu")) != base
    assert key(alice, dataclasses.replace(GPU, cuda_version="12.8")) != key(alice, GPU)
    monkeypatch.setenv("NVCC_APPEND_FLAGS", "-DX=1")
    assert key(alice) != base
    monkeypatch.delenv("NVCC_APPEND_FLAGS")
    monkeypatch.setenv(build_flags.PTXAS_VERBOSE_ENV, "1")             # check --verbose: other flags
    assert key(alice) != base
    monkeypatch.delenv(build_flags.PTXAS_VERBOSE_ENV)
    (tmp_path / "alice" / "helper.cuh").write_text("// any file of the folder\n")
    assert key(alice) != base
    (tmp_path / "alice" / "helper.cuh").unlink()
    assert key(alice) == base
    monkeypatch.setattr("grader.build.inputs.build_code_digest", lambda: "another grader")
    assert key(alice) != base


def _object(tmp_path: Path, c_source: str) -> bytes:
    """A real object file (the reach audit reads its imports with nm)."""
    src, obj = tmp_path / "unit.c", tmp_path / "unit.o"
    src.write_text(c_source)
    subprocess.run(["gcc", "-c", str(src), "-o", str(obj)], check=True)
    return obj.read_bytes()


@pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("nm") is None,
                    reason="needs gcc and binutils")
@pytest.mark.parametrize("device", [CPU, GPU], ids=["compile_check", "extension"])
def test_a_hit_reproduces_the_build_stage_and_what_the_audit_reads(tmp_path, monkeypatch, device):
    """build_submission through the cache: the first build compiles and is stored, the second
    compiles nothing and leaves the same files, the same result and the same audit verdict; a
    build that fails or times out is never stored."""
    objects = {"honest": _object(tmp_path, "int scale(int x) { return 2 * x; }\n"),
               "dlopen": _object(tmp_path, "#include <dlfcn.h>\n"
                                           "void *f(void) { return dlopen(\"x\", 0); }\n")}
    compiled = []

    def compile_(sub, *, build_dir, device, limits, log_path, sandbox):
        compiled.append(sub.id)
        text = sub.source.read_text()
        mode = build.cuda_mode(device)
        if "broken" in text or "slow" in text:
            status = Status.BUILD_ERROR if "broken" in text else Status.TIMEOUT
            return BuildResult(status, mode, 3.0, message="compile failed"), "error: x"
        build_dir.mkdir(parents=True, exist_ok=True)
        (build_dir / build.STUDENT_OBJECT).write_bytes(objects[text.split()[1]])
        build_headers.record_headers(build_dir, [str(sub.source)], how="test", base=build_dir)
        if mode == "extension":
            (build_dir / f"{sub.module_name}.so").write_bytes(b"module of " + sub.id.encode())
        (build_dir / "build.ninja").write_text("not cached")
        return (BuildResult(Status.PASS, mode, 40.0, artifact=build.artifact_path(
            build_dir, mode, sub.module_name), log_tail="warning: unused"), "ptxas info: 40 registers")
    monkeypatch.setattr(build, "_build_once", compile_)
    monkeypatch.setattr(build, "machine_load", lambda: 0.0)   # a timeout is the submission's
    cache = BuildCache(tmp_path / "build" / "cache", sandboxed=True)
    for name, text in [("alice", "// honest"), ("mallory", "// dlopen"), ("bob", "// broken"),
                       ("carol", "// slow")]:
        (tmp_path / "subs" / name).mkdir(parents=True)
        (tmp_path / "subs" / name / "submission.cu").write_text(text + "\n")

    def grade(name: str, log: Path, sandbox: Sandbox = SANDBOX) -> tuple[BuildResult, BuildResult, dict]:
        sub = inspect_folder(tmp_path / "subs" / name)
        build_dir = tmp_path / "build" / "students" / sub.module_name
        built = build_submission(sub, build_dir=build_dir, device=device, limits=config.Limits(),
                                 log_path=log, sandbox=sandbox, cache=cache)
        files = {p.name: p.read_bytes() for p in build_dir.iterdir()} if build_dir.exists() else {}
        return built, audit_build(sub, built, build_dir), files

    first = {n: grade(n, tmp_path / f"{n}.1.log") for n in ("alice", "mallory", "bob", "carol")}
    assert compiled == ["alice", "mallory", "bob", "carol"]
    second = {n: grade(n, tmp_path / f"{n}.2.log") for n in ("alice", "mallory", "bob", "carol")}
    assert compiled[4:] == ["bob", "carol"]   # failures are compiled again: never cached
    for name in ("alice", "mallory"):
        (b1, a1, f1), (b2, a2, f2) = first[name], second[name]
        assert b2.reused and not b1.reused and b2.elapsed_s < 5
        assert dataclasses.replace(b2, reused=False, elapsed_s=b1.elapsed_s) == b1
        assert (a2.status, a2.message) == (a1.status, a1.message)
        assert f2 == {k: v for k, v in f1.items() if k != "build.ninja"}
        log = (tmp_path / f"{name}.2.log").read_text()
        assert log.startswith("[build cache: nothing compiled") and "ptxas info: 40 registers" in log
    assert first["alice"][1].status is Status.PASS
    assert first["mallory"][1].status is Status.FLAGGED and "dlopen" in first["mallory"][1].message
    assert not any(b.reused for b, _, _ in (second["bob"], second["carol"]))
    # a build that is not sandboxed neither reads nor writes the cache
    unsandboxed, _, _ = grade("alice", tmp_path / "alice.3.log", Sandbox(None, "turned off"))
    assert not unsandboxed.reused and compiled[-1] == "alice"


def test_every_cuda_build_starts_from_an_empty_folder(tmp_path):
    folder = tmp_path / "b"
    (folder / "sub").mkdir(parents=True)
    (folder / "cuda.cuda.o").write_bytes(b"old")
    (folder / "link").symlink_to(tmp_path / "outside")
    (tmp_path / "outside").write_text("kept")
    empty_folder(folder)
    assert folder.is_dir() and not any(folder.iterdir())
    assert (tmp_path / "outside").read_text() == "kept"   # links are removed, never followed


def test_builds_use_every_build_cpu_as_memory_allows():
    split = CpuSplit(gpu=tuple(range(13, 16)), build=tuple(range(13)))
    assert default_build_jobs(split, available_bytes=120 << 30) == 13   # was min(8, ...)
    assert default_build_jobs(split, available_bytes=int(config.BUILD_PEAK_GB * 5) << 30) == 5
    assert default_build_jobs(split, available_bytes=1 << 30) == 1


@pytest.mark.slow
@pytest.mark.skipif(not has_nvcc(), reason="needs nvcc")
def test_a_real_compile_check_is_reused_by_the_next_run(tmp_path):
    """The grader end to end (`check`, sandboxed where bubblewrap works): the second run's
    build compiles nothing, and the result it records is the first's."""
    from grader.isolation.sandbox import default_layout
    if not Sandbox.probe(**default_layout()).active:
        pytest.skip("no working bubblewrap: the cache is off without a sandbox")
    runs = []
    for i in range(2):
        out = tmp_path / f"results{i}"
        proc = subprocess.run([sys.executable, "-m", "grader", "check", str(EXAMPLES / "tiled_cuda"),
                               "--out", str(out), "--build-dir", str(tmp_path / "build")],
                              capture_output=True, text=True, cwd=config.REPO_ROOT, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads((out / "tiled_cuda.json").read_text()))
    assert not runs[0]["build"]["reused"] and runs[1]["build"]["reused"]
    assert runs[1]["build"]["elapsed_s"] < 5 < runs[0]["build"]["elapsed_s"]
    assert runs[1]["status"] == runs[0]["status"] == "not_run"
    assert (runs[1]["message"], runs[1]["notes"]) == (runs[0]["message"], runs[0]["notes"])


def test_a_pipe_left_in_a_build_folder_fails_the_store_and_never_blocks_it(tmp_path):
    """A build folder is written by a sandboxed process; the grader's own process copies out of
    it. A named pipe left where the object file belongs is not stored and does not hang the
    grader (the old open() waited for a writer forever); a regular file beside it is stored."""
    from .test_submission import finishes
    cache = BuildCache(tmp_path / "cache", sandboxed=True)
    built = fake_build(tmp_path, {"sub_a.so": b"module"})
    os.mkfifo(built / "cuda.cuda.o")
    why = finishes(cache.store, inputs(), built, ["sub_a.so", "cuda.cuda.o"], compile_s=1.0,
                   log="", log_tail="", folder=built)
    assert why.startswith("not stored") and "named pipe" in why, why
    assert cache.restore(inputs(), tmp_path / "into") is None   # nothing half-stored
    (built / "cuda.cuda.o").unlink()
    (built / "cuda.cuda.o").write_bytes(b"\x7fELF object")
    assert cache.store(inputs(), built, ["sub_a.so", "cuda.cuda.o"], compile_s=1.0, log="",
                       log_tail="") == ""


def test_the_cache_keeps_the_record_of_the_headers_a_build_opened(tmp_path):
    """The reach audit reads which headers a build opened from the record beside its object
    (build.HEADERS_RECORD); a restored build has it back, checked like every file it keeps."""
    for mode in ("extension", "compile_only"):
        assert build.HEADERS_RECORD in build.cached_files(mode, "sub_a")
    cache = BuildCache(tmp_path / "cache", sandboxed=True)
    built = fake_build(tmp_path, {"cuda.cuda.o": b"\x7fELF object"})
    build_headers.record_headers(built, ["/b/cuda.cu", "/usr/include/stdio.h"], how="test", base=built)
    assert cache.store(inputs(), built, build.cached_files("compile_only", "sub_a"),
                       compile_s=1.0, log="", log_tail="") == ""
    into = tmp_path / "into"
    assert cache.restore(inputs(), into) is not None
    from grader.trusted.audit.includes import read_headers_record
    assert read_headers_record(into / build.HEADERS_RECORD) == ["/b/cuda.cu", "/usr/include/stdio.h"]
