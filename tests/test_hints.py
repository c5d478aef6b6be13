"""Hints: which TODOs are open is read from the code (is it still the skeleton's?), never from the
labels; a finished stage is never called open; the optional stage is named as optional; quotes
are whole sentences."""

from __future__ import annotations

import re

import pytest

from grader import config, hints
from grader.build import BuildResult
from grader.correctness import CaseResult
from grader.status import Status

ROOT = config.REPO_ROOT
SKELETON = (ROOT / "student" / "submission.cu").read_text()
TRITON = (ROOT / "student" / "triton" / "submission.py").read_text()
TILED = (ROOT / "examples" / "tiled_cuda" / "submission.cu").read_text()

# The student's code for each place of the CUDA skeleton, as examples/tiled_cuda writes it.
STAGE1_LOOP = """\
        float s = 0.f;
        for (int i = 0; i < PER_LANE; ++i) s += __half2float(q[lane + 32 * i]) * __half2float(k[(long)j * D + lane + 32 * i]);
        for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffff, s, offset);
        s *= softmax_scale;
        const float m_new = fmaxf(m_i, s), correction = __expf(m_i - m_new), p = __expf(s - m_new);
        l_i = l_i * correction + p;
        for (int i = 0; i < PER_LANE; ++i)
            acc[i] = acc[i] * correction + p * __half2float(v[(long)j * D + lane + 32 * i]);
        m_i = m_new;
"""
STAGE1_WRITE = "    for (int i = 0; i < PER_LANE; ++i) o[lane + 32 * i] = __float2half(acc[i] / l_i);\n"
STAGE2_COPY = """\
        __syncthreads();
        for (int idx = tid; idx < Bc * D; idx += blockDim.x) {
            const int j = idx / D, d = idx % D;
            k_s[j][d] = kv0 + j < S ? k[(long)(kv0 + j) * D + d] : __float2half(0.f);
            v_s[j][d] = kv0 + j < S ? v[(long)(kv0 + j) * D + d] : __float2half(0.f);
        }
        __syncthreads();
"""
STAGE2_ROW = """\
            float s = 0.f;
            for (int d = 0; d < D; ++d) s += q_s[warp * ROWS + r][d] * __half2float(k_s[lane][d]);
            m_i[r] = fmaxf(m_i[r], s);
"""
STAGE2_WRITE = """\
    for (int r = 0; r < ROWS; ++r) {
        const int row = row0 + warp * ROWS + r;
        if (row >= S) continue;
        for (int i = 0; i < PER_LANE; ++i) O[(bh * S + row) * D + lane + 32 * i] = __float2half(acc[r][i] / l_i[r]);
    }
"""


def after_block(source: str, label: str, code: str) -> str:
    """`code` inserted below the comment block that holds `label` (the label is kept)."""
    lines = source.splitlines(keepends=True)
    i = next(n for n, l in enumerate(lines) if label in l)
    while i + 1 < len(lines) and lines[i + 1].lstrip().startswith(("//", "#")) \
            and "TODO(" not in lines[i + 1] and "---" not in lines[i + 1]:
        i += 1
    return "".join(lines[:i + 1]) + code + "".join(lines[i + 1:])


def above_labels(source: str, label: str, code: str) -> str:
    """`code` inserted above the line that holds `label` (the student writes above the label)."""
    lines = source.splitlines(keepends=True)
    i = next(n for n, l in enumerate(lines) if label in l)
    return "".join(lines[:i]) + code + "".join(lines[i:])


def without_todo_comments(source: str) -> str:
    """The labels and their comment lines deleted, as a tidy student does."""
    out, in_todo = [], False
    for line in source.splitlines(keepends=True):
        stripped = line.strip()
        if stripped.startswith("// TODO("):
            in_todo = True
            continue
        if in_todo and stripped.startswith("//") and not stripped.startswith("// ---"):
            continue
        in_todo = False
        code, sep, comment = line.partition("// TODO(")
        out.append(code.rstrip() + "\n" if sep and code.strip() else line)
    return "".join(out)


