import pytest

from grader import build, config
from grader.build import build_submission, relevant_log
from grader.device import DeviceInfo
from grader import sandbox as sandbox_mod
from grader.sandbox import Sandbox
from grader.status import Status
from grader.submission import inspect_folder

from .conftest import EXAMPLES, has_nvcc

CPU = DeviceInfo(cuda=False, name="cpu", capability=None, arch="90a", l2_bytes=0, memory_bytes=0,
                 sm_count=0, driver="none", torch_version="x", cuda_version=None, nvcc=None,
                 python="3")


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
    hang = make_submission("hang", "import time\ntime.sleep(600)\n")
    r = build_submission(inspect_folder(hang), build_dir=tmp_path / "b", device=CPU,
                         limits=config.Limits(import_s=2))
    assert r.status is Status.ENVIRONMENT_ERROR and not r.status.scored
    assert "twice" in r.message and "overloaded (load 9.0 per core)" in r.message
    assert "not your fault" in r.message and r.elapsed_s >= 4


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
    monkeypatch.setattr(build, "cuda_include_dirs", lambda: [])
    monkeypatch.setattr(build, "_cuda_home_include", lambda: [])
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
    from grader.device import find_nvcc
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
    from grader import pipeline
    calls, notes = [], []
    def timed_out(*a):
        calls.append(1)
        return pipeline.Ran({"c1": dict(status="timeout", message="still running after 2 s"),
                             "c2": dict(status="pass", message="")}, "log", None, {})
    monkeypatch.setattr(pipeline, "run_cases", timed_out)
    ctx = types.SimpleNamespace(progress=types.SimpleNamespace(note=notes.append))
    sub = types.SimpleNamespace(id="alice")
    monkeypatch.setattr(pipeline, "machine_load", lambda: 0.5)      # idle: the student's timeout
    runs, *_ = pipeline.run_cases_under_load(sub, None, [], ctx, None)
    assert runs["c1"]["status"] == "timeout" and len(calls) == 1 and not notes
    monkeypatch.setattr(pipeline, "machine_load", lambda: 9.0)      # overloaded: twice, the machine's
    runs, *_ = pipeline.run_cases_under_load(sub, None, [], ctx, None)
    assert len(calls) == 3 and "overloaded" in notes[0]
    assert runs["c1"]["status"] == "environment_error" and "not your" in runs["c1"]["message"]
    assert runs["c2"]["status"] == "pass"
    # a hung submission's own threads load the machine while it runs: read after the stage, the
    # load is high; read before it, low. Its timeout stays its own, with no second try.
    loads = iter([0.5, 9.0, 9.0])
    monkeypatch.setattr(pipeline, "machine_load", lambda: next(loads))
    runs, *_ = pipeline.run_cases_under_load(sub, None, [], ctx, None)
    assert runs["c1"]["status"] == "timeout" and len(calls) == 4


def test_every_extension_links_the_cuda_driver_from_the_stub_or_the_installed_library(
        tmp_path, monkeypatch):
    """Tensor-map encoding (cuTensorMapEncodeTiled) needs the driver linked in; the toolkit's stub
    comes first (no GPU needed), then the installed driver's libcuda.so.1, then nothing."""
    home, driver = tmp_path / "cuda", tmp_path / "driver"
    (home / "targets" / "x86_64-linux" / "lib" / "stubs").mkdir(parents=True)
    driver.mkdir()
    (driver / "libcuda.so.1").write_bytes(b"")
    monkeypatch.setattr(build, "find_nvcc", lambda: str(home / "bin" / "nvcc"))
    monkeypatch.setattr(build.os.path, "isfile",
                        lambda p, real=build.os.path.isfile: real(p) and str(p).startswith(str(tmp_path)))
    monkeypatch.setattr(build, "_driver_folders", lambda: [str(driver)])

    def flags():
        build.driver_ldflags.cache_clear()
        return build.driver_ldflags()
    try:
        assert flags() == (f"-L{driver}", "-l:libcuda.so.1")
        (home / "targets" / "x86_64-linux" / "lib" / "stubs" / "libcuda.so").write_bytes(b"")
        assert flags() == (f"-L{home}/targets/x86_64-linux/lib/stubs", "-lcuda")
        monkeypatch.setattr(build, "find_nvcc", lambda: None)
        (driver / "libcuda.so.1").unlink()
        assert flags() == ()
    finally:
        build.driver_ldflags.cache_clear()
