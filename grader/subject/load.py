"""Loading what the subject calls: a submission's built CUDA extension, a Python submission
(its .py sources only, never a bytecode cache or an extension module beside them), or a grader
baseline, by path from grader/problem/attention/baseline_kernels.py. Runs inside the subject."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

from grader.subject.tracebacks import GRADER_CODE


ENTRY_POINT = "flash_attention_forward"   # CUDA submissions (CS149)
PY_ENTRY_POINT = "custom_kernel"          # Python submissions (GPU MODE)


class LoadError(Exception):
    """The submission could not be loaded: the message is for the student."""


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
    """Compiles the source file the grader audited (grader/trusted/audit/reach.py), never a bytecode cache
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
    path = GRADER_CODE / "problem" / "attention" / "baseline_kernels.py"   # grader.problem.BASELINE_KERNELS
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
