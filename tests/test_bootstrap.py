"""scripts/bootstrap.sh (issue 32): set-up prints a line per step and nothing of pip's or of the
interpreters it starts; all of that goes to its log.

The machine here is made to warn about everything: a base Python whose pip is a stand-in that
prints pip's warnings on both streams and "installs" stub packages, venvs holding a .pth file
that fails at every start of their interpreter, and a torch that warns when it is imported."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from grader.common import config

# What pip and the interpreters say on this machine; none of it may reach the terminal.
NOISE = ("WARNING: Ignoring invalid distribution", "is ignored: it is either a non-existing path",
         "Error processing line", "_no_such_module", "Failed to initialize NumPy", "Traceback")

FAKE_PIP = textwrap.dedent('''\
    """pip as a machine with broken package folders runs it: warnings on both streams; `install`
    writes a stub package and its metadata for each requirement into --python's site-packages."""
    import re, subprocess, sys
    from pathlib import Path

    for stream in (sys.stdout, sys.stderr):
        print("WARNING: Ignoring invalid distribution ~orch (/usr/lib/python3/site-packages)", file=stream)
        print("WARNING: Location '/nowhere' is ignored: it is either a non-existing path or lacks a "
              "specific scheme.", file=stream)
    args = sys.argv[1:]
    python = args[args.index("--python") + 1] if "--python" in args else sys.executable
    if "install" not in args:
        sys.exit(0 if "--version" in args else 1)
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    with_value = {"--python", "--index-url", "--find-links", "--retries", "--timeout", "-d"}
    specs = [a for i, a in enumerate(args[args.index("install") + 1:], args.index("install") + 1)
             if not a.startswith("-") and args[i - 1] not in with_value]
    if "torch==0.0" in specs:
        print("ERROR: No matching distribution found for torch==0.0", file=sys.stderr)
        sys.exit(1)
    for spec in specs:
        name = re.split(r"[<>=!~ \\[]", spec, maxsplit=1)[0]
        version = spec.split("==")[1] if "==" in spec else "1.0"
        module = {"import-linter": "importlinter"}.get(name, name.replace("-", "_"))
        (site / module).mkdir(exist_ok=True)
        init = "def zeros(n):\\n    return [0] * n\\n"
        if name == "torch":
            init = ("import sys\\nprint('UserWarning: Failed to initialize NumPy', file=sys.stderr)\\n"
                    f"__version__ = {version!r}\\nclass version:\\n    cuda = None\\n"
                    "def from_numpy(a):\\n    return a\\n")
        (site / module / "__init__.py").write_text(init)
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\\nName: {name}\\nVersion: {version}\\n")
        print(f"Successfully installed {name}-{version}")
    ''')

BASE_PYTHON = textwrap.dedent('''\
    #!/bin/sh
    # python3, but its pip is the stand-in, and a venv it makes holds a .pth that fails at every start.
    if [ "$1" = -m ] && [ "$2" = pip ]; then shift 2; exec {real} {pip} "$@"; fi
    if [ "$1" = -m ] && [ "$2" = venv ]; then
        {real} -m venv --without-pip "$3" || exit 1
        site=$("$3/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        echo "import _no_such_module" > "$site/broken.pth"
        exit 0
    fi
    exec {real} "$@"
    ''')


def _set_up(tmp_path: Path, **knobs: str) -> tuple[subprocess.CompletedProcess, Path]:
    """scripts/bootstrap.sh run in a copy of the kit, on the warning machine."""
    kit = tmp_path / "kit"
    (kit / "scripts").mkdir(parents=True)
    shutil.copy(config.REPO_ROOT / "scripts" / "bootstrap.sh", kit / "scripts")
    shutil.copy(config.REPO_ROOT / "pyproject.toml", kit)
    (tmp_path / "fake_pip.py").write_text(FAKE_PIP)
    real = getattr(sys, "_base_executable", sys.executable)
    base = tmp_path / "python3"
    base.write_text(BASE_PYTHON.format(real=real, pip=tmp_path / "fake_pip.py"))
    base.chmod(0o755)
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "cusparse.h").write_text("")   # no header fetch: nvcc may be here
    env = {**os.environ, "BASE_PYTHON": str(base), "TORCH_INDEX": "pip", "WITH_TRITON": "1",
           "WITH_TILELANG": "0", "WITH_BROWSER": "0", "GRADER_CUDA_INCLUDE": str(tmp_path / "include"),
           **knobs}
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run(["sh", "scripts/bootstrap.sh"], cwd=kit, env=env, capture_output=True,
                          text=True, timeout=120), kit


def test_set_up_prints_its_steps_and_nothing_of_pip_s(tmp_path):
    proc, kit = _set_up(tmp_path)
    shown = proc.stdout + proc.stderr
    assert proc.returncode == 0, shown
    leaked = [line for line in shown.splitlines() if any(n in line for n in NOISE)]
    assert not leaked, "\n".join(leaked)
    assert all(line.startswith("bootstrap: ") for line in shown.splitlines()), shown
    steps = proc.stdout.splitlines()
    assert steps[0].startswith("bootstrap: creating .venv with Python ")
    assert "bootstrap: installing torch==2.13.0" in steps
    assert any(s.startswith("bootstrap: Triton 1.0 installed") for s in steps)
    assert steps[-1].startswith("bootstrap: ready in ") and "torch 2.13.0, CUDA none" in steps[-1]
    log = (kit / ".venv" / "setup.log").read_text()
    for noise in NOISE[:4]:   # all of it went to the log
        assert noise in log, noise
    assert (kit / ".venv" / ".ready").is_file()


def test_a_step_that_fails_shows_the_log_s_tail(tmp_path):
    proc, kit = _set_up(tmp_path, TORCH_SPEC="torch==0.0")   # the stand-in has no such torch
    assert proc.returncode == 1 and proc.stdout.splitlines()[-1] == "bootstrap: installing torch==0.0"
    said = proc.stderr.splitlines()
    assert said[0] == ("bootstrap: pip install failed, so set-up stopped; the set-up's output is in "
                       ".venv/setup.log, whose last lines are:"), proc.stderr
    assert "    ERROR: No matching distribution found for torch==0.0" in said
    assert not (kit / ".venv" / ".ready").exists()
