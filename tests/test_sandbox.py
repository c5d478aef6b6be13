"""The sandbox's cuDNN cover (issue 30, grader/isolation/sandbox.py): a student's subject cannot load any
cuDNN engine library, while the dispatcher libcudnn.so.N and every other file stay as they are;
the checker's and the baselines' processes (not wrapped with hide_libraries) keep cuDNN whole.

The files here are fakes in a temporary folder that stands for a site-packages' nvidia/cudnn/lib;
the tests that run bubblewrap skip where it cannot run (CI installs it: REQUIRE_SANDBOX=1 there
makes a skip a failure)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grader.isolation import sandbox as sandbox_mod
from grader.isolation.procs import child_env
from grader.isolation.sandbox import (Sandbox, cudnn_engines, default_layout, empty_file, find_cudnn_engines,
                            hide_args, ldconfig_libraries)

ENGINES = ("libcudnn_adv.so.9", "libcudnn_cnn.so.9", "libcudnn_engines_precompiled.so.9",
           "libcudnn_engines_runtime_compiled.so.9", "libcudnn_heuristic.so.9", "libcudnn_ops.so.9")
# Kept: torch asks cuDNN's version at import, and the dispatcher finds it in the graph library
# (hiding it aborted `import torch` in the subject on the GPU machine, session 19).
GRAPH = "libcudnn_graph.so.9"


def fake_cudnn(folder: Path) -> Path:
    """A folder laid out as the nvidia-cudnn-cu12 wheel's lib/ (each engine a real file under its
    full version, with the soname a link to it), plus files that must stay: the dispatcher and
    its development link, cuBLAS, and a file whose name only looks like cuDNN's."""
    folder.mkdir(parents=True)
    for name in ENGINES:
        (folder / f"{name}.1.0").write_bytes(b"ENGINE " + name.encode())
        (folder / name).symlink_to(f"{name}.1.0")
    (folder / f"{GRAPH}.1.0").write_bytes(b"GRAPH")
    (folder / GRAPH).symlink_to(f"{GRAPH}.1.0")
    (folder / "libcudnn.so.9.1.0").write_bytes(b"DISPATCHER")
    (folder / "libcudnn.so.9").symlink_to("libcudnn.so.9.1.0")
    (folder / "libcudnn.so").symlink_to("libcudnn.so.9")
    (folder / "libcublas.so.12").write_bytes(b"CUBLAS")
    (folder / "libcudnn_notes.txt").write_bytes(b"NOT A LIBRARY")
    (folder / "libcudnn_gone.so.9").symlink_to("nowhere.so.9")   # dangling: loads nothing anyway
    return folder


def test_the_engines_are_found_as_their_real_files_and_the_dispatcher_is_not_one(tmp_path):
    lib = fake_cudnn(tmp_path / "site-packages" / "nvidia" / "cudnn" / "lib")
    found = find_cudnn_engines([str(lib), str(tmp_path / "absent")])
    assert found == tuple(sorted(str(lib / f"{n}.1.0") for n in ENGINES))
    assert not any(os.path.basename(p).startswith(("libcudnn.so", "libcublas")) for p in found)
    # ldconfig's cache names a system install's files: the engines among them are found too
    system = fake_cudnn(tmp_path / "usr" / "lib")
    listed = [str(system / "libcudnn_ops.so.9"), str(system / "libcublas.so.12")]
    assert find_cudnn_engines([], listed) == (str(system / "libcudnn_ops.so.9.1.0"),)


def test_ldconfigs_cache_is_read_for_library_paths(monkeypatch):
    out = ("3 libs found in cache `/etc/ld.so.cache'\n"
           "\tlibcudnn_ops.so.9 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcudnn_ops.so.9\n"
           "\tlibcudnn.so.9 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcudnn.so.9\n")
    monkeypatch.setattr(sandbox_mod.shutil, "which", lambda tool: "/sbin/ldconfig")
    monkeypatch.setattr(sandbox_mod.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, out, ""))
    assert ldconfig_libraries() == ("/usr/lib/x86_64-linux-gnu/libcudnn_ops.so.9",
                                    "/usr/lib/x86_64-linux-gnu/libcudnn.so.9")