def states(source: str, skeleton: str = SKELETON) -> dict[str, bool]:
    return {t.label: t.open for t in hints.todo_states(source, skeleton)}


def stage1_done(source: str = SKELETON) -> str:
    src = after_block(source, "TODO(1.3)", STAGE1_LOOP)
    return after_block(src, "TODO(1.4)", STAGE1_WRITE)


def stage2_done(source: str) -> str:
    src = source.replace("KERNEL_VERSION = 1;", "KERNEL_VERSION = 2;")
    src = after_block(src, "TODO(2.1)", STAGE2_COPY)
    src = after_block(src, "TODO(2.3)", STAGE2_ROW)
    return after_block(src, "TODO(2.5)", STAGE2_WRITE)


# ---------------------------------------------------------------- the skeleton and finished stages


def test_the_skeleton_has_every_todo_open_and_stage_3_is_optional():
    todos = hints.todo_states(SKELETON, SKELETON)
    assert [t.label for t in todos] == ["TODO(1.1)", "TODO(1.2)", "TODO(1.3)", "TODO(1.4)",
                                        "TODO(2.0)", "TODO(2.1)", "TODO(2.2)", "TODO(2.3)",
                                        "TODO(2.4)", "TODO(2.5)", "TODO(3.1)", "TODO(3.2)", "TODO(3.3)"]
    assert all(t.open for t in todos)
    assert {t.stage for t in todos if t.optional} == {3}
    assert hints.first_open_todo(SKELETON, SKELETON).startswith("TODO(1.1): the score s = ")


def test_the_installed_skeleton_is_found_for_each_track():
    assert hints.read_skeleton("cuda") == SKELETON and hints.read_skeleton("python") == TRITON
    assert hints.first_open_todo(SKELETON).startswith("TODO(1.1)")       # no skeleton passed
    assert hints.first_open_todo(TRITON).startswith("TODO(1.1): load the K tile")


def test_labels_kept_above_finished_code_are_not_open():
    finished = stage2_done(stage1_done())
    assert "TODO(1.1)" in finished and "TODO(2.5)" in finished   # every label is still there
    required = {k: v for k, v in states(finished).items() if not k.startswith("TODO(3")}
    assert not any(required.values()), required
    assert hints.first_open_todo(finished, SKELETON) is None


def test_finished_stages_are_never_called_open_whatever_the_labels():
    tidy = without_todo_comments(stage2_done(stage1_done()))
    assert not re.search(r"TODO\([12]\.", tidy)
    assert hints.first_open_todo(tidy, SKELETON) is None
    # the bundled example of stages 1 and 2, which has no labels and its own names
    assert hints.first_open_todo(TILED, SKELETON) is None
    text = hints.progress_hint(TILED, SKELETON)
    assert "No TODO of stages 1 and 2 is still on the skeleton's code" in text
    assert "open" not in text


def test_code_written_above_a_kept_label_counts():
    src = above_labels(SKELETON, "TODO(1.1)", STAGE1_LOOP)
    src = above_labels(src, "TODO(1.4)", STAGE1_WRITE)
    assert hints.first_open_todo(src, SKELETON).startswith("TODO(2.0): switch to 2")


def test_a_label_deleted_before_the_work_is_done_is_still_open():
    src = stage1_done().replace("// TODO(2.1): all threads copy", "// all threads copy")
    assert hints.first_open_todo(src, SKELETON).startswith("TODO(2.0)")
    src = src.replace("KERNEL_VERSION = 1;", "KERNEL_VERSION = 2;")
    assert hints.first_open_todo(src, SKELETON).startswith("TODO(2.1): all threads copy")


# ---------------------------------------------------------------- partial stages


