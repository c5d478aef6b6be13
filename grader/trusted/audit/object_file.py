"""Reading the object compiled from a submission's translation unit: the symbols it imports and
the kernels it defines (binutils' nm, c++filt), its host code disassembled (objdump), and its
sections, symbols and relocations (read_elf, with struct: no tool). What they mean for the
audit is symbols.py's and memory_walk.py's."""

from __future__ import annotations

import bisect
import dataclasses
import functools
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

from grader.trusted.audit.findings import AuditUnavailable


# ---------------------------------------------------------------- binutils: symbols and code


def undefined_symbols(obj: Path) -> list[str]:
    """The symbols an object file imports, demangled (binutils' nm)."""
    nm = shutil.which("nm")
    if nm is None:
        raise AuditUnavailable("binutils' nm is missing (install binutils; g++ brings it)")
    proc = subprocess.run([nm, "--undefined-only", "--demangle", "--format=just-symbols", str(obj)],
                          capture_output=True, text=True, errors="replace", timeout=120)
    if proc.returncode != 0:
        raise AuditUnavailable(f"nm could not read {obj.name}: {proc.stderr.strip()[:300]}")
    return [line.strip() for line in proc.stdout.splitlines() if line.strip()]


def defined_kernels(obj: Path) -> list[str]:
    """The GPU kernels the object's translation unit defines, demangled. nvcc gives each
    __global__ function a host stub under the kernel's own mangled name, and a
    `__device_stub__` function beside it (or, once inlined, its static locals) whose name holds
    that mangled name, length-prefixed: `74__device_stub__Z17attention_kernel1ILi64E...`. A
    kernel with internal linkage (static, or in an anonymous namespace, as the solution's are)
    has an `L` in its own mangled name that the stub's copy lacks: the two are matched
    demangled."""
    nm, cxxfilt = shutil.which("nm"), shutil.which("c++filt")
    if nm is None or cxxfilt is None:
        raise AuditUnavailable("binutils' nm or c++filt is missing (install binutils)")
    proc = subprocess.run([nm, "--defined-only", "--format=just-symbols", str(obj)],
                          capture_output=True, text=True, errors="replace", timeout=120)
    if proc.returncode != 0:
        raise AuditUnavailable(f"nm could not read {obj.name}: {proc.stderr.strip()[:300]}")
    symbols = proc.stdout.split()
    stubbed = {"_" + s[m.end():m.end() + int(m.group(1)) - len("__device_stub__")]
               for s in symbols for m in re.finditer(r"(\d+)__device_stub__(?=Z)", s)}
    candidates = [s for s in symbols if s.startswith("_Z") and "__device_stub__" not in s]
    if not stubbed or not candidates:
        return []
    names = _demangle(sorted(stubbed) + candidates)
    kernels = {names[s] for s in stubbed}
    return [names[s] for s in candidates if names[s] in kernels and names[s] != s]


def _demangle(names: list[str]) -> dict[str, str]:
    cxxfilt = shutil.which("c++filt")
    if cxxfilt is None:
        raise AuditUnavailable("binutils' c++filt is missing (install binutils)")
    out = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True,
                         errors="replace", timeout=120).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


@functools.lru_cache(maxsize=2)
def _disassembly_cached(obj: str, mtime_ns: int, size: int) -> str:
    objdump = shutil.which("objdump")
    if objdump is None:
        raise AuditUnavailable("binutils' objdump is missing (install binutils; g++ brings it)")
    proc = subprocess.run([objdump, "-d", "-C", "--no-show-raw-insn", obj], capture_output=True,
                          text=True, errors="replace", timeout=300)
    if proc.returncode != 0:
        raise AuditUnavailable(f"objdump could not read {Path(obj).name}: {proc.stderr.strip()[:300]}")
    return proc.stdout


def _disassembly(obj: Path) -> str:
    """The object's host code, disassembled (objdump -d, demangled), once per file version."""
    st = os.stat(obj)
    return _disassembly_cached(str(obj), st.st_mtime_ns, st.st_size)


# ---------------------------------------------------------------- the ELF object, read with struct


# The ELF header's first four bytes, and the dynamic section's tag of the GNU symbol hash table,
# as they appear in machine code (immediates, little-endian) or data.
ELF_MAGIC = b"\x7fELF"
DT_GNU_HASH = (0x6FFFFEF5).to_bytes(4, "little")


