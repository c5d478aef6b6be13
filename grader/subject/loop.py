"""The subject: the only process that imports a submission. It runs what it is told and reports.

    python grader/subject/loop.py --setup JSON          (started by grader/harness.py)
    python grader/subject/loop.py --check-load TARGET_JSON   (the build stage's import check)

The harness starts it with two pipes and four shared buffers (Q, K, V, O) as inherited file
descriptors. After loading the submission it answers each request, one JSON line each way:

    {"op": "call", "n": 7, "shape": [B, H, S, D], "profile": true}
        -> {"event": "done", "n": 7, "returned": {...}, "launched": [...], "peak_memory_bytes": ...}
         | {"event": "error", "n": 7, "error": "ValueError", "message": ..., "context_alive": true}
    {"op": "arm", "n": 9, "shape": [B, H, S, D]}      (no reply: the next "go"'s views made)
    {"op": "go", "n": 10}
        -> {"event": "done", "n": 10, "returned": {...}}, then {"event": "diagnostics", "n": 10, ...}
    {"op": "profile", "on": true}  /  {"op": "profile", "on": false} -> {"event": "profile", "kernels": [...]}
    {"op": "ping", "n": 8} -> {"event": "pong", "n": 8}
    {"op": "exit"}

A prepared subject (setup "prepare": true) first starts the profiler once, replies
{"event": "prepared"} and reads one line, "load"; it replies {"event": "loading"} and then loads
the submission.

A call reads Q, K, V from the shared buffers, calls the submission, copies what it returned into
the shared O, synchronizes the device and replies. A timed call is armed first ("arm": its views
of the buffers made before the harness's clock starts) and started by "go", so that between "go"
and the launch this process does no more than read one short line. The harness times it with its
own clock, reads O itself, and treats every reply as a claim: this process decides nothing.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path

import torch

from grader.procs import read_line
from grader.shared_memory import map_buffer

ENTRY_POINT = "flash_attention_forward"   # CUDA submissions (CS149)
PY_ENTRY_POINT = "custom_kernel"          # Python submissions (GPU MODE)


class LoadError(Exception):
    """The submission could not be loaded: the message is for the student."""


# TileLang without a GPU (issue 15). TileLang has no CPU interpreter, so off the GPU its kernels
# are lowered and compiled by nvcc for the course GPU (config.DEFAULT_CUDA_ARCH), exactly as
# tilelang.jit does there, and then not launched: the call ends with a "not_run" reply naming what
# was compiled. The harness takes that claim only where there is no GPU, and nothing is graded.
TILELANG_TARGET_ENV = "TILELANG_DEFAULT_TARGET"
# TileLang's disk cache holds shared libraries it loads into this process, in a folder this
# process can write to: off, so that TileLang loads only what it has just compiled itself.
TILELANG_NO_DISK_CACHE = {"TILELANG_DISABLE_CACHE": "1"}


class NotRunHere(BaseException):
    """A compiled TileLang kernel was about to launch with no GPU to run it. A BaseException,
    so that a submission's `except Exception:` does not turn it into a fallback."""


def tilelang_without_gpu() -> str:
    """Every TileLang kernel launch (JITKernel.__call__, eager and lazy mode alike) raises
    NotRunHere with the kernel's name: by then TileLang has lowered it and nvcc compiled it.
    Returns the nvcc TileLang compiles with, or '' when it has none."""
    from tilelang import env
    from tilelang.jit.kernel import JITKernel

    def launch(kernel, *args, **kwargs):
        try:
            names = re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(",
                               kernel.get_kernel_source())
        except Exception:   # the name is a courtesy; the compile already happened
            names = []
        raise NotRunHere(", ".join(dict.fromkeys(names)) or "the kernel")

    JITKernel.__call__ = launch
    nvcc = os.path.join(env.CUDA_HOME or "/nonexistent", "bin", "nvcc")
    return nvcc if os.access(nvcc, os.X_OK) else ""


def without_cudnn_attention() -> None:
    """A student's subject has no cuDNN engine (grader/sandbox.py, hide_libraries): SDPA is told
    so, and picks one of PyTorch's own kernels instead of failing inside cuDNN (which it did on
    an H100, "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED", session 19). A submission that calls SDPA
    then launches a library kernel, and is flagged for that, as it always was; one that turns
    cuDNN back on only gets the failure. A default, not a defence: the engines are absent."""
    try:
        torch.backends.cuda.enable_cudnn_sdp(False)
    except AttributeError:   # a torch without cuDNN attention
        pass


