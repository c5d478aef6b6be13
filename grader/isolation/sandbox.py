"""The sandbox every submission's build, run and timing process runs in: bubblewrap.

Inside, only an allow-list of the host's filesystem exists, read-only: the system folders (/usr,
/lib, /etc, /opt, /sys, ...), the Python interpreter and every folder on its import path, the
grader's own code and the repository's virtual environment. Nothing else is there: not the rest
of the repository (the solution, the hidden cases), not the submissions folder (everyone else's
code), not the results or build folders, not the home folders. /tmp, /dev/shm and $HOME are
empty, size-capped scratch space. The submission's own folder is read-only; only its build
folder (while it builds) is writable. No network (a new network namespace), no other processes
(a new PID namespace), only the GPU's device nodes in /dev. Never root: when the grader runs as
root, the sandboxed process drops to uid/gid 65534 (nobody) with every capability dropped
(setpriv), so it cannot change GPU clocks or settings, ptrace anything or write what root owns.
Where bubblewrap is missing or cannot create namespaces, `Sandbox.probe` says why, and the grader
says so loudly on every result and on the leaderboard, then runs plain subprocesses: grading goes
on.

A student's subject sees no cuDNN engine (`wrap(hide_libraries=True)`, issue 30): each library
file that computes cuDNN's kernels is covered by an empty file, so cuDNN's attention, faster than
any student's, cannot run in a process whose own report of what ran is the submission's to forge.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import glob
import importlib.util
import os
import re
import shutil
import site
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from grader.common import config
from grader.isolation.priority import lowered

MODES = ("auto", "require", "off")   # GRADER_SANDBOX: auto = use it when it works
TMPFS_BYTES = 8 << 30   # each scratch tmpfs (nvcc's temporary files go to /tmp)
NOBODY = 65534          # the uid and gid sandboxed processes run as when the grader is root
_GPU_NODE = re.compile(r"nvidia\d+")   # one GPU's node; nvidiactl, nvidia-uvm, ... are shared


def drop_privileges() -> list[str]:
    """The command prefix that runs the rest as nobody with no capabilities, when we are root."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise SandboxUnavailable("the grader runs as root and setpriv (util-linux) is missing: "
                                 "submissions would run as root; apt-get install util-linux")
    return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--"]


def give_to_sandbox(path: Path) -> None:
    """Make a folder the sandboxed user will write (a build folder) its own, with what is in it."""
    if os.geteuid() != 0:
        return
    os.chown(path, NOBODY, NOBODY)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(root, name), NOBODY, NOBODY, follow_symlinks=False)


class SandboxUnavailable(RuntimeError):
    """GRADER_SANDBOX=require and bubblewrap cannot run here."""


