import json
import os
import re
import shutil
import subprocess
import threading

import pytest

from grader.build import stage as build
from grader.build import child as build_child, flags as build_flags, headers as build_headers
from grader.build import log as build_log, messages as build_messages, watch as build_watch

from grader.common import config

from grader.trusted.audit import reach
from grader.build.stage import build_submission
from grader.build.log import relevant_log
from grader.build.messages import StudentCheck
from grader.course.verdicts import BuildResult
from .devices import CPU
from grader.isolation import sandbox as sandbox_mod
from grader.isolation.sandbox import Sandbox
from grader.common.status import Status
from grader.course.submission import inspect_folder

from .conftest import EXAMPLES, has_nvcc



def test_compiler_output_is_mapped_back_to_the_students_lines():
    log = ("/x/build/sub_a/cuda.cu(45): error: identifier \"m_nwe\" is undefined\n"
           "          m_i = m_nwe;\n                ^\n\n1 error detected\n"
           "/x/build/sub_a/cuda.cu:12:7: warning: unused variable\nninja: build stopped\n")
    text = relevant_log(log)
    assert text.splitlines()[0] == 'submission.cu:42: error: identifier "m_nwe" is undefined'
    assert "m_i = m_nwe;" in text
    assert "submission.cu:9:7: warning" in relevant_log(log, errors_only=True)


def test_a_failed_compile_names_the_compiler_s_error_not_a_warning_before_it():
    # Session 15's GPU course: torch's warning about the GPUs came first in a failed build's log,
    # and "compile failed: ... UserWarning: CUDA initialization: Unexpected error from
    # cudaGetDeviceCount() ... out of memory" was the whole message a student read.
    log = ("/opt/venv/torch/cuda/__init__.py:180: UserWarning: CUDA initialization: Unexpected "
           "error from cudaGetDeviceCount(). Error 2: out of memory\n"
           "FAILED: cuda.cuda.o\n"
           "/x/build/sub_a/cuda.cu(45): error: identifier \"m_nwe\" is undefined\n"
           "RuntimeError: Error building extension 'sub_a'\n")
    assert build._first_error(relevant_log(log)) == \
        'submission.cu:42: error: identifier "m_nwe" is undefined'
    assert build._first_error("ld: error while loading shared libraries\n") == \
        "ld: error while loading shared libraries"
    assert build._first_error("x.cu:3: warning: unused variable error_count\n") == ""


def test_a_cuda_build_on_a_gpu_machine_sees_no_gpu(make_submission, tmp_path, monkeypatch):
    """A build runs beside other submissions' timed calls and needs no GPU (its architecture is
    given): CUDA_VISIBLE_DEVICES is empty and its sandbox binds no GPU's node, as for a Python
    submission's import check."""
    import dataclasses
    gpu = dataclasses.replace(CPU, cuda=True, name="NVIDIA H100", capability=(9, 0), nvcc="/usr/bin/nvcc")
    seen = {}

    def run(cmd, **kw):
        seen.update(cmd=cmd, env=kw["env"])
        raise RuntimeError("stop here")

    monkeypatch.setattr(build, "run_limited", run)
    box = Sandbox(bwrap="/usr/bin/bwrap")
    nodes = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"]   # a machine with two GPUs
    monkeypatch.setattr(sandbox_mod.glob, "glob", lambda pattern: nodes if pattern == "/dev/nvidia*" else [])
    sub = inspect_folder(make_submission("kernel", "// a kernel\n", filename="submission.cu"))
    with pytest.raises(RuntimeError, match="stop here"):
        build_submission(sub, build_dir=tmp_path / "b", device=gpu, limits=config.Limits(), sandbox=box)
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == ""
    bound = " ".join(seen["cmd"])
    assert "/dev/nvidiactl" in bound and "/dev/nvidia0" not in bound and "/dev/nvidia1" not in bound


def test_python_import_errors_are_build_errors(make_submission, tmp_path):
    limits = config.Limits()
    broken = make_submission("syntax", "def custom_kernel(data)\n    return data[0]\n")
    missing = make_submission("missing", "def kernel(data):\n    return data[0]\n")
    fine = make_submission("fine", "def custom_kernel(data):\n    return data[0]\n")
    r = build_submission(inspect_folder(broken), build_dir=tmp_path / "b1", device=CPU, limits=limits)
    assert r.status is Status.BUILD_ERROR and r.mode == "import" and "SyntaxError" in r.log_tail
    r = build_submission(inspect_folder(missing), build_dir=tmp_path / "b2", device=CPU, limits=limits)
    assert r.status is Status.BUILD_ERROR and "does not define custom_kernel" in r.message
    r = build_submission(inspect_folder(fine), build_dir=tmp_path / "b3", device=CPU, limits=limits)
    assert r.status is Status.PASS


