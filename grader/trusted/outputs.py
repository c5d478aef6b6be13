"""A case's output as the run stage hands it to the check stage: O's float16 elements, raw and
row-major, in <out_dir>/<case id>.f16, written by the harness after the call's reply and read by
the checker. Nothing but the elements: the case gives the shape, and the run stage writes only an
output of the case's shape and float16 (run_stage.output_problem). Both ends are trusted; the
subject cannot reach the folder.

Raw, not torch.save: the largest case's output is 537 MB, and its torch.save archive (a CRC of
every record) and torch.load held each run stage on the GPU stages' CPUs and each check: with
raw elements the run stage took a median 1.10 s against 1.62-1.68 s, the check 0.77 s against
1.17-1.25 s (H100 courses of sessions 26, 27 and 29, notes/throughput.md). The file is mapped
(torch.from_file), so O is copied from the GPU straight into its pages.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

SUFFIX = ".f16"


def output_path(out_dir: Path | str, case_id: str) -> Path:
    return Path(out_dir) / f"{case_id}{SUFFIX}"


def save_output(o: torch.Tensor, path: Path) -> None:
    """O's elements into a new file at `path` (its own copy: O is the subject's buffer too). What
    was at `path` is removed first, a link included (never followed), and the file's space is
    taken before it is mapped: a full disk is an OSError here, not a SIGBUS in the copy."""
    if o.dtype != torch.float16:
        raise ValueError(f"an output is saved as float16, not {o.dtype}")
    path.unlink(missing_ok=True)   # a mapping of an old file would keep its size and elements
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        if o.numel():
            os.posix_fallocate(fd, 0, 2 * o.numel())
    finally:
        os.close(fd)
    if o.numel():
        mapped = torch.from_file(str(path), shared=True, size=o.numel(), dtype=torch.float16)
        mapped.copy_(o.detach().reshape(-1))
        del mapped   # unmapped: the elements are in the file


def load_output(path: Path, shape: tuple[int, ...], device: str | torch.device) -> torch.Tensor:
    """The output saved at `path`, of `shape`, on `device`. A file of any other size is an error
    that says so (the harness wrote it: the machine's problem, not the submission's)."""
    numel = 1
    for n in shape:
        numel *= n
    size = path.stat().st_size
    if size != 2 * numel:
        raise ValueError(f"{path}: {size} bytes, expected {2 * numel} (float16 elements of shape "
                         f"{tuple(shape)}); the run stage writes it whole, so it was cut short or "
                         f"written by another grader version: grade the submission again")
    if numel == 0:
        return torch.empty(shape, dtype=torch.float16, device=device)
    mapped = torch.from_file(str(path), shared=False, size=numel, dtype=torch.float16)
    return mapped.view(shape).to(device)
