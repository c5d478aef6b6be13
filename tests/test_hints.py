"""Hints: a TODO is done when the student's code in its place does what it asks, whatever its
label and wherever in that place the code sits; a finished stage is never called open, an
unfinished TODO never done; the optional stage is named as optional; quotes are whole sentences.

The core test writes each skeleton's TODOs one at a time, in order, the ways a student does
(below the TODO's comment or above its label; the comment kept, deleted as each TODO is done, or
deleted from the start; placeholders such as `pass` kept or deleted), and checks every prefix."""

from __future__ import annotations

import dataclasses
import re

import pytest

from grader.common import config

from grader.report import hints, hints_skeleton, hints_todos
from grader.course.verdicts import BuildResult
from grader.course.verdicts import CaseResult
from grader.common.status import Status

ROOT = config.REPO_ROOT
SKELETON = (ROOT / "student" / "submission.cu").read_text()
TRITON = (ROOT / "student" / "triton" / "submission.py").read_text()
TILELANG = (ROOT / "student" / "tilelang" / "submission.py").read_text()
CUTE = (ROOT / "student" / "cute" / "submission.cu").read_text()
TILED = (ROOT / "examples" / "tiled_cuda" / "submission.cu").read_text()
NAIVE = (ROOT / "examples" / "naive_cuda" / "submission.cu").read_text()


# ---------------------------------------------------------------- a student's work, TODO by TODO


@dataclasses.dataclass(frozen=True)
class Step:
    """One TODO done as a student does it. Each of `parts` is (anchor, code): the code goes below
    the line that holds `anchor` (its own earlier code), or, where anchor is None, at the TODO's
    place: below its comment, or above its label. `replace` edits its own line instead (TODO(2.0)).
    `drop`: the skeleton's placeholder lines it replaces, which a tidy student deletes."""
    label: str
    parts: tuple[tuple[str | None, str], ...] = ()
    replace: tuple[str, str] | None = None
    drop: tuple[str, ...] = ()


def step(label: str, code: str = "", *, drop: tuple[str, ...] = (), after: str | None = None,
         parts: tuple = (), replace: tuple[str, str] | None = None) -> Step:
    return Step(label, parts or ((after, code),), replace, drop)


@dataclasses.dataclass(frozen=True)
class Way:
    """How the student writes: `above` the label or below the TODO's comment; the comment of a
    done TODO deleted (`tidy`), or every TODO comment deleted before any work (`bare`); the
    placeholders a TODO's code replaces deleted (`drop`)."""
    name: str
    above: bool = False
    tidy: bool = False
    bare: bool = False
    drop: bool = False


WAYS = [Way("below, labels and placeholders kept"),
        Way("above the label, placeholders deleted", above=True, drop=True),
        Way("each TODO's comment deleted once done", tidy=True, drop=True),
        Way("every TODO comment deleted first", bare=True)]


def is_comment(text: str) -> bool:
    return text.lstrip().startswith(("//", "#"))


def todo_rows(lines: list[str], label: str) -> list[int]:
    """The rows of a TODO's comment: its label's row and the comment rows below it, up to the
    next TODO, code or a blank line (a rule of dashes is not the TODO's)."""
    first = next(n for n, text in enumerate(lines) if label in text)
    rows = [first]
    while rows[-1] + 1 < len(lines) and is_comment(lines[rows[-1] + 1]) \
            and not re.match(r"\s*(//|#)\s*TODO\(", lines[rows[-1] + 1]):
        rows.append(rows[-1] + 1)
    return [r for r in rows if not re.match(r"\s*(//|#)\s*-{4,}", lines[r])]


def without_comment(text: str) -> str | None:
    """The line without its TODO comment: None for a comment line, its code for code with one."""
    if is_comment(text):
        return None
    return re.split(r"\s*(//|#)\s*TODO\(", text)[0]


def written(skeleton: str, steps: list[Step], way: Way) -> str:
    """The skeleton with `steps` done, in order, the `way` a student does them."""
    lines = skeleton.splitlines()
    row_of = list(range(len(lines)))            # each line's row in the skeleton (None: new)
    dropped: set[int] = set()                   # skeleton rows deleted
    for s in steps:
        if s.replace is not None:
            old, new = s.replace
            i = next(n for n, text in enumerate(lines) if old in text)
            lines[i] = lines[i].replace(old, new)
            continue
        rows = todo_rows(skeleton.splitlines(), s.label)
        for anchor, code in s.parts:
            if anchor is not None:
                at = next(n for n, text in enumerate(lines) if anchor in text) + 1
            else:
                at = row_of.index(rows[0]) if way.above else row_of.index(rows[-1]) + 1
            new = code.rstrip("\n").split("\n")
            lines[at:at] = new
            row_of[at:at] = [None] * len(new)
        if way.drop:
            for text in s.drop:   # the first such line below the label (else above it)
                matches = [r for r, t in enumerate(skeleton.splitlines()) if t.strip() == text]
                dropped.add(([r for r in matches if r > rows[0]] or matches)[0])
    labels = [s.label for s in steps] if way.tidy else []
    if way.bare:
        labels = sorted(set(re.findall(r"TODO\(\d+(?:\.\d+)?\)", skeleton)) - {"TODO(0)"})
    uncommented = {r for label in labels for r in todo_rows(skeleton.splitlines(), label)}
    out = []
    for text, row in zip(lines, row_of):
        if row in dropped:
            continue
        if row in uncommented:
            text = without_comment(text)
            if text is None:
                continue
        out.append(text)
    return "\n".join(out) + "\n"