def test_on_a_gpu_machine_the_import_check_sees_no_gpu_and_a_file_that_needs_one_is_run(
        make_submission, tmp_path):
    # Red team, session 7 (tests/adversarial/import_gpu_hog_py): the import check runs while
    # other submissions are timed, so it gets no GPU; a file that uses one when imported passes
    # the build and is imported on its own GPU worker's GPU, at its first case.
    import dataclasses
    gpu = dataclasses.replace(CPU, cuda=True, name="NVIDIA H100", capability=(9, 0))
    sees = make_submission("sees", """
        import os
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "", os.environ["CUDA_VISIBLE_DEVICES"]
        def custom_kernel(data):
            return data[0]
    """)
    needs = make_submission("needs", """
        raise RuntimeError("No CUDA GPUs are available")
        def custom_kernel(data):
            return data[0]
    """)
    broken = make_submission("broken", "raise ValueError('not finished')\n")
    limits = config.Limits()
    r = build_submission(inspect_folder(sees), build_dir=tmp_path / "b1", device=gpu, limits=limits)
    assert r.status is Status.PASS, r.log_tail
    r = build_submission(inspect_folder(needs), build_dir=tmp_path / "b2", device=gpu, limits=limits)
    assert r.status is Status.PASS and "imported on its GPU, at its first case" in r.message
    r = build_submission(inspect_folder(broken), build_dir=tmp_path / "b3", device=gpu, limits=limits)
    assert r.status is Status.BUILD_ERROR and "not finished" in r.message
    r = build_submission(inspect_folder(needs), build_dir=tmp_path / "b4", device=CPU, limits=limits)
    assert r.status is Status.BUILD_ERROR   # without a GPU anywhere, that is the verdict


def test_import_that_hangs_times_out(make_submission, tmp_path, monkeypatch):
    monkeypatch.setattr(build, "machine_load", lambda: 0.1)   # an idle machine: the student's
    hang = make_submission("hang", "import time\ntime.sleep(600)\n")
    r = build_submission(inspect_folder(hang), build_dir=tmp_path / "b", device=CPU,
                         limits=config.Limits(import_s=3))
    assert r.status is Status.TIMEOUT and "within 3 s" in r.message and "twice" not in r.message
    assert r.elapsed_s < 6


def test_a_timeout_on_an_overloaded_machine_is_retried_then_the_machines(make_submission, tmp_path,
                                                                          monkeypatch):
    monkeypatch.setattr(build, "machine_load", lambda: 9.0)
    monkeypatch.setattr(config, "BUILD_LOAD_SCALE_MAX", 1.5)   # the limit follows the load: 3 s
    hang = make_submission("hang", "import time\ntime.sleep(600)\n")
    r = build_submission(inspect_folder(hang), build_dir=tmp_path / "b", device=CPU,
                         limits=config.Limits(import_s=2))
    assert r.status is Status.ENVIRONMENT_ERROR and not r.status.scored and r.under_load
    assert "twice" in r.message and "overloaded (load 9.0 per core)" in r.message
    assert "within 3 s (the limit times 1.5 for the grading machine's load)" in r.message
    assert "not your fault" in r.message and r.elapsed_s >= 6


def test_a_missing_provided_module_is_the_machines_fault_and_retried(make_submission, tmp_path,
                                                                     monkeypatch):
    monkeypatch.setattr(config, "PROVIDED_MODULES", (*config.PROVIDED_MODULES, "grader_absent_mod"))
    calls = []
    real = build._build_once
    monkeypatch.setattr(build, "_build_once", lambda *a, **k: calls.append(1) or real(*a, **k))
    sub = make_submission("needs", "import grader_absent_mod\ndef custom_kernel(d):\n    return d[0]\n")
    r = build_submission(inspect_folder(sub), build_dir=tmp_path / "b", device=CPU, limits=config.Limits())
    assert r.status is Status.ENVIRONMENT_ERROR and len(calls) == 2
    assert "lacks the Python module 'grader_absent_mod'" in r.message and "tried twice" in r.message
    # a module the course does not provide is the student's own import error
    other = make_submission("other", "import grader_unknown_mod\n")
    r = build_submission(inspect_folder(other), build_dir=tmp_path / "b2", device=CPU, limits=config.Limits())
    assert r.status is Status.BUILD_ERROR and "grader_unknown_mod" in r.message


