"""The sandbox every submission's build, run and timing process runs in: bubblewrap.

Inside, only an allow-list of the host's filesystem exists, read-only: the system folders (/usr,
/lib, /etc, /opt, /sys, ...), the Python interpreter and every folder on its import path, the
grader's own code and the repository's virtual environment. Nothing else is there: not the rest
of the repository (the solution, the hidden cases), not the submissions folder (everyone else's
code), not the results or build folders, not the home folders. /tmp, /dev/shm and $HOME are
empty, size-capped scratch space. Writable: the submission's own folder, its build folder and
its scratch folder. No network (a new network namespace), no other processes (a new PID
namespace), only the GPU's device nodes in /dev. Where bubblewrap is missing or cannot create
namespaces, `Sandbox.probe` says why, and the grader says so loudly on every result and on the
leaderboard, then runs plain subprocesses: grading goes on.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

from . import config

MODES = ("auto", "require", "off")
TMPFS_BYTES = 8 << 30   # each hidden folder's scratch tmpfs (nvcc's temporary files go to /tmp)   # GRADER_SANDBOX: auto = use it when it works


class SandboxUnavailable(RuntimeError):
    """GRADER_SANDBOX=require and bubblewrap cannot run here."""


@dataclasses.dataclass(frozen=True)
class Sandbox:
    bwrap: str | None                  # None: plain subprocesses
    reason: str = ""                   # why not, when bwrap is None
    readable: tuple[str, ...] = ()     # read-only inside; nothing else of the host exists
    scratch: tuple[str, ...] = ()      # empty tmpfs inside

    @property
    def active(self) -> bool:
        return self.bwrap is not None

    def wrap(self, cmd: list[str], *, writable: list[Path | str]) -> list[str]:
        """`cmd` as run inside the sandbox, with `writable` folders bound read-write."""
        if not self.active:
            return cmd
        args = [self.bwrap, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                "--die-with-parent", "--new-session"]
        args += ["--dev", "/dev", "--proc", "/proc"]
        for node in sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/dri")):
            args += ["--dev-bind", node, node]
        for path in self.scratch:   # size-capped: writes there vanish and cannot fill memory
            args += ["--size", str(TMPFS_BYTES), "--tmpfs", path]
        for path in self.readable:  # after the scratch folders: a pyenv in $HOME stays visible
            if os.path.islink(path) and os.path.dirname(path) == "/":   # /bin -> usr/bin
                args += ["--symlink", os.readlink(path), path]
            elif os.path.exists(path):
                args += ["--ro-bind", path, path]
        for path in writable:   # a symlinked folder appears where the grader names it
            os.makedirs(path, exist_ok=True)
            args += ["--bind", str(Path(path).resolve()), str(Path(path).absolute())]
        return args + ["--", *cmd]

    @classmethod
    def probe(cls, *, readable: list[Path | str], scratch: list[Path | str],
              mode: str | None = None) -> "Sandbox":
        """A working sandbox, or an inactive one that says why (or raise, when required)."""
        mode = mode or os.environ.get("GRADER_SANDBOX", "auto")
        if mode not in MODES:
            raise ValueError(f"GRADER_SANDBOX={mode!r}: use one of {', '.join(MODES)}")
        if mode == "off":
            return cls(None, "turned off (GRADER_SANDBOX=off)")
        bwrap = os.environ.get("GRADER_BWRAP") or shutil.which("bwrap")
        reason = ""
        if bwrap is None:
            reason = "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
        else:
            trial = cls(bwrap, readable=SYSTEM).wrap(["true"], writable=[])
            try:
                proc = subprocess.run(trial, capture_output=True, text=True, timeout=30)
                if proc.returncode != 0:
                    reason = f"bwrap cannot create its namespaces here: {proc.stderr.strip()[:300]}"
            except (OSError, subprocess.TimeoutExpired) as e:
                reason = f"bwrap failed to start: {e}"
        if reason:
            if mode == "require":
                raise SandboxUnavailable(f"GRADER_SANDBOX=require, but {reason}")
            return cls(None, reason)
        return cls(bwrap, readable=tuple(dict.fromkeys(str(p) for p in readable)),
                   scratch=tuple(dict.fromkeys(str(p) for p in scratch)))

    def describe(self) -> str:
        if self.active:
            return "sandboxed (bubblewrap: no network; only system folders, the grader and the submission's own folders visible)"
        return f"NOT SANDBOXED: {self.reason}"


SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/sys")


def default_layout() -> dict:
    """What a submission's processes see, for `Sandbox.probe(**default_layout())`: the system,
    the interpreter and its import path (a pyenv in $HOME, a .pth to another site-packages), the
    grader's code and the virtual environment. Never the repository root or anything in it."""
    python = [sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)),
              *site.getsitepackages(), *sys.path]
    repo = str(config.REPO_ROOT)
    readable = list(SYSTEM)
    for path in python:
        path = os.path.realpath(path) if path else ""
        if not path or not os.path.isdir(path) or path in ("/", repo) or path.startswith(repo + os.sep):
            continue   # the repository's own folders are added one by one below
        if not any(path == r or path.startswith(r + os.sep) for r in SYSTEM):
            readable.append(path)
    readable += [str(config.REPO_ROOT / "grader"), str(config.REPO_ROOT / ".venv")]
    if os.environ.get("GRADER_CUDA_INCLUDE"):   # headers a compile check needs (build.py)
        readable.append(os.environ["GRADER_CUDA_INCLUDE"])
    scratch = ["/tmp", "/dev/shm", str(Path.home())]
    return dict(readable=readable, scratch=scratch)