def test_the_list_is_made_once_per_process(tmp_path):
    lib = fake_cudnn(tmp_path / "lib")
    first = cudnn_engines((str(lib),))
    (lib / "libcudnn_new.so.9").write_bytes(b"x")
    assert cudnn_engines((str(lib),)) is first   # cached: not looked for again


def test_a_file_is_covered_wherever_a_bind_shows_it(tmp_path):
    """The sandbox shows a folder at the path the grader names (a bind of its real path): the
    cover goes where the file appears inside, once per path, and not where no bind shows it."""
    real = fake_cudnn(tmp_path / "real" / "lib")
    (tmp_path / "venv").symlink_to(tmp_path / "real")
    engine = str(real / "libcudnn_ops.so.9.1.0")
    args = hide_args([engine, "/elsewhere/libcudnn_adv.so.9"],
                     [str(tmp_path / "venv"), str(real), str(tmp_path / "real")])
    empty = empty_file()
    assert args == ["--ro-bind", empty, str(tmp_path / "venv" / "lib" / "libcudnn_ops.so.9.1.0"),
                    "--ro-bind", empty, engine]
    assert os.path.getsize(empty) == 0 and os.stat(empty).st_mode & 0o777 == 0o444
    assert hide_args([], [str(real)]) == []


def test_wrap_covers_the_engines_last_and_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox_mod, "drop_privileges", lambda: [])
    lib = fake_cudnn(tmp_path / "lib")
    box = Sandbox("/usr/bin/bwrap", readable=("/usr",), cudnn_folders=(str(lib),))
    plain = box.wrap(["true"], readonly=[lib])
    hidden = box.wrap(["true"], readonly=[lib], hide_libraries=True)
    assert plain == box.wrap(["true"], readonly=[lib], hide_libraries=False)
    assert hidden[:len(plain) - 2] == plain[:-2] and hidden[-2:] == ["--", "true"]
    covers = hidden[len(plain) - 2:-2]
    assert covers[2::3] == [str(lib / f"{n}.1.0") for n in sorted(ENGINES)]
    assert set(covers[0::3]) == {"--ro-bind"} and set(covers[1::3]) == {empty_file()}
    # nothing found (a CPU machine): hiding is a no-op
    none = Sandbox("/usr/bin/bwrap", readable=("/usr",), cudnn_folders=(str(tmp_path / "empty"),))
    assert none.wrap(["true"], hide_libraries=True) == none.wrap(["true"])
    assert Sandbox(None, "off").wrap(["true"], hide_libraries=True) == ["true"]


# Inside the sandbox: each name's size and first bytes, and whether ctypes can load it.
_LOOK = """
import ctypes, json, os, sys
out = {}
for name in sorted(os.listdir(sys.argv[1])):
    path = os.path.join(sys.argv[1], name)
    try:
        with open(path, 'rb') as f:
            data = f.read(64)
        out[name] = data.decode(errors='replace')
    except OSError as e:
        out[name] = 'unreadable: ' + e.strerror
    if name.endswith('.so.9') and sys.argv[2:]:
        try:
            out[name + ' loads'] = ctypes.CDLL(path).answer()
        except OSError as e:
            out[name + ' loads'] = str(e).split(': ')[-1]
print(json.dumps(out))
"""


def _box(lib: Path) -> Sandbox:
    box = Sandbox.probe(**default_layout(), mode="auto")
    if not box.active:
        if os.environ.get("REQUIRE_SANDBOX") == "1":
            pytest.fail("REQUIRE_SANDBOX=1 but bubblewrap cannot run here")
        pytest.skip(f"no sandbox here: {box.reason}")
    return Sandbox(box.bwrap, readable=box.readable, scratch=box.scratch, gpu_nodes=(),
                   cudnn_folders=(str(lib),))


