"""Reach: what a submission's code could get at, read by the grader from what it holds before any of
that code runs. Trusted side: nothing here imports, loads or executes a submission.

Why. Which kernels ran is reported by the subject process (grader/subject/loop.py lists them from
its own profiler). A submission runs in that process, so it can rewrite the report, but only by
reaching the grader's objects or memory there: Python's reflection (modules, frames, the garbage
collector, dynamic code), native code loaded behind the grader's back, or, from C++, the Python
C API, the dynamic linker and the operating system. Those are the audited ways in.

Invariant. A submission is ranked only if
  - Python: grader/trusted/audit/allowlist.py (an allowlist: what it cannot account for goes to review;
    known ways into the grader's process are flagged). The subject then imports the folder's
    .py sources only (subject/load.py, SourceOnly).
  - CUDA C++: the object compiled from its translation unit (build.STUDENT_OBJECT, built without
    importing the module, so none of its code has run) imports no symbol on NATIVE_REACH (the
    Python C API, the dynamic linker and PyTorch's wrapper of it, driver entry points and module
    loaders, other processes' memory, threads, files, the profiler, cuBLAS, cuDNN, the
    dispatcher), no plain C function outside C_ALLOWED (of the driver: tensor-map encoding
    only, DRIVER_ALLOWED), no PyTorch operator that computes (at::_ops or a backend namespace,
    outside DATA_OPS), its host code has no system call instruction, it defines no library's
    kernel (library_kernels: CUTLASS's, by the rule integrity.classify_launched applies to what
    runs; CuTe-templated kernels are the student's), and its compile opened no library's kernel
    source (cpp_includes: the compiler's record of the files it opened, build.HEADERS_RECORD,
    so every spelling of an include is the file it opens). It goes to review when its object
    shows what a walk through a library's memory is made of (native_review: a library
    function's address taken as data, ELF's magic numbers, the loader's headers).

What it cannot see, and says so in README: machine code that finds functions by walking mapped
memory itself with none of those marks (no import, no system call, no ELF magic, starting from
a vtable or a return address). A red team wrote 18 attacks against the first version of this
file (13 in Python, 5 in C++, tests/test_reach.py has their shapes); each is flagged now.
Everything else a submission reports about itself stays a claim the trusted side weighs
(grader/trusted/integrity.py).

Here: the entry points (native_reach, native_review, verdict). The rules on the object's symbols
are in symbols.py, the headers its compile opened in includes.py, the marks of a walk through
memory in memory_walk.py, the reading of the object (binutils, ELF) in object_file.py, and
ReachFinding and AuditUnavailable in findings.py.
"""

from __future__ import annotations

import re
from pathlib import Path

from grader.course.submission import CUDA_FILE as _SOURCE_NAME
# AuditUnavailable is raised by what these entry points read; its callers catch reach.AuditUnavailable.
from grader.trusted.audit.findings import AuditUnavailable as AuditUnavailable, ReachFinding
from grader.trusted.audit.includes import HEADERS_RECORD, cpp_includes, read_headers_record
from grader.trusted.audit.memory_walk import (LOADER_HEADERS, NOTED_HEADERS, function_addresses,
                                              magic_numbers, page_masks, text_notes)
from grader.trusted.audit.object_file import read_elf, undefined_symbols
from grader.trusted.audit.symbols import (C_ALLOWED, _ATEN_OP, _BACKEND_HELPERS, _BACKEND_OP,
                                          _data_op, _native_reason, _raw_system_calls,
                                          _without_templates, library_kernels)


# ---------------------------------------------------------------- native, by the object's symbols