def states(source: str, skeleton: str = SKELETON) -> dict[str, bool]:
    """{label: open}"""
    return {t.label: t.open for t in hints_todos.todo_states(source, skeleton)}


# ---------------------------------------------------------------- the CUDA skeleton's TODOs, done


CUDA_STEPS = [
    step("TODO(1.1)", """\
        float s = 0.f;
        for (int i = 0; i < PER_LANE; ++i) s += __half2float(q[lane + 32 * i]) * __half2float(k[(long)j * D + lane + 32 * i]);
        for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffff, s, offset);
        s *= softmax_scale;
""", drop=("(void)q; (void)k; (void)v; (void)o; (void)lane; (void)softmax_scale; (void)m_i; (void)l_i;",)),
    step("TODO(1.2)", """\
        const float m_new = fmaxf(m_i, s);
        const float correction = __expf(m_i - m_new);   // exp(-inf) = 0 at j = 0
        const float p = __expf(s - m_new);
        l_i = l_i * correction + p;
        m_i = m_new;
"""),
    step("TODO(1.3)", """\
        for (int i = 0; i < PER_LANE; ++i)
            acc[i] = acc[i] * correction + p * __half2float(v[(long)j * D + lane + 32 * i]);
"""),
    step("TODO(1.4)", """\
    for (int i = 0; i < PER_LANE; ++i) o[lane + 32 * i] = __float2half(acc[i] / l_i);
""", drop=("(void)acc;",)),
    step("TODO(2.0)", replace=("KERNEL_VERSION = 1;", "KERNEL_VERSION = 2;")),
    step("TODO(2.1)", """\
        __syncthreads();   // every warp is done with the previous tile
        for (int idx = tid; idx < Bc * D; idx += blockDim.x) {
            const int j = idx / D, d = idx % D;
            k_s[j][d] = kv0 + j < S ? k[(long)(kv0 + j) * D + d] : __float2half(0.f);
            v_s[j][d] = kv0 + j < S ? v[(long)(kv0 + j) * D + d] : __float2half(0.f);
        }
        __syncthreads();   // the tile is complete before anyone reads it
""", drop=("(void)k; (void)v; (void)warp; (void)lane; (void)k_s; (void)v_s;",)),
    step("TODO(2.2)", """\
            float s = 0.f;
            for (int d = 0; d < D; ++d) s += q_s[warp * ROWS + r][d] * __half2float(k_s[lane][d]);
            if (kv0 + lane >= S) s = -INFINITY;
            float tile_max = s;
            for (int offset = 16; offset > 0; offset /= 2)
                tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, offset));
            const float m_old = m_i[r];
            m_i[r] = fmaxf(m_old, tile_max);
"""),
    step("TODO(2.3)", """\
            const float correction = __expf(m_old - m_i[r]), p = __expf(s - m_i[r]);
            float p_sum = p;
            for (int offset = 16; offset > 0; offset /= 2) p_sum += __shfl_xor_sync(0xffffffff, p_sum, offset);
            l_i[r] = l_i[r] * correction + p_sum;
            for (int i = 0; i < PER_LANE; ++i) acc[r][i] *= correction;
            for (int j = 0; j < Bc; ++j) {
                const float p_j = __shfl_sync(0xffffffff, p, j);
                for (int i = 0; i < PER_LANE; ++i) acc[r][i] += p_j * __half2float(v_s[j][lane + 32 * i]);
            }
"""),
    step("TODO(2.4)", """\
    for (int r = 0; r < ROWS; ++r) {
        const int row = row0 + warp * ROWS + r;
        if (row >= S) continue;   // rows past S were computed on zeros
    }
"""),
    step("TODO(2.5)", after="if (row >= S) continue;", code="""\
        half* o = O + (bh * S + row) * D;
        for (int i = 0; i < PER_LANE; ++i) o[lane + 32 * i] = __float2half(acc[r][i] / l_i[r]);
""", drop=("(void)acc;",)),
    # The optional stage: a kernel of the student's below its TODOs, mma.sync's m16n8k16.
    step("TODO(3.1)", after="README.md, \"Performance\", lists", code="""\

// Thread t of a warp holds rows g = t / 4 and g + 8 of each 16 x 8 result, columns 2c, 2c + 1.
__device__ unsigned pack_half2(half lo, half hi) {
    __half2 h = __halves2half2(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
}

__device__ void mma_16816(float c[4], const unsigned a[4], const unsigned b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <int D>
__global__ void attention_kernel3(const half* __restrict__ Q, const half* __restrict__ K,
                                  const half* __restrict__ V, half* __restrict__ O, int S,
                                  float softmax_scale) {
    constexpr int NB = Bc / 8, DB = D / 8;
    __shared__ half q_s[64][D + 8], k_s[Bc][D + 8], v_s[Bc][D + 8];
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
    const long bh = blockIdx.y;
    const int row0 = blockIdx.x * 64;
    const half* q = Q + bh * S * D;
    const half* k = K + bh * S * D;
    const half* v = V + bh * S * D;
    for (int idx = tid; idx < 64 * D; idx += blockDim.x) {
        const int r = idx / D, d = idx % D;
        q_s[r][d] = row0 + r < S ? q[(long)(row0 + r) * D + d] : __float2half(0.f);
    }
    float m_i[2] = {-INFINITY, -INFINITY}, l_i[2] = {0.f, 0.f};   // rows g and g + 8
    float acc[DB][4] = {};

    for (int kv0 = 0; kv0 < S; kv0 += Bc) {
        __syncthreads();
        for (int idx = tid; idx < Bc * D; idx += blockDim.x) {
            const int j = idx / D, d = idx % D;
            k_s[j][d] = kv0 + j < S ? k[(long)(kv0 + j) * D + d] : __float2half(0.f);
            v_s[j][d] = kv0 + j < S ? v[(long)(kv0 + j) * D + d] : __float2half(0.f);
        }
        __syncthreads();
        float s[NB][4] = {};   // S = Q K^T, this warp's 16 rows
        for (int kk = 0; kk < D; kk += 16) {
            const int r = warp * 16 + g, d = kk + 2 * c;
            const unsigned a[4] = {pack_half2(q_s[r][d], q_s[r][d + 1]),
                                   pack_half2(q_s[r + 8][d], q_s[r + 8][d + 1]),
                                   pack_half2(q_s[r][d + 8], q_s[r][d + 9]),
                                   pack_half2(q_s[r + 8][d + 8], q_s[r + 8][d + 9])};
            for (int nb = 0; nb < NB; ++nb) {
                const unsigned b[2] = {pack_half2(k_s[nb * 8 + g][d], k_s[nb * 8 + g][d + 1]),
                                       pack_half2(k_s[nb * 8 + g][d + 8], k_s[nb * 8 + g][d + 9])};
                mma_16816(s[nb], a, b);
            }
        }
        // then the softmax
        // then P V
    }
    // and the output
}
"""),
    step("TODO(3.2)", after="// then the softmax", code="""\
        for (int h = 0; h < 2; ++h) {
            float tile_max = -INFINITY;
            for (int nb = 0; nb < NB; ++nb)
                for (int e = 0; e < 2; ++e) {
                    const int key = kv0 + nb * 8 + 2 * c + e;
                    s[nb][2 * h + e] = key < S ? s[nb][2 * h + e] * softmax_scale : -INFINITY;
                    tile_max = fmaxf(tile_max, s[nb][2 * h + e]);
                }
            tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 1));
            tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 2));
            const float m_new = fmaxf(m_i[h], tile_max), correction = __expf(m_i[h] - m_new);
            float p_sum = 0.f;
            for (int nb = 0; nb < NB; ++nb)
                for (int e = 0; e < 2; ++e) {
                    s[nb][2 * h + e] = __expf(s[nb][2 * h + e] - m_new);
                    p_sum += s[nb][2 * h + e];
                }
            l_i[h] = l_i[h] * correction + p_sum;   // this thread's share of the row
            for (int db = 0; db < DB; ++db) {
                acc[db][2 * h] *= correction;
                acc[db][2 * h + 1] *= correction;
            }
            m_i[h] = m_new;
        }
"""),
    step("TODO(3.3)", parts=(("// then P V", """\
        for (int kb = 0; kb < NB / 2; ++kb) {   // P as the A operand, 16 keys a step
            const unsigned a[4] = {pack_half2(__float2half(s[2 * kb][0]), __float2half(s[2 * kb][1])),
                                   pack_half2(__float2half(s[2 * kb][2]), __float2half(s[2 * kb][3])),
                                   pack_half2(__float2half(s[2 * kb + 1][0]), __float2half(s[2 * kb + 1][1])),
                                   pack_half2(__float2half(s[2 * kb + 1][2]), __float2half(s[2 * kb + 1][3]))};
            const int key = kb * 16 + 2 * c;
            for (int db = 0; db < DB; ++db) {
                const unsigned b[2] = {pack_half2(v_s[key][db * 8 + g], v_s[key + 1][db * 8 + g]),
                                       pack_half2(v_s[key + 8][db * 8 + g], v_s[key + 9][db * 8 + g])};
                mma_16816(acc[db], a, b);
            }
        }
"""), ("// and the output", """\
    for (int h = 0; h < 2; ++h) {
        const int row = row0 + warp * 16 + g + 8 * h;
        float l = l_i[h];
        l += __shfl_xor_sync(0xffffffff, l, 1);
        l += __shfl_xor_sync(0xffffffff, l, 2);
        if (row >= S) continue;
        for (int db = 0; db < DB; ++db)
            for (int e = 0; e < 2; ++e)
                O[(bh * S + row) * D + db * 8 + 2 * c + e] = __float2half(acc[db][2 * h + e] / l);
    }
"""))),
]
TRITON_STEPS = [
    step("TODO(1.1)", """\
        k = tl.load(K + base + cols[None, :] * HEAD_DIM + offs_d[:, None],
                    mask=cols[None, :] < seq_len, other=0.0)
        scores = tl.dot(q, k) * softmax_scale
""", drop=("pass",)),
    step("TODO(1.2)", """\
        scores = tl.where(cols[None, :] < seq_len, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        m_i = m_new
"""),
    step("TODO(1.3)", """\
        v = tl.load(V + base + cols[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=cols[:, None] < seq_len, other=0.0)
        acc += tl.dot(p.to(tl.float16), v)
"""),
    step("TODO(1.4)", """\
    acc = acc / l_i[:, None]
    tl.store(O + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], acc.to(tl.float16),
             mask=row_ok)
"""),
]

