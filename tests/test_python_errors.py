"""A Python submission's error names the student's file, line and code (issue 34): a SyntaxError
with Python's caret, a runtime error with the student's own frames, and never the grader's, in
`check`'s output, the feedback Markdown and the leaderboard page alike."""

from __future__ import annotations

import html
import importlib
import re
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path

import pytest

from grader.common import config

from grader.trusted import run_stage
from grader.problem import Case
from grader.course.verdicts import CaseResult
from grader.report.feedback import ERRORS_WITHHELD, errors_withheld, feedback_markdown
from grader.stages.folders import SUBJECT
from grader.report.privacy import Redactor
from grader.isolation.procs import child_env
from grader.course.results import SubmissionResult
from grader.common.status import Status
from grader.subject.tracebacks import RAISED_HERE, student_traceback

GRADER_FRAMES = ("loop.py", "harness.py", "grader/", "importlib", "<frozen")

SYNTAX_ERROR = {"submission.py": """\
    import torch


    def custom_kernel(data)
        q, k, v = data
        return q
    """}

# An IndexError two frames deep: custom_kernel -> tile (submission.py) -> pick (helpers.py).
INDEX_ERROR = {
    "submission.py": """\
    import torch
    from helpers import pick


    def tile(q):
        rows = [q[0]]
        return pick(rows, 3)


    def custom_kernel(data):
        q, k, v = data
        tile(q)
        return q
    """,
    "helpers.py": """\
    def pick(rows, i):
        return rows[i]
    """}


