"""The handout's appendix A (stage 3): its fragment tables agree with the PTX ISA's definitions of
mma.m16n8k16 (.f16 inputs, .f32 accumulators), and its code compiles for the course GPU."""

from __future__ import annotations

import re
import subprocess

import pytest

from grader.common import config

from .conftest import has_nvcc

HANDOUT = (config.REPO_ROOT / "student" / "README.md").read_text()


# The PTX ISA's fragment definitions, written out independently of the handout:
# groupID = laneid >> 2, threadID_in_group = laneid % 4.
def ptx_a(row: int, col: int) -> int:
    """Lane that holds A[row][col] (16 x 16, .row): rows groupID (+8), columns tig*2 (+1) (+8)."""
    return 4 * (row % 8) + (col % 8) // 2


def ptx_b(k: int, n: int) -> int:
    """Lane that holds B[k][n] (16 x 8, .col): column groupID, rows tig*2 (+1) (+8)."""
    return 4 * n + (k % 8) // 2


def ptx_c(row: int, col: int) -> int:
    """Lane that holds C[row][col] (16 x 8, .f32): rows groupID (+8), columns tig*2 (+1)."""
    return 4 * (row % 8) + col // 2


def grid(name: str) -> list[list[int]]:
    block = re.search(rf"<!-- grid:{name} -->\n```text\n(.*?)```", HANDOUT, re.S)
    assert block, f"appendix grid {name} is missing"
    rows = block.group(1).splitlines()[1:]
    return [[int(x) for x in row.split()[1:]] for row in rows]


@pytest.mark.parametrize("name, rows, cols, lane", [("A", 16, 16, ptx_a), ("B", 16, 8, ptx_b),
                                                    ("C", 16, 8, ptx_c)])
def test_fragment_grids_match_the_ptx_isa(name, rows, cols, lane):
    table = grid(name)
    assert len(table) == rows and all(len(r) == cols for r in table)
    assert table == [[lane(r, c) for c in range(cols)] for r in range(rows)]


def test_register_table_matches_the_grids():
    """The (row, column) list per register says the same as the PTX definitions, for every lane."""
    for lane in range(32):
        g, t = lane // 4, lane % 4
        a = {0: [(g, 2 * t), (g, 2 * t + 1)], 1: [(g + 8, 2 * t), (g + 8, 2 * t + 1)],
             2: [(g, 2 * t + 8), (g, 2 * t + 9)], 3: [(g + 8, 2 * t + 8), (g + 8, 2 * t + 9)]}
        assert all(ptx_a(r, c) == lane for cells in a.values() for r, c in cells)
        assert all(ptx_b(k, g) == lane for k in (2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9))
        assert all(ptx_c(r, c) == lane for r in (g, g + 8) for c in (2 * t, 2 * t + 1))
    assert "| A | `a[2]` | (g, 2t+8), (g, 2t+9) |" in HANDOUT
    assert "| B | `b[1]` | (k = 2t+8, n = g), (k = 2t+9, n = g) |" in HANDOUT
    assert "| C, D | `c[2]`, `c[3]` | (g+8, 2t), (g+8, 2t+1) |" in HANDOUT


def test_the_accumulators_of_two_score_tiles_are_the_a_fragment_of_p():
    """The handout's claim: a[0..3] of P (16 keys) = (c0[0], c0[1]), (c0[2], c0[3]), (c1[0], c1[1]),
    (c1[2], c1[3]) for the score tiles of keys 0-7 (c0) and 8-15 (c1)."""
    for lane in range(32):
        g, t = lane // 4, lane % 4
        c_cells = [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]
        p_from_c = [(r, c) for r, c in c_cells] + [(r, c + 8) for r, c in c_cells]   # tile 1: keys 8-15
        a_cells = [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1),
                   (g, 2 * t + 8), (g, 2 * t + 9), (g + 8, 2 * t + 8), (g + 8, 2 * t + 9)]
        assert p_from_c == a_cells
    assert "`a[0] = (c0[0], c0[1])`, `a[1] = (c0[2], c0[3])`, `a[2] = (c1[0], c1[1])`" in HANDOUT


