"""What the grader runs on: probed in a child process, so the grader itself holds no CUDA context."""

from __future__ import annotations

import dataclasses
import datetime
import json
import shutil
import subprocess
import sys

from . import __version__, config


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    cuda: bool                 # a usable CUDA device is present
    name: str                  # 'NVIDIA H200' or 'cpu'
    capability: tuple[int, int] | None
    arch: str                  # nvcc arch suffix: '90a' on Hopper
    l2_bytes: int
    memory_bytes: int
    sm_count: int
    driver: str
    torch_version: str
    cuda_version: str | None   # the CUDA torch was built with
    nvcc: str | None           # path to nvcc, needed to build or compile-check CUDA submissions
    python: str
    matmul_tflops: float = 0.0  # fp16 8192³ matmul through torch, measured at the start of the run
    grader_version: str = __version__
    date: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DeviceInfo":
        d = dict(d)
        if d.get("capability") is not None:
            d["capability"] = tuple(d["capability"])
        return cls(**d)


def arch_for(capability: tuple[int, int] | None) -> str:
    """sm_90a on Hopper (wgmma and setmaxnreg need the 'a' target), sm_100a on Blackwell."""
    if capability is None:
        return config.DEFAULT_CUDA_ARCH
    major, minor = capability
    return f"{major}{minor}" + ("a" if major >= 9 else "")


def _probe() -> dict:
    import torch
    info = dict(cuda=False, name="cpu", capability=None, l2_bytes=0, memory_bytes=0, sm_count=0,
                torch_version=torch.__version__, cuda_version=torch.version.cuda)
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(cuda=True, name=props.name, capability=(props.major, props.minor),
                    l2_bytes=props.L2_cache_size, memory_bytes=props.total_memory,
                    sm_count=props.multi_processor_count, matmul_tflops=_matmul_tflops(torch))
    return info


def _matmul_tflops(torch, n: int = 8192, reps: int = 10) -> float:
    """The GPU's practical fp16 matrix peak, for the page's '% of peak' column: the median of
    `reps` 8192³ products on random data (zeros run faster), after warm-up."""
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.float16) for _ in range(2))
    for _ in range(3):
        a @ b
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return 2 * n ** 3 / (sorted(times)[len(times) // 2] * 1e-3) / 1e12


def _driver() -> str:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return "none"
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
        return out.strip().splitlines()[0] if out.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def find_nvcc() -> str | None:
    import os
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and os.path.isfile(os.path.join(home, "bin", "nvcc")):
            return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc")


def detect(*, force_cpu: bool = False) -> DeviceInfo:
    """Probe torch and the GPU in a child process (a CUDA context in the grader would stay open)."""
    if force_cpu:
        raw = subprocess.run([sys.executable, "-c", "import torch,json;print(json.dumps("
                              "dict(torch_version=torch.__version__,cuda_version=torch.version.cuda)))"],
                             capture_output=True, text=True, timeout=300, check=True).stdout
        info = dict(cuda=False, name="cpu", capability=None, l2_bytes=0, memory_bytes=0,
                    sm_count=0, **json.loads(raw.strip().splitlines()[-1]))
    else:
        raw = subprocess.run([sys.executable, "-m", "grader.device"], capture_output=True,
                             text=True, timeout=300, cwd=config.REPO_ROOT, check=True).stdout
        info = json.loads(raw.strip().splitlines()[-1])
    raw_capability = info.pop("capability", None)
    capability = tuple(raw_capability) if raw_capability else None
    return DeviceInfo(capability=capability, arch=arch_for(capability),
                      driver=_driver() if info["cuda"] else "none", nvcc=find_nvcc(),
                      python=sys.version.split()[0],
                      date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                      **info)


if __name__ == "__main__":
    print(json.dumps(_probe()))