# The other two tracks, as their finished examples write them.
TILELANG_STEPS = [
    step("TODO(1.1)", """\
            scores = T.alloc_fragment([BLOCK_M, BLOCK_N], accum)
            p = T.alloc_fragment([BLOCK_M, BLOCK_N], dtype)
            m_i = T.alloc_fragment([BLOCK_M], accum)
            m_prev = T.alloc_fragment([BLOCK_M], accum)
            alpha = T.alloc_fragment([BLOCK_M], accum)
            row_sum = T.alloc_fragment([BLOCK_M], accum)
            l_i = T.alloc_fragment([BLOCK_M], accum)
            T.fill(l_i, 0)
            T.fill(m_i, -T.infinity(accum))
"""),
    step("TODO(1.2)", """\
                for i, j in T.Parallel(BLOCK_M, BLOCK_N):
                    scores[i, j] = T.if_then_else(t * BLOCK_N + j < seq_len, 0, -T.infinity(accum))
                T.gemm(q_tile, k_tile, scores, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
"""),
    step("TODO(1.3)", """\
                T.copy(m_i, m_prev)
                T.reduce_max(scores, m_i, dim=1, clear=False)
                for i in T.Parallel(BLOCK_M):
                    alpha[i] = T.exp2((m_prev[i] - m_i[i]) * qk_scale)
                for i, j in T.Parallel(BLOCK_M, BLOCK_N):
                    scores[i, j] = T.exp2(scores[i, j] * qk_scale - m_i[i] * qk_scale)
                T.reduce_sum(scores, row_sum, dim=1)
                for i in T.Parallel(BLOCK_M):
                    l_i[i] = l_i[i] * alpha[i] + row_sum[i]
"""),
    step("TODO(1.4)", """\
                for i, j in T.Parallel(BLOCK_M, head_dim):
                    acc[i, j] *= alpha[i]
                T.copy(scores, p)
                T.gemm(p, v_tile, acc, policy=T.GemmWarpPolicy.FullRow)
"""),
    step("TODO(1.5)", """\
            for i, j in T.Parallel(BLOCK_M, head_dim):
                acc[i, j] /= l_i[i]
"""),
]