def test_ldmatrix_rows_give_the_fragments():
    """For each operand row of the appendix's table, the matrix a lane's address feeds and the
    register it lands in reproduce the mma fragments (ldmatrix: lanes 8i..8i+7 give matrix i)."""
    for lane in range(32):
        i = lane // 8
        # A of Q·Kᵀ: row lane % 16, chunk lane / 16 -> matrix i covers rows 8*(i%2).., cols 8*(i//2)..
        assert (lane % 16 // 8, lane // 16) == (i % 2, i // 2)
        # B of Q·Kᵀ (K rows = keys): keys 8*(i//2).., chunk i%2: r[i] = b[i%2] of key tile i//2
        assert ((lane % 8 + 8 * (lane // 16)) // 8, (lane // 8) % 2) == (i // 2, i % 2)
        # B of P·V (V rows = keys, .trans): keys 8*(i%2).., chunk i//2: r[i] = b[i%2] of column tile i//2
        assert ((lane % 8 + 8 * ((lane // 8) % 2)) // 8, lane // 16) == (i % 2, i // 2)
    for row in ("`lane % 16` | `lane / 16` | `a[0..3]`",
                "`lane % 8 + 8 * (lane / 16)` | `(lane / 8) % 2`",
                "`lane % 8 + 8 * ((lane / 8) % 2)` | `lane / 16`"):
        assert row in HANDOUT, row


def appendix_code() -> list[str]:
    appendix = HANDOUT[HANDOUT.index("## Appendix A"):]
    return re.findall(r"```cpp\n(.*?)```", appendix, re.S)


@pytest.mark.slow
@pytest.mark.skipif(not has_nvcc(), reason="needs nvcc")
def test_the_appendix_code_compiles_for_the_course_gpu(tmp_path):
    mma, ldmatrix, opt_in = appendix_code()
    extern, host = opt_in.split("\n", 1)
    unit = f"""#include <cuda_fp16.h>
#include <c10/cuda/CUDAException.h>
constexpr int Br = 64, Bc = 64;
template <int D>
__global__ void my_kernel(const half* q, const half* k, const half* v, half* o, int S,
                          float softmax_scale) {{
{extern}
    smem_raw[threadIdx.x] = 0;
}}
__global__ void fragments(float* out) {{
    __shared__ __align__(16) half tile[16 * 16];
    const half* row_address = tile + (threadIdx.x % 16) * 16 + (threadIdx.x / 16) * 8;
    unsigned r[4], a[4], b[2];
    float c[4] = {{0.f, 0.f, 0.f, 0.f}};
{ldmatrix}
    for (int i = 0; i < 4; ++i) a[i] = r[i];
    b[0] = r[0]; b[1] = r[1];
{mma}
    out[threadIdx.x] = c[0] + c[1] + c[2] + c[3];
}}
void launch(dim3 grid, dim3 block, cudaStream_t stream, const half* q, const half* k,
            const half* v, half* o, int S, float softmax_scale) {{
    constexpr int D = 128;
{host}
}}
"""
    (tmp_path / "appendix.cu").write_text(unit)
    import torch.utils.cpp_extension as ext
    from grader.isolation.device import find_nvcc
    cmd = [find_nvcc(), "-c", str(tmp_path / "appendix.cu"), "-o", str(tmp_path / "appendix.o"),
           "-std=c++17", f"-arch=sm_{config.DEFAULT_CUDA_ARCH}", "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE"]
    for inc in ext.include_paths():
        cmd += ["-I", inc]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_the_performance_figures_students_read_come_from_the_one_measured_table():
    # The handout's table, its estimate for the largest case and the skeleton's per-version
    # times are rendered from bench/results.json (scripts/perf_table.py; that the files hold what
    # it renders is test_release's test); none is typed.
    import copy
    import json
    from scripts import perf_table
    results = json.loads(perf_table.RESULTS.read_text())
    case = perf_table.largest_case(results)
    measured = copy.deepcopy(results)
    measured["figures"] += [dict(case=case, row=perf_table.STAGES["naive"], median_ms=1195.3, tflops=7.4),
                            dict(case=case, row=perf_table.STAGES["tiled"], median_ms=716.2, tflops=12.3)]
    versions = perf_table.render_versions(measured)
    cudnn = perf_table.figure(results, "SDPA cuDNN", case)["median_ms"]
    assert "online softmax: ~1195 ms." in versions and "masked tails: ~716 ms." in versions
    assert f"{cudnn:.1f} ms" in perf_table.render_estimate(results)
    assert "| stage 1: naive (examples/naive_cuda) | - | - | 1195.300 ms (7) |" in perf_table.render_table(measured)
