"""Does a student's subject see cuDNN? (issue 30, item 3; grader/isolation/sandbox.py, hide_libraries)

    python scripts/probe_hidden_cudnn.py          # on the GPU machine, from the repository root

Prints the cuDNN engine files `Sandbox.wrap(hide_libraries=True)` covers on this machine, then
runs itself twice in the sandbox the grader gives a subject (bubblewrap, the GPU's nodes, the
interpreter and the grader's code): once with hide_libraries=True (a student's subject) and once
without (a baseline's). In each it tries, on a small fp16 case, SDPA with the cuDNN backend (it
must fail where cuDNN is hidden and work where it is not), SDPA with FLASH and with EFFICIENT
(PyTorch's own kernels: they must work in both) and a plain fp16 matmul (cuBLAS: works in both),
and lists the cuDNN files the process mapped. Prints one table and a verdict line; exits 0 in
every case (a machine without a GPU or bubblewrap says so in the table). `--inside` is the part
that runs in the sandbox and prints one JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPE = (1, 4, 256, 64)   # (batch, heads, seq, head_dim): every backend supports it on sm80+
BACKENDS = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION")
ROWS = ("torch", "cuDNN version", *(f"SDPA {b}" for b in BACKENDS), "fp16 matmul",
        "cuDNN files mapped", "mapped from")
COLUMNS = (("student subject (cuDNN hidden)", True), ("baseline subject (cuDNN kept)", False))


# ---------------------------------------------------------------- inside the sandbox


def _first_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return next((line for line in text.splitlines() if line.strip()), text)[:160]


def _mapped_cudnn() -> tuple[str, str]:
    """The cuDNN files this process has mapped (/proc/self/maps): their names, and their folders."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "cudnn" in line}
    except OSError as e:
        return f"unknown ({e.strerror})", ""
    names = sorted({os.path.basename(p) for p in paths})
    return ", ".join(names) or "none", ", ".join(sorted({os.path.dirname(p) for p in paths}))


def probe() -> dict[str, str]:
    """Each row's outcome in this process."""
    rows: dict[str, str] = {}
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as e:   # the subject could not even load torch: every row says so
        return {"torch": f"FAILED: {_first_line(e)}"}
    rows["torch"] = f"ok {torch.__version__}"
    if not torch.cuda.is_available():
        return {**rows, **{r: "no CUDA device" for r in ROWS[1:]}}
    try:
        rows["cuDNN version"] = str(torch.backends.cudnn.version())
    except Exception as e:
        rows["cuDNN version"] = f"FAILED: {_first_line(e)}"
    torch.manual_seed(0)
    q, k, v = (torch.randn(SHAPE, device="cuda", dtype=torch.float16) for _ in range(3))
    with sdpa_kernel(SDPBackend.MATH):
        expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    # cuDNN last: whatever its failure leaves behind cannot change the rows before it
    for backend in (*BACKENDS[1:], BACKENDS[0]):
        try:
            with sdpa_kernel(getattr(SDPBackend, backend)):
                out = F.scaled_dot_product_attention(q, k, v)
            torch.cuda.synchronize()
            rows[f"SDPA {backend}"] = f"works (max err {(out.float() - expected).abs().max().item():.1e})"
        except Exception as e:
            rows[f"SDPA {backend}"] = f"FAILED: {_first_line(e)}"
    try:
        a = q.reshape(-1, SHAPE[-1])
        got = a @ a.T
        torch.cuda.synchronize()
        err = (got.float() - a.float() @ a.float().T).abs().max().item()
        rows["fp16 matmul"] = f"works (max err {err:.1e})"
    except Exception as e:
        rows["fp16 matmul"] = f"FAILED: {_first_line(e)}"
    rows["cuDNN files mapped"], rows["mapped from"] = _mapped_cudnn()
    return rows


# ---------------------------------------------------------------- outside: wrap, run, tabulate


def run_wrapped(box, hide: bool) -> dict[str, str]:
    """This script's --inside part in `box`, as a subject is run."""
    from grader.isolation.procs import child_env
    cmd = box.wrap([sys.executable, str(Path(__file__).resolve()), "--inside"],
                   readonly=[Path(__file__).resolve().parent], hide_libraries=hide)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd="/",
                              env=child_env(cuda=True), errors="replace")
    except (OSError, subprocess.SubprocessError) as e:
        return {"torch": f"FAILED to run: {_first_line(e)}"}
    lines = proc.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"torch": f"FAILED (exit {proc.returncode}): {tail[:160]}"}


def verdict(hidden: dict[str, str], kept: dict[str, str]) -> str:
    """What the table shows, in one line."""
    works = lambda rows, row: rows.get(row, "").startswith("works")   # noqa: E731
    if any(rows.get("cuDNN version") == "no CUDA device" for rows in (hidden, kept)):
        return "NOT MEASURED: no CUDA device here; run it on the GPU machine"
    problems = []
    if works(hidden, "SDPA CUDNN_ATTENTION"):
        problems.append("cuDNN attention still runs in a student's subject")
    if not works(kept, "SDPA CUDNN_ATTENTION"):
        problems.append("cuDNN attention does not run in a baseline's subject either")
    for row in ("SDPA FLASH_ATTENTION", "SDPA EFFICIENT_ATTENTION", "fp16 matmul"):
        for name, rows in (("student", hidden), ("baseline", kept)):
            if not works(rows, row):
                problems.append(f"{row} fails in the {name}'s subject")
    if problems:
        return "UNEXPECTED: " + "; ".join(problems)
    return ("OK: cuDNN attention fails only where cuDNN is hidden; FLASH, EFFICIENT and the "
            "matmul work in both")


def table(columns: list[tuple[str, dict[str, str]]]) -> str:
    width = max(len(r) for r in ROWS)
    widths = [max(len(title), *(len(rows.get(r, "")) for r in ROWS)) for title, rows in columns]
    lines = [" | ".join([" " * width, *(t.ljust(w) for (t, _), w in zip(columns, widths))])]
    lines.append("-+-".join(["-" * width, *("-" * w for w in widths)]))
    for row in ROWS:
        lines.append(" | ".join([row.ljust(width),
                                 *(rows.get(row, "").ljust(w) for (_, rows), w in zip(columns, widths))]))
    return "\n".join(lines)


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from grader.isolation.sandbox import Sandbox, cudnn_engines, cudnn_search_folders, default_layout
    engines = cudnn_engines()
    print(f"searched: {', '.join(cudnn_search_folders()) or 'no folder'} and ldconfig's cache")
    print(f"hide_libraries covers {len(engines)} cuDNN engine file(s) here:")
    for path in engines:
        print(f"  {path}")
    box = Sandbox.probe(**default_layout(), mode="auto")
    if not box.active:
        print(f"no sandbox here ({box.reason}): nothing to compare; run it where the grader "
              f"runs sandboxed")
        return 0
    columns = [(title, run_wrapped(box, hide)) for title, hide in COLUMNS]
    print(table(columns))
    print(verdict(columns[0][1], columns[1][1]))
    if not engines:
        print("(hide_libraries found no cuDNN engine here: if cuDNN loads above, compare 'mapped "
              "from' with the folders searched)")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--inside"]:
        print(json.dumps(probe()))
        sys.exit(0)
    sys.exit(main())