CUTE_STEPS = [   # stage 1; the optional stage 2 changes the kernel above its TODOs (hints_todos._DOES)
    step("TODO(1.1)", """\
        if (kv_rows < Bc) {
            CUTE_UNROLL
            for (int i = 0; i < size(acc_s); ++i)
                if (get<1>(tScS(i)) >= kv_rows) acc_s(i) = -INFINITY;
        }
"""),
    step("TODO(1.2)", after="Tensor o_rc = make_tensor(acc_o.data(), rows_cols(acc_o.layout()));", code="""\
        float m_new[ROWS];
        CUTE_UNROLL
        for (int r = 0; r < ROWS; ++r) {
            float tile_max = -INFINITY;
            CUTE_UNROLL
            for (int c = 0; c < size<1>(s_rc); ++c) tile_max = fmaxf(tile_max, s_rc(r, c));
            m_new[r] = fmaxf(m_i[r], quad_max(tile_max));
            CUTE_UNROLL
            for (int c = 0; c < size<1>(s_rc); ++c) s_rc(r, c) = exp2f((s_rc(r, c) - m_new[r]) * scale_log2);
        }
        // now P, in place of the scores
"""),
    step("TODO(1.3)", after="// now P, in place of the scores", code="""\
        CUTE_UNROLL
        for (int r = 0; r < ROWS; ++r) {
            const float rescale = exp2f((m_i[r] - m_new[r]) * scale_log2);   // 0 on the first tile
            float tile_sum = 0.f;
            CUTE_UNROLL
            for (int c = 0; c < size<1>(s_rc); ++c) tile_sum += s_rc(r, c);
            l_i[r] = l_i[r] * rescale + tile_sum;
            CUTE_UNROLL
            for (int c = 0; c < size<1>(o_rc); ++c) o_rc(r, c) *= rescale;
            m_i[r] = m_new[r];
        }
""", drop=("(void)s_rc; (void)o_rc; (void)tScS; (void)scale_log2;",)),
    step("TODO(1.4)", """\
        Tensor p_half = make_tensor_like<Element>(acc_s);
        CUTE_UNROLL
        for (int i = 0; i < size(acc_s); ++i) p_half(i) = static_cast<Element>(acc_s(i));
        Tensor tOrP = make_tensor(p_half.data(), as_a_operand(p_half.layout()));
        CUTE_UNROLL
        for (int kk = 0; kk < size<2>(tOrP); ++kk) {
            copy(v_copy, tOsVt(_, _, kk), tOrVt_view(_, _, kk));
            gemm(tiled_mma, tOrP(_, _, kk), tOrVt(_, _, kk), acc_o);
        }
""", drop=("(void)tOrVt; (void)tOsVt; (void)tOrVt_view; (void)acc_o;",)),
    step("TODO(1.5)", """\
    Tensor o_rc = make_tensor(acc_o.data(), rows_cols(acc_o.layout()));
    CUTE_UNROLL
    for (int r = 0; r < ROWS; ++r) {
        const float inv_l = 1.f / quad_sum(l_i[r]);
        CUTE_UNROLL
        for (int c = 0; c < size<1>(o_rc); ++c) o_rc(r, c) *= inv_l;
    }
    Tensor tOgO = thr_mma.partition_C(gO);
    CUTE_UNROLL
    for (int i = 0; i < size(acc_o); ++i)
        if (get<0>(tOcO(i)) < q_rows) tOgO(i) = static_cast<Element>(acc_o(i));
""", drop=("(void)tOcO; (void)l_i; (void)q_rows;",)),
]

TRACKS = {"cuda": (SKELETON, CUDA_STEPS), "triton": (TRITON, TRITON_STEPS),
          "tilelang": (TILELANG, TILELANG_STEPS), "cute": (CUTE, CUTE_STEPS)}


