"""What the grader runs on: probed in a child process, so the grader itself holds no CUDA context."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shutil
import subprocess
import sys

from grader import __version__
from grader.common import config


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
    index: int | None = None   # the GPU's CUDA index as the grader sees it (--gpus), None without one
    uuid: str = ""             # 'GPU-…': the child processes of its GPU worker see only this GPU

    @property
    def label(self) -> str:
        """'GPU 1 (NVIDIA H200)', or the device's name without a GPU index."""
        return f"GPU {self.index} ({self.name})" if self.index is not None else self.name

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


def _probe(selection: list[int] | None = None) -> dict:
    """Every GPU this process sees (index, name, uuid), and the full probe of each selected one
    (default: all; an index that does not exist is left out, for the caller to name)."""
    import torch
    base = dict(cuda=False, name="cpu", capability=None, l2_bytes=0, memory_bytes=0, sm_count=0,
                torch_version=torch.__version__, cuda_version=torch.version.cuda)
    if not torch.cuda.is_available():
        return dict(listed=[], probed=[base])
    listed = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        listed.append(dict(index=i, name=props.name, uuid=_uuid(props),
                           capability=[props.major, props.minor]))
    probed = []
    for i in (range(len(listed)) if selection is None else selection):
        if not 0 <= i < len(listed):
            continue
        props = torch.cuda.get_device_properties(i)
        with torch.cuda.device(i):   # the events and the products on GPU i
            probed.append(dict(base, cuda=True, name=props.name,
                               capability=(props.major, props.minor),
                               l2_bytes=props.L2_cache_size, memory_bytes=props.total_memory,
                               sm_count=props.multi_processor_count,
                               matmul_tflops=_matmul_tflops(torch, device=i), index=i,
                               uuid=listed[i]["uuid"]))
    return dict(listed=listed, probed=probed)


def _uuid(props) -> str:
    """'GPU-5c3f…' as CUDA_VISIBLE_DEVICES and nvidia-smi write it ('' if torch cannot say):
    torch prints the bytes without the prefix."""
    raw = str(getattr(props, "uuid", "") or "")
    if not raw:
        return ""
    return raw if raw.startswith(("GPU-", "MIG-")) else f"GPU-{raw}"


def _matmul_tflops(torch, n: int = 8192, reps: int = 10, device: int = 0) -> float:
    """The GPU's practical fp16 matrix peak, for the page's '% of peak' column: the median of
    `reps` 8192³ products on random data (zeros run faster), after warm-up, on GPU `device`
    (the current device: its stream records the events)."""
    a, b = (torch.randn(n, n, device=f"cuda:{device}", dtype=torch.float16) for _ in range(2))
    for _ in range(3):
        a @ b
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize(device)
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
    """Probe torch and the first GPU in a child process (a CUDA context in the grader would stay
    open)."""
    return detect_gpus([0], force_cpu=force_cpu)[0]


class GpuSelectionError(ValueError):
    """--gpus names no GPU, a GPU twice, one that does not exist, or GPUs of different kinds."""


def parse_gpus(text: str | None) -> list[int] | None:
    """'0,1' -> [0, 1]; None or 'all' -> None (every GPU). GpuSelectionError for anything else
    (not a number, a negative one, a GPU named twice, an empty list)."""
    if text is None or text.strip().lower() == "all":
        return None
    parts = [p.strip() for p in text.split(",")]
    if not any(parts):
        raise GpuSelectionError(f"--gpus {text!r} names no GPU: give indices separated by commas "
                                f"(--gpus 0,1), or all")
    indices = []
    for part in parts:
        if not part.isdigit():
            raise GpuSelectionError(f"--gpus {text!r}: {part!r} is not a GPU index; give indices "
                                    f"separated by commas (--gpus 0,1), or all")
        if int(part) in indices:
            raise GpuSelectionError(f"--gpus {text!r}: GPU {int(part)} is named twice")
        indices.append(int(part))
    return sorted(indices)