def _inside(box: Sandbox, lib: Path, *, hide: bool, load: bool = False) -> dict:
    cmd = box.wrap([sys.executable, "-c", _LOOK, str(lib), *(["load"] if load else [])],
                   readonly=[lib], hide_libraries=hide)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=child_env(cuda=False))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_inside_the_sandbox_the_engines_read_empty_and_everything_else_is_intact(tmp_path):
    lib = fake_cudnn(tmp_path / "site-packages" / "nvidia" / "cudnn" / "lib")
    box = _box(lib)
    outside = {p.name: p.read_bytes().decode() for p in lib.iterdir() if p.exists()}
    hidden = _inside(box, lib, hide=True)
    for name in ENGINES:   # the soname (a link) and the real file alike
        assert hidden[name] == hidden[f"{name}.1.0"] == "", name
    kept = {n: v for n, v in hidden.items() if not n.startswith(ENGINES)}
    assert kept == {**{n: outside[n] for n in kept if n in outside},
                    "libcudnn_gone.so.9": "unreadable: No such file or directory"}
    assert kept["libcudnn.so.9"] == kept["libcudnn.so"] == "DISPATCHER"
    assert kept["libcublas.so.12"] == "CUBLAS"
    assert kept[GRAPH] == kept[f"{GRAPH}.1.0"] == "GRAPH"
    # without the keyword (the baselines' subjects) nothing is hidden
    plain = _inside(box, lib, hide=False)
    assert {n: v for n, v in plain.items() if n in outside} == outside


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build a real library")
def test_a_hidden_engine_cannot_be_loaded_and_the_dispatcher_still_can(tmp_path):
    """With real shared libraries: the dynamic loader refuses the covered file (an empty file is
    no ELF object), as cuDNN's dispatcher's dlopen of an engine will; the dispatcher loads."""
    lib = tmp_path / "nvidia" / "cudnn" / "lib"
    lib.mkdir(parents=True)
    source = tmp_path / "answer.c"
    source.write_text("int answer(void) { return 42; }\n")
    for name in ("libcudnn_engines_precompiled.so.9", "libcudnn.so.9"):
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib / name), str(source)], check=True)
    box = _box(lib)
    plain = _inside(box, lib, hide=False, load=True)
    assert plain["libcudnn_engines_precompiled.so.9 loads"] == plain["libcudnn.so.9 loads"] == 42
    hidden = _inside(box, lib, hide=True, load=True)
    assert hidden["libcudnn.so.9 loads"] == 42
    assert hidden["libcudnn_engines_precompiled.so.9 loads"] == "file too short", hidden


def _probe_script():
    import importlib.util
    from grader.common import config
    path = config.REPO_ROOT / "scripts" / "probe_hidden_cudnn.py"
    spec = importlib.util.spec_from_file_location("probe_hidden_cudnn", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, path


def test_the_probe_script_runs_here_and_judges_its_table_as_the_gpu_should_read_it():
    """scripts/probe_hidden_cudnn.py, which the GPU run uses to show cuDNN absent from a
    student's subject: it exits 0 on this machine, and its verdict names what is wrong."""
    probe, path = _probe_script()
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300,
                          cwd="/")
    assert proc.returncode == 0 and "hide_libraries covers" in proc.stdout, proc.stderr[-2000:]
    ok = {"cuDNN version": "91000", **{r: "works (max err 1.0e-03)" for r in probe.ROWS[2:6]}}
    hidden = {**ok, "SDPA CUDNN_ATTENTION": "FAILED: RuntimeError: No available kernel."}
    assert probe.verdict(hidden, ok).startswith("OK")
    assert "still runs in a student's subject" in probe.verdict(ok, ok)
    broken = {**hidden, "SDPA FLASH_ATTENTION": "FAILED: x"}
    assert "SDPA FLASH_ATTENTION fails in the student's subject" in probe.verdict(broken, ok)
    assert probe.verdict({"cuDNN version": "no CUDA device"}, ok).startswith("NOT MEASURED")


def test_engines_beside_a_dispatcher_found_anywhere_are_found_too(tmp_path):
    """cuDNN's dispatcher loads its engines from its own folder first ($ORIGIN): an engine there
    is covered even when only the dispatcher was listed (ldconfig names a link to it)."""
    lib = fake_cudnn(tmp_path / "cuda" / "lib64")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "libcudnn.so.9").symlink_to(lib / "libcudnn.so.9")
    assert find_cudnn_engines([], [str(tmp_path / "cache" / "libcudnn.so.9")]) == \
        tuple(sorted(str(lib / f"{n}.1.0") for n in ENGINES))
    assert find_cudnn_engines([str(tmp_path / "cache")]) == find_cudnn_engines([str(lib)])