def native_reach(obj: Path) -> list[ReachFinding]:
    """Findings for the imports of the object compiled from a submission's translation unit, for
    system calls its host code makes without one, for library kernels it defines, and for
    library kernel sources its compile opened (cpp_includes, from the record beside it)."""
    findings = []
    for symbol in undefined_symbols(obj):
        bare = _without_templates(re.sub(r"@.*$", "", symbol))   # versioned: open@GLIBC_2.2.5
        head = bare.split("(", 1)[0].strip()
        op, backend = _ATEN_OP.match(bare), _BACKEND_OP.match(head)
        if op and not _data_op(op.group(1) + (op.group(2) or "")):
            findings.append(ReachFinding(obj.name, head, "a PyTorch operator that computes"))
        elif backend and not _data_op(backend.group(2)) and backend.group(2) not in _BACKEND_HELPERS:
            findings.append(ReachFinding(obj.name, head, "a PyTorch operator that computes"))
        elif why := _native_reason(head):
            findings.append(ReachFinding(obj.name, head, why))
        elif re.fullmatch(r"\w+", head) and not C_ALLOWED.match(head):
            findings.append(ReachFinding(obj.name, head, "a C library function outside what a "
                                         "kernel's host code needs (files, processes, threads, "
                                         "memory mapping)"))
    if _raw_system_calls(obj):
        findings.append(ReachFinding(obj.name, "syscall instruction",
                                     "a system call made directly, without an import"))
    findings += library_kernels(obj)
    findings += cpp_includes(obj)
    return findings


# ---------------------------------------------------------------- native: what an instructor reads


def native_review(build_dir: Path, source: str) -> tuple[list[ReachFinding], list[str]]:
    """What an instructor must see of a CUDA build the audit let through: the findings that send
    it to review, and notes ('where: what') on every unusual but allowed construct, those
    findings' among them.

    To review (read from the object and the compiler's record, never from text; none in any
    honest C++ submission, measured: README):
      - the address of a library function taken as data, not called (function_addresses):
        where a walk through a library's memory starts;
      - the ELF header's magic number or DT_GNU_HASH in host code or data (magic_numbers): what
        a walk looks for to find a library's symbols;
      - <elf.h>, <link.h> or <sys/auxv.h> opened (LOADER_HEADERS): the loader's structures.
    Notes only: a page mask in host code (page_masks), headers for memory and process
    introspection (NOTED_HEADERS), and what the source text shows (text_notes)."""
    obj = Path(build_dir) / STUDENT_OBJECT
    elf = read_elf(obj)
    review = [ReachFinding(f"{obj.name}, in {where}", f"&{function}",
                           "a library function's address taken as data, not called")
              for where, function in function_addresses(elf)]
    review += [ReachFinding(f"{obj.name}, in {where}", what, "a magic number of ELF in host code")
               for where, what in magic_numbers(elf)]
    headers = read_headers_record(Path(build_dir) / HEADERS_RECORD)
    review += [ReachFinding(f"{_SOURCE_NAME}, as compiled", h, "the dynamic loader's structures")
               for h in headers if LOADER_HEADERS.search(h)]
    notes = [f"{f.where}: {f.what}: {f.why}" for f in review]
    notes += [f"{obj.name}, in {where}: a page mask: {insn}" for where, insn in page_masks(obj)]
    notes += [f"{_SOURCE_NAME}, as compiled: {h}: a header for memory or process introspection"
              for h in headers if NOTED_HEADERS.search(h)]
    return review, notes + text_notes(source)


# ---------------------------------------------------------------- the verdict


def verdict(findings: list[ReachFinding], limit: int = 6) -> str:
    """The flag's text ('' when there is nothing to flag)."""
    if not findings:
        return ""
    lines = ["reaches past its kernel: the code uses ways into the grader's process, other "
             "processes or native code that no FlashAttention kernel needs (the grader audits "
             "them before running anything; see README, 'Integrity'). Remove them:"]
    lines += [f"  {f.describe()}" for f in findings[:limit]]
    if len(findings) > limit:
        lines.append(f"  ... and {len(findings) - limit} more")
    return "\n".join(lines)


# load_inline puts these three lines above the student's source in cuda.cu, compiled to
# STUDENT_OBJECT (with a GPU and in a compile check alike): everything the submission wrote is in it.
STUDENT_OBJECT = "cuda.cuda.o"


