"""What a CUDA build's translation unit costs to compile, against the full torch/extension.h and
against torch's tensor API alone (build/child.py CHECK_EXTENSION_H, which the real build now tries
first), and what load_inline's binding (main.cpp) costs: CPU seconds of each compile (user +
system of the compiler's processes), one after the other, with the real build's flags (nvcc -c
only: no GPU or CUDA-enabled torch needed).

    .venv/bin/python bench/unit_compile_probe.py [FILE.cu ...] [--arch 90a] [--out bench/x.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grader.build.child import check_include, compile_check_command   # noqa: E402
from grader.build.flags import LOAD_INLINE_PRELUDE                      # noqa: E402
from grader.common import config                                        # noqa: E402
from grader.isolation.device import find_nvcc                           # noqa: E402


def timed(cmd: list[str]) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return dict(ok=proc.returncode == 0, wall_s=round(time.monotonic() - t0, 1),
                cpu_s=round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1),
                tail=proc.stdout[-400:] if proc.returncode else "")


def binding_command(folder: Path) -> list[str]:
    """load_inline's main.cpp for this course's entry point, compiled as torch's ninja rule does."""
    import sysconfig
    import torch
    from torch.utils.cpp_extension import include_paths
    main = folder / "main.cpp"
    main.write_text("#include <torch/extension.h>\n" + config.ENTRY_DECLARATION + "\n"
                    "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n"
                    f'm.def("{config.ENTRY_POINT}", torch::wrap_pybind_function({config.ENTRY_POINT}), '
                    f'"{config.ENTRY_POINT}");\n}}\n')
    cmd = [os.environ.get("CXX", "c++"), "-c", str(main), "-o", str(folder / "main.o"),
           "-DTORCH_EXTENSION_NAME=probe", "-DTORCH_API_INCLUDE_EXTENSION_H",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", "-fPIC", "-O3",
           "-std=c++20" if tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 10) else "-std=c++17"]
    for inc in [*include_paths(), sysconfig.get_paths()["include"]]:
        cmd += ["-isystem", inc]
    return cmd


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("files", nargs="*", default=["solution/submission.cu", "student/submission.cu"])
    p.add_argument("--arch", default="90a")
    p.add_argument("--out")
    a = p.parse_args()
    nvcc = find_nvcc()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rows.append(dict(unit="binding (main.cpp)", header="full", **timed(binding_command(folder))))
        for f in a.files:
            unit = folder / "cuda.cu"
            unit.write_text("\n".join(LOAD_INLINE_PRELUDE + [Path(f).read_text()]))
            shim = check_include(folder)
            for header, first in (("full", []), ("tensor API", [str(shim)])):
                rows.append(dict(unit=f, header=header, **timed(compile_check_command(
                    unit, folder / "cuda.o", "probe", a.arch, nvcc, first))))
                print(rows[-1], flush=True)
    for r in rows:
        print(f"{r['unit']:28} {r['header']:11} ok={r['ok']!s:5} cpu {r['cpu_s']:6.1f} s  wall {r['wall_s']:6.1f} s")
    if a.out:
        Path(a.out).write_text(json.dumps(dict(
            date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), host=platform.node(),
            cpus=os.cpu_count(), load=os.getloadavg(), nvcc=nvcc, arch=a.arch, rows=rows), indent=1))


if __name__ == "__main__":
    main()