# Sections the host object carries the device code in (CUDA fatbinaries): not host code.
_DEVICE_SECTIONS = re.compile(r"^(\.nv_fatbin|\.nvFatBinSegment|__nv_relfatbin|\.nv\.)")
_SHF_ALLOC, _SHF_EXECINSTR = 0x2, 0x4


@dataclasses.dataclass(frozen=True)
class _Section:
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int


@dataclasses.dataclass(frozen=True)
class _Symbol:
    name: str
    section: int      # 0: undefined
    value: int
    size: int


@dataclasses.dataclass(frozen=True)
class _Elf:
    """A relocatable ELF64 little-endian object file, as much of it as native_review reads."""
    data: bytes
    machine: int
    sections: list[_Section]
    symbols: list[_Symbol]
    # section index -> (start addresses, its named symbols), sorted by address
    by_section: dict[int, tuple[list[int], list[_Symbol]]]

    def bytes_of(self, section: _Section) -> bytes:
        return self.data[section.offset:section.offset + section.size] if section.type != 8 else b""

    def host_sections(self) -> list[_Section]:
        """Sections loaded with the host code (not the device code's fatbinary)."""
        return [s for s in self.sections if _in_host_code_or_data(s)]

    def relocations(self):
        """(section the relocation applies to, offset, type, symbol) for every RELA entry."""
        for rela in (s for s in self.sections if s.type == 4 and s.info < len(self.sections)):
            target, body = self.sections[rela.info], self.bytes_of(rela)
            for offset, info, _ in struct.iter_unpack("<QQq", body[:len(body) // 24 * 24]):
                if info >> 32 < len(self.symbols):
                    yield target, offset, info & 0xFFFFFFFF, self.symbols[info >> 32]

    def enclosing(self, section: _Section, offset: int) -> str:
        """The name of the defined symbol whose bytes hold `offset` of `section`, else the
        section's name."""
        starts, symbols = self.by_section.get(self.sections.index(section), ([], []))
        at = bisect.bisect_right(starts, offset)
        for sym in reversed(symbols[max(0, at - 8):at]):
            if offset < sym.value + max(sym.size, 1):
                return sym.name
        return section.name


def read_elf(obj: Path) -> _Elf:
    """The object's sections and symbol table, read with struct (no tool): AuditUnavailable when
    it is not a relocatable ELF64 little-endian file."""
    data = Path(obj).read_bytes()
    if data[:4] != ELF_MAGIC or data[4:6] != b"\x02\x01":
        raise AuditUnavailable(f"{Path(obj).name} is not a 64-bit little-endian ELF object")
    try:
        machine, shoff, shentsize, shnum, shstrndx = (struct.unpack_from("<H", data, 18)[0],
                                                      *struct.unpack_from("<Q", data, 40),
                                                      *struct.unpack_from("<HHH", data, 58))
        raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        names = raw[shstrndx]
        sections = [_Section(_c_string(data, names[4] + r[0]), r[1], r[2], r[4], r[5], r[6], r[7])
                    for r in raw]
        symbols: list[_Symbol] = []
        for table in (s for s in sections if s.type == 2):
            strings = sections[table.link].offset
            body = data[table.offset:table.offset + table.size]
            symbols = [_Symbol(_c_string(data, strings + name), shndx, value, size)
                       for name, _, _, shndx, value, size in
                       struct.iter_unpack("<IBBHQQ", body[:len(body) // 24 * 24])]
    except (struct.error, IndexError) as e:
        raise AuditUnavailable(f"{Path(obj).name} is not an ELF object this audit can read: "
                               f"{e}") from None
    by: dict[int, list[_Symbol]] = {}
    for sym in symbols:
        if sym.name and 0 < sym.section < 0xFF00:   # defined in a section (not ABS, COMMON)
            by.setdefault(sym.section, []).append(sym)
    index = {k: ([s.value for s in v], v) for k, v in
             ((k, sorted(v, key=lambda s: s.value)) for k, v in by.items())}
    return _Elf(data, machine, sections, symbols, index)


def _c_string(data: bytes, at: int) -> str:
    return data[at:data.index(b"\0", at)].decode("utf-8", "replace")


def _in_host_code_or_data(section: _Section) -> bool:
    """Loaded with the host code, and not unwind data (which names the personality routine)."""
    return bool(section.flags & _SHF_ALLOC) and not _DEVICE_SECTIONS.match(section.name) \
        and section.name not in (".eh_frame", ".gcc_except_table")
