"""`python -m grader check PATH`: a student's check of one submission folder (check_command): a
mistaken PATH said as such (check_usage), then the student-facing result and, for CUDA, what
the compile made of each kernel (build_summary, from ptxas -v in the build log)."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path

from grader.build.flags import PTXAS_VERBOSE_ENV
from grader.cli.grade import _grade
from grader.common import config
from grader.common.status import Status
from grader.course.locks import run_build_dir
from grader.course.results import RunFileError, read_results, read_run
from grader.course.submission import CUDA_FILE, PYTHON_FILE, Kind, inspect_folder
from grader.course.verdicts import BuildResult
from grader.executors import slurm
from grader.report.feedback import feedback_text


def build_summary(build: BuildResult | None, device: dict, log: Path, *, verbose: bool) -> str:
    """For a CUDA check whose compile succeeded: the architecture the file was compiled for and,
    verbose, what ptxas said of each kernel (registers, spills, stack, shared memory), from the
    build log. '' after a compile that failed or did not finish: nothing was compiled."""
    if build is None or build.status is not Status.PASS:
        return ""
    arch = device.get("arch", config.DEFAULT_CUDA_ARCH)
    where = (f"the architecture of this machine's {device.get('name')}" if device.get("cuda") else
             "the course GPU's architecture (no GPU here: compiled, not run)")
    lines = [f"Compiled for sm_{arch}, {where}."]
    if not verbose:
        return (lines[0] + " Registers, spills and shared memory per kernel: make check VERBOSE=1 "
                "(python -m grader check --verbose).")
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return lines[0] + f" No build log at {log}."
    kernels = ptxas_report(text)
    if not kernels:
        return lines[0] + " ptxas reported no kernel (see the build log: " + str(log) + ")."
    lines.append("ptxas, per kernel (spills cost speed: registers that do not fit go to local memory):")
    width = max(len(k["kernel"]) for k in kernels)
    for k in kernels:
        lines.append(f"  {k['kernel']:{width}}  {k['registers']:>3} registers  "
                     f"{k['spill_stores']} B spill stores  {k['spill_loads']} B spill loads  "
                     f"{k['stack']} B stack  {k['smem']} B static shared memory")
    return "\n".join(lines)


_PTXAS_ENTRY = re.compile(r"ptxas info\s*: Compiling entry function '([^']+)' for '(\w+)'")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_USED = re.compile(r"ptxas info\s*: Used (\d+) registers")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")


def ptxas_report(text: str) -> list[dict]:
    """Each kernel ptxas compiled (-Xptxas=-v), in order, with its name demangled."""
    kernels, current = [], None
    for line in text.splitlines():
        m = _PTXAS_ENTRY.search(line)
        if m:
            current = dict(symbol=m.group(1), kernel=m.group(1), registers=0, spill_stores=0,
                           spill_loads=0, stack=0, smem=0)
            kernels.append(current)
            continue
        if current is None:
            continue
        m = _PTXAS_FRAME.search(line)
        if m:
            current.update(stack=int(m.group(1)), spill_stores=int(m.group(2)),
                           spill_loads=int(m.group(3)))
        m = _PTXAS_USED.search(line)
        if m:
            current["registers"] = int(m.group(1))
            smem = _PTXAS_SMEM.search(line)
            current["smem"] = int(smem.group(1)) if smem else 0
    names = _demangle([k["symbol"] for k in kernels])
    for k, name in zip(kernels, names):
        k["kernel"] = name
    return kernels


def _demangle(symbols: list[str]) -> list[str]:
    """C++ names for mangled symbols (binutils' c++filt; the symbols themselves without it),
    shortened to the kernel's name and template arguments."""
    import shutil
    import subprocess
    tool = shutil.which("c++filt")
    if not symbols or tool is None:
        return symbols
    try:
        out = subprocess.run([tool], input="\n".join(symbols), capture_output=True, text=True,
                             timeout=30).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return symbols
    if len(out) != len(symbols):
        return symbols
    return [re.sub(r"^void |\(.*\)$", "", name) for name in out]


NOT_SANDBOXED = "NOT SANDBOXED"   # how grader/isolation/sandbox.py's describe() starts without bubblewrap


def check_usage(path: Path) -> str:
    """Why `check PATH` cannot check PATH ('' if it can): it takes one submission folder, the
    one that holds submission.cu or submission.py. A missing path, a file, or a folder of
    several submissions is a mistake in the command, said as such, never a verdict."""
    files = f"{CUDA_FILE} or {PYTHON_FILE}"

    def command(folder) -> str:
        return f"make check SUBMISSION={folder}  (or: python -m grader check {folder})"

    if not path.exists():
        return (f"{path}: no such folder. Check the folder that holds your {files}, for "
                f"example: {command('student')}")
    if path.is_file():
        if path.name in (CUDA_FILE, PYTHON_FILE):
            return f"{path} is a file; check takes the folder that holds it: {command(path.parent)}"
        return (f"{path} is a file; check takes the folder that holds your {files}, for example: "
                f"{command('student')}")
    if _holds_submission(path):
        return ""
    try:
        inner = sorted(p.name for p in path.iterdir() if _holds_submission(p))
    except OSError as e:
        return f"{path}: cannot read this folder ({e.strerror})"
    if len(inner) == 1:
        return (f"{path} holds no {files} itself; its folder {inner[0]} does: "
                f"{command(path / inner[0])}")
    if inner:
        listed = ", ".join(inner[:5]) + (f" and {len(inner) - 5} more" if len(inner) > 5 else "")
        return (f"{path} holds {len(inner)} submissions ({listed}); check takes one: "
                f"{command(path / inner[0])}. To grade them all: make grade SUBMISSIONS={path}")
    return ""   # a folder with neither file: the verdict says what it holds and how to name it


def _holds_submission(folder: Path) -> bool:
    try:
        return folder.is_dir() and ((folder / CUDA_FILE).is_file() or (folder / PYTHON_FILE).is_file())
    except OSError:
        return False


def check_command(args) -> int:
    """`check`: one submission folder graded, no baselines, and the student-facing text."""
    problem = check_usage(args.path)
    if problem:   # a mistake in the command, not in the code: no verdict
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if slurm.misuse(args):
        print(f"error: {slurm.misuse(args)}", file=sys.stderr)
        return 2
    if args.executor == "slurm":   # this same check, run on a Slurm node (grader/executors/slurm.py)
        return slurm.check(args, out=args.out or
                           config.DEFAULT_RESULTS / "check" / args.path.absolute().name)
    sub = inspect_folder(args.path)
    # A results folder per submission folder (results/check/triton, ...): checks of two tracks
    # run at once; a second check of the same folder is refused (its lock names --out).
    out = args.out or config.DEFAULT_RESULTS / "check" / sub.id
    # Its build folder is that results folder's own (issue 32), so a check never builds in the
    # folder of a grading run or of another check; the build cache in build/ is shared.
    args.cache_root = args.build_dir or config.DEFAULT_BUILD
    args.build_dir = args.build_dir or run_build_dir(out)
    # Without a GPU, a Python submission also runs on small public cases (the public ones are too
    # large for a CPU); a CUDA one is compile-checked only.
    args.cpu_cases = config.CPU_CHECK_CASES if sub.kind is Kind.PYTHON else None
    if args.verbose:   # the builds this run starts report on each kernel; an unchanged one is rebuilt
        os.environ[PTXAS_VERBOSE_ENV] = "1"
        args.force = True
    code = _grade([sub], out=out, args=args, baselines=[], quiet=True)
    if code in (2, 3, 130):
        return code
    result = next(r for r in read_results(out) if r.id == sub.id)
    # The sandbox keeps a course's secrets from submissions; a student's check has none to keep.
    print(feedback_text(dataclasses.replace(result, notes=tuple(
        n for n in result.notes if not n.startswith(NOT_SANDBOXED)))))
    if sub.kind is Kind.CUDA and result.build is not None and result.build.status is Status.PASS:
        try:
            device = read_run(out, complete=False).get("device", {})
        except RunFileError:
            device = {}
        print("\n" + build_summary(result.build, device, out / "logs" / f"{sub.id}.build.log",
                                   verbose=args.verbose))
    print(f"\nfull result: {out / (sub.id + '.json')}")
    if result.status in (Status.ENVIRONMENT_ERROR, Status.NO_RESULT):   # the machine's doing
        return 3
    return 0 if result.status in (Status.PASS, Status.NOT_RUN) else 1