def test_a_submission_cannot_claim_the_machine_lacks_a_module_it_has(make_submission, tmp_path):
    liar = make_submission("liar", "raise ModuleNotFoundError(\"No module named 'torch'\")\n")
    r = build_submission(inspect_folder(liar), build_dir=tmp_path / "b", device=CPU, limits=config.Limits())
    assert r.status is Status.BUILD_ERROR


def test_environment_problem_reads_tools_and_headers(monkeypatch):
    monkeypatch.setattr(build_log, "cuda_include_dirs", lambda: [])
    monkeypatch.setattr(build_log, "_cuda_home_include", lambda: [])
    out = "/x/ATen/cuda/CUDAContext.h:7:10: fatal error: cusparse.h: No such file or directory\n"
    assert "cusparse.h" in build.environment_problem(out, "compile_only")
    assert build.environment_problem(out, "import") == ""
    assert build.environment_problem("fatal error: mine.h: No such file or directory", "compile_only") == ""


def test_cuda_without_nvcc_is_an_environment_error(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "submission.cu").write_text("// x")
    r = build_submission(inspect_folder(tmp_path / "s"), build_dir=tmp_path / "b", device=CPU,
                         limits=config.Limits())
    assert r.status is Status.ENVIRONMENT_ERROR and "nvcc" in r.message and "not graded" in r.message


def test_invalid_folder_is_a_build_error_with_the_reason(tmp_path):
    (tmp_path / "empty").mkdir()
    r = build_submission(inspect_folder(tmp_path / "empty"), build_dir=tmp_path / "b", device=CPU,
                         limits=config.Limits())
    assert r.status is Status.BUILD_ERROR and "neither submission.cu nor submission.py" in r.message


@pytest.mark.slow
@pytest.mark.skipif(not has_nvcc(), reason="needs nvcc")
def test_compile_check_without_gpu_reports_the_students_line(tmp_path):
    from grader.isolation.device import find_nvcc
    import dataclasses
    cpu = dataclasses.replace(CPU, nvcc=find_nvcc())
    r = build_submission(inspect_folder(EXAMPLES / "build_error"), build_dir=tmp_path / "b",
                         device=cpu, limits=config.Limits())
    assert r.status is Status.BUILD_ERROR and r.mode == "compile_only"
    line = next(i for i, l in enumerate((EXAMPLES / "build_error" / "submission.cu").read_text()
                                        .splitlines(), 1) if "m_nwe" in l)
    assert f"submission.cu:{line}: error" in r.log_tail and "m_nwe" in r.message


def test_only_the_machines_outcomes_go_unscored():
    assert {s for s in Status if not s.scored} == {Status.NOT_RUN, Status.ENVIRONMENT_ERROR,
                                                   Status.NO_RESULT}
    assert "not your fault" in Status.ENVIRONMENT_ERROR.description
    assert all(s.description for s in Status)


def test_a_run_that_times_out_on_an_overloaded_machine_is_retried_then_the_machines(monkeypatch):
    import types
    from grader.stages import run as run_stage
    calls, notes = [], []
    def timed_out(*a):
        calls.append(1)
        return run_stage.Ran({"c1": dict(status="timeout", message="still running after 2 s"),
                             "c2": dict(status="pass", message="")}, "log", None, {})
    monkeypatch.setattr(run_stage, "run_cases", timed_out)
    ctx = types.SimpleNamespace(progress=types.SimpleNamespace(note=notes.append))
    sub = types.SimpleNamespace(id="alice")
    monkeypatch.setattr(run_stage, "machine_load", lambda: 0.5)      # idle: the student's timeout
    runs, *_ = run_stage.run_cases_under_load(sub, None, [], ctx, None)
    assert runs["c1"]["status"] == "timeout" and len(calls) == 1 and not notes
    monkeypatch.setattr(run_stage, "machine_load", lambda: 9.0)      # overloaded: twice, the machine's
    runs, *_ = run_stage.run_cases_under_load(sub, None, [], ctx, None)
    assert len(calls) == 3 and "overloaded" in notes[0]
    assert runs["c1"]["status"] == "environment_error" and "not your" in runs["c1"]["message"]
    assert runs["c1"]["overloaded"] and "overloaded" not in runs["c2"]
    assert runs["c2"]["status"] == "pass"
    # a hung submission's own threads load the machine while it runs: read after the stage, the
    # load is high; read before it, low. Its timeout stays its own, with no second try.
    loads = iter([0.5, 9.0, 9.0])
    monkeypatch.setattr(run_stage, "machine_load", lambda: next(loads))
    runs, *_ = run_stage.run_cases_under_load(sub, None, [], ctx, None)
    assert runs["c1"]["status"] == "timeout" and len(calls) == 4


