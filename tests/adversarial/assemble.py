"""Assemble the adversarial submissions into a folder the grader can grade.

    python tests/adversarial/assemble.py DEST [NAME ...]

Each adversarial submission is a folder here with one cheat or fault (expected.json says which
threat of issue 5 it is and the verdict it must get, with a GPU and without one). They reuse an
honest kernel instead of repeating it:
- Python ones import `honest_flash` (the Triton example), copied into their folder;
- CUDA ones say `#include "honest_attention.cuh"`: the line is replaced by the naive CUDA
  example, its entry point renamed `honest_forward`, so each assembled submission.cu is one
  standalone file, as a student's is.
The assembled folders are self-contained: the sandbox shows a submission its own folder only.
A folder's file FIFOS (one name a line) is not copied: each name it lists is made a named pipe
in the assembled folder (named_pipe_py), since a git checkout cannot hold one.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = HERE / "_shared"
EXPECTED = json.loads((HERE / "expected.json").read_text())
INCLUDE = '#include "honest_attention.cuh"'
FIFO_LIST = "FIFOS"


def names() -> list[str]:
    return [n for n in EXPECTED if not n.startswith("_")]


def honest_cuda() -> str:
    source = (SHARED / "honest_attention.cuh").read_text()
    return ("// ---- honest kernel: examples/naive_cuda, entry point renamed honest_forward ----\n"
            "#define flash_attention_forward honest_forward\n" + source +
            "\n#undef flash_attention_forward\n// ---- end of the honest kernel ----\n")


def assemble_one(name: str, dest: Path) -> Path:
    src, out = HERE / name, dest / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for path in src.iterdir():
        if path.name == FIFO_LIST:
            continue
        text = path.read_text()
        if path.name == "submission.cu" and INCLUDE in text:
            text = text.replace(INCLUDE, honest_cuda())
        (out / path.name).write_text(text)
    if (src / "submission.py").exists():
        shutil.copyfile(SHARED / "honest_flash.py", out / "honest_flash.py")
    for pipe in fifos(name):
        os.mkfifo(out / pipe)
    return out


def fifos(name: str) -> list[str]:
    """The named pipes the assembled folder of `name` holds (its FIFOS file)."""
    listed = HERE / name / FIFO_LIST
    return listed.read_text().split() if listed.exists() else []


def assemble(dest: Path, selected: list[str] | None = None) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    return [assemble_one(n, dest) for n in (selected or names())]


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for folder in assemble(Path(sys.argv[1]), sys.argv[2:] or None):
        print(folder)