def load_extension(path: str, name: str):
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    if spec is None:
        raise LoadError(f"cannot load the built extension {path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    fn = getattr(module, ENTRY_POINT, None)
    if fn is None:
        raise LoadError(f"the extension does not export {ENTRY_POINT}")
    return fn


class SourceOnly(importlib.machinery.SourceFileLoader):
    """Compiles the source file the grader audited (grader/reach.py), never a bytecode cache
    beside it: a __pycache__ shipped in the folder could hold other code than its source."""

    def get_code(self, fullname):
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)


def source_only_imports(folder: Path) -> None:
    """Imports from the submission's folder load .py sources only: no extension module (.so) and
    no bytecode (.pyc) there can stand in for code the grader did not read."""
    def hook(path: str):
        resolved = Path(path or ".").resolve()
        if resolved == folder or folder in resolved.parents:
            return importlib.machinery.FileFinder(
                path, (SourceOnly, importlib.machinery.SOURCE_SUFFIXES))
        raise ImportError("not the submission's folder")
    sys.path_hooks.insert(0, hook)
    sys.path_importer_cache.clear()


def load_python(source: str):
    source_path = Path(source).resolve()
    source_only_imports(source_path.parent)
    sys.path.insert(0, str(source_path.parent))
    spec = importlib.util.spec_from_file_location("submission", str(source_path),
                                                  loader=SourceOnly("submission", str(source_path)))
    module = importlib.util.module_from_spec(spec)
    sys.modules["submission"] = module
    spec.loader.exec_module(module)
    kernel = getattr(module, PY_ENTRY_POINT, None)
    if kernel is None:
        raise LoadError(f"{source_path.name} does not define {PY_ENTRY_POINT}(data); the grader "
                        f"calls {PY_ENTRY_POINT}((Q, K, V)) and expects O back.")
    if not callable(kernel):
        raise LoadError(f"{PY_ENTRY_POINT} in {source_path.name} is not a function.")
    return lambda q, k, v: kernel((q, k, v))


def load_builtin(name: str):
    path = Path(__file__).with_name("baselines.py")
    spec = importlib.util.spec_from_file_location("_grader_baselines", str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FUNCTIONS[name]


def load(target: dict):
    if target["kind"] == "cuda":
        return load_extension(target["artifact"], target["module_name"])
    if target["kind"] == "python":
        return load_python(target["source"])
    return load_builtin(target["name"])


def submission_folder(target: dict) -> Path | None:
    """The folder whose files are the student's own code, where a traceback keeps its frames
    (student_traceback); None for the grader's baselines, whose tracebacks go to instructors
    whole. A CUDA submission has no Python of its own: its errors keep no frame at all."""
    if target.get("kind") == "python":
        return Path(target["source"]).resolve().parent
    if target.get("kind") == "cuda":
        return Path(target["artifact"]).resolve().parent
    return None


# What marks the line where the error was raised. It names the error in words because the build
# stage keeps an import check's output only around lines that do (build.relevant_log): a
# SyntaxError's source line and caret follow its "File" line.
RAISED_HERE = "  <- the error is here"
GRADER_CODE = Path(__file__).resolve().parents[1]   # grader/: never the student's code


def student_traceback(e: BaseException, folder: Path, frames: int = 30) -> str:
    """`e` as Python prints it (its chain, a SyntaxError's source line and caret), keeping only
    the frames of files in `folder`, the submission's, each named by its path there
    ("submission.py", "utils/tiles.py"): the student's own code, never the grader's (this file,
    importlib's frames) or a library's. At most the innermost `frames` frames of each exception;
    the line where the last one was raised is marked (RAISED_HERE)."""
    te = traceback.TracebackException.from_exception(e)
    for part in _chain(te):
        part.stack = traceback.StackSummary.from_list(
            [f for f in part.stack if _in_folder(f, folder)][-frames:])
        if part.exc_type is not None and issubclass(part.exc_type, SyntaxError):
            part.filename = _relative(part.filename, folder) or part.filename
    text = "".join(te.format())
    if isinstance(e, SyntaxError) and te.lineno is not None:
        place = f"{te.filename or '<string>'}, line {te.lineno}"
        if te.msg and text.endswith(f": {te.msg}\n"):   # the line a verdict quotes: as str(e)
            text = f"{text[:-1]} ({place})\n"
        raised = f'  File "{te.filename or "<string>"}", line {te.lineno}\n'
    elif te.stack:
        f = te.stack[-1]
        raised = f'  File "{f.filename}", line {f.lineno}, in {f.name}\n'
    else:   # none of the student's code on the way (a CUDA extension's error): the error alone
        return text
    at = text.rfind(raised)
    return text if at < 0 else f"{text[:at]}{raised[:-1]}{RAISED_HERE}\n{text[at + len(raised):]}"


def _chain(te: traceback.TracebackException):
    """`te` and every exception printed with it: its cause, its context, a group's members."""
    seen, todo = set(), [te]
    while todo:
        part = todo.pop()
        if id(part) in seen:
            continue
        seen.add(id(part))
        yield part
        todo += [p for p in (part.__cause__, part.__context__) if p is not None]
        todo += getattr(part, "exceptions", None) or []


def _relative(filename: str | None, folder: Path) -> str:
    """`filename`'s path in `folder` ('' when it is elsewhere, or no file at all: '<string>',
    '<frozen importlib._bootstrap>')."""
    if not filename or not os.path.isabs(filename):
        return ""
    try:   # any name a code object was compiled with: a loop of links, a NUL
        path = Path(filename).resolve()
    except (OSError, RuntimeError, ValueError):
        return ""
    if path.is_relative_to(GRADER_CODE) or not path.is_relative_to(folder):
        return ""
    return str(path.relative_to(folder))


def _in_folder(frame: traceback.FrameSummary, folder: Path) -> bool:
    """Whether `frame` is in the submission's code; it is then named by its path there (its
    source line was read when the exception was captured)."""
    where = _relative(frame.filename, folder)
    if where:
        frame.filename = where
    return bool(where)


def _error(e: BaseException, folder: Path | None) -> dict:
    """What the harness is told of an error: its type, its message and its traceback, which for
    a submission holds the student's own frames only (student_traceback)."""
    text = (student_traceback(e, folder) if folder is not None
            else traceback.format_exc(limit=8))
    return dict(error=type(e).__name__, message=str(e)[:4000], traceback=text[-6000:])


def launched_names(prof, device: str) -> list[list]:
    """[name, count, total GPU µs] of the kernels (GPU) or aten operators (CPU) a profiler saw."""
    totals: dict[str, list] = {}
    for event in prof.events():
        on_gpu = getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA
        if (device == "cuda" and on_gpu) or (device != "cuda" and not on_gpu
                                             and event.name.startswith("aten::")):
            entry = totals.setdefault(event.name[:300], [0, 0.0])
            entry[0] += 1
            entry[1] += event.time_range.elapsed_us() if on_gpu else 0.0
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:200]
    return [[name, count, round(us, 3)] for name, (count, us) in ranked]


