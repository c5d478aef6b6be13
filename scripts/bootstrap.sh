#!/bin/sh
# Make .venv/bin/python able to run the grader, on a fresh machine or one with torch already.
#
#  - A torch that is already installed (the GPU machine's CUDA build) is reused: .venv sees the
#    site-packages of the interpreter that has it through a .pth file, and nothing is reinstalled.
#  - Otherwise $TORCH_SPEC (torch==2.13.0 by default: the CPU build this course's CPU machines
#    have a local wheel of) is installed.
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
VENV=.venv
STAMP=${STAMP:-$VENV/.ready}
for knob in "WITH_TRITON=$WITH_TRITON" "WITH_TILELANG=$WITH_TILELANG" "WITH_BROWSER=$WITH_BROWSER"; do
    case "${knob#*=}" in auto|0|1) ;; *) echo "bootstrap: $knob: use auto, 1 or 0" >&2; exit 2 ;; esac
done
rm -f "$VENV"/.ready "$VENV"/.ready-*   # set-up is not done until it is done
PIP_SRC=""
[ -d .whl ] && PIP_SRC="--no-index --find-links .whl"

if [ ! -x "$VENV/bin/python" ]; then
    echo "bootstrap: creating $VENV with $($BASE_PYTHON --version)"
    # An interpreter without ensurepip (Debian without python3-venv) still makes a venv
    # without pip; the base interpreter's pip then installs into it.
    "$BASE_PYTHON" -m venv "$VENV" 2>/dev/null || { rm -rf "$VENV"; "$BASE_PYTHON" -m venv --without-pip "$VENV"; }
fi
PY="$VENV/bin/python"
if "$PY" -m pip --version >/dev/null 2>&1; then PIP="$PY -m pip"; else PIP="$BASE_PYTHON -m pip --python $PY"; fi

# Reuse the base interpreter's packages (torch above all) when it has torch.
SITE_PTH_MARK=/nonexistent
if "$BASE_PYTHON" -c "import torch" 2>/dev/null; then
    SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    # 'import' lines in a .pth run at start-up; addsitedir also honours that folder's own .pth files.
    "$BASE_PYTHON" -c "import site, sysconfig; dirs = dict.fromkeys(
        [sysconfig.get_paths()['purelib'], sysconfig.get_paths()['platlib']] + site.getsitepackages())
print('import site; ' + '; '.join(f'site.addsitedir({d!r})' for d in dirs))" > "$SITE/_base_site.pth"
    SITE_PTH_MARK="$SITE/_base_site.pth"
    echo "bootstrap: reusing torch from $BASE_PYTHON"
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
if [ ! -f "$SITE_PTH_MARK" ] && ! torch_ok; then
    echo "bootstrap: installing $TORCH_SPEC"
    $PIP install -q $PIP_SRC "$TORCH_SPEC"
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
    echo "bootstrap: installing $MISSING"
    $PIP install -q $PIP_SRC $MISSING
fi

# extra NAME KNOB WHY: install pyproject's optional dependencies NAME; with KNOB=auto a machine
# that cannot (no wheel for it, no network) is told what it lacks, and set-up goes on.
extra() {
    SPECS=$("$PY" -c "import sys, tomllib; print(' '.join(tomllib.load(open('pyproject.toml','rb'))['project']['optional-dependencies'][sys.argv[1]]))" "$1")
    echo "bootstrap: installing $SPECS ($3)"
    if ! $PIP install -q $PIP_SRC $SPECS; then
        if [ "$2" = 1 ]; then
            echo "bootstrap: $SPECS could not be installed, and it is required here" >&2
            exit 1
        fi
        echo "bootstrap: WARNING: $SPECS could not be installed on this machine; $4" >&2
    fi
}
# Triton: the bundled Triton example and Triton submissions; without a GPU through its interpreter.
if [ "$WITH_TRITON" != 0 ] && ! "$PY" -c "import triton" 2>/dev/null; then
    extra triton "$WITH_TRITON" "Triton submissions run on its CPU interpreter without a GPU" \
        "Triton submissions get environment_error (not graded) here"
fi
# TileLang: the bundled TileLang example and TileLang submissions. It has no CPU interpreter:
# without a GPU its kernels are lowered and compiled for the course GPU (nvcc), not run.
if [ "$WITH_TILELANG" != 0 ] && ! "$PY" -c "import tilelang" 2>/dev/null; then
    extra tilelang "$WITH_TILELANG" "TileLang submissions; without a GPU they are compiled, not run" \
        "TileLang submissions get environment_error (not graded) here"
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
    echo "bootstrap: installing $CUTE_SPEC (CUTLASS/CuTe headers for the CuTe track)"
    $PIP install -q --no-deps $PIP_SRC $CUTE_SPEC \
        || echo "bootstrap: WARNING: $CUTE_SPEC could not be installed on this machine; CuTe submissions get environment_error (not graded) here" >&2
fi
# Playwright: drives the system's chromium in the browser test of the page.
if [ "$WITH_BROWSER" = 1 ] || { [ "$WITH_BROWSER" = auto ] && { command -v chromium || command -v chromium-browser; } >/dev/null 2>&1; }; then
    if ! "$PY" -c "import playwright" 2>/dev/null; then
        extra browser "$WITH_BROWSER" "the browser test drives the system chromium" \
            "the browser test of the page is skipped"
    fi
fi

# Headers for compile checks when torch has no CUDA.
if "$PY" -c "import torch, sys; sys.exit(0 if torch.version.cuda is None else 1)" && command -v nvcc >/dev/null; then
    CUDA_INC="$(dirname "$(dirname "$(command -v nvcc)")")/include"
    if [ ! -f "$CUDA_INC/cusparse.h" ] && [ ! -f "$VENV/cuda-include/cusparse.h" ] \
       && [ ! -f "${GRADER_CUDA_INCLUDE:-/nonexistent}/cusparse.h" ]; then
        echo "bootstrap: fetching cuBLAS/cuSPARSE/cuSOLVER headers for compile checks"
        TMP=$(mktemp -d)
        $PIP download -q --no-deps $PIP_SRC -d "$TMP" nvidia-cublas nvidia-cusparse nvidia-cusolver
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
if ! "$PY" -c "import numpy, torch; torch.from_numpy(numpy.zeros(1))" >/dev/null 2>&1; then
    echo "bootstrap: WARNING: numpy does not work with this torch here; install the version" \
         "pyproject.toml names: $PIP install 'numpy<2.4'" >&2
fi
if [ "$WITH_TRITON" != 0 ] && "$PY" -c "import triton" 2>/dev/null; then
    echo "bootstrap: Triton $("$PY" -c 'import triton; print(triton.__version__)') installed:" \
         "Triton submissions run on its interpreter where there is no GPU (TRITON_INTERPRET=1)"
fi
if [ "$WITH_TILELANG" != 0 ] && "$PY" -c "import tilelang" 2>/dev/null; then
    echo "bootstrap: TileLang $("$PY" -c 'import tilelang; print(tilelang.__version__)' 2>/dev/null) installed:" \
         "where there is no GPU, TileLang submissions are compiled for the course GPU (nvcc), not run"
fi
printf '%s\n' "${KNOBS:-base=$BASE_PYTHON torch=$TORCH_SPEC triton=$WITH_TRITON tilelang=$WITH_TILELANG browser=$WITH_BROWSER}" > "$STAMP"
echo "bootstrap: ready ($("$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'))"
