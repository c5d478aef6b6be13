"""The record of every file a CUDA build's translation unit opened (HEADERS_RECORD, which
grader/trusted/audit/reach.py audits): read from nvcc's dependency file in a compile check
(DEPFILE, depfile_paths) or from what ninja kept of it (ninja_deps), written by the build child
as it exits (_exit_recorded, record_headers).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from grader.trusted.audit.includes import HEADERS_RECORD, HEADERS_SCHEMA
from grader.trusted.audit.reach import STUDENT_OBJECT


# Where nvcc writes its dependency list in a compile check (-MD -MF); the extension's build has
# torch's ninja rule write it, and ninja keeps it (.ninja_deps).
DEPFILE = STUDENT_OBJECT + ".d"


def _exit_recorded(returncode: int, build_dir: Path, headers, how: str, *, base: Path) -> None:
    """End the build child: after a compile that passed, with the record of the headers it opened
    written (record_headers). A record that cannot be made is the machine's problem, not the
    student's: the child says why and still exits as the compile did, and the grader, finding no
    record, calls the build an environment error (with_kernels)."""
    if returncode == 0:
        try:
            record_headers(build_dir, headers(), how=how, base=base)
        except (OSError, ValueError, RuntimeError, subprocess.SubprocessError) as e:
            print(f"grader: no record of the headers the build opened: {e}", flush=True)
    sys.exit(returncode)


def record_headers(build_dir: Path, headers: list[str], *, how: str, base: Path) -> None:
    """Write HEADERS_RECORD beside STUDENT_OBJECT: the real path of every file the compiler opened
    for the submission's translation unit (the unit itself first), as it opened them.

    Why the record can be trusted although the build child runs in the submission's sandbox:
    nothing of the submission runs there. Its source is compiled, never run (the module is built,
    not imported: build_extension), and a compiler reads files, it runs none of them. The list is
    what the preprocessor opened, not what the text says: every spelling of an #include
    (`<cutlass//gemm/...>`, `..`, an absolute path, a line continuation, a macro) is the file it
    opens, and a GNU line marker in the source (`# 1 "cute/tensor.hpp" 1`), which changes the
    names diagnostics, `-H` and the preprocessed markers show, adds or hides nothing here
    (tests/test_native_audit.py). nvcc's list covers both its passes, the device code's and the
    host code's. Paths are resolved here, in the view of the files the compiler had (a relative
    one against `base`, the folder the compiler ran in)."""
    if not headers:
        raise ValueError("the compiler listed no file")
    real = [os.path.realpath(os.path.join(base, h)) for h in headers]
    record = dict(schema=HEADERS_SCHEMA, object=STUDENT_OBJECT, how=how, headers=real)
    (build_dir / HEADERS_RECORD).write_text(json.dumps(record, indent=0))


def _depfile_headers(depfile: Path) -> list[str]:
    """nvcc's dependency list, read and then removed (the record holds what is needed)."""
    paths = depfile_paths(depfile.read_text(errors="surrogateescape"))
    depfile.unlink()
    return paths


def depfile_paths(text: str) -> list[str]:
    """The prerequisites of the first rule of a make-style dependency file (gcc's and nvcc's -MD
    output): after its target's colon, split on whitespace that no backslash escapes; `\\ ` is a
    space, `\\#` a hash, `$$` a dollar, and a backslash that ends a line continues it."""
    rule = re.sub(r"\\\r?\n", " ", text).split("\n", 1)[0]
    colon = re.search(r":(?=\s|$)", rule)
    if colon is None:
        raise ValueError("not a dependency file (no target)")
    tokens = re.findall(r"(?:\\[ #\t]|\$\$|\\(?![ #\t])|[^\s\\])+", rule[colon.end():])
    return [re.sub(r"\\([ #\t])|\$(\$)", lambda m: m.group(1) or m.group(2), t) for t in tokens]


def ninja_deps(build_dir: Path, target: str = STUDENT_OBJECT) -> list[str]:
    """What ninja recorded of the files `target`'s compile opened (`ninja -t deps`): torch's rule
    for a CUDA source has nvcc write a dependency file (-MD -MF), which ninja reads into its
    .ninja_deps and deletes. Paths are as ninja keeps them (relative to the build folder or
    absolute)."""
    ninja = shutil.which("ninja")
    if ninja is None:
        raise RuntimeError("ninja is not on PATH")
    proc = subprocess.run([ninja, "-C", str(build_dir), "-t", "deps", target],
                          capture_output=True, text=True, errors="surrogateescape", timeout=120)
    lines = proc.stdout.splitlines()
    if proc.returncode != 0 or not lines or not re.match(rf"{re.escape(target)}: #deps \d+", lines[0]):
        raise RuntimeError(f"ninja keeps no dependency record of {target} (torch's build rule asked "
                           f"for none?): {(proc.stdout or proc.stderr).strip()[:300]}")
    return [line.strip() for line in lines[1:] if line.strip()]
