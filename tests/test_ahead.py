"""A Triton submission's kernels compiled in its build, with no GPU (grader/build/ahead.py,
grader/subject/ahead.py): what is compiled, what is kept and copied into a run's JIT folder, and
the invariant that it changes no verdict and sees no GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grader.build import ahead
from grader.build.ahead import AHEAD_KEEP_FILES, compile_ahead, keepable, seed_jit_folder, wanted
from grader.common import config
from grader.common.status import Status
from grader.course.submission import Kind, Submission
from grader.course.verdicts import BuildResult
from grader.isolation.device import DeviceInfo
from .devices import CPU
from grader.isolation.procs import child_env
from grader.problem import Case
from grader.stages.folders import jit_cache

from .conftest import EXAMPLES, cuda_available

GPU = DeviceInfo(cuda=True, name="H100 (its description only)", capability=(9, 0), arch="90a",
                 l2_bytes=0, memory_bytes=0, sm_count=0, driver="none", torch_version="x",
                 cuda_version=None, nvcc=None, python="3")
PASSED = BuildResult(Status.PASS, "import", 1.0)
# Two specialisations of the kit's example: head_dim 64 with a ragged length, head_dim 128.
CASES = [Case(1, 2, 77, 64, seed=11), Case(1, 1, 1, 128, seed=7)]
ON = config.Limits(ahead_s=90.0)   # config.Limits.ahead_s's default


def triton_with_ptxas() -> bool:
    try:
        import triton
    except ImportError:
        return False
    return (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists()


needs_triton = pytest.mark.skipif(not triton_with_ptxas(), reason="needs Triton with its ptxas")


def example(name: str = "triton_flash") -> Submission:
    return Submission(name, EXAMPLES / name, Kind.PYTHON)


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


@needs_triton
def test_a_triton_submission_s_kernels_are_compiled_in_its_build_and_seed_its_run(tmp_path):
    built = compile_ahead(example(), PASSED, build_dir=tmp_path / "build", device=GPU,
                          limits=ON, sandbox=None, cases=CASES, log_path=tmp_path / "build.log")
    assert built.status is Status.PASS and built.elapsed_s > PASSED.elapsed_s
    folder = Path(built.compiled_ahead)
    assert folder == (tmp_path / "build" / ahead.AHEAD_FOLDER / "triton").resolve()
    compiled = [p.name for p in files_under(folder)]
    # one cubin per specialisation, for the grading GPU's architecture
    assert sum(n.endswith(".cubin") for n in compiled) == 2, compiled
    log = (tmp_path / "build.log").read_text()
    assert "compiled ahead, with no GPU" in log and '"ok": true' in log
    # its run's JIT folder starts from a copy (folders.jit_cache), which its subject's Triton reads
    sub = example()
    with jit_cache(sub, ON, built) as jit:
        copied = sorted(p.relative_to(jit / "triton") for p in files_under(jit / "triton"))
        assert copied == sorted(p.relative_to(folder) for p in files_under(folder))
        written = {(p, p.stat().st_ino) for p in files_under(jit / "triton")}
        # the run's sandbox does not see the build folder: nothing in the copy may lead there
        # (Triton's group files named it, and every kernel was compiled again: session 25)
        (tmp_path / "build").rename(tmp_path / "build-unseen")
        # another process compiling the same kernels in that folder finds every one there and
        # writes nothing, not even a file again: the key is the kernel's source, its
        # specialisation and the target
        request = dict(target=dict(kind="python", source=str(sub.source)), capability=90,
                       shapes=[list(c.shape) for c in CASES], deadline=time.monotonic() + 300)
        env = {**child_env(cuda=True), "TRITON_CACHE_DIR": str(jit / "triton")}
        env.pop("TRITON_INTERPRET", None)
        proc = subprocess.run([sys.executable, str(config.GRADER_DIR / "subject" / "loop.py"),
                               "--compile-ahead", json.dumps(request)], env=env,
                              capture_output=True, text=True, timeout=600)
        assert '"ok": true' in proc.stdout, proc.stdout + proc.stderr[-2000:]
        assert {(p, p.stat().st_ino) for p in files_under(jit / "triton")} == written


def _submission(make_submission, name: str, body: str) -> Submission:
    folder = make_submission(name, "import torch\nimport triton\n\n" + body)
    return Submission(name, folder, Kind.PYTHON)


@needs_triton
@pytest.mark.parametrize("body, said", [
    ("def custom_kernel(data):\n    raise RuntimeError('only on the GPU')\n", "only on the GPU"),
    ("def custom_kernel(data):\n    while True:\n        pass\n", "stopped at its limit"),
    ("def custom_kernel(data):\n    import os\n    os._exit(3)\n", "it exited with 3"),
])
def test_compiling_ahead_never_changes_a_verdict(make_submission, tmp_path, body, said):
    """Whatever the submission does when called with no GPU, its build's verdict is the import
    check's, nothing is kept, and the time spent is bounded by the limit. (The limit leaves a slow
    machine time to import torch: the log shows the call was made.)"""
    sub = _submission(make_submission, "odd", body)
    limits = config.Limits(ahead_s=30.0)
    built = compile_ahead(sub, PASSED, build_dir=tmp_path / "build", device=GPU, limits=limits,
                          sandbox=None, cases=CASES, log_path=tmp_path / "log")
    assert built.status is Status.PASS and built.message == "" and built.compiled_ahead == ""
    assert said in (tmp_path / "log").read_text()
    assert built.elapsed_s < PASSED.elapsed_s + 30.0 + 30   # its limit, and slack for the kill
    assert not files_under(tmp_path / "build" / ahead.AHEAD_FOLDER)


def test_what_is_compiled_ahead_sees_no_gpu_and_is_not_interpreted(monkeypatch, tmp_path):
    """The invariant's mechanism: the child has CUDA_VISIBLE_DEVICES empty and a sandbox with no
    GPU device node (it runs beside other submissions' timed calls), and Triton compiles for real
    (no TRITON_INTERPRET)."""
    seen = {}

    class FakeSandbox:
        gpu_nodes = ("/dev/nvidia0",)

        def without_gpus(self):
            seen["without_gpus"] = True
            return self

        def wrap(self, cmd, *, writable=(), readonly=(), nice=0):
            seen["wrapped"] = (list(writable), list(readonly))
            return cmd

    def fake_run(cmd, *, env, **kw):
        seen["env"], seen["cmd"] = env, cmd
        from grader.isolation.procs import ProcResult
        return ProcResult(returncode=0, timed_out=False, elapsed_s=0.1, output="", output_bytes=0)

    monkeypatch.setattr(ahead, "run_limited", fake_run)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    compile_ahead(example(), PASSED, build_dir=tmp_path / "b", device=GPU, limits=ON,
                  sandbox=FakeSandbox(), cases=CASES)
    assert seen["without_gpus"] and seen["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert "TRITON_INTERPRET" not in seen["env"]
    assert seen["env"]["TRITON_CACHE_DIR"].startswith(str((tmp_path / "b").resolve()))
    assert seen["wrapped"] == ([(tmp_path / "b").resolve()], [EXAMPLES / "triton_flash"])
    request = json.loads(seen["cmd"][seen["cmd"].index("--compile-ahead") + 1])
    assert request["capability"] == 90 and request["shapes"] == [list(c.shape) for c in CASES]


def test_only_a_passing_triton_build_on_a_gpu_machine_compiles_ahead(make_submission):
    limits = ON
    triton_sub = example()
    assert wanted(triton_sub, PASSED, GPU, CASES, limits)
    assert not wanted(triton_sub, PASSED, CPU, CASES, limits)
    assert wanted(triton_sub, PASSED, GPU, CASES, config.Limits())   # on by default
    assert not wanted(triton_sub, PASSED, GPU, CASES, config.Limits(ahead_s=0.0))   # GRADER_AHEAD_S=0
    assert not wanted(triton_sub, BuildResult(Status.BUILD_ERROR, "import", 1.0), GPU, CASES, limits)
    assert not wanted(Submission("c", EXAMPLES / "solution", Kind.CUDA), PASSED, GPU, CASES, limits)
    plain = make_submission("plain", "import torch\ndef custom_kernel(data):\n    return data[0]\n")
    assert not wanted(Submission("plain", plain, Kind.PYTHON), PASSED, GPU, CASES, limits)


def test_a_seed_with_a_link_a_fifo_or_too_many_files_is_not_used(tmp_path):
    """Only regular files of Triton's cache reach a run's JIT folder: a folder holding a link
    (to another submission's files, or the grader's) or a device is not used at all, nor one
    past the limits; an autotuner's choice is never copied. Triton's launcher libraries are: only
    the submission's own processes load from its JIT folder, and they may write there anyway."""
    def seed(name: str) -> Path:
        folder = tmp_path / name / "triton" / "KEY"
        folder.mkdir(parents=True)
        (folder / "k.cubin").write_bytes(b"\0" * 64)
        (folder / "k.json").write_text("{}")
        return folder.parent

    good = seed("good")
    (good / "KEY" / "launcher.so").write_bytes(b"\x7fELF")
    (good / "KEY" / "k.autotune.json").write_text("{}")
    jit = tmp_path / "jit-good"
    jit.mkdir()
    assert seed_jit_folder(str(good), jit) == 3
    assert sorted(p.name for p in files_under(jit)) == ["k.cubin", "k.json", "launcher.so"]

    linked = seed("linked")
    secret = tmp_path / "secret.txt"
    secret.write_text("another submission's")
    os.symlink(secret, linked / "KEY" / "k.ptx")
    fifo = seed("fifo")
    os.mkfifo(fifo / "KEY" / "pipe")
    many = seed("many")
    for i in range(AHEAD_KEEP_FILES + 1):
        (many / "KEY" / f"f{i}.json").write_text("")
    for bad in (linked, fifo, many):
        assert keepable(bad) is None
        out = tmp_path / f"jit-{bad.parent.name}"
        out.mkdir()
        assert seed_jit_folder(str(bad), out) == 0 and not files_under(out)
    assert seed_jit_folder("", tmp_path) == 0 and seed_jit_folder(str(tmp_path / "none"), tmp_path) == 0


def test_a_seed_s_groups_name_only_the_copies_in_their_own_key_folder(tmp_path):
    """Triton finds a kernel through its group file's absolute paths. The copy's groups name the
    copies (the build folder is not in the run's sandbox), and only files of their own key folder:
    a group naming another submission's file or the grader's names a file of that folder
    instead; a group that is not Triton's is not copied (its kernel is compiled in the turn)."""
    seed = tmp_path / "build" / "ahead" / "triton"
    (seed / "KEY").mkdir(parents=True)
    (seed / "KEY" / "k.cubin").write_bytes(b"\0")
    (seed / "KEY" / "__grp__k.json").write_text(json.dumps({"child_paths": {
        "k.cubin": str(seed / "KEY" / "k.cubin"), "k.json": "/etc/passwd"}}))
    (seed / "KEY" / "__grp__bad.json").write_text("{not json")
    jit = tmp_path / "jit"
    jit.mkdir()
    assert seed_jit_folder(str(seed), jit) == 2
    group = json.loads((jit / "KEY" / "__grp__k.json").read_text())
    assert group == {"child_paths": {"k.cubin": str(jit / "KEY" / "k.cubin"),
                                     "k.json": str(jit / "KEY" / "passwd")}}
    assert not (jit / "KEY" / "__grp__bad.json").exists()


# ---------------------------------------------------------------- on the GPU machine (make test-gpu)

RUN_ON_GPU = """
import json, sys, time, torch
from grader.subject.load import load
fn = load(dict(kind="python", source=sys.argv[1]))
out = []
for shape in json.loads(sys.argv[2]):
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.float16) for _ in range(3))
    began = time.monotonic()
    o = fn(q, k, v)
    torch.cuda.synchronize()
    first_s = time.monotonic() - began
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    out.append(dict(shape=shape, first_s=first_s, err=float((o.float() - ref.float()).abs().max())))
print(json.dumps(out))
"""


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU")
def test_on_the_gpu_a_run_finds_every_kernel_compiled_ahead(tmp_path):
    """Compiled with no GPU for this GPU's target, each kernel is what the run's Triton looks up:
    the run compiles nothing and builds no launcher (no cubin or launcher library is added to its
    JIT folder) and its outputs are right."""
    from grader.isolation.device import detect
    device = detect()
    built = compile_ahead(example(), PASSED, build_dir=tmp_path / "build", device=device,
                          limits=ON, sandbox=None, cases=CASES,
                          log_path=tmp_path / "log")
    assert built.compiled_ahead, (tmp_path / "log").read_text()[-3000:]
    with jit_cache(example(), ON, built) as jit:
        (tmp_path / "build").rename(tmp_path / "build-unseen")   # as the run's sandbox sees it
        before = {(p.relative_to(jit), p.stat().st_ino) for p in files_under(jit)
                  if p.suffix == ".cubin" or "launcher" in p.name}
        env = {**child_env(cuda=True), "TRITON_CACHE_DIR": str(jit / "triton")}
        proc = subprocess.run([sys.executable, "-c", RUN_ON_GPU, str(example().source),
                               json.dumps([list(c.shape) for c in CASES])],
                              env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        after = {(p.relative_to(jit), p.stat().st_ino) for p in files_under(jit)
                 if p.suffix == ".cubin" or "launcher" in p.name}
    # nothing written again (a cache miss replaces the file in its key folder: a new inode)
    assert len([p for p, _ in before if p.suffix == ".cubin"]) == 2 and after == before, (before, after)
    for r in json.loads(proc.stdout.splitlines()[-1]):
        assert r["err"] < 1e-2, r


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU")
def test_on_the_gpu_compiling_ahead_sees_no_gpu(make_submission, tmp_path):
    """The attack twin of the invariant: a submission that looks for the GPU while its kernels are
    compiled ahead finds none (it runs beside other submissions' timed calls)."""
    from grader.isolation.device import detect
    sub = _submission(make_submission, "looks", "def custom_kernel(data):\n"
                      "    print('GPUS', torch.cuda.is_available(), torch.cuda.device_count())\n"
                      "    return data[0]\n")
    compile_ahead(sub, PASSED, build_dir=tmp_path / "build", device=detect(),
                  limits=ON, sandbox=None, cases=CASES, log_path=tmp_path / "log")
    assert "GPUS False 0" in (tmp_path / "log").read_text()


# ---------------------------------------------------------------- Triton warmed before the turn

WARM = """
import json, sys
from grader.subject.libraries import warm_triton
failed = warm_triton()
print(json.dumps(dict(failed=failed, imported="triton.language" in sys.modules)))
"""


def test_a_prepared_subject_warms_triton_only_for_a_triton_submission_on_a_gpu(make_submission):
    """libraries.warms_triton: the warm-up (Triton's import, its key, its driver) is paid before
    the turn only where the submission's sources use Triton and a GPU will run it; a CUDA
    submission, a Python one without Triton and any subject off the GPU load nothing more."""
    from grader.subject.libraries import warms_triton
    triton_sub = example()
    plain = Submission("plain", make_submission("plain", "import torch\n\ndef custom_kernel(data):\n"
                                                "    return data[0]\n"), Kind.PYTHON)
    setup = lambda sub, kind="python", device="cuda": dict(   # noqa: E731
        device=device, target=dict(kind=kind, source=str(sub.source)))
    assert warms_triton(setup(triton_sub))
    assert not warms_triton(setup(triton_sub, device="cpu"))
    assert not warms_triton(setup(triton_sub, kind="cuda"))
    assert not warms_triton(setup(plain))


@needs_triton
def test_warming_triton_never_raises_and_says_what_it_could_not_do():
    """Off the GPU the driver and the backend cannot start: warm_triton names those steps (for the
    harness's log) and raises nothing, and what it could do (the import) is done."""
    proc = subprocess.run([sys.executable, "-c", WARM], env=child_env(cuda=cuda_available()),
                          capture_output=True, text=True, timeout=300, cwd=Path(__file__).parent.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = json.loads(proc.stdout.splitlines()[-1])
    assert said["imported"]
    if cuda_available():
        assert said["failed"] == []
    else:
        assert [step.split(":")[0] for step in said["failed"]] == ["driver", "backend"], said


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU")
def test_on_the_gpu_warming_triton_builds_its_driver_module_in_the_jit_folder(tmp_path):
    """On the GPU every step of the warm-up is done, and what Triton compiles for its driver lands
    in the JIT folder named by TRITON_CACHE_DIR (the submission's own), not in a shared one."""
    env = {**child_env(cuda=True), "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    proc = subprocess.run([sys.executable, "-c", WARM], env=env, capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).parent.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[-1])["failed"] == []
    assert any(p.suffix == ".so" for p in files_under(tmp_path / "triton")), files_under(tmp_path)


def test_the_run_log_says_how_many_kernels_were_compiled_ahead_and_how_many_in_the_turn(tmp_path):
    """jit_report: the kernels (cache keys with a cubin) and native launchers the JIT folder held
    when the GPU stages began, against those they added: what says whether compiling ahead paid
    (issue 32)."""
    from grader.stages.folders import jit_report
    seed = tmp_path / "ahead" / "triton"
    for key in ("KEYA", "KEYB"):
        (seed / key).mkdir(parents=True)
        (seed / key / "_attention_kernel.cubin").write_bytes(b"\0")
        (seed / key / "_attention_kernel.json").write_text("{}")
    (seed / "KEYL").mkdir()
    (seed / "KEYL" / "__triton_launcher.cpython-312-x86_64-linux-gnu.so").write_bytes(b"\0")
    built = BuildResult(Status.PASS, "import", 1.0, compiled_ahead=str(seed))
    with jit_cache(example(), ON, built) as jit:
        assert jit_report(jit) == ("grader: Triton kernels: 2 compiled in the build, 0 compiled in "
                                   "the GPU stages' turn; launchers: 1 built in the build, 0 in the turn\n")
        (jit / "triton" / "KEYC").mkdir()
        (jit / "triton" / "KEYC" / "_attention_kernel.cubin").write_bytes(b"\0")
        (jit / "triton" / "KEYD").mkdir()   # a launcher's folder: no kernel
        (jit / "triton" / "KEYD" / "__triton_launcher.cpython-312-x86_64-linux-gnu.so").write_bytes(b"\0")
        assert jit_report(jit) == ("grader: Triton kernels: 2 compiled in the build, 1 compiled in "
                                   "the GPU stages' turn; launchers: 1 built in the build, 1 in the turn\n")
        # a cache miss compiles into the same key folder, replacing the file: compiled in the turn
        again = jit / "triton" / "KEYA" / "_attention_kernel.cubin"
        (jit / "again.tmp").write_bytes(b"\1")
        os.replace(jit / "again.tmp", again)
        assert jit_report(jit).startswith("grader: Triton kernels: 2 compiled in the build, 2 ")
    assert jit_report(jit) == ""   # the folder is gone with its GPU stages
    with jit_cache(example(), ON, PASSED) as jit:
        assert jit_report(jit) == ""   # nothing compiled anywhere: nothing to say
