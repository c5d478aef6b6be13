"""The marks of a walk through a library's memory, for native_review (reach.py): what the object
shows (a library function's address taken as data, ELF's magic numbers in host code) sends a
submission to review; a page mask in host code and what only the source text shows (text_notes)
are notes for the instructor."""

from __future__ import annotations

import re
from pathlib import Path

from grader.course.submission import CUDA_FILE as _SOURCE_NAME, split_sources
from grader.trusted.audit.object_file import (DT_GNU_HASH, ELF_MAGIC, _SHF_EXECINSTR, _Elf, _Section,
                                              _demangle, _disassembly, _in_host_code_or_data)

# The reach audit flags a way out by its name. Machine code that finds a library's functions by
# walking mapped memory needs no name (tests/adversarial/mem_walk_cu: from the address of an
# allowed PyTorch function, back page by page to the library's ELF header, then its dynamic
# symbols), and no static check can see every such walk. native_review finds the constructs
# such a walk is made of, and the review queue shows them to an instructor: what the object shows
# sends the submission to review (zero on every honest C++ submission, measured: README), what
# only the text shows is a note.


# Headers that describe the dynamic linker's structures (ELF's headers and symbol tables, the
# list of loaded libraries): no kernel's host code opens them, and torch's headers do not.
LOADER_HEADERS = re.compile(r"(?:^|/)(elf\.h|link\.h|bits/link\.h|sys/auxv\.h)$")
# ... and headers for memory and process introspection: a note (their functions are flagged).
NOTED_HEADERS = re.compile(r"(?:^|/)(dlfcn\.h|sys/mman\.h|execinfo\.h|ucontext\.h|"
                           r"sys/ptrace\.h|sys/uio\.h)$")


# Undefined symbols whose address the compiler itself takes: the C++ personality routine (each
# function's unwind data), the filler of a vtable's pure or deleted entries.
_COMPILERS_OWN = frozenset({"__gxx_personality_v0", "__cxa_pure_virtual", "__cxa_deleted_virtual"})
# Plain C symbols that are data, not functions: their address is what code uses.
_C_DATA = frozenset({"stdout", "stderr", "stdin", "__dso_handle", "__libc_single_threaded",
                     "_GLOBAL_OFFSET_TABLE_", "errno"})


# Relocation types that are calls or jumps (the rest take an address as data), and those whose
# instruction decides (x86-64: R_X86_64_PC32 after e8/e9 is a call, R_X86_64_GOTPCRELX after
# ff 15/ff 25 an indirect one through the GOT).
_EM_X86_64, _EM_AARCH64 = 62, 183
_CALLS = {_EM_X86_64: {4}, _EM_AARCH64: {282, 283}}            # PLT32; JUMP26, CALL26
_CALL_BY_OPCODE = {2: (1, (b"\xe8", b"\xe9")), 41: (2, (b"\xff\x15", b"\xff\x25"))}


# ---------------------------------------------------------------- what the object shows (review)


def function_addresses(elf: _Elf) -> list[tuple[str, str]]:
    """(where, function) for each library function whose address the object's host code or data
    takes without calling it: a relocation other than a call against an undefined symbol that
    is a function (a C++ name with parameters, or a plain C name that is not data). The
    compiler's own are left out (the personality routine, a vtable's entries and fillers,
    destructors it registers for static objects: C++ cannot take a destructor's address)."""
    found = []
    for section, offset, kind, sym in elf.relocations():
        if sym.section == 0 and sym.name and sym.name not in _COMPILERS_OWN | _C_DATA \
                and _in_host_code_or_data(section) and not _is_call(elf, section, offset, kind):
            where = elf.enclosing(section, offset)
            if not where.startswith("_ZTV"):   # a vtable's entries are the compiler's
                found.append((where, sym.name))
    names = _demangle(sorted({n for pair in found for n in pair}))
    return [(names[w], names[f]) for w, f in dict.fromkeys(found)
            if ("(" in names[f] and "::~" not in names[f]) or re.fullmatch(r"\w+", names[f])]


def _is_call(elf: _Elf, section: _Section, offset: int, kind: int) -> bool:
    if kind in _CALLS.get(elf.machine, ()):
        return True
    if elf.machine == _EM_X86_64 and kind in _CALL_BY_OPCODE and section.flags & _SHF_EXECINSTR:
        width, opcodes = _CALL_BY_OPCODE[kind]
        return elf.data[section.offset + offset - width:section.offset + offset] in opcodes
    return False


def magic_numbers(elf: _Elf) -> list[tuple[str, str]]:
    """(where, what) for the ELF header's magic and DT_GNU_HASH in host code or data (x86-64
    immediates are little-endian in the instruction's bytes; a string is its bytes). The
    object's own ELF header is not in a section; the device code's fatbinary, full of ELF
    headers, is left out."""
    found = []
    for section in elf.host_sections():
        body = elf.bytes_of(section)
        for what, pattern in (("the ELF header's magic number (0x464c457f, \"\\x7fELF\")", ELF_MAGIC),
                              ("DT_GNU_HASH (0x6ffffef5), the tag of a library's symbol hash table",
                               DT_GNU_HASH)):
            at = body.find(pattern)
            if at >= 0:
                found.append((elf.enclosing(section, at), what))
    names = _demangle(sorted({w for w, _ in found}))
    return [(names[w], what) for w, what in found]