@dataclasses.dataclass(frozen=True)
class Sandbox:
    bwrap: str | None                  # None: plain subprocesses
    reason: str = ""                   # why not, when bwrap is None
    readable: tuple[str, ...] = ()     # read-only inside; nothing else of the host exists
    scratch: tuple[str, ...] = ()      # empty tmpfs inside
    # The GPU nodes (/dev/nvidiaN) a process may open: a GPU worker's one GPU (for_gpu). None:
    # every GPU's. The driver's shared nodes (nvidiactl, nvidia-uvm, ...) are always there.
    gpu_nodes: tuple[str, ...] | None = None
    # Where hide_libraries looks for cuDNN's engines. None: where torch finds them
    # (cudnn_search_folders, and the dynamic linker's cache); a test names its own folders.
    cudnn_folders: tuple[str, ...] | None = None

    def for_gpu(self, minor: int | None) -> "Sandbox":
        """This sandbox for one GPU worker: of the GPUs' own nodes only /dev/nvidia<minor>, so
        that a submission cannot reach another worker's GPU whatever CUDA_VISIBLE_DEVICES says
        (`minor`: device.device_minor; None, unknown: every GPU's node, as without workers)."""
        return self if minor is None else dataclasses.replace(self, gpu_nodes=(f"/dev/nvidia{minor}",))

    def without_gpus(self) -> "Sandbox":
        """This sandbox with no GPU's node at all (a build: a CUDA compile or a Python
        submission's import check, which runs while other submissions are timed and must not
        load their GPUs)."""
        return dataclasses.replace(self, gpu_nodes=())

    def device_nodes(self) -> list[str]:
        """The device nodes bound into the sandbox: the NVIDIA driver's, and /dev/dri."""
        nodes = sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/dri"))
        if self.gpu_nodes is None:
            return nodes
        return [n for n in nodes if not _GPU_NODE.fullmatch(os.path.basename(n))
                or n in self.gpu_nodes]

    @property
    def active(self) -> bool:
        return self.bwrap is not None

    def wrap(self, cmd: list[str], *, writable: list[Path | str] = (),
             readonly: list[Path | str] = (), hide_libraries: bool = False,
             nice: int = 0) -> list[str]:
        """`cmd` as run inside the sandbox: `writable` folders bound read-write, `readonly` ones
        (the submission's folder) read-only, as an unprivileged user. `hide_libraries` (a
        student's subject): every cuDNN engine library (cudnn_engines) reads as an empty file
        inside, so that none can be loaded; the dispatcher libcudnn.so.N, which libtorch_cuda
        needs to load at all, stays. `nice` (a build): run at that CPU priority, in the session
        --new-session makes too (priority.lowered)."""
        if not self.active:
            return cmd
        args = [self.bwrap, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                "--die-with-parent", "--new-session"]
        args += ["--dev", "/dev", "--proc", "/proc"]
        for node in self.device_nodes():
            args += ["--dev-bind", node, node]
        for path in self.scratch:   # size-capped, anyone may write: writes vanish with the process
            args += ["--perms", "1777", "--size", str(TMPFS_BYTES), "--tmpfs", path]
        mounts = [(path, "--ro-bind") for path in self.readable if os.path.exists(path)]
        mounts += [(str(Path(p).absolute()), "--ro-bind") for p in readonly]
        for path in writable:
            os.makedirs(path, exist_ok=True)
            mounts.append((str(Path(path).absolute()), "--bind"))
        bound: list[str] = []
        made: set[str] = set()
        # Parents before children (a later bind of a parent would hide a child); a symlinked
        # folder appears where the grader names it.
        for dest, how in sorted(mounts, key=lambda m: m[0].count(os.sep)):
            if os.path.islink(dest) and os.path.dirname(dest) == "/":   # /bin -> usr/bin
                args += ["--symlink", os.readlink(dest), dest]
                continue
            args += _parents(dest, self.scratch, bound, made)
            args += [how, os.path.realpath(dest), dest]
            bound.append(dest)
        if hide_libraries:   # last: over the binds that show the files
            args += hide_args(cudnn_engines(self.cudnn_folders), bound)
        return args + ["--", *drop_privileges(), *lowered(cmd, nice)]

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
            try:
                trial = cls(bwrap, readable=SYSTEM).wrap(["true"])
                proc = subprocess.run(trial, capture_output=True, text=True, timeout=30)
                if proc.returncode != 0:
                    reason = f"bwrap cannot create its namespaces here: {proc.stderr.strip()[:300]}"
            except SandboxUnavailable as e:
                reason = str(e)
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
            who = f"as uid {NOBODY} (nobody), no capabilities" if os.geteuid() == 0 else \
                "as the grader's own user, no capabilities"
            return (f"sandboxed (bubblewrap, {who}: no network; only system folders, the grader "
                    f"and the submission's own folders visible; its folder read-only)")
        return f"NOT SANDBOXED: {self.reason}"


def _parents(dest: str, scratch: tuple[str, ...], bound: list[str], made: set[str]) -> list[str]:
    """bwrap arguments that create `dest`'s missing parent folders traversable (0755): bwrap would
    copy the host's modes, and a 0700 parent (a root-owned temporary folder) locks nobody out.
    Parents that are mounts, or inside an earlier bind, exist already and are left alone."""
    args = []
    parts = Path(dest).parts
    for i in range(2, len(parts)):
        parent = str(Path(*parts[:i]))
        if parent in scratch or parent in made or any(
                parent == b or parent.startswith(b + os.sep) for b in bound):
            continue
        args += ["--perms", "0755", "--dir", parent]
        made.add(parent)
    return args


SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/sys")


# ---------------------------------------------------------------- cuDNN's engines, hidden
#
# Issue 30: which kernels a call ran is reported by the subject, so a submission that can run
# code there can forge the report; what it can gain is bounded by the fastest attention the
# subject can reach. cuDNN's is faster than any student kernel measured (13.1 ms against 17.5 ms on
# an H100), so a student's subject must not be able to load it. cuDNN 9 is a dispatcher,
# libcudnn.so.N, that libtorch_cuda links against (it must be there for torch to load at all),
# and libraries it dlopens when a cuDNN call first needs one: _graph, _engines_precompiled,
# _engines_runtime_compiled, _heuristic, _ops, _cnn, _adv (cuDNN 8: _ops_infer, _cnn_train, ...).
# The graph library stays too: torch asks cuDNN's version when it is imported, and the dispatcher
# finds cudnnGetVersion there (hiding it made `import torch` abort in the subject: "Cannot load
# symbol cudnnGetVersion", notes/gpu_runs.md, session 19). It builds an attention's graph; the
# engines that run one are what is hidden. Each engine file is covered by an empty one in the
# sandbox, so the dispatcher's dlopen fails ("file too short") and so does every cuDNN call that
# runs anything; the checker and the baselines are not wrapped so, and keep cuDNN.

# every libcudnn_*.so* but the graph library; never the dispatcher, libcudnn.so*
CUDNN_ENGINE = re.compile(r"^libcudnn_(?!graph\b)\w+\.so(\.\d+)*$")
CUDNN_DISPATCHER = re.compile(r"^libcudnn\.so(\.\d+)*$")
# The dynamic linker's own last resort, searched after LD_LIBRARY_PATH and its cache.
LINKER_DEFAULT_FOLDERS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64")


