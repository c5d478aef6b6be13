#!/bin/sh
# Make .venv/bin/python able to run the grader, on a fresh machine or one with torch already.
#
#  - A torch that is already installed (the GPU machine's CUDA build) is reused: .venv sees the
#    site-packages of the interpreter that has it through a .pth file, and nothing is reinstalled.
#  - Otherwise $TORCH_SPEC (torch==2.13.0 by default: the CPU build this course's CPU machines
#    have a local wheel of) is installed. TORCH_INDEX=auto (default): on Linux without an NVIDIA
#    GPU, from PyTorch's CPU index (CPU_TORCH_INDEX): its CPU build, about 200 MB, where PyPI's
#    Linux torch brings about 3 GB of CUDA libraries that need a GPU (and PyPI's, if that index
#    cannot be reached); with a GPU, or elsewhere, from pip's own index. TORCH_INDEX=URL: that
#    index; TORCH_INDEX=pip: pip's own.
#  - The terminal shows a line per step, this script's own. Everything the commands it runs print
#    goes to $SETUP_LOG (default .venv/setup.log, this set-up's only): pip's warnings, progress
#    and resolver notes, and what an interpreter says as it starts (a .pth file of a reused
#    site-packages that fails, a torch that warns as it is imported). A step that fails names the
#    log and shows its last lines.
#  - Missing packages come from PyPI, or only from ./.whl when that folder exists (offline
#    machines: carry pytest_json_report and pytest_metadata wheels there).
#  - Everything the bundled examples and tests need is installed by default: numpy (a
#    dependency), Triton where a wheel exists for this machine (its interpreter runs Triton
#    submissions on a CPU: TRITON_INTERPRET=1), Playwright where a chromium is installed (the
#    browser test of the page), TileLang where a wheel exists (Linux, Python >= 3.10; without a GPU
#    it compiles TileLang submissions for the course GPU with nvcc and does not run them).
#    WITH_TRITON / WITH_TILELANG / WITH_BROWSER: auto (default), 1 (required: fail without it),
#    0 (not installed). Offline, TileLang needs these wheels in ./.whl (for the machine's Python):
#    tilelang, apache-tvm-ffi, torch-c-dlpack-ext, z3-solver, ml-dtypes, cloudpickle, psutil, tqdm.
#  - The stamp ($STAMP, default .venv/.ready; the Makefile names it after the knobs' values) is
#    written last, with the knobs in it: a failed or interrupted set-up leaves none.
#  - Without a CUDA build of torch, nvcc compile checks need the cuBLAS/cuSPARSE/cuSOLVER
#    headers that <ATen/cuda/CUDAContext.h> includes; they are extracted from NVIDIA's wheels
#    into .venv/cuda-include when the local CUDA install lacks them.
set -eu
cd "$(dirname "$0")/.."
BASE_PYTHON=${BASE_PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
WITH_TRITON=${WITH_TRITON:-auto}
WITH_TILELANG=${WITH_TILELANG:-auto}
WITH_BROWSER=${WITH_BROWSER:-auto}
TORCH_INDEX=${TORCH_INDEX:-auto}
CPU_TORCH_INDEX=https://download.pytorch.org/whl/cpu
VENV=.venv
STAMP=${STAMP:-$VENV/.ready}
SETUP_LOG=${SETUP_LOG:-$VENV/setup.log}
STARTED=$(date +%s)
for knob in "WITH_TRITON=$WITH_TRITON" "WITH_TILELANG=$WITH_TILELANG" "WITH_BROWSER=$WITH_BROWSER"; do
    case "${knob#*=}" in auto|0|1) ;; *) echo "bootstrap: $knob: use auto, 1 or 0" >&2; exit 2 ;; esac
done
rm -f "$VENV"/.ready "$VENV"/.ready-*   # set-up is not done until it is done
PIP_SRC=""
[ -d .whl ] && PIP_SRC="--no-index --find-links .whl"
mkdir -p "$VENV" "$(dirname "$SETUP_LOG")"
: > "$SETUP_LOG"
# From here on every command's output goes to the log (issue 32: pip's warnings about ignored
# locations and invalid distributions, 41 lines on an instructor's fresh machine, and a .pth
# file's traceback at each of a dozen probes' start); this script's own lines reach the terminal
# through say (stdout) and warn (stderr) only.
exec 3>&1 4>&2 >>"$SETUP_LOG" 2>&1
say() { echo "bootstrap: $*" >&3; }
warn() { echo "bootstrap: $*" >&4; }