def test_every_extension_links_the_cuda_driver_from_the_stub_or_the_installed_library(
        tmp_path, monkeypatch):
    """Tensor-map encoding (cuTensorMapEncodeTiled) needs the driver linked in; the toolkit's stub
    comes first (no GPU needed), then the installed driver's libcuda.so.1, then nothing."""
    home, driver = tmp_path / "cuda", tmp_path / "driver"
    (home / "targets" / "x86_64-linux" / "lib" / "stubs").mkdir(parents=True)
    driver.mkdir()
    (driver / "libcuda.so.1").write_bytes(b"")
    monkeypatch.setattr(build_flags, "find_nvcc", lambda: str(home / "bin" / "nvcc"))
    monkeypatch.setattr(build_flags.os.path, "isfile", lambda p, real=build_flags.os.path.isfile:
                        real(p) and str(p).startswith(str(tmp_path)))
    monkeypatch.setattr(build_flags, "_driver_folders", lambda: [str(driver)])

    def flags():
        build_flags.driver_ldflags.cache_clear()
        return build_flags.driver_ldflags()
    try:
        assert flags() == (f"-L{driver}", "-l:libcuda.so.1")
        (home / "targets" / "x86_64-linux" / "lib" / "stubs" / "libcuda.so").write_bytes(b"")
        assert flags() == (f"-L{home}/targets/x86_64-linux/lib/stubs", "-lcuda")
        monkeypatch.setattr(build_flags, "find_nvcc", lambda: None)
        (driver / "libcuda.so.1").unlink()
        assert flags() == ()
    finally:
        build_flags.driver_ldflags.cache_clear()


# ---------------------------------------------------------------- what a CUDA build opened and defines


def test_the_compile_check_asks_nvcc_for_the_files_it_opens(tmp_path):
    cmd = build_child.compile_check_command(tmp_path / "cuda.cu", tmp_path / build.STUDENT_OBJECT, "m",
                                            "90a", "nvcc", depfile=tmp_path / build_headers.DEPFILE)
    at = cmd.index("-MD")
    assert cmd[at + 1:at + 3] == ["-MF", str(tmp_path / build_headers.DEPFILE)]
    assert "-MD" not in build_child.compile_check_command(tmp_path / "cuda.cu", tmp_path / "x.o", "m",
                                                          "90a", "nvcc")


def test_a_dependency_file_is_read_as_make_reads_it():
    text = ("/b/cuda.cuda.o : /b/cuda.cu /usr/include/a\\ b.h \\\n"
            "    /s/$$x\\#y.h /s/c.h\n/usr/include/a\\ b.h:\n")
    assert build_headers.depfile_paths(text) == ["/b/cuda.cu", "/usr/include/a b.h", "/s/$x#y.h", "/s/c.h"]
    with pytest.raises(ValueError):
        build_headers.depfile_paths("no rule here\n")


# torch's ninja rule for a CUDA source (torch.utils.cpp_extension._write_ninja_file, CUDA builds),
# with gcc in nvcc's place: ninja reads the depfile into .ninja_deps and removes it.
TORCH_RULE = """rule cuda_compile
  depfile = $out.d
  deps = gcc
  command = {compiler} -MD -MF $out.d -c $in -o $out
build cuda.cuda.o: cuda_compile {source}
default cuda.cuda.o
"""


@pytest.mark.skipif(any(shutil.which(t) is None for t in ("ninja", "gcc")), reason="needs ninja")
def test_the_extension_build_records_what_ninja_kept_of_nvccs_dependency_list(tmp_path, capsys):
    (tmp_path / "own.h").write_text("#define SCALE 2\n")
    (tmp_path / "cuda.cu.c").write_text('#include "own.h"\n#include <stdint.h>\nint f(void) { return SCALE; }\n')
    (tmp_path / "build.ninja").write_text(TORCH_RULE.format(compiler="gcc", source=tmp_path / "cuda.cu.c"))
    subprocess.run(["ninja", "-C", str(tmp_path)], check=True, capture_output=True)
    assert not (tmp_path / "cuda.cuda.o.d").exists()   # ninja keeps it, in .ninja_deps
    with pytest.raises(SystemExit) as ended:
        build_headers._exit_recorded(0, tmp_path, lambda: build_headers.ninja_deps(tmp_path), "ninja -t deps",
                                     base=tmp_path)
    assert ended.value.code == 0
    record = reach.read_headers_record(tmp_path / build.HEADERS_RECORD)
    assert record[0] == str(tmp_path / "cuda.cu.c") and str(tmp_path / "own.h") in record
    assert any(h.endswith("/stdint.h") for h in record)
    # a rule that asked for no dependency list: no record, said, and the compile's own exit
    (tmp_path / build.HEADERS_RECORD).unlink()
    (tmp_path / "build.ninja").write_text(TORCH_RULE.format(compiler="gcc", source=tmp_path / "cuda.cu.c")
                                          .replace("  depfile = $out.d\n  deps = gcc\n", ""))
    subprocess.run(["ninja", "-C", str(tmp_path), "-t", "recompact"], check=True, capture_output=True)
    (tmp_path / "cuda.cuda.o").unlink()
    subprocess.run(["ninja", "-C", str(tmp_path)], check=True, capture_output=True)
    with pytest.raises(SystemExit) as ended:
        build_headers._exit_recorded(0, tmp_path, lambda: build_headers.ninja_deps(tmp_path), "ninja -t deps",
                                     base=tmp_path)
    assert ended.value.code == 0 and not (tmp_path / build.HEADERS_RECORD).exists()
    assert "grader: no record of the headers the build opened" in capsys.readouterr().out


