"""Which part of Triton's cache key differs between the build's sandbox and the run's (issue 32).

    python bench/triton_key_probe.py

A Triton kernel compiled ahead in the build (grader/build/ahead.py) is found by the run only if
every part of its cache key is the same in both: the cache-invalidating environment variables,
Triton's own key, the backend's (ptxas's version), the compile options and the kernel's own
hash. Each is printed for a plain process, the build's sandbox (no GPU) and the run's (the GPU,
cuDNN hidden), as far as each differs from the plain process's.
"""
import json, os, subprocess, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHILD = r'''
import json, sys, hashlib, importlib.util
out = {}
def h(x): return hashlib.sha256(str(x).encode()).hexdigest()[:12]
try:
    from triton._C.libtriton import get_cache_invalidating_env_vars
    out["env_vars"] = get_cache_invalidating_env_vars()
except Exception as e: out["env_vars"] = repr(e)
try:
    try: from triton.runtime.cache import triton_key
    except ImportError: from triton.compiler.compiler import triton_key
    out["triton_key"] = h(triton_key())
except Exception as e: out["triton_key"] = repr(e)
try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    b = make_backend(GPUTarget("cuda", 90, 32))
    out["backend_hash"] = b.hash()
    o = b.parse_options({})
    out["options_hash"] = h(o.hash())
    out["options"] = {k: str(v)[:120] for k, v in sorted(o.__dict__.items())}
except Exception as e: out["backend"] = repr(e)
try:
    spec = importlib.util.spec_from_file_location("submission", sys.argv[1])
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    import triton
    out["fn_keys"] = {n: h(getattr(m, n).cache_key) for n in dir(m) if isinstance(getattr(m, n), triton.runtime.jit.JITFunction)}
except Exception as e: out["fn"] = repr(e)
print("KEYS " + json.dumps(out))
'''
from grader.isolation.sandbox import Sandbox, default_layout
from grader.isolation.procs import child_env
src = os.path.abspath("examples/triton_flash/submission.py")
sb = Sandbox.probe(**default_layout())
print("sandbox", sb.describe())
cmd = [sys.executable, "-c", CHILD, src]
runs = {}
env_b = child_env(cuda=True); env_b["CUDA_VISIBLE_DEVICES"] = ""; env_b.pop("TRITON_INTERPRET", None)
env_r = child_env(cuda=True)
for name, c, env in (("plain", cmd, env_r),
                     ("build", sb.without_gpus().wrap(cmd, readonly=[os.path.dirname(src)]), env_b),
                     ("run", sb.wrap(cmd, readonly=[os.path.dirname(src)], hide_libraries=True), env_r)):
    p = subprocess.run(c, env=env, capture_output=True, text=True, timeout=300, cwd=os.path.dirname(src))
    line = [l for l in p.stdout.splitlines() if l.startswith("KEYS ")]
    runs[name] = json.loads(line[-1][5:]) if line else {"error": p.stderr[-800:]}
base = runs["plain"]
for name, r in runs.items():
    print("==", name)
    for k, v in r.items():
        if name == "plain" or v != base.get(k):
            if isinstance(v, dict) and isinstance(base.get(k), dict) and name != "plain":
                v = {kk: vv for kk, vv in v.items() if base[k].get(kk) != vv}
            print("  ", k, json.dumps(v)[:600])

# ---- on a GPU: compile ahead in the build's sandbox, run in the run's, and compare what each
# wrote: the run's new key folders, and how their metadata differs from the seeded ones'.
RUN = r'''
import json, sys, torch
from grader.subject.load import load
fn = load(dict(kind="python", source=sys.argv[1]))
for shape in json.loads(sys.argv[2]):
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.float16) for _ in range(3))
    fn(q, k, v)
torch.cuda.synchronize()
print("RAN")
'''
import torch
if torch.cuda.is_available():
    import tempfile
    from pathlib import Path
    from grader.build.ahead import compile_ahead, seed_jit_folder
    from grader.common import config
    from grader.common.status import Status
    from grader.course.submission import Kind, Submission
    from grader.course.verdicts import BuildResult
    from grader.isolation.device import detect
    from grader.isolation.sandbox import give_to_sandbox
    from grader.problem import Case
    cases = [Case(1, 1, 1, 128, seed=1), Case(1, 2, 77, 64, seed=2), Case(3, 5, 113, 128, seed=3),
             Case(1, 64, 1024, 128, seed=4)]
    sub = Submission("triton_flash", Path(src).parent, Kind.PYTHON)
    with tempfile.TemporaryDirectory(prefix="keyprobe-", dir="/tmp") as tmp:
        tmp = Path(tmp)
        built = compile_ahead(sub, BuildResult(Status.PASS, "import", 1.0), build_dir=tmp / "build",
                              device=detect(), limits=config.Limits(ahead_s=90), sandbox=sb,
                              cases=cases, log_path=tmp / "ahead.log")
        if not built.compiled_ahead:
            print("nothing compiled ahead:", (tmp / "ahead.log").read_text()[-1500:])
        else:
            seeded = {p.name for p in Path(built.compiled_ahead).iterdir()}
            for how in ("plain", "run"):
                jit = tmp / f"jit-{how}" / "triton"
                jit.mkdir(parents=True)
                seed_jit_folder(built.compiled_ahead, jit)
                give_to_sandbox(jit.parent)
                cmd = [sys.executable, "-c", RUN, src, json.dumps([list(c.shape) for c in cases])]
                if how == "run":
                    cmd = sb.wrap(cmd, writable=[jit.parent], readonly=[os.path.dirname(src)],
                                  hide_libraries=True)
                p = subprocess.run(cmd, env={**env_r, "TRITON_CACHE_DIR": str(jit)},
                                   capture_output=True, text=True, timeout=300,
                                   cwd=os.path.dirname(src))
                new = sorted({q.name for q in jit.iterdir()} - seeded)
                print(f"== {how}: {'ran' if 'RAN' in p.stdout else 'FAILED ' + p.stderr[-800:]}; "
                      f"{len(seeded)} seeded, {len(new)} new key folders")
                for key in new:
                    meta = next(iter((jit / key).glob("[!_]*.json")), None)
                    if meta is None:
                        print("   ", key, sorted(q.name for q in (jit / key).iterdir()))
                        continue
                    got = json.loads(meta.read_text())
                    near = [json.loads(next(iter((Path(built.compiled_ahead) / s).glob("[!_]*.json"))).read_text())
                            for s in seeded if any((Path(built.compiled_ahead) / s).glob("[!_]*.json"))]
                    best = min(near, key=lambda m: sum(m.get(k) != v for k, v in got.items())) if near else {}
                    print("   ", key, {k: (v, best.get(k)) for k, v in got.items() if best.get(k) != v})