def cudnn_search_folders() -> tuple[str, ...]:
    """The folders a subject's torch finds cuDNN in: torch's own lib folder, the nvidia/cudnn/lib
    folder of every site-packages on the interpreter's path (the nvidia-cudnn-cu* wheels, which
    libtorch_cuda's RPATH names), LD_LIBRARY_PATH's folders (the subject inherits them), the
    environment's lib folder (conda) and the linker's default folders. torch is found, not
    imported. With ldconfig's cache (ldconfig_libraries), every place a dlopen by name looks."""
    spec = importlib.util.find_spec("torch")
    folders = [os.path.join(loc, "lib") for loc in (spec.submodule_search_locations or [])] \
        if spec is not None else []
    folders += [os.path.join(p, "nvidia", "cudnn", "lib")
                for p in (*site.getsitepackages(), *sys.path) if p]
    folders += [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    folders += [os.path.join(sys.prefix, "lib"), *LINKER_DEFAULT_FOLDERS]
    return tuple(dict.fromkeys(os.path.realpath(f) for f in folders if os.path.isdir(f)))


def ldconfig_libraries() -> tuple[str, ...]:
    """Every library path in the dynamic linker's cache (`ldconfig -p`); () without ldconfig."""
    ldconfig = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)), None)
    if ldconfig is None:
        return ()
    try:
        out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=60,
                             errors="replace").stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(line.rsplit("=>", 1)[1].strip() for line in out.splitlines() if "=>" in line)


def find_cudnn_engines(folders: Iterable[str], listed: Iterable[str] = ()) -> tuple[str, ...]:
    """The real files (links resolved) of every cuDNN engine library (CUDNN_ENGINE) in `folders`,
    among the `listed` paths (ldconfig's), or beside any dispatcher found there (the dispatcher
    looks in its own folder first, its $ORIGIN), sorted, each once. A link's own name needs no
    cover of its own: whatever name a loader opens resolves to the real file, which is covered."""
    folders, listed = list(folders), list(listed)
    dispatchers = [os.path.join(f, n) for f in folders for n in _listdir(f) if CUDNN_DISPATCHER.match(n)]
    dispatchers += [p for p in listed if CUDNN_DISPATCHER.match(os.path.basename(p))]
    folders += [os.path.dirname(p) for d in dispatchers for p in (d, os.path.realpath(d))]
    names = [os.path.join(folder, name) for folder in dict.fromkeys(folders)
             for name in _listdir(folder) if CUDNN_ENGINE.match(name)]
    names += [p for p in listed if CUDNN_ENGINE.match(os.path.basename(p))]
    real = set()
    for name in names:
        try:
            path = os.path.realpath(name, strict=True)
            if stat.S_ISREG(os.stat(path).st_mode):
                real.add(path)
        except OSError:   # a dangling link loads nothing: nothing to hide
            continue
    return tuple(sorted(real))


@functools.cache
def cudnn_engines(folders: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The cuDNN engine files hide_libraries covers, found once per process: in `folders`, or
    (None) where torch finds them (cudnn_search_folders and ldconfig's cache). () where there is
    no cuDNN (a CPU machine): then hiding is a no-op."""
    if folders is not None:
        return find_cudnn_engines(folders)
    return find_cudnn_engines(cudnn_search_folders(), ldconfig_libraries())


def hide_args(files: Iterable[str], bound: Iterable[str]) -> list[str]:
    """bwrap arguments that cover each of `files` (real paths) with an empty read-only file
    wherever a bind shows it inside the sandbox: `bound` are the binds' destinations, each
    showing what its real path holds. A file no bind shows is not there to hide."""
    binds = [(dest, os.path.realpath(dest)) for dest in bound]
    covered: list[str] = []
    for path in files:
        for dest, real in binds:
            if path.startswith(real.rstrip(os.sep) + os.sep):
                inside = dest.rstrip(os.sep) + path[len(real.rstrip(os.sep)):]
                if inside not in covered:
                    covered.append(inside)
    if not covered:
        return []
    empty = empty_file()
    return [arg for inside in covered for arg in ("--ro-bind", empty, inside)]


_EMPTY_FILES: list[str] = []   # the empty files this process made; the last is the one in use


def empty_file() -> str:
    """An empty regular file of the grader's own, read-only (0444), that bwrap binds over what a
    sandbox must not load. Made once per process, in its temporary folder (outside every
    sandbox: bwrap opens it before the sandbox exists), and made again if it is no longer an
    empty file of ours; removed when the process exits."""
    if _EMPTY_FILES:
        try:
            st = os.lstat(_EMPTY_FILES[-1])
            if stat.S_ISREG(st.st_mode) and st.st_size == 0 and st.st_uid == os.geteuid():
                return _EMPTY_FILES[-1]
        except OSError:
            pass
    fd, path = tempfile.mkstemp(prefix="grader-hidden-library-")
    os.close(fd)
    os.chmod(path, 0o444)
    if not _EMPTY_FILES:
        atexit.register(_remove_empty_files)
    _EMPTY_FILES.append(path)
    return path


def _remove_empty_files() -> None:
    for path in _EMPTY_FILES:
        try:
            os.unlink(path)
        except OSError:
            pass


def _listdir(folder: str) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


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
