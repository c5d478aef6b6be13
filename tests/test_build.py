import pytest

from grader import config
from grader.build import build_submission, relevant_log
from grader.device import DeviceInfo
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


def test_import_that_hangs_times_out(make_submission, tmp_path):
    hang = make_submission("hang", "import time\ntime.sleep(600)\n")
    r = build_submission(inspect_folder(hang), build_dir=tmp_path / "b", device=CPU,
                         limits=config.Limits(import_s=3))
    assert r.status is Status.TIMEOUT and "within 3 s" in r.message


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


def test_first_open_todo_skips_boilerplate_and_orders_by_number():
    from grader.hints import first_open_todo
    src = ("// TODO(2.0): switch versions\n// TODO(0): nothing\n  // TODO(1.3): accumulate\n"
           "// TODO(1.1): the score s = q.k\n")
    assert first_open_todo(src) == "TODO(1.1): the score s = q.k"
    assert first_open_todo("int main() {}") is None
    skeleton = (config.REPO_ROOT / "student" / "submission.cu").read_text()
    assert first_open_todo(skeleton).startswith("TODO(1.1)")