def test_the_extension_build_has_torch_ask_nvcc_for_its_dependency_list(tmp_path, monkeypatch):
    """torch's ninja rule asks nvcc for the list unless TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES
    is 1 in the environment the grader inherited; the build child sets it to 0 for its own call."""
    from torch.utils import cpp_extension
    seen = {}
    monkeypatch.setenv("TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES", "1")
    monkeypatch.setattr(cpp_extension, "load_inline", lambda **kw: seen.update(
        skip=os.environ["TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES"]))
    monkeypatch.setattr(cpp_extension, "_import_module_from_library",
                        cpp_extension._import_module_from_library)
    (tmp_path / "submission.cu").write_text("// a kernel\n")
    build_child.build_extension(tmp_path / "submission.cu", "m", tmp_path / "b", "90a")
    assert seen == {"skip": "0"}


@pytest.mark.skipif(any(shutil.which(t) is None for t in ("g++", "nm", "c++filt")),
                    reason="needs g++ and binutils")
def test_a_passing_cuda_build_carries_its_kernels_and_without_its_record_is_the_machines(tmp_path):
    from .test_native_audit import KERNELS, kernel_object
    kernel_object(tmp_path, KERNELS)
    built = BuildResult(Status.PASS, "compile_only", 40.0)
    assert [k.split("<")[0] for k in build.with_kernels(built, tmp_path).kernels] == \
        ["void attention_kernel1", "void attention_kernel1"]
    failed = BuildResult(Status.BUILD_ERROR, "compile_only", 4.0, message="compile failed")
    assert build.with_kernels(failed, tmp_path) == failed
    (tmp_path / build.HEADERS_RECORD).unlink()
    unaudited = build.with_kernels(built, tmp_path)
    assert unaudited.status is Status.ENVIRONMENT_ERROR and "no record of the headers" in unaudited.message
    assert "not your fault" in unaudited.message


def test_result_files_from_before_kernels_were_recorded_still_load():
    old = dict(status="pass", mode="extension", elapsed_s=40.0, artifact="/b/m.so", message="",
               log_tail="", reused=True)
    assert BuildResult.from_dict(old) == BuildResult(Status.PASS, "extension", 40.0,
                                                     artifact="/b/m.so", reused=True)
    new = BuildResult(Status.PASS, "extension", 40.0, kernels=("void k<64>(float*)",),
                      review=("cuda.cuda.o: &free",), audit_notes=("submission.cu line 3: x",))
    assert BuildResult.from_dict(json.loads(json.dumps(new.to_dict()))) == new


# ---------------------------------------------------------------- a student's check (issue 34)
# On a student's machine a build that runs past its limit is most often the machine (a busy
# laptop timed the untouched skeleton out twice), and a silent compile of a minute looks hung.


def test_a_checks_timeout_names_the_limit_to_raise_and_is_not_tried_again(make_submission,
                                                                           tmp_path, monkeypatch):
    monkeypatch.setattr(build, "machine_load", lambda: 9.0)   # a course's build would try twice
    calls = []
    real = build._build_once
    monkeypatch.setattr(build, "_build_once", lambda *a, **k: calls.append(1) or real(*a, **k))
    hang = make_submission("hang", "import time\ntime.sleep(600)\n")
    r = build_submission(inspect_folder(hang), build_dir=tmp_path / "b", device=CPU,
                         limits=config.Limits(import_s=2), student_check=StudentCheck())
    assert r.status is Status.TIMEOUT and len(calls) == 1, r.message
    assert r.message.startswith("the import of submission.py did not finish in 2 s: this machine "
                                "may be slow or busy (load 9.0 per core when it began)")
    assert "make check GRADER_IMPORT_S=900" in r.message
    assert "the environment variable GRADER_IMPORT_S=900" in r.message
    assert "not your fault" not in r.message and "instructor" not in r.message