def select_gpus(wanted: list[int] | None, listed: list[dict]) -> list[int]:
    """The indices to grade on, checked against the GPUs this machine has (`listed`: index,
    name, uuid, capability each): every GPU when `wanted` is None. GPUs of different kinds in
    one run are refused: their times cannot be compared, and a build is for one architecture."""
    have = {g["index"]: g for g in listed}
    shown = ", ".join(f"{g['index']} ({g['name']})" for g in listed) or "none"
    def kind(i):
        return have[i]["name"], tuple(have[i].get("capability") or ())

    # By default every GPU of the first one's kind (a machine may hold a display GPU as well).
    chosen = [i for i in sorted(have) if kind(i) == kind(min(have))] if wanted is None else wanted
    unknown = [i for i in chosen if i not in have]
    if unknown:
        raise GpuSelectionError(f"--gpus: no GPU {', '.join(map(str, unknown))} on this machine; "
                                f"its GPUs: {shown}")
    if not chosen:
        raise GpuSelectionError("--gpus names no GPU")
    kinds = {kind(i) for i in chosen}
    if len(kinds) > 1:
        raise GpuSelectionError(f"--gpus: GPUs of different kinds ({shown}); their times cannot "
                                f"be compared: grade on one kind at a time (--gpus "
                                f"{','.join(str(i) for i in chosen if have[i]['name'] == have[chosen[0]]['name'])})")
    return chosen


def detect_gpus(wanted: list[int] | None = None, *, force_cpu: bool = False) -> list[DeviceInfo]:
    """One DeviceInfo per GPU to grade on (`wanted`: CUDA indices as the grader sees them, None:
    all; GpuSelectionError when that is not a valid set), each probed on its own GPU; without a
    CUDA device (or `force_cpu`), the one CPU device."""
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    if force_cpu:
        raw = subprocess.run([sys.executable, "-c", "import torch,json;print(json.dumps("
                              "dict(torch_version=torch.__version__,cuda_version=torch.version.cuda)))"],
                             capture_output=True, text=True, timeout=300, check=True).stdout
        infos = [dict(cuda=False, name="cpu", capability=None, l2_bytes=0, memory_bytes=0,
                      sm_count=0, **json.loads(raw.strip().splitlines()[-1]))]
    else:
        cmd = [sys.executable, "-m", "grader.isolation.device"]
        if wanted is not None:
            cmd += ["--gpus", ",".join(map(str, wanted))]
        raw = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                             cwd=config.REPO_ROOT, check=True).stdout
        probe = json.loads(raw.strip().splitlines()[-1])
        if probe["listed"]:
            chosen = select_gpus(wanted, probe["listed"])
            infos = [p for i in chosen for p in probe["probed"] if p.get("index") == i]
        else:
            infos = probe["probed"]
    devices = []
    for info in infos:
        raw_capability = info.pop("capability", None)
        capability = tuple(raw_capability) if raw_capability else None
        devices.append(DeviceInfo(capability=capability, arch=arch_for(capability),
                                  driver=_driver() if info["cuda"] else "none", nvcc=find_nvcc(),
                                  python=sys.version.split()[0], date=date, **info))
    return devices


def device_minor(uuid: str, root: str = "/proc/driver/nvidia/gpus") -> int | None:
    """The N of /dev/nvidiaN for the GPU with this UUID, from the driver's own account of each
    GPU (its 'information' file: 'GPU UUID:' and 'Device Minor:'); None where it cannot say
    (no driver, a MIG instance)."""
    import glob
    for path in sorted(glob.glob(os.path.join(root, "*", "information"))):
        try:
            fields = dict(line.split(":", 1) for line in open(path).read().splitlines() if ":" in line)
        except OSError:
            continue
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        if uuid and fields.get("GPU UUID") == uuid and fields.get("Device Minor", "").isdigit():
            return int(fields["Device Minor"])
    return None


if __name__ == "__main__":
    gpus = sys.argv[2] if len(sys.argv) > 2 and sys.argv[1] == "--gpus" else None
    print(json.dumps(_probe([int(i) for i in gpus.split(",")] if gpus else None)))