# log_tail WHY: a failed step, said on stderr with the log's last lines.
log_tail() {
    warn "$1; the set-up's output is in $SETUP_LOG, whose last lines are:"
    tail -n 25 "$SETUP_LOG" | sed 's/^/    /' >&4
}
# pip_logged ARGS...: pip, into the log (its status is the caller's to judge).
pip_logged() {
    echo "=== $(date '+%H:%M:%S') pip $*"
    $PIP "$@" --disable-pip-version-check --no-input --progress-bar off
}
# pip_or_stop ARGS...: pip_logged; when it fails, set-up stops with the log's tail.
pip_or_stop() {
    pip_logged "$@" || { log_tail "pip $1 failed, so set-up stopped"; exit 1; }
}
# last_error: pip's last ERROR line, for a one-line warning.
last_error() {
    grep '^ERROR' "$SETUP_LOG" | tail -n 1 | cut -c1-200
}

if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV with $("$BASE_PYTHON" --version 2>&1); pip's output goes to $SETUP_LOG"
    # An interpreter without ensurepip (Debian without python3-venv) still makes a venv
    # without pip; the base interpreter's pip then installs into it.
    "$BASE_PYTHON" -m venv "$VENV" || "$BASE_PYTHON" -m venv --without-pip "$VENV" \
        || { log_tail "$BASE_PYTHON could not create $VENV"; exit 1; }
else
    say "bringing $VENV up to date (a knob or pyproject.toml changed, or a set-up did not" \
        "finish); pip's output goes to $SETUP_LOG"
fi
PY="$VENV/bin/python"
if "$PY" -m pip --version >/dev/null 2>&1; then PIP="$PY -m pip"; else PIP="$BASE_PYTHON -m pip --python $PY"; fi
# has PYTHON MODULE: whether MODULE is there, without importing it (torch and TileLang take many
# seconds to import on a busy machine; set-up imports torch once, at its end).
has() {
    "$1" -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else 1)" "$2" 2>/dev/null
}
# version DIST: an installed distribution's version, from its metadata.
version() {
    "$PY" -c "import importlib.metadata as md, sys; print(md.version(sys.argv[1]))" "$1" 2>/dev/null
}

# Reuse the base interpreter's packages (torch above all) when it has torch.
SITE_PTH_MARK=/nonexistent
if has "$BASE_PYTHON" torch; then
    SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    # 'import' lines in a .pth run at start-up; addsitedir also honours that folder's own .pth files.
    "$BASE_PYTHON" -c "import site, sysconfig; dirs = dict.fromkeys(
        [sysconfig.get_paths()['purelib'], sysconfig.get_paths()['platlib']] + site.getsitepackages())
print('import site; ' + '; '.join(f'site.addsitedir({d!r})' for d in dirs))" > "$SITE/_base_site.pth"
    SITE_PTH_MARK="$SITE/_base_site.pth"
    say "reusing torch $(version torch) from $BASE_PYTHON"
fi

# The venv's own torch (not a reused one) must satisfy $TORCH_SPEC: a changed knob reinstalls it.
torch_ok() {
    "$PY" - "$TORCH_SPEC" <<'PYEOF'
import importlib.metadata as md, sys
try:
    import torch  # noqa: F401
except ImportError:
    sys.exit(1)
try:
    from pip._vendor.packaging.requirements import Requirement
    req = Requirement(sys.argv[1])
    sys.exit(0 if req.specifier.contains(md.version(req.name), prereleases=True) else 1)
except Exception:   # no pip in the venv, or a spec that is a path or URL: an importable torch will do
    sys.exit(0)
PYEOF
}
# Where torch comes from (TORCH_INDEX): a machine without an NVIDIA GPU gets the CPU build.
torch_index() {
    case "$TORCH_INDEX" in
        pip) ;;
        auto) if [ -z "$PIP_SRC" ] && [ "$(uname -s)" = Linux ] \
                 && ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
                  echo "$CPU_TORCH_INDEX"
              fi ;;
        *) echo "$TORCH_INDEX" ;;
    esac
}
if [ ! -f "$SITE_PTH_MARK" ] && ! torch_ok; then
    INDEX=$(torch_index)
    if [ -n "$INDEX" ]; then
        why=""
        [ "$INDEX" = "$CPU_TORCH_INDEX" ] && why=" (no NVIDIA GPU here: the CPU build)"
        say "installing $TORCH_SPEC from $INDEX$why"
        # few retries: an index that cannot be reached falls back to pip's own soon
        if ! pip_logged install --index-url "$INDEX" --retries 1 --timeout 30 "$TORCH_SPEC"; then
            say "$INDEX did not give $TORCH_SPEC ($(last_error)); installing it from pip's own index"
            pip_or_stop install $PIP_SRC "$TORCH_SPEC"
        fi
    else
        say "installing $TORCH_SPEC"
        pip_or_stop install $PIP_SRC "$TORCH_SPEC"
    fi