def call_activities(device: str) -> list:
    """What a profiled "call" records: the CPU's operators, and the GPU's kernels on a GPU."""
    from torch.profiler import ProfilerActivity
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])


class Subject:
    def __init__(self, setup: dict):
        self.device = setup["device"]
        self.requests = os.fdopen(setup["requests_fd"], "r", buffering=1)
        self.replies = os.fdopen(setup["replies_fd"], "w", buffering=1)
        self.buffers = {name: map_buffer(fd, nbytes, self.device)
                        for name, (fd, nbytes) in setup["buffers"].items()}
        self.folder = submission_folder(setup["target"])   # its errors keep frames there only
        self.fn = None
        self.profiler = None
        self.tilelang_nvcc: str | None = None   # set once TileLang is told there is no GPU
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(3)] if self.device == "cuda" else []
        self.t_line = 0.0
        self.clocks = (0.0, 0.0, 0.0, 0.0)
        self.armed = None   # (shape, views) of the next timed call, or why not: Subject.arm

    def reply(self, record: dict) -> None:
        self.replies.write(json.dumps(record) + "\n")
        self.replies.flush()

    def send(self, line: bytes) -> None:
        """An encoded reply, written at once (every earlier one was flushed)."""
        os.write(self.replies.fileno(), line)

    def synchronize(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def context_alive(self) -> bool:
        try:
            self.synchronize()
            return True
        except Exception:
            return False

    def views(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
        return tuple(self.buffers[name].view(shape) for name in "qkvo")

    def arm(self, request: dict) -> None:
        """The next timed call's views of the buffers, made before its "go" (no reply: the
        harness waits for nothing outside a timed call's clock). A shape the buffers cannot
        hold is go's error."""
        try:
            shape = tuple(request["shape"])
            self.armed = (shape, self.views(shape))
        except (KeyError, TypeError, ValueError) as e:
            self.armed = e

    def go(self, n: int) -> dict:
        """The armed call, timed: nothing between the request and the reply but the call itself
        (no memory statistics, its events made in advance, its reply encoded while the GPU works
        and written as soon as the device is synchronized); what this process measured about
        itself is sent in a second line after the reply (diagnostics)."""
        armed, self.armed = self.armed, None
        if armed is None:
            raise RuntimeError("the grader sent go with no call armed")
        if isinstance(armed, Exception):
            raise armed
        shape, views = armed
        return self.call(dict(shape=list(shape), n=n), views)

    def call(self, request: dict, armed: tuple[torch.Tensor, ...] | None = None) -> dict:
        """One call on the shared buffers: an untimed one ("call"), or the armed timed one,
        which replies itself."""
        shape, timed = tuple(request["shape"]), armed is not None
        q, k, v, o = armed or self.views(shape)
        if self.device == "cuda" and not timed:
            torch.cuda.reset_peak_memory_stats()
        received = time.perf_counter()
        profiler = None
        if request.get("profile"):
            from torch.profiler import profile
            profiler = profile(activities=call_activities(self.device))
            profiler.__enter__()
        events = self.events
        if self.device != "cuda" and "tilelang" in sys.modules and self.tilelang_nvcc is None:
            self.tilelang_nvcc = tilelang_without_gpu()
        not_run = ""   # why the call stopped short of a launch (TileLang without a GPU)
        try:
            if events:
                events[0].record()
            try:
                out = self.fn(q, k, v)
            except NotRunHere as compiled:
                arch = os.environ.get(TILELANG_TARGET_ENV, "")
                not_run = (f"not run: TileLang lowered {compiled} to CUDA and nvcc compiled it for "
                           f"{_arch(arch)}; there is no GPU here to launch it, so nothing about "
                           f"its results is known")
            except Exception:
                if self.tilelang_nvcc != "":
                    raise
                not_run = ("not compiled, not run: TileLang compiles with nvcc, which this machine "
                           "lacks, and there is no GPU; nothing about the kernel is known")
            if not not_run:
                if events:
                    events[1].record()
                returned = describe(out, shape)
                if returned["usable"]:
                    o.copy_(out)
                if events:
                    events[2].record()
                if timed:
                    done = (json.dumps(dict(event="done", returned=returned, n=request["n"]))
                            + "\n").encode()
                self.synchronize()
                synced = replied = time.perf_counter()
                if timed:
                    self.send(done)
                    replied = time.perf_counter()
        finally:
            if profiler is not None:
                profiler.__exit__(None, None, None)
        if not_run:   # with what ran before the launch: a library call there is flagged
            return dict(event="not_run", message=not_run,
                        launched=launched_names(profiler, self.device) if profiler else [])
        self.clocks = (self.t_line, received, synced, replied)
        if timed:
            return dict(event="done", returned=returned)
        peak = torch.cuda.max_memory_allocated() if self.device == "cuda" else 0
        return dict(event="done", returned=returned, peak_memory_bytes=peak,
                    launched=launched_names(profiler, self.device) if profiler else [],
                    **self.diagnostics())

    def diagnostics(self) -> dict:
        """Diagnostics only, never used to rank: this process's own clocks around the last call
        (its CUDA events around the call and around the copy into O; the host clock when the
        request line arrived, when it was taken up and when the work was done). The protocol's
        overhead is measured with them (bench/timing_trust.py, bench/protocol_probe.py)."""
        line, received, synced, replied = self.clocks
        return dict(subject_ms=(synced - received) * 1e3, subject_gpu_ms=_elapsed_ms(self.events[:2]),
                    subject_copy_ms=_elapsed_ms(self.events[1:]), t_line=line,
                    t_received=received, t_synced=synced, t_replied=replied)

    def profile(self, on: bool) -> dict:
        from torch.profiler import ProfilerActivity, profile
        if on:
            activities = [ProfilerActivity.CUDA] if self.device == "cuda" else [ProfilerActivity.CPU]
            self.profiler = profile(activities=activities, acc_events=True)
            self.profiler.__enter__()
            return dict(event="profile", on=True)
        kernels = []
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)
            kernels = launched_names(self.profiler, self.device)
            self.profiler = None
        return dict(event="profile", on=False, kernels=kernels)

    def lines(self):
        """Requests, one line each. On a GPU they are polled, not waited for: waking from a sleep
        costs a few hundred microseconds on a virtual machine, and every timed call pays it."""
        if self.device != "cuda":
            yield from self.requests
            return
        fd, pending = self.requests.fileno(), b""
        os.set_blocking(fd, False)
        while True:
            line, sep, rest = pending.partition(b"\n")
            if sep:
                pending = rest
                self.t_line = time.perf_counter()
                yield line.decode()
                continue
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                return
            pending += chunk

    def serve(self) -> None:
        for line in self.lines():
            request = json.loads(line)
            op, n = request["op"], request.get("n")
            if op == "exit":
                return
            if op == "ping":
                self.reply(dict(event="pong", n=n))
                continue
            if op == "profile":
                self.reply(dict(self.profile(request["on"]), n=n))
                continue
            if op == "arm":
                self.arm(request)
                continue
            try:
                record = self.go(n) if op == "go" else self.call(request)
            except Exception as e:   # the submission's fault: reported, then the next request
                self.reply(dict(event="error", context_alive=self.context_alive(),
                                **_error(e, self.folder), n=n))
                continue
            if op == "go" and record.get("event") == "done":   # its reply is written: Subject.call
                self.reply(dict(event="diagnostics", n=n, **self.diagnostics()))   # outside the clock
            else:
                self.reply(dict(record, n=n))


def _mentions_tilelang(source: str) -> bool:
    try:
        return any("tilelang" in path.read_text(errors="replace")
                   for path in Path(source).parent.glob("*.py"))
    except OSError:
        return False


def _arch(target: str) -> str:
    try:
        return json.loads(target).get("arch", "the course GPU")
    except (ValueError, AttributeError):
        return "the course GPU"


def _elapsed_ms(events: list) -> float | None:
    """The events' interval, or None when there are none or the work is not finished (a call
    that returned early): a diagnostic must never turn into the call's error."""
    try:
        return events[0].elapsed_time(events[1]) if events and events[1].query() else None
    except RuntimeError:
        return None


def describe(out, shape: tuple[int, ...]) -> dict:
    """What the call returned, and whether it can be copied into O (a tensor of Q's shape)."""
    if not isinstance(out, torch.Tensor):
        return dict(usable=False, type=type(out).__name__)
    return dict(usable=tuple(out.shape) == shape, type="Tensor", shape=list(out.shape),
                dtype=str(out.dtype).removeprefix("torch."), device=str(out.device))


def prepare(subject: Subject) -> None:
    """A subject started before its turn (issue 13: pipeline.Lookahead). Before any submission
    code is loaded: start the profiler once with nothing to see (its first start in a process
    costs seconds, CUPTI's: 5.5 s on an H100, bench/run_stage_probe.json), say "prepared", and
    wait, blocked and not polling, for "load", and say "loading" (the harness then knows that a
    death from here on is the submission's). Anything else, or the pipe's end: exit."""
    from torch.profiler import profile
    with profile(activities=call_activities(subject.device)):
        pass
    subject.reply(dict(event="prepared"))
    if read_line(subject.requests.fileno(), limit=64) != "load":
        sys.stdout.flush()
        os._exit(0)
    subject.reply(dict(event="loading"))   # from here on, what happens is the submission's


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="grader/subject/loop.py")
    p.add_argument("--setup", help="JSON from the harness: device, pipes, buffers, target")
    p.add_argument("--check-load", help="JSON target: load it, report, exit (the build stage)")
    a = p.parse_args(argv)
    if a.check_load:
        target = json.loads(a.check_load)
        try:
            load(target)
        except LoadError as e:   # the grader's own finding: no traceback through grader code
            print(f"LoadError: {e}")
            sys.exit(1)
        except BaseException as e:   # the submission's own error while importing: where it is
            sys.stdout.flush()
            print(student_traceback(e, submission_folder(target)), end="", file=sys.stderr)
            sys.stderr.flush()
            os._exit(1)
        print(f"imported {target.get('source')}: {PY_ENTRY_POINT} found")
        sys.stdout.flush()
        os._exit(0)
    setup = json.loads(a.setup)
    subject = Subject(setup)   # maps the shared buffers: CUDA starts here
    if setup.get("prepare"):
        prepare(subject)
    if setup["target"].get("kind") == "python":   # before the submission imports TileLang
        os.environ.update(TILELANG_NO_DISK_CACHE)
    if setup["target"].get("kind") in ("cuda", "python"):
        without_cudnn_attention()
    if setup["device"] != "cuda":
        from grader import config
        os.environ[TILELANG_TARGET_ENV] = json.dumps(
            {"kind": "cuda", "arch": f"sm_{config.DEFAULT_CUDA_ARCH}"})
        if setup["target"].get("kind") == "python" and _mentions_tilelang(setup["target"]["source"]):
            try:
                subject.tilelang_nvcc = tilelang_without_gpu()
            except ImportError:   # not installed: the submission's own import says so
                pass
    try:
        subject.fn = load(setup["target"])
    except BaseException as e:   # SystemExit and KeyboardInterrupt from a submission included
        subject.reply(dict(event="load_error", **_error(e, subject.folder)))
        sys.stdout.flush()
        os._exit(0)
    subject.reply(dict(event="ready"))
    subject.serve()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: a broken extension can crash in its destructors after the work.
    os._exit(0)


if __name__ == "__main__":
    main()