def labels(skeleton: str) -> list[str]:
    return [t.label for t in hints_todos.todo_states(skeleton, skeleton)]


def test_the_steps_cover_every_todo_of_each_skeleton_in_order():
    assert [s.label for s in CUDA_STEPS] == labels(SKELETON)
    assert [s.label for s in TRITON_STEPS] == labels(TRITON)
    assert [s.label for s in TILELANG_STEPS] == labels(TILELANG)
    assert [s.label for s in CUTE_STEPS] == [t for t in labels(CUTE) if t.startswith("TODO(1.")]


def test_a_written_step_is_where_a_student_puts_it():
    src = written(SKELETON, CUDA_STEPS[:1], WAYS[0])
    assert "s *= softmax_scale;\n        // TODO(1.2)" in src                      # below 1.1's comment
    src = written(SKELETON, CUDA_STEPS[:2], WAYS[1])
    assert "m_i = m_new;\n        // TODO(1.2)" in src                          # above 1.2's label
    assert "(void)q; (void)k;" not in src
    src = written(TRITON, TRITON_STEPS[:1], WAYS[2])
    assert "TODO(1.1)" not in src and "TODO(1.2)" in src and "pass" not in src
    assert "TODO" not in written(TRITON, [], WAYS[3])
    src = written(SKELETON, CUDA_STEPS, WAYS[2])
    assert src.index("m_i[h] = m_new;") < src.index("P as the A operand") < src.index("(bh * S + row) * D + db")


# ---------------------------------------------------------------- every prefix, both skeletons


def prefixes(steps: list[Step]):
    return [pytest.param(k, id=f"{k}:{steps[k - 1].label if k else 'skeleton'}")
            for k in range(len(steps) + 1)]


def check_prefix(skeleton: str, steps: list[Step], k: int, way: Way) -> None:
    src = written(skeleton, steps[:k], way)
    done = {s.label for s in steps[:k]}
    todos = hints_todos.todo_states(src, skeleton)
    # never an unfinished TODO called done, never a finished one called open (nor lost)
    assert {t.label: t.state for t in todos} == \
        {t.label: "done" if t.label in done else "open" for t in todos}, way.name
    required = [t for t in todos if not t.optional]
    first = next((t for t in required if t.label not in done), None)
    hint = hints.progress_hint(src, skeleton)
    if first is None:
        assert hints.first_open_todo(src, skeleton) is None
        assert hint.startswith("No TODO of stage"), hint
        optional = [t.label for t in todos if t.optional]
        assert ("is optional" in hint) == (bool(optional) and not done & set(optional)), hint
        return
    assert hints.first_open_todo(src, skeleton) == first.quote()
    mine = [t.label for t in required if t.stage == first.stage and t.label in done]
    if mine:
        assert hint.startswith(f"Stage {first.stage} has your code for {hints._and(mine)}; the first "
                               f"TODO your code does not do yet is {first.quote()}"), hint
    else:
        assert hint == f"The first TODO still on the skeleton's code is {first.quote()}"


@pytest.mark.parametrize("way", WAYS, ids=lambda w: w.name)
@pytest.mark.parametrize("k", prefixes(CUDA_STEPS))
def test_every_prefix_of_the_cuda_skeleton(k, way):
    check_prefix(SKELETON, CUDA_STEPS, k, way)


@pytest.mark.parametrize("way", WAYS, ids=lambda w: w.name)
@pytest.mark.parametrize("k", prefixes(TRITON_STEPS))
def test_every_prefix_of_the_triton_skeleton(k, way):
    check_prefix(TRITON, TRITON_STEPS, k, way)


@pytest.mark.parametrize("way", WAYS, ids=lambda w: w.name)
@pytest.mark.parametrize("track", ["tilelang", "cute"])
def test_every_prefix_of_the_other_tracks(track, way):
    skeleton, steps = TRACKS[track]
    for k in range(len(steps) + 1):
        check_prefix(skeleton, steps, k, way)


# ---------------------------------------------------------------- the cases that were wrong


@pytest.mark.parametrize("way", WAYS, ids=lambda w: w.name)
def test_the_trial_of_2026_11_26_only_todo_1_1_written(way):
    """With only TODO(1.1)'s code the hint sent the student to TODO(1.4): code in the loop (or
    `pass` deleted) closed every TODO of the comment block it sits under."""
    src = written(SKELETON, CUDA_STEPS[:1], way)
    assert states(src)["TODO(1.2)"] and states(src)["TODO(1.3)"] and not states(src)["TODO(1.1)"]
    assert hints.progress_hint(src, SKELETON).startswith(
        "Stage 1 has your code for TODO(1.1); the first TODO your code does not do yet is "
        "TODO(1.2): update the softmax state")
    src = written(TRITON, TRITON_STEPS[:1], way)
    assert states(src, TRITON) == {"TODO(1.1)": False, "TODO(1.2)": True, "TODO(1.3)": True,
                                   "TODO(1.4)": True}
    assert hints.first_open_todo(src, TRITON).startswith("TODO(1.2): keys past seq_len get -inf")


def test_code_that_does_a_later_todo_of_a_shared_place_closes_that_one_only():
    src = written(SKELETON, [CUDA_STEPS[2]], WAYS[0])            # acc += p v_j, nothing else
    s = states(src)
    assert s["TODO(1.1)"] and s["TODO(1.2)"] and not s["TODO(1.3)"]
    assert hints.first_open_todo(src, SKELETON).startswith("TODO(1.1)")
    src = written(TRITON, TRITON_STEPS[1:3], WAYS[2])            # the softmax and P V, no scores
    assert states(src, TRITON) == {"TODO(1.1)": True, "TODO(1.2)": False, "TODO(1.3)": False,
                                   "TODO(1.4)": True}