def test_a_message_names_the_grading_machine_in_a_course_and_this_machine_in_a_check(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "submission.cu").write_text("// x")
    sub = inspect_folder(tmp_path / "s")
    graded = build_submission(sub, build_dir=tmp_path / "b", device=CPU, limits=config.Limits())
    checked = build_submission(sub, build_dir=tmp_path / "b", device=CPU, limits=config.Limits(),
                               student_check=StudentCheck())
    assert graded.message.startswith("the grading machine has no nvcc")
    assert "the instructor fixes the machine and grades it again" in graded.message
    assert checked.status is Status.ENVIRONMENT_ERROR
    assert checked.message.startswith("this machine has no nvcc (the CUDA toolkit): install it or set "
                                      "CUDA_HOME")
    assert "instructor fixes" not in checked.message and "make env" in checked.message


def test_slow_build_message_names_the_make_and_the_environment_variable(monkeypatch):
    text = build.slow_build_message("compile", 300, source_name="submission.cu", phase="ptxas",
                                    load=2.54)
    assert text.startswith("the compile of submission.cu did not finish in 300 s (it was in: "
                           "ptxas): this machine may be slow or busy (load 2.5 per core")
    assert "make check GRADER_BUILD_S=900 (for python -m grader check, the environment variable " \
           "GRADER_BUILD_S=900)." in text
    # three times the limit, at least 900 s
    assert "GRADER_BUILD_S=1500" in build.slow_build_message("compile", 500, source_name="s.cu",
                                                             phase="", load=0.5)
    assert "(it was in" not in build.slow_build_message("compile", 40, source_name="s.cu",
                                                        phase="", load=0.5)
    # the variables named are the ones the limits are read from
    for what, variable in build_messages.LIMIT_ENV.items():
        monkeypatch.setenv(variable, "7")
    limits = config.Limits.from_env()
    assert (limits.build_s, limits.import_s) == (7.0, 7.0)


# The processes of a compile check (nvcc -c) and of torch's ninja build, as /proc shows them
# ((comm, argv), seen on the CPU machine on 2026-11-26): nvcc runs each tool through `sh -c`.
PY = ("python3.11", ["/k/.venv/bin/python", "-m", "grader.build.stage", "compile_only", "s.cu"])
NVCC = ("nvcc", ["/usr/local/cuda/bin/nvcc", "-c", "/b/cuda.cu", "-o", "/b/cuda.cuda.o"])
SH = ("sh", ["sh", "-c", "gcc -std=c++20 ..."])
GCC = ("gcc", ["gcc", "-std=c++20", "-E", "-x", "c++", "/b/cuda.cu"])


def tool(name: str, *args: str) -> tuple[str, list[str]]:
    return name, [f"/usr/local/cuda/bin/{name}", *args]


@pytest.mark.parametrize("running, phase", [
    ([PY], "starting (Python, torch)"),
    ([PY, NVCC], "nvcc"),
    ([PY, NVCC, SH, GCC, ("cc1plus", ["/usr/lib/gcc/x86_64-linux-gnu/12/cc1plus", "-E", "-quiet"])],
     "preprocessor"),
    ([PY, NVCC, SH, tool("cudafe++", "--c++20")], "front end (cudafe++)"),
    ([PY, NVCC, SH, ("cicc", ["/usr/local/cuda/nvvm/bin/cicc", "--c++20"])], "device code (cicc)"),
    ([PY, NVCC, SH, tool("ptxas", "-arch=sm_90a")], "ptxas"),
    ([PY, NVCC, SH, tool("fatbinary", "--create")], "fatbinary"),
    ([PY, NVCC, SH, ("gcc", ["gcc", "-c", "-x", "c++"]),
      ("cc1plus", ["/usr/lib/gcc/x86_64-linux-gnu/12/cc1plus", "-quiet", "cuda.cudafe1.cpp"])],
     "host compiler"),
    # torch's ninja build with a GPU: nvcc on cuda.cu beside c++ on main.cpp, then the link
    ([PY, ("ninja", ["/k/.venv/bin/ninja", "-v"]), NVCC, SH, ("cicc", ["cicc"]),
      ("c++", ["c++", "-c", "main.cpp"]), ("cc1plus", ["cc1plus", "main.cpp"])],
     "device code (cicc) + host compiler"),
    ([PY, ("ninja", ["ninja", "-v"]), ("c++", ["c++", "-shared", "main.o", "cuda.cuda.o"]),
      ("collect2", ["/usr/lib/gcc/x86_64-linux-gnu/12/collect2", "-plugin"]), ("ld", ["/usr/bin/ld"])],
     "link"),
    ([PY, ("ninja", ["ninja", "-v"])], "ninja"),
    ([], ""),
])
def test_build_phase_reads_which_tool_the_build_runs(running, phase):
    assert build_watch.build_phase(running) == phase
    assert build_watch.build_phase(list(reversed(running))) == phase   # the order /proc lists them in