def test_partial_stage_1_names_the_first_place_still_the_skeletons():
    src = after_block(SKELETON, "TODO(1.3)", STAGE1_LOOP)      # the loop, not the write
    assert states(src)["TODO(1.1)"] is False and states(src)["TODO(1.4)"] is True
    text = hints.progress_hint(src, SKELETON)
    assert text.startswith("Stage 1 has your code where TODO(1.1), TODO(1.2) and TODO(1.3) sit")
    assert text.endswith("is TODO(1.4): write o[lane + 32 i] = acc[i] / l_i as half (__float2half).")
    # the write without the loop: the loop's TODOs are the first open ones
    src = after_block(SKELETON, "TODO(1.4)", STAGE1_WRITE)
    assert states(src)["TODO(1.4)"] is False
    assert hints.first_open_todo(src, SKELETON).startswith("TODO(1.1)")


def test_partial_stage_2_in_order():
    src = stage1_done().replace("KERNEL_VERSION = 1;", "KERNEL_VERSION = 2;")
    src = after_block(src, "TODO(2.1)", STAGE2_COPY)
    s = states(src)
    assert not s["TODO(2.0)"] and not s["TODO(2.1)"]
    assert s["TODO(2.2)"] and s["TODO(2.3)"] and s["TODO(2.4)"] and s["TODO(2.5)"]
    assert hints.first_open_todo(src, SKELETON).startswith(
        "TODO(2.2): lane j computes the score of row warp * ROWS + r with key kv0 + j")
    # the rows' code (inside the loop over r) is 2.2/2.3's, not 2.1's: 2.1 stays open without its copy
    only_rows = after_block(stage1_done(), "TODO(2.3)", STAGE2_ROW)
    s = states(only_rows)
    assert s["TODO(2.1)"] and not s["TODO(2.2)"] and not s["TODO(2.3)"] and s["TODO(2.5)"]
    # the final write closes 2.4 and 2.5 and nothing else
    only_write = after_block(stage1_done(), "TODO(2.5)", STAGE2_WRITE)
    s = states(only_write)
    assert not s["TODO(2.4)"] and not s["TODO(2.5)"] and s["TODO(2.1)"] and s["TODO(2.2)"]
    assert not s["TODO(1.4)"]   # version 1's write, which looks the same, is a place of its own


def test_a_version_left_as_the_skeleton_while_a_later_one_is_written_is_skipped():
    src = stage2_done(SKELETON)          # straight to version 2; version 1 untouched
    assert states(src)["TODO(1.1)"] is True
    assert hints.first_open_todo(src, SKELETON) is None


# ---------------------------------------------------------------- the optional stage


def test_the_optional_stage_is_named_as_optional_never_as_open():
    finished = stage2_done(stage1_done())
    text = hints.progress_hint(finished, SKELETON)
    assert "Stage 3 is optional: if you want the speed, it starts at TODO(3.1): compute S = Q Kᵀ" in text
    assert "open" not in text
    # once stage 3 has code of the student's, it is not mentioned
    kernel3 = "template <int D>\n__global__ void attention_kernel3(const half* Q) { (void)Q; }\n"
    started = after_block(finished, "TODO(3.1)", "// " + "-" * 20 + "\n" + kernel3)
    assert states(started)["TODO(3.1)"] is False
    assert "Stage 3" not in hints.progress_hint(started, SKELETON)


def test_the_cpu_check_hint_never_calls_a_finished_stage_open():
    build = BuildResult(Status.PASS, "compile_only", 1.0)
    cases = [CaseResult("b1_h64_s1024_d128", Status.NOT_RUN, "not run: no CUDA device")]
    text = hints.hint_for(build, cases, stage2_done(stage1_done()))
    assert text.startswith("Correctness is not checked without a CUDA device. No TODO of stages 1 and 2")
    assert "TODO(3.1)" in text and "optional" in text
    text = hints.hint_for(build, cases, SKELETON)
    assert "The first TODO still on the skeleton's code is TODO(1.1): the score" in text