def test_a_deleted_placeholder_is_not_work():
    src = SKELETON.replace("    (void)acc;\n", "")              # both of them
    src = src.replace("(void)q; (void)k; (void)v; (void)o; (void)lane; (void)softmax_scale; "
                      "(void)m_i; (void)l_i;", "")
    assert all(states(src).values())
    assert all(states(TRITON.replace("        pass\n", ""), TRITON).values())
    # nor is a deleted TODO(2.0) line a switch to version 2 (nor still the skeleton's)
    no_switch = written(SKELETON, CUDA_STEPS[:4], WAYS[0]).replace("constexpr int KERNEL_VERSION = 1;", "")
    assert {t.label: t.state for t in hints_todos.todo_states(no_switch, SKELETON)}["TODO(2.0)"] == "gone"
    assert hints.progress_hint(no_switch, SKELETON).startswith(
        "The first TODO still on the skeleton's code is TODO(2.1)")


def test_the_write_without_its_guard_leaves_the_tails_open():
    unguarded = step("TODO(2.5)", """\
    for (int r = 0; r < ROWS; ++r)
        for (int i = 0; i < PER_LANE; ++i)
            O[(bh * S + row0 + warp * ROWS + r) * D + lane + 32 * i] = __float2half(acc[r][i] / l_i[r]);
""")
    src = written(SKELETON, CUDA_STEPS[:8] + [unguarded], WAYS[0])
    s = states(src)
    assert s["TODO(2.4)"] and not s["TODO(2.5)"]
    assert hints.first_open_todo(src, SKELETON).startswith("TODO(2.4): tails.")


def test_a_moved_declaration_does_not_cost_the_loop_its_match():
    """examples/naive_cuda declares o after the loop, not before it: a greedy diff matched that
    line and lost the loop, whose code then sat in no TODO's place."""
    todos = {t.label: t.state for t in hints_todos.todo_states(NAIVE, SKELETON)}
    assert all(todos[f"TODO(1.{n})"] == "done" for n in range(1, 5)), todos
    # it has no version 2, no KERNEL_VERSION, no place for any TODO of stage 2: none is called
    # open, nor done
    assert {todos[label] for label in todos if label.startswith("TODO(2.")} == {"gone"}
    assert hints.first_open_todo(NAIVE, SKELETON) is None
    assert hints.progress_hint(NAIVE, SKELETON).startswith("No TODO of stages 1 and 2 is still")


# ---------------------------------------------------------------- labels and places


def test_the_skeleton_has_every_todo_open_and_stage_3_is_optional():
    todos = hints_todos.todo_states(SKELETON, SKELETON)
    assert [t.label for t in todos] == ["TODO(1.1)", "TODO(1.2)", "TODO(1.3)", "TODO(1.4)",
                                        "TODO(2.0)", "TODO(2.1)", "TODO(2.2)", "TODO(2.3)",
                                        "TODO(2.4)", "TODO(2.5)", "TODO(3.1)", "TODO(3.2)", "TODO(3.3)"]
    assert all(t.open for t in todos)
    assert {t.stage for t in todos if t.optional} == {3}
    assert hints.first_open_todo(SKELETON, SKELETON).startswith("TODO(1.1): the score s = ")


def test_the_installed_skeleton_is_found_for_each_track():
    assert hints_skeleton.read_skeleton("cuda") == SKELETON and hints_skeleton.read_skeleton("python") == TRITON
    assert hints.first_open_todo(SKELETON).startswith("TODO(1.1)")       # no skeleton passed
    assert hints.first_open_todo(TRITON).startswith("TODO(1.1): load the K tile")


@pytest.mark.parametrize("kind", sorted(hints_skeleton.SKELETON_FILES))
def test_each_todo_says_what_its_code_does_and_each_finished_example_does_it(kind):
    """Every TODO of every track's skeleton has its entry in hints_todos._DOES (without one, any code
    in its place would close it, and every TODO sharing that place); the finished example of the
    track does every required one."""
    skeleton = hints_skeleton.read_skeleton(kind)
    todos = hints_todos.todo_states(skeleton, skeleton)
    assert todos and all(t.open for t in todos)
    assert {t.number for t in todos} == set(hints_todos._DOES[kind])
    example = {"cuda": "tiled_cuda/submission.cu", "python": "triton_flash/submission.py",
               "tilelang": "tilelang_flash/submission.py", "cute": "cute_flash/submission.cu"}[kind]
    source = (ROOT / "examples" / example).read_text()
    assert not [t.label for t in hints_todos.todo_states(source, skeleton) if t.open and not t.optional]
    assert hints.progress_hint(source).startswith("No TODO of stage")


def test_finished_stages_are_never_called_open_whatever_the_labels():
    for way in WAYS:
        finished = written(SKELETON, CUDA_STEPS[:10], way)
        assert hints.first_open_todo(finished, SKELETON) is None, way.name
    assert "TODO(1.1)" in written(SKELETON, CUDA_STEPS[:10], WAYS[0])   # every label still there
    # the bundled example of stages 1 and 2, which has no labels and its own names
    assert hints.first_open_todo(TILED, SKELETON) is None
    text = hints.progress_hint(TILED, SKELETON)
    assert "No TODO of stages 1 and 2 is still on the skeleton's code" in text
    assert "open" not in text


