"""Reading a failed or finished build's output: what the machine lacks (environment_problem, never
the student's fault), the compiler's first error (_first_error) and the log a student reads, with
the translation unit's lines mapped back to their file (relevant_log).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil

from grader.common import config
from grader.build.flags import (CUTLASS_INSTALL, LOAD_INLINE_PRELUDE, cuda_include_dirs,
                                cutlass_include)


_NO_MODULE = re.compile(r"^(?:ModuleNotFoundError|ImportError): No module named '([\w.]+)'", re.M)
_NO_HEADER = re.compile(r"fatal error: ([\w/.]+\.h): No such file or directory")
_NO_NINJA = "Ninja is required to load C++ extensions"


# gcc's preprocessor (fatal error: cute/tensor.hpp: No such file) and nvcc's front end (cannot
# open source file "cute/tensor.hpp") on an #include of a CUTLASS or CuTe header.
_NO_CUTLASS = re.compile(r"fatal error: (?:cute|cutlass)/[\w/.]+: No such file or directory|"
                         r"cannot open source file \"(?:cute|cutlass)/[\w/.]+\"")


def environment_problem(output: str, mode: str) -> str:
    """What the grading machine lacks, judging by a failed build's output ('' if nothing): a
    module the set-up installs (config.PROVIDED_MODULES), a header it provides, ninja. What the
    output claims is checked against this process's own view, so a submission cannot print its
    way out of a verdict: a module this interpreter can import is not missing."""
    for name in _NO_MODULE.findall(output):
        top = name.split(".")[0]
        if top in config.PROVIDED_MODULES and importlib.util.find_spec(top) is None:
            return (f"lacks the Python module '{top}', which the course's set-up installs "
                    f"(scripts/bootstrap.sh)")
    if mode == "import":
        return ""
    for header in _NO_HEADER.findall(output):
        name = os.path.basename(header)
        if name in config.PROVIDED_HEADERS and not any(
                os.path.isfile(os.path.join(d, name)) for d in cuda_include_dirs() + _cuda_home_include()):
            return (f"lacks the CUDA header {name}, which the set-up provides "
                    f"(scripts/bootstrap.sh fetches it into .venv/cuda-include)")
    if _NO_CUTLASS.search(output) and cutlass_include() is None:
        return (f"lacks the CUTLASS/CuTe headers (cute/..., cutlass/...), which the set-up "
                f"provides: {CUTLASS_INSTALL}")
    if _NO_NINJA in output and shutil.which("ninja") is None:
        return "lacks ninja, which torch's extension builder needs (pip install ninja)"
    return ""


def _cuda_home_include() -> list[str]:
    nvcc = shutil.which("nvcc")
    return [os.path.join(os.path.dirname(os.path.dirname(nvcc)), "include")] if nvcc else []


def _first_error(log: str) -> str:
    """The first compiler error: the line a student should read first. A compiler's diagnostic
    ("error:", "error #20-D:") comes before any other line that says error, and a line of a
    warning never is one (torch's "CUDA initialization: Unexpected error" warning came first in
    the build log of session 15's GPU course)."""
    lines = [l for l in log.splitlines() if not _A_WARNING.search(l)]
    for pattern in (_DIAGNOSTIC, _ANY_ERROR):
        found = next((l for l in lines if pattern.search(l)), None)
        if found is not None:
            return found
    return ""


_DIAGNOSTIC = re.compile(r"\berror\b( #[\w-]+)?\s*:", re.I)
_ANY_ERROR = re.compile(r"\berror\b", re.I)
_A_WARNING = re.compile(r"\w*Warning:|\bwarning( #[\w-]+)?\s*:", re.I)


_CUDA_LOC = re.compile(r"\S*cuda\.cu\((\d+)\)")        # nvcc:  .../cuda.cu(45): error: ...
_GCC_LOC = re.compile(r"\S*cuda\.cu:(\d+)(:\d+)?")       # host compiler: .../cuda.cu:45:3: error


def relevant_log(output: str, source_name: str = "submission.cu", *, errors_only: bool = False,
                 max_lines: int = 60) -> str:
    """Compiler output with paths mapped back to the student's file and line, errors first."""
    shift = len(LOAD_INLINE_PRELUDE)
    text = _CUDA_LOC.sub(lambda m: f"{source_name}:{int(m.group(1)) - shift}", output)
    text = _GCC_LOC.sub(lambda m: f"{source_name}:{int(m.group(1)) - shift}{m.group(2) or ''}", text)
    lines = text.splitlines()
    errors = [i for i, l in enumerate(lines) if re.search(r"\berror\b|Error|Traceback", l)]
    if errors_only:
        warnings = [l for l in lines if re.search(r"\bwarning\b", l) and source_name in l]
        return "\n".join(warnings[:max_lines])
    if not errors:
        return "\n".join(lines[-max_lines:])
    # Each error with the two lines after it (nvcc prints the offending source line there).
    keep: list[str] = []
    for i in errors:
        for line in lines[i:i + 3]:
            if line not in keep[-3:]:
                keep.append(line)
    if len(keep) > max_lines:
        keep = keep[:max_lines] + [f"[... {len(keep) - max_lines} more lines: see the full log ...]"]
    return "\n".join(keep)