fi

# The rest of pyproject's dependencies, whatever is missing (pip leaves satisfied ones alone).
DEPS=$("$PY" -c "import tomllib; print(' '.join(d for d in tomllib.load(open('pyproject.toml','rb'))['project']['dependencies'] if not d.startswith('torch')))" 2>/dev/null \
       || echo "pytest pytest-json-report jinja2 ninja rich numpy<2.4")
MISSING=$("$PY" - $DEPS <<'PYEOF'
import importlib.metadata as md, re, sys
names = [re.split(r"[<>=!~ \[]", d, maxsplit=1)[0] for d in sys.argv[1:]]
missing = []
for dep, name in zip(sys.argv[1:], names):
    try:
        md.version(name)
    except md.PackageNotFoundError:
        missing.append(dep)
print(" ".join(missing))
PYEOF
)
if [ -n "$MISSING" ]; then
    say "installing $MISSING"
    pip_or_stop install $PIP_SRC $MISSING
fi

# extra NAME KNOB WHY: install pyproject's optional dependencies NAME; with KNOB=auto a machine
# that cannot (no wheel for it, no network) is told what it lacks, and set-up goes on.
extra() {
    SPECS=$("$PY" -c "import sys, tomllib; print(' '.join(tomllib.load(open('pyproject.toml','rb'))['project']['optional-dependencies'][sys.argv[1]]))" "$1")
    say "installing $SPECS ($3)"
    if ! pip_logged install $PIP_SRC $SPECS; then
        if [ "$2" = 1 ]; then
            log_tail "$SPECS could not be installed, and it is required here"
            exit 1
        fi
        warn "WARNING: $SPECS could not be installed on this machine ($(last_error);" \
             "pip's output: $SETUP_LOG); $4"
    fi
}
# Triton: the bundled Triton example and Triton submissions; without a GPU through its interpreter.
if [ "$WITH_TRITON" != 0 ] && ! has "$PY" triton; then
    extra triton "$WITH_TRITON" "Triton submissions run on its CPU interpreter without a GPU" \
        "Triton submissions get environment_error (not graded) here"
fi
# TileLang: the bundled TileLang example and TileLang submissions. It has no CPU interpreter:
# without a GPU its kernels are lowered and compiled for the course GPU (nvcc), not run.
if [ "$WITH_TILELANG" != 0 ] && ! has "$PY" tilelang; then
    extra tilelang "$WITH_TILELANG" "TileLang submissions; without a GPU they are compiled, not run" \
        "TileLang submissions get environment_error (not graded) here"
fi
# import-linter: `make lint` checks the grader's import contracts (pyproject.toml). Wanted where
# `make test` runs; a machine that cannot get it (offline) is told so, and only `make lint` stops.
if ! has "$PY" importlinter; then
    extra lint auto "make lint checks the grader's layers" "make lint (part of make test) cannot run here"
fi
# The course check service (issue 33, grader/service/): wanted where it runs and where `make test`
# drives it over HTTP; a machine that cannot get it is told so, and only the service's tests skip.
if ! has "$PY" starlette || ! has "$PY" uvicorn || ! has "$PY" python_multipart; then
    extra service auto "the course check service" "the course check service cannot run here"