def test_python_alone_after_the_compile_is_not_called_starting():
    """What a timeout's message names: Python alone before any tool ran is the build starting;
    after nvcc or a tool ran, it is the build child's work after the compile."""
    following = build_watch.following
    assert following(build_watch.STARTING, "") == build_watch.STARTING
    assert following(build_watch.STARTING, build_watch.STARTING) == build_watch.STARTING
    assert following(build_watch.STARTING, "device code (cicc)") == build_watch.AFTER_COMPILE
    assert following(build_watch.STARTING, "nvcc") == build_watch.AFTER_COMPILE
    assert following(build_watch.STARTING, build_watch.AFTER_COMPILE) == build_watch.AFTER_COMPILE
    assert following("ptxas", build_watch.AFTER_COMPILE) == "ptxas"   # a second compile (ninja)


def test_progress_lines_say_what_runs_for_how_long_and_the_limit():
    assert build_messages.progress_line("compile", "submission.cu", "ptxas", 42.4, 300) == \
        "compiling submission.cu: ptxas, 42 s (limit 300 s: GRADER_BUILD_S)"
    assert build_messages.progress_line("import", "submission.py", "", 12.0, 120) == \
        "importing submission.py, 12 s (limit 120 s: GRADER_IMPORT_S)"


def test_a_checks_build_reports_its_progress_while_it_runs_and_a_courses_does_not(
        make_submission, tmp_path):
    slow = make_submission("slow", "import time\ntime.sleep(6)\n"
                                   "def custom_kernel(data):\n    return data[0]\n")
    lines = []
    r = build_submission(inspect_folder(slow), build_dir=tmp_path / "b", device=CPU,
                         limits=config.Limits(), student_check=StudentCheck(lines.append, every_s=1.0))
    assert r.status is Status.PASS, r.log_tail
    assert len(lines) >= 2, lines
    assert all(re.fullmatch(r"importing submission\.py, \d+ s \(limit 120 s: GRADER_IMPORT_S\)", l)
               for l in lines), lines
    seconds = [int(re.search(r", (\d+) s", l).group(1)) for l in lines]
    assert seconds == sorted(seconds) and seconds[-1] >= 5, lines   # it slept 6 s
    assert not [t for t in threading.enumerate() if t.name == "build-watch"]   # stopped with it


def test_only_a_case_the_load_rule_ended_makes_a_result_the_overloaded_machine_s():
    """stages/run.py overloaded reads the typed flag the load rule sets, never a message: a
    submission cannot earn a second grading by printing the rule's words, nor lose one by
    their rewording."""
    import types
    from grader.course.verdicts import CaseResult
    from grader.stages.run import overloaded
    words = "timed out twice, both times while the grading machine was overloaded, load 3.0"
    def result(*cases):
        return types.SimpleNamespace(status=Status.ENVIRONMENT_ERROR, cases=cases)
    assert overloaded(result(CaseResult("c", Status.ENVIRONMENT_ERROR, "", overloaded=True)))
    assert not overloaded(result(CaseResult("c", Status.ENVIRONMENT_ERROR, words)))
    assert not overloaded(result(CaseResult("c", Status.RUNTIME_ERROR, words, overloaded=False)))
    passed = types.SimpleNamespace(status=Status.PASS,
                                   cases=(CaseResult("c", Status.ENVIRONMENT_ERROR, "", overloaded=True),))
    assert not overloaded(passed)
    # the flag survives the result file
    case = CaseResult("c", Status.ENVIRONMENT_ERROR, "x", overloaded=True)
    assert CaseResult.from_dict(case.to_dict()).overloaded


def test_a_folder_the_grading_side_lost_is_an_environment_error_not_a_build_error(tmp_path):
    """An INVALID submission is the student's build_error, unless the grader's side lost or
    damaged it (Submission.machine_fault: a service store's upload, course/service_drop.py):
    then it is environment_error, never a grade."""
    from grader.course.submission import Kind, Submission
    for fault, status in ((False, Status.BUILD_ERROR), (True, Status.ENVIRONMENT_ERROR)):
        sub = Submission("alice", tmp_path, Kind.INVALID, problem="its upload is damaged.",
                         machine_fault=fault)
        built = build_submission(sub, build_dir=tmp_path / "b", device=CPU, limits=config.Limits(),
                                 sandbox=None)
        assert built.status is status and built.message == "its upload is damaged."


