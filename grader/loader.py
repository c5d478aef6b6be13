"""Load a submission's callable inside the process that will run it.

Every loaded callable takes (Q, K, V) and returns O, whatever the contract it came through.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from typing import Callable

from . import config


class LoadError(Exception):
    """The submission could not be loaded: message is for the student."""


def load_extension(path: str | Path, name: str) -> Callable:
    """Import a built extension module (.so) by path, as load_inline would."""
    import torch  # noqa: F401  (the extension links against libtorch)
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    if spec is None:
        raise LoadError(f"cannot load the built extension {path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    fn = getattr(module, config.ENTRY_POINT, None)
    if fn is None:
        raise LoadError(f"the extension does not export {config.ENTRY_POINT}")
    return fn


def load_python_submission(source: str | Path) -> Callable:
    """Import submission.py and return a (Q, K, V) -> O wrapper around custom_kernel(data)."""
    source = Path(source).resolve()
    sys.path.insert(0, str(source.parent))
    spec = importlib.util.spec_from_file_location("submission", str(source))
    module = importlib.util.module_from_spec(spec)
    sys.modules["submission"] = module
    spec.loader.exec_module(module)
    kernel = getattr(module, config.PY_ENTRY_POINT, None)
    if kernel is None:
        raise LoadError(f"{source.name} does not define {config.PY_ENTRY_POINT}(data); the grader "
                        f"calls {config.PY_ENTRY_POINT}((Q, K, V)) and expects O back.")
    if not callable(kernel):
        raise LoadError(f"{config.PY_ENTRY_POINT} in {source.name} is not a function.")
    return lambda q, k, v: kernel((q, k, v))


def load_baseline(name: str) -> Callable:
    from .baselines import BASELINES
    return BASELINES[name].fn