def page_masks(obj: Path) -> list[tuple[str, str]]:
    """(function, instruction) for each host instruction that masks an address to its 4 KiB
    page (x86-64, objdump): where a walk through memory starts."""
    found = []
    function = ""
    for line in _disassembly(obj).splitlines():
        head = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if head:
            function = head.group(1)
        elif re.search(r"\band[lq]?\s+\$0x(?:f{13}|f{5})000,", line):
            found.append((function, line.split("\t")[-1].strip()))
    return found


# ---------------------------------------------------------------- what only the text shows (notes)


# What only the source text shows (comments left out), a note for the instructor: magic numbers
# of ELF, page masks, return and frame addresses (by line); integers cast to pointers (a cast to
# a pointer type whose operand starts with an integer: a literal, an integer type, or a variable
# the file declares as one); assembly for the host CPU (an asm statement with x86 registers or
# instructions; a kernel's PTX has neither).
TEXT_NOTES = [(why, re.compile(pattern)) for why, pattern in (
    ("a magic number of ELF (a library's header or symbol table)",
     r"0[xX]464[cC]457[fF]|\\(?:x7[fF]|177)(?:\"\s*\")?ELF|\bELFMAG\b|0[xX]6[fF]{4}[eE][fF]5|\bDT_GNU_HASH\b|"
     r"\bElf(?:32|64|W)_\w+|\bPT_DYNAMIC\b"),
    ("a page mask or page size", r"~\s*(?:\w+\s*)?\(?\s*0[xX]0*[fF]{3}\b|0[xX](?:[fF]{5}|[fF]{13})000\b|"
                                 r"\bgetpagesize\b|_SC_PAGE_?SIZE\b|~\s*\(\s*4096\s*-\s*1\s*\)|"
                                 r"&\s*-\s*4096\b"),
    ("a return or frame address", r"__builtin_(?:return|frame|extract_return)_addr(?:ess)?\b"),
)]
_INTEGER_TYPE = r"(?:u?intptr_t|size_t|ssize_t|ptrdiff_t|u?int64_t|(?:unsigned\s+)?long(?:\s+long)?)"
_INTEGER_VARIABLE = re.compile(rf"\b{_INTEGER_TYPE}\s+(?:const\s+)?(\w+)\s*[=;,)\[{{]|"
                               rf"\bauto\s+(\w+)\s*=\s*reinterpret_cast\s*<\s*{_INTEGER_TYPE}\s*>")
_POINTER_CAST = re.compile(r"reinterpret_cast\s*<[^<>;]*\*\s*>\s*\(\s*\(?\s*([\w~]+)|"
                           r"\(\s*(?:const\s+|volatile\s+)*\w+(?:\s+const)?\s*\*+\s*\)\s*\(?\s*([\w~]+)")
_ASM = re.compile(r"\b(?:asm|__asm__|__asm)\b\s*(?:volatile|__volatile__|goto|inline|\s)*\(")
_HOST_ASM = re.compile(r"%%[re]?(?:ax|bx|cx|dx|si|di|sp|bp)\b|\b(?:syscall|sysenter|rdtscp?|cpuid|"
                       r"rdpid|rdrand)\b|\bint\s+\$?0x80\b")


def text_notes(source: str) -> list[str]:
    """'file line N: what: code' for what the C++ files of read_sources' text show (comments
    left out): TEXT_NOTES by line, integers cast to pointers, assembly for the host CPU."""
    notes = []
    for name, text in split_sources(source).items():
        if name.endswith(".py"):
            continue
        name = name or _SOURCE_NAME
        code = re.sub(r"//[^\n]*|/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text,
                      flags=re.DOTALL)
        lines = code.split("\n")
        integers = {a or b for a, b in _INTEGER_VARIABLE.findall(code)}
        for number, line in enumerate(lines, 1):
            notes += [f"{name} line {number}: {why}: {line.strip()[:120]}"
                      for why, pattern in TEXT_NOTES if pattern.search(line)]
            if any(_is_integer(a or b, integers) for a, b in _POINTER_CAST.findall(line)):
                notes.append(f"{name} line {number}: an integer cast to a pointer: {line.strip()[:120]}")
        for m in _ASM.finditer(code):
            body = code[m.end():m.end() + 4000].split(");", 1)[0]
            if _HOST_ASM.search(body):
                number = code.count("\n", 0, m.start()) + 1
                notes.append(f"{name} line {number}: inline assembly for the host CPU: "
                             f"{lines[number - 1].strip()[:120]}")
    return notes


def _is_integer(operand: str, integers: set[str]) -> bool:
    return operand in integers or re.fullmatch(_INTEGER_TYPE, operand) is not None \
        or re.fullmatch(r"~?(?:0[xX][0-9a-fA-F]+|\d+)[uUlL]*", operand) is not None