fi
# CUTLASS/CuTe headers (the CuTe track): pyproject's `cute` extra, the nvidia-cutlass wheel, with
# --no-deps: the grader reads only the headers it ships, never its Python package. Wanted on every
# machine; one that cannot get it (offline without it in ./.whl) is told so, and CuTe submissions
# then get environment_error there. A pin that changes in pyproject reinstalls it.
CUTE_SPEC=$("$PY" -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml','rb'))['project']['optional-dependencies']['cute']))")
if ! "$PY" - $CUTE_SPEC <<'PYEOF'
import importlib.metadata as md, re, sys
try:
    installed = md.version(re.split(r"[<>=!~ ]", sys.argv[1], maxsplit=1)[0])
except md.PackageNotFoundError:
    sys.exit(1)
try:   # the pin, as pip reads it; a venv without pip: any installed version will do
    from pip._vendor.packaging.requirements import Requirement
except ImportError:
    sys.exit(0)
sys.exit(0 if Requirement(sys.argv[1]).specifier.contains(installed, prereleases=True) else 1)
PYEOF
then
    say "installing $CUTE_SPEC (CUTLASS/CuTe headers for the CuTe track)"
    pip_logged install --no-deps $PIP_SRC $CUTE_SPEC \
        || warn "WARNING: $CUTE_SPEC could not be installed on this machine ($(last_error);" \
                "pip's output: $SETUP_LOG); CuTe submissions get environment_error (not graded) here"
fi
# Playwright: drives the system's chromium in the browser test of the page.
if [ "$WITH_BROWSER" = 1 ] || { [ "$WITH_BROWSER" = auto ] && { command -v chromium || command -v chromium-browser; } >/dev/null 2>&1; }; then
    if ! has "$PY" playwright; then
        extra browser "$WITH_BROWSER" "the browser test drives the system chromium" \
            "the browser test of the page is skipped"
    fi
fi

# One import of torch (seconds on a busy machine) answers the rest: its version, its CUDA, and
# whether numpy works with it ("version cuda numpy_ok").
if ! PROBE=$("$PY" - <<'PYEOF'
import torch
try:
    import numpy
    torch.from_numpy(numpy.zeros(1))
    numpy_ok = 1
except Exception:
    numpy_ok = 0
print(torch.__version__, torch.version.cuda or "none", numpy_ok)
PYEOF
); then
    log_tail "torch does not import in $VENV, so set-up stopped"
    exit 1
fi
set -- $(printf '%s\n' "$PROBE" | tail -n 1) none none 0   # its last line; stdout could hold more
TORCH_VERSION=$1 TORCH_CUDA=$2 NUMPY_OK=$3

# Headers for compile checks when torch has no CUDA.
if [ "$TORCH_CUDA" = none ] && command -v nvcc >/dev/null; then
    CUDA_INC="$(dirname "$(dirname "$(command -v nvcc)")")/include"
    if [ ! -f "$CUDA_INC/cusparse.h" ] && [ ! -f "$VENV/cuda-include/cusparse.h" ] \
       && [ ! -f "${GRADER_CUDA_INCLUDE:-/nonexistent}/cusparse.h" ]; then
        say "fetching cuBLAS/cuSPARSE/cuSOLVER headers for compile checks"
        TMP=$(mktemp -d)
        pip_or_stop download --no-deps $PIP_SRC -d "$TMP" nvidia-cublas nvidia-cusparse nvidia-cusolver
        mkdir -p "$VENV/cuda-include"
        for w in "$TMP"/*.whl; do
            "$PY" -c "import sys, zipfile, os
z = zipfile.ZipFile(sys.argv[1])
for n in z.namelist():
    if '/include/' in n and n.endswith('.h'):
        open(os.path.join(sys.argv[2], os.path.basename(n)), 'wb').write(z.read(n))" "$w" "$VENV/cuda-include"
        done
        rm -rf "$TMP"
    fi
fi
# torch without a working numpy warns on every import ("Failed to initialize NumPy") and cannot
# convert tensors to arrays, which Triton's CPU interpreter does all the time: say so here, once.
if [ "$NUMPY_OK" != 1 ]; then
    warn "WARNING: numpy does not work with this torch here; install the version" \
         "pyproject.toml names: $PIP install 'numpy<2.4'"
fi
if [ "$WITH_TRITON" != 0 ] && has "$PY" triton; then
    say "Triton $(version triton) installed:" \
         "Triton submissions run on its interpreter where there is no GPU (TRITON_INTERPRET=1)"
fi
if [ "$WITH_TILELANG" != 0 ] && has "$PY" tilelang; then
    say "TileLang $(version tilelang) installed:" \
         "where there is no GPU, TileLang submissions are compiled for the course GPU (nvcc), not run"
fi
printf '%s\n' "${KNOBS:-base=$BASE_PYTHON torch=$TORCH_SPEC triton=$WITH_TRITON tilelang=$WITH_TILELANG browser=$WITH_BROWSER}" > "$STAMP"
say "ready in $(( $(date +%s) - STARTED )) s (torch $TORCH_VERSION, CUDA $TORCH_CUDA); the set-up's log: $SETUP_LOG"