def test_a_label_deleted_before_the_work_is_done_is_still_open():
    src = written(SKELETON, CUDA_STEPS[:4], WAYS[0]).replace("// TODO(2.1): all threads copy",
                                                             "// all threads copy")
    assert hints.first_open_todo(src, SKELETON).startswith("TODO(2.0)")
    src = src.replace("KERNEL_VERSION = 1;", "KERNEL_VERSION = 2;")
    assert hints.first_open_todo(src, SKELETON).startswith("TODO(2.1): all threads copy")


def test_a_stage_with_some_todos_done_names_them_in_plain_words():
    src = written(SKELETON, CUDA_STEPS[:3], WAYS[0])
    assert hints.progress_hint(src, SKELETON) == (
        "Stage 1 has your code for TODO(1.1), TODO(1.2) and TODO(1.3); the first TODO your code "
        "does not do yet is TODO(1.4): write o[lane + 32 i] = acc[i] / l_i as half (__float2half).")
    text = hints.progress_hint(written(SKELETON, CUDA_STEPS[:6], WAYS[0]), SKELETON)
    assert text.startswith("Stage 2 has your code for TODO(2.0) and TODO(2.1); the first TODO")
    assert " sit" not in text


def test_the_rows_code_is_the_rows_todos_not_the_copys():
    # the rows' code (inside the loop over r) is 2.2/2.3's, not 2.1's: 2.1 stays open without its copy
    version2 = written(SKELETON, CUDA_STEPS[:5], WAYS[0])
    only_rows = written(version2, [CUDA_STEPS[6], CUDA_STEPS[7]], WAYS[0])
    s = states(only_rows)
    assert s["TODO(2.1)"] and not s["TODO(2.2)"] and not s["TODO(2.3)"] and s["TODO(2.5)"]
    # the final write, guarded, does 2.4 and 2.5 and nothing else
    only_write = written(version2, CUDA_STEPS[8:10], WAYS[0])
    s = states(only_write)
    assert not s["TODO(2.4)"] and not s["TODO(2.5)"] and s["TODO(2.1)"] and s["TODO(2.2)"]
    assert not s["TODO(1.4)"]   # version 1's write, which looks the same, is a place of its own


def test_a_version_left_as_the_skeleton_while_a_later_one_is_written_is_skipped():
    src = written(SKELETON, CUDA_STEPS[4:10], WAYS[0])   # straight to version 2; version 1 untouched
    assert states(src)["TODO(1.1)"] is True
    assert hints.first_open_todo(src, SKELETON) is None


# ---------------------------------------------------------------- the optional stage


def test_the_optional_stage_is_named_as_optional_never_as_open():
    finished = written(SKELETON, CUDA_STEPS[:10], WAYS[0])
    text = hints.progress_hint(finished, SKELETON)
    assert "Stage 3 is optional: if you want the speed, it starts at TODO(3.1): compute S = Q Kᵀ" in text
    assert "open" not in text
    # an empty kernel of the student's does none of it; its MMA starts the stage, not mentioned then
    stub = "template <int D>\n__global__ void attention_kernel3(const half* Q) { (void)Q; }\n"
    started = written(finished, [step("TODO(3.1)", stub, after="README.md, \"Performance\"")], WAYS[0])
    assert states(started)["TODO(3.1)"] and "Stage 3 is optional" in hints.progress_hint(started, SKELETON)
    started = written(SKELETON, CUDA_STEPS[:11], WAYS[0])
    assert states(started)["TODO(3.1)"] is False
    assert "Stage 3" not in hints.progress_hint(started, SKELETON)


def test_the_cpu_check_hint_never_calls_a_finished_stage_open():
    build = BuildResult(Status.PASS, "compile_only", 1.0)
    cases = [CaseResult("b1_h64_s1024_d128", Status.NOT_RUN, "not run: no CUDA device")]
    text = hints.hint_for(build, cases, written(SKELETON, CUDA_STEPS[:10], WAYS[0]))
    assert text.startswith("Correctness is not checked without a CUDA device. No TODO of stages 1 and 2")
    assert "TODO(3.1)" in text and "optional" in text
    text = hints.hint_for(build, cases, SKELETON)
    assert "The first TODO still on the skeleton's code is TODO(1.1): the score" in text


# ---------------------------------------------------------------- the Triton track


def test_triton_track_finished_partial_and_skeleton():
    assert all(states(TRITON, TRITON).values())
    # the loop written and `pass` deleted (as anyone would): 1.4 is still open
    partial = written(TRITON, TRITON_STEPS[:3], WAYS[2])
    assert states(partial, TRITON) == {"TODO(1.1)": False, "TODO(1.2)": False, "TODO(1.3)": False,
                                       "TODO(1.4)": True}
    assert hints.first_open_todo(partial, TRITON) == (
        "TODO(1.4): divide acc by l_i and store it to O as float16, masking rows past seq_len.")
    assert not any(states(written(TRITON, TRITON_STEPS, WAYS[2]), TRITON).values())
    example = (ROOT / "examples" / "triton_flash" / "submission.py").read_text()
    assert hints.first_open_todo(example, TRITON) is None


def test_result_hints_name_the_tracks_own_todos():
    assert "TODO(2.4)" not in str(TRITON)   # the Triton skeleton has stage 1 only
    crash = [CaseResult("c", Status.RUNTIME_ERROR, "CUDA error: an illegal memory access")]
    assert "TODO(2.4)" in hints.hint_for(None, crash, SKELETON)
    text = hints.hint_for(None, crash, TRITON)
    assert "TODO(2.4)" not in text and "TODO(1.2)" in text