def test_the_real_build_compiles_the_unit_against_the_tensor_api_first_and_again_whole_if_not(
        tmp_path, monkeypatch, capfd):
    """Issue 32: the CUDA builds' CPU bounds a course's end, and about half of nvcc's work on a
    kernel file is torch/extension.h's binding and C++ frontend, which a kernel does not use. The
    real build compiles the unit against CHECK_EXTENSION_H first (its -I, for the CUDA unit only:
    the binding keeps the real header); a unit that fails there for any reason is compiled again
    with the full header, and only that compile's output reaches the log the student reads."""
    source = tmp_path / "submission.cu"
    source.write_text("// a kernel\n")
    calls = []

    def fake(src, name, build_dir, arch, extra):
        calls.append(list(extra))
        os.write(1, f"compile {len(calls)}\n".encode())   # ninja writes to fd 1, not sys.stdout
        if any(f.startswith("-I") for f in extra) and len(calls) == 1 and fail_first:
            raise RuntimeError("Error building extension")
        return build_dir / f"{name}.so"

    monkeypatch.setattr(build_child, "_load_inline", fake)
    fail_first = False
    path = build_child.build_extension(source, "sub_x", tmp_path / "ok", "90a", ["-DX=1"])
    assert path == tmp_path / "ok" / "sub_x.so" and len(calls) == 1
    shim = tmp_path / "ok" / "check-include"
    assert calls[0] == ["-DX=1", f"-I{shim}"]
    assert (shim / "torch" / "extension.h").read_text() == build_child.CHECK_EXTENSION_H
    out = capfd.readouterr().out
    assert "compile 1\n" in out and "again with the full" not in out
    assert not (tmp_path / "ok" / "tensor-api-compile.log").exists()

    calls.clear()
    fail_first = True
    build_child.build_extension(source, "sub_x", tmp_path / "again", "90a", ["-DX=1"])
    assert calls == [["-DX=1", f"-I{tmp_path / 'again' / 'check-include'}"], ["-DX=1"]]
    out = capfd.readouterr().out
    assert "compile 1" not in out and "compile 2\n" in out   # the first compile's output dropped
    assert "compiling submission.cu again with the full torch/extension.h" in out
    # what the student reads first is the real build's first error, not the grader's line
    log = (out + "FAILED: cuda.cuda.o\nptxas fatal   : Unresolved extern function '_Z3fooi'\n"
           "RuntimeError: Error building extension 'sub_x'\n")
    assert build_log._first_error(build_log.relevant_log(log)).startswith("RuntimeError")

    calls.clear()   # a unit that names the binding or the C++ frontend: the full header at once
    source.write_text("#include <torch/extension.h>\nauto f = torch::nn::functional::softmax;\n")
    build_child.build_extension(source, "sub_x", tmp_path / "whole", "90a", ["-DX=1"])
    assert calls == [["-DX=1"]] and not (tmp_path / "whole" / "check-include").exists()
    for text in ("py::object o;", "PYBIND11_MODULE(m, m) {}", "PyObject *p;", "Py_INCREF(p);",
                 "torch::optim::SGD s;", "torch::jit::load(x);"):
        assert build_child.NEEDS_FULL_HEADER.search(text), text
    for text in ("// PyTorch's layout", "at::Tensor t;", "torch::Tensor q;", "c10::Half h;",
                 "torch::empty_like(q)", "nnz += 1;"):
        assert not build_child.NEEDS_FULL_HEADER.search(text), text


def test_a_second_load_inline_of_one_name_keeps_the_name(tmp_path, monkeypatch):
    """torch renames a module built twice in one process with other flags (<name>_v1); the
    second compile of build_extension must build the module the grader loads (<name>.so)."""
    from torch.utils import cpp_extension
    seen = []

    def fake_load_inline(name, **kw):
        seen.append(cpp_extension.JIT_EXTENSION_VERSIONER.bump_version_if_changed(
            name, [], build_arguments=[kw["extra_cuda_cflags"]], build_directory=str(tmp_path),
            with_cuda=True, with_sycl=False, is_python_module=True, is_standalone=False))

    monkeypatch.setattr(cpp_extension, "load_inline", fake_load_inline)
    monkeypatch.setattr(cpp_extension, "_import_module_from_library", None)
    source = tmp_path / "submission.cu"
    source.write_text("// a kernel\n")
    build_child._load_inline(source, "sub_twice", tmp_path, "90a", ["-Ia"])
    build_child._load_inline(source, "sub_twice", tmp_path, "90a", [])
    assert seen == [0, 0]