# ---------------------------------------------------------------- the Triton track


def test_triton_track_finished_partial_and_skeleton():
    loop = """\
        col_ok = cols < seq_len
        k = tl.load(K + base + cols[None, :] * HEAD_DIM + offs_d[:, None],
                    mask=col_ok[None, :], other=0.0)
        scores = tl.where(col_ok[None, :], tl.dot(q, k) * softmax_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + base + cols[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=col_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_new
"""
    write = ("    tl.store(O + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :],\n"
             "             (acc / l_i[:, None]).to(tl.float16), mask=row_ok)\n")
    assert all(states(TRITON, TRITON).values())
    # the loop written and `pass` deleted (as anyone would): 1.4 is still open
    partial = after_block(TRITON, "TODO(1.3)", loop).replace("        pass\n", "")
    s = states(partial, TRITON)
    assert s == {"TODO(1.1)": False, "TODO(1.2)": False, "TODO(1.3)": False, "TODO(1.4)": True}
    assert hints.first_open_todo(partial, TRITON) == (
        "TODO(1.4): divide acc by l_i and store it to O as float16, masking rows past seq_len.")
    finished = after_block(partial, "TODO(1.4)", write)
    assert not any(states(finished, TRITON).values())
    example = (ROOT / "examples" / "triton_flash" / "submission.py").read_text()
    assert hints.first_open_todo(example, TRITON) is None


def test_result_hints_name_the_tracks_own_todos():
    from grader.compare import Finding
    assert "TODO(2.4)" not in str(TRITON)   # the Triton skeleton has stage 1 only
    crash = [CaseResult("c", Status.RUNTIME_ERROR, "CUDA error: an illegal memory access")]
    assert "TODO(2.4)" in hints.hint_for(None, crash, SKELETON)
    text = hints.hint_for(None, crash, TRITON)
    assert "TODO(2.4)" not in text and "TODO(1.2)" in text
    assert Finding   # the result hints' findings are tested with the grader (test_grade_cpu)


# ---------------------------------------------------------------- quotes


def test_quotes_are_whole_sentences():
    text = ("First sentence, e.g. with an abbreviation and lane, lane + 32, ... an ellipsis. "
            "Second one here. Third.")
    assert hints.whole_sentences(text, 1000) == text
    assert hints.whole_sentences(text, 90) == ("First sentence, e.g. with an abbreviation and "
                                               "lane, lane + 32, ... an ellipsis.")
    assert hints.whole_sentences(text, 100) == text[:text.index(" Third")]
    assert hints.whole_sentences(text, 10).endswith("an ellipsis.")   # never cut inside one
    for todo in hints.todo_states(SKELETON, SKELETON) + hints.todo_states(TRITON, TRITON):
        quote = todo.quote()
        said = quote.split(": ", 1)[1]
        assert todo.text.startswith(said), quote                      # a prefix of the TODO ...
        assert said == todo.text or re.search(r"[.!?]$", said), quote  # ... ending a sentence
        assert "Let lane own elements" not in quote or quote.endswith("holds the total."), quote


def test_todo_text_is_the_whole_comment_block():
    todo = next(t for t in hints.todo_states(SKELETON, SKELETON) if t.label == "TODO(1.1)")
    assert todo.text.endswith("add the 32 partial sums with __shfl_xor_sync so every lane holds the total.")
    three = {t.label: t.text for t in hints.todo_states(SKELETON, SKELETON) if t.stage == 3}
    assert three["TODO(3.2)"] == "apply the online softmax to the accumulator fragments."


@pytest.mark.parametrize("source", ["", "int main() { return 0; }", "def custom_kernel(d):\n    return d[0]\n"])
def test_unrelated_sources_get_no_false_todo(source):
    # code that shares nothing with the skeleton has no place left that is the skeleton's
    assert hints.first_open_todo(source) is None