# ---------------------------------------------------------------- a file that does not build


def test_a_python_syntax_error_is_named_as_python_with_its_line():
    broken = TRITON.replace("        pass\n", "        k = tl.load(K + (base\n")
    line = broken.splitlines().index("        k = tl.load(K + (base") + 1
    # what the import check leaves (grader/build/stage.py: the traceback's first lines, not the file's)
    build = BuildResult(Status.BUILD_ERROR, "import", 0.4,
                        message="import failed: SyntaxError: '(' was never closed",
                        log_tail="Traceback (most recent call last):\n  File \"loop.py\", line 487")
    text = hints.hint_for(build, [], broken)
    assert text == (f"Python cannot read submission.py: a syntax error at line {line} ('(' was never "
                    f"closed). Fix the syntax there, or just above it (an unclosed bracket, a "
                    f"missing colon).")
    assert "compiler" not in hints.hint_for(build, [], None)
    assert "syntax error" in hints.hint_for(build, [], None)
    indented = TRITON.replace("    m_i = tl.full", "  m_i = tl.full")
    assert re.match(r"Python cannot read submission\.py: a syntax error at line 32 \(", 
                    hints.hint_for(build, [], indented))


def test_other_import_errors_and_compile_errors_keep_their_own_words():
    build = BuildResult(Status.BUILD_ERROR, "import", 0.4, message="import failed: NameError: name "
                        "'tl' is not defined", log_tail='  File "/x/submission.py", line 12, in <module>')
    text = hints.hint_for(build, [], TRITON)
    assert text == "Importing submission.py raised an error at line 12 of submission.py: fix what the message above names."
    cuda = BuildResult(Status.BUILD_ERROR, "compile_only", 3.0, message="compile failed",
                       log_tail="submission.cu:38: error: expected a ';'")
    assert hints.hint_for(cuda, [], SKELETON) == (
        "Fix the first error the compiler reports at line 38 of submission.cu; later errors often "
        "follow from it.")


def test_a_check_on_a_slow_machine_and_a_grading_run_get_their_own_words():
    from grader.build.messages import machine_words, slow_build_message
    slow = BuildResult(Status.TIMEOUT, "compile_only", 300.0, message=slow_build_message(
        "compile", 300, source_name="submission.cu", phase="ptxas", load=3.2),
        students_machine=True)
    text = hints.hint_for(slow, [], SKELETON)
    assert "slow or busy" in text and "Raise the limit" in text and "unrolled" in text
    graded = BuildResult(Status.TIMEOUT, "compile_only", 300.0, message="compile did not finish within 300 s")
    assert hints.hint_for(graded, [], SKELETON) == (
        "The build ran past its time limit: look for huge unrolled loops or templates.")
    for check, words in ((object(), "this machine lacks"), (None, "the grading machine lacked")):
        machine, fault = machine_words(check)
        env = BuildResult(Status.ENVIRONMENT_ERROR, "compile_only", 1.0,
                          message=f"{machine} lacks ninja. {fault}", students_machine=check is not None)
        assert words in hints.hint_for(env, [], SKELETON)


def test_an_error_on_a_hidden_case_only_sends_the_student_to_make_check():
    hidden = [CaseResult("h", Status.RUNTIME_ERROR, "IndexError: list index out of range", hidden=True)]
    text = hints.hint_for(None, hidden, TRITON)
    assert "hidden case" in text and "make check" in text and "message above" not in text
    public = [dataclasses.replace(hidden[0], hidden=False)]
    assert "read the message above" in hints.hint_for(None, public, TRITON)


# ---------------------------------------------------------------- quotes


def test_quotes_are_whole_sentences():
    text = ("First sentence, e.g. with an abbreviation and lane, lane + 32, ... an ellipsis. "
            "Second one here. Third.")
    assert hints_todos.whole_sentences(text, 1000) == text
    assert hints_todos.whole_sentences(text, 90) == ("First sentence, e.g. with an abbreviation and "
                                               "lane, lane + 32, ... an ellipsis.")
    assert hints_todos.whole_sentences(text, 100) == text[:text.index(" Third")]
    assert hints_todos.whole_sentences(text, 10).endswith("an ellipsis.")   # never cut inside one
    for todo in hints_todos.todo_states(SKELETON, SKELETON) + hints_todos.todo_states(TRITON, TRITON):
        quote = todo.quote()
        said = quote.split(": ", 1)[1]
        assert todo.text.startswith(said), quote                      # a prefix of the TODO ...
        assert said == todo.text or re.search(r"[.!?]$", said), quote  # ... ending a sentence
        assert "Let lane own elements" not in quote or quote.endswith("holds the total."), quote


def test_todo_text_is_the_whole_comment_block():
    todo = next(t for t in hints_todos.todo_states(SKELETON, SKELETON) if t.label == "TODO(1.1)")
    assert todo.text.endswith("add the 32 partial sums with __shfl_xor_sync so every lane holds the total.")
    three = {t.label: t.text for t in hints_todos.todo_states(SKELETON, SKELETON) if t.stage == 3}
    assert three["TODO(3.2)"] == "apply the online softmax to the accumulator fragments."


@pytest.mark.parametrize("source", ["", "int main() { return 0; }", "def custom_kernel(d):\n    return d[0]\n"])
def test_unrelated_sources_get_no_false_todo(source):
    # code that shares nothing with the skeleton has no place left that is the skeleton's
    assert hints.first_open_todo(source) is None