def write(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in files.items():
        (folder / name).write_text(textwrap.dedent(source))
    return folder


def lines_of(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()]


def assert_names_the_syntax_error(text: str) -> None:
    """`text` shows submission.py's line 4, its source and Python's own caret under the missing
    ':', and no grader frame."""
    lines = lines_of(text)
    at = lines.index(f'  File "submission.py", line 4{RAISED_HERE}')
    assert lines[at + 1:at + 3] == ["    def custom_kernel(data)", " " * 27 + "^"], text
    assert "SyntaxError: expected ':' (submission.py, line 4)" in lines, text
    assert not [w for w in GRADER_FRAMES if w in text], text


def assert_names_the_index_error(text: str) -> None:
    """`text` shows the three frames of the student's code, the innermost marked, each with its
    source line, then the error; no grader frame."""
    lines = lines_of(text)
    at = lines.index("Traceback (most recent call last):")
    frames = [line for line in lines[at:] if line.startswith("  File ")]
    assert frames[:3] == ['  File "submission.py", line 12, in custom_kernel',
                          '  File "submission.py", line 7, in tile',
                          f'  File "helpers.py", line 2, in pick{RAISED_HERE}'], text
    assert lines[lines.index(frames[2]) + 1] == "    return rows[i]", text
    assert "IndexError: list index out of range" in lines[at:], text
    assert not [w for w in GRADER_FRAMES if w in text], text


# ---------------------------------------------------------------- the subject's formatting


def raised(tmp_path, files: dict[str, str], call: str, library: str = "") -> BaseException:
    """The exception `call` raises in a module `main` of a submission folder made of `files`,
    with a module `lib` outside that folder (a library's code) made of `library`."""
    folder = write(tmp_path / "sub", files)
    write(tmp_path / "site", {"lib.py": library})
    sys.path[:0] = [str(folder), str(tmp_path / "site")]
    try:
        exec(call, {"importlib": importlib})
    except BaseException as e:   # noqa: BLE001 - what is wanted
        return e
    finally:
        del sys.path[:2]
        for name in [*files, "lib.py"]:
            sys.modules.pop(name.removesuffix(".py"), None)
    pytest.fail(f"{call} raised nothing")


def test_a_runtime_error_keeps_the_student_s_frames_only(tmp_path):
    """A library's frame between two of the student's is cut, as is this test's own; the
    innermost frame is marked, with Python's source line and carets."""
    e = raised(tmp_path, {"main.py": """\
        from lib import apply

        def run():
            return apply(step, [1])

        def step(rows):
            return rows[3]
        """}, "importlib.import_module('main').run()",
        library="def apply(f, x):\n    return f(x)\n")
    text = student_traceback(e, (tmp_path / "sub").resolve())
    assert lines_of(text) == [
        "Traceback (most recent call last):",
        '  File "main.py", line 4, in run',
        "    return apply(step, [1])",
        "           ^^^^^^^^^^^^^^^^",
        f'  File "main.py", line 7, in step{RAISED_HERE}',
        "    return rows[3]",
        "           ~~~~^^^",
        "IndexError: list index out of range"], text
    assert "lib.py" in "".join(traceback.format_exception(e))   # it was there to cut


def test_a_syntax_error_keeps_python_s_caret_and_the_import_that_reached_it(tmp_path):
    e = raised(tmp_path, {"main.py": "import helpers\n",
                          "helpers.py": "def pick(rows, i)\n    return rows[i]\n"},
               "importlib.import_module('main')")
    text = student_traceback(e, (tmp_path / "sub").resolve())
    python_s = lines_of("".join(traceback.format_exception_only(e)))
    assert lines_of(text) == [
        "Traceback (most recent call last):",
        '  File "main.py", line 1, in <module>',
        "    import helpers",
        f'  File "helpers.py", line 1{RAISED_HERE}',
        "    def pick(rows, i)",
        python_s[2],                       # Python's own caret, under the missing ':'
        "SyntaxError: expected ':' (helpers.py, line 1)"], text
    assert python_s[2] == " " * 21 + "^"


def test_an_error_with_none_of_the_student_s_code_on_the_way_is_the_error_alone(tmp_path):
    """A chained error keeps its chain; an error raised in a library called from no student
    frame (a CUDA extension's, for one) says its type and message only."""
    e = raised(tmp_path, {"main.py": """\
        def run():
            try:
                {}["k"]
            except KeyError as e:
                raise ValueError("no k") from e
        """}, "importlib.import_module('main').run()")
    text = student_traceback(e, (tmp_path / "sub").resolve())
    assert "KeyError: 'k'" in text and "direct cause" in text and text.endswith("ValueError: no k\n")
    assert lines_of(text).count(f'  File "main.py", line 5, in run{RAISED_HERE}') == 1, text
    lib = raised(tmp_path, {}, "import lib; lib.boom()",
                 library="def boom():\n    raise RuntimeError('CUDA error: an illegal memory access')\n")
    assert student_traceback(lib, (tmp_path / "sub").resolve()) == \
        "RuntimeError: CUDA error: an illegal memory access\n"


def test_an_import_error_in_the_subject_is_the_first_case_s_verdict_with_its_line(tmp_path):
    """The run stage's load (a file that uses the GPU when imported is first imported there):
    the harness's record says the import failed, and where."""
    folder = write(tmp_path / "sub", {"submission.py": "from helpers import pick\n",
                                      "helpers.py": "def pick(rows, i)\n    return rows[i]\n"})
    case = Case(1, 2, 7, 64, seed=1)
    spec = dict(mode="run", device="cpu", target=dict(kind="python", source=str(folder / "submission.py")),
                subject_cmd=[sys.executable, str(SUBJECT)], cwd=str(folder), head_bytes=4096,
                tail_bytes=4096, file_bytes=1 << 30, deadline_s=120, out_dir=str(tmp_path),
                result=str(tmp_path / "run.json"), env=child_env(cuda=False), cases=[case.to_dict()])
    message = run_stage.run_cases(spec)["cases"][case.id]["message"]
    assert message.startswith("import failed: SyntaxError: expected ':' (helpers.py, line 1)\n"), message
    lines = lines_of(message)
    at = lines.index(f'  File "helpers.py", line 1{RAISED_HERE}')
    assert lines[at - 2:at] == ['  File "submission.py", line 1, in <module>', "    from helpers import pick"]
    assert not [w for w in GRADER_FRAMES if w in message], message


# ---------------------------------------------------------------- what the student reads


def errors_withheld_result(public_error: bool) -> SubmissionResult:
    hidden = CaseResult("b1_h2_s77_d64", Status.RUNTIME_ERROR, message="IndexError: ...", hidden=True)
    public = CaseResult("b1_h3_s3_d64", Status.RUNTIME_ERROR if public_error else Status.NOT_RUN,
                        message="IndexError: list index out of range" if public_error else "")
    return SubmissionResult(id="s", label="s", kind="python", role="student",
                            status=Status.RUNTIME_ERROR, message="runtime_error on case b1_h2_s77_d64",
                            cases=(hidden, public))


def test_feedback_says_how_to_see_an_error_raised_on_hidden_cases_only():
    """On the CPU the course's small cases are its hidden ones: an error raised there only has
    its text withheld, so the feedback says where to read it (make check)."""
    run = {"cases": [{"id": "b1_h2_s77_d64", "hidden": True,
                      "line": "batch_size: 1; num_heads: 2; seq_len: 77; head_dim: 64; seed: 11"},
                     {"id": "b1_h3_s3_d64", "hidden": False}]}
    shown = Redactor.for_run(run).student_result(errors_withheld_result(public_error=False))
    assert errors_withheld(shown) and ERRORS_WITHHELD in feedback_markdown(shown)
    assert "IndexError" not in feedback_markdown(shown)
    seen = Redactor.for_run(run).student_result(errors_withheld_result(public_error=True))
    assert not errors_withheld(seen) and ERRORS_WITHHELD not in feedback_markdown(seen)
    assert not errors_withheld(errors_withheld_result(public_error=False))   # not redacted: shown


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """`python -m grader check` of each broken folder on the CPU, both at once: its output and
    its results folder, by folder name. Each has a small public case and a small hidden one
    (whose text must stay withheld from the student)."""
    root = tmp_path_factory.mktemp("python_errors")
    (root / "public.txt").write_text("batch_size: 1; num_heads: 2; seq_len: 5; head_dim: 64; seed: 3\n")
    (root / "hidden.txt").write_text("batch_size: 1; num_heads: 3; seq_len: 11; head_dim: 64; seed: 4\n")
    started = {}
    for name, files in (("syntax_s1", SYNTAX_ERROR), ("helper_s1", INDEX_ERROR)):
        folder = write(root / "subs" / name, files)
        started[name] = subprocess.Popen(
            [sys.executable, "-m", "grader", "check", str(folder), "--out", str(root / name),
             "--build-dir", str(root / f"build_{name}"), "--cases", str(root / "public.txt"),
             "--hidden", str(root / "hidden.txt"), "--cpu"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=config.REPO_ROOT)
    done = {}
    for name, proc in started.items():
        stdout, stderr = proc.communicate(timeout=600)
        done[name] = (subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr),
                      root / name)
    return done


def page_section(out: Path, sub_id: str) -> str:
    """The leaderboard page's feedback for `sub_id`, as the browser shows its text."""
    page = (out / "leaderboard.html").read_text()
    section = re.search(rf'<details class="sub" id="sub-{sub_id}">(.*?)</details>', page, re.S)
    assert section, page[-3000:]
    return html.unescape(re.sub(r"<[^>]+>", "", section.group(1).replace("<pre>", "\n")))


@pytest.mark.slow
def test_a_syntax_error_shows_the_file_line_and_caret_in_check_feedback_and_page(checked):
    proc, out = checked["syntax_s1"]
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "import failed: SyntaxError: expected ':' (submission.py, line 4)" in proc.stdout
    assert_names_the_syntax_error(proc.stdout.replace("\n    ", "\n"))   # check indents the log
    assert_names_the_syntax_error((out / "feedback" / "syntax_s1.md").read_text())
    assert_names_the_syntax_error(page_section(out, "syntax_s1"))


@pytest.mark.slow
def test_a_runtime_error_shows_the_student_s_frames_in_check_feedback_and_page(checked):
    proc, out = checked["helper_s1"]
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    public = re.search(r"runtime_error\s+b1_h2_s5_d64\n(.*?)\n  \S", proc.stdout, re.S)
    assert public, proc.stdout[-3000:]
    assert_names_the_index_error(textwrap.dedent(public.group(1)))
    feedback = (out / "feedback" / "helper_s1.md").read_text()
    section = re.search(r"### `b1_h2_s5_d64`: runtime_error\n\n```\n(.*?)```", feedback, re.S)
    assert section, feedback
    assert_names_the_index_error(section.group(1))
    assert not [w for w in GRADER_FRAMES if w in feedback], feedback
    # the hidden case's text is withheld whole, as ever; the public case shows the error
    hidden = re.search(r"### `hidden case 1`: runtime_error\n\n```\n(.*?)```", feedback, re.S)
    assert hidden and "its output on hidden cases is not shown" in hidden.group(1), feedback
    assert "helpers.py" not in hidden.group(1) and ERRORS_WITHHELD not in feedback
    assert_names_the_index_error(page_section(out, "helper_s1"))
