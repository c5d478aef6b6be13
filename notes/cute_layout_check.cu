// Host-side check of examples/cute_flash's layout assumptions (no GPU: CuTe layouts are host code).
// Build and run (notes/tracks.md): nvcc -std=c++17 -O1 --expt-relaxed-constexpr -I "$(.venv/bin/python -c 'from grader import build; print(build.cutlass_include())')" notes/cute_layout_check.cu -o /tmp/cute_layout_check && /tmp/cute_layout_check
// rows_cols and as_a_operand are copies of the example's helpers: keep them in step.
#include <cstdio>
#include <vector>
#include <cute/tensor.hpp>
using namespace cute;
constexpr int NUM_WARPS = 4, Br = 64, Bc = 64;
using TiledMma = decltype(make_tiled_mma(SM80_16x8x16_F32F16F16F32_TN{},
                                         Layout<Shape<Int<NUM_WARPS>, _1, _1>>{},
                                         Tile<Int<16 * NUM_WARPS>, _16, _16>{}));
template <class L> auto rows_cols(L acc) {
    return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)), make_layout(get<0, 0>(acc), get<2>(acc)));
}
template <class L> auto as_a_operand(L acc) {
    auto split = logical_divide(acc, Shape<Underscore, Underscore, _2>{});
    return make_layout(make_layout(get<0>(split), get<2, 0>(split)), get<1>(split), get<2, 1>(split));
}
template <int D> int check() {
    int bad = 0;
    using SmemAtom = decltype(composition(Swizzle<3, 3, 3>{}, Layout<Shape<_8, _64>, Stride<_64, _1>>{}));
    using SmemLayoutKV = decltype(tile_to_shape(SmemAtom{}, Shape<Int<Bc>, Int<D>>{}));
    using SmemLayoutVt = decltype(composition(SmemLayoutKV{}, make_layout(Shape<Int<D>, Int<Bc>>{}, GenRowMajor{})));
    SmemLayoutKV kv; SmemLayoutVt vt;
    for (int j = 0; j < Bc; ++j) for (int d = 0; d < D; ++d) if (vt(d, j) != kv(j, d)) ++bad;
    // the swizzled layout is a bijection onto [0, Bc*D), and keeps 8-element chunks contiguous
    std::vector<int> seen(Bc * D, 0);
    for (int j = 0; j < Bc; ++j) for (int d = 0; d < D; ++d) { int o = kv(j, d); if (o < 0 || o >= Bc*D) ++bad; else seen[o]++; if (d % 8 && kv(j, d) != kv(j, d - 1) + 1) ++bad; }
    for (int x : seen) if (x != 1) ++bad;
    printf("D=%d smem layout checks: %d bad\n", D, bad);
    TiledMma mma;
    auto cS = make_identity_tensor(Shape<Int<Br>, Int<Bc>>{});
    auto cO = make_identity_tensor(Shape<Int<Br>, Int<D>>{});
    for (int t = 0; t < 128; ++t) {
        auto thr = mma.get_thread_slice(t);
        auto tScS = thr.partition_C(cS);       // GEMM1's C: (row, key)
        auto tOcP = thr.partition_A(cS);       // GEMM2's A: (row, key)
        auto as_a = make_tensor(tScS.data(), as_a_operand(tScS.layout()));
        if (size(as_a) != size(tOcP)) ++bad;
        if (size<1>(as_a) != size<1>(tOcP) || size<2>(as_a) != size<2>(tOcP)) ++bad;
        for (int i = 0; i < size(tOcP); ++i) if (as_a(i) != tOcP(i)) ++bad;
        // rows_cols: one row per mode-0 index; the row's 4 holders are lanes t^1, t^2, t^3
        auto rc = make_tensor(tScS.data(), rows_cols(tScS.layout()));
        for (int r = 0; r < size<0>(rc); ++r) for (int c = 0; c < size<1>(rc); ++c) {
            if (get<0>(rc(r, c)) != get<0>(rc(r, 0))) ++bad;
            int row = get<0>(rc(r, c));
            if (row / 16 != t / 32 || row % 8 != (t % 32) / 4) ++bad;
        }
        // every (row, key) of the tile is held by exactly one thread: counted below
        auto tOcO = thr.partition_C(cO);
        auto orc = make_tensor(tOcO.data(), rows_cols(tOcO.layout()));
        for (int r = 0; r < size<0>(orc); ++r) if (get<0>(orc(r, 0)) != get<0>(rc(r, 0))) ++bad;  // same rows in O and S
    }
    std::vector<int> held(Br * Bc, 0);
    for (int t = 0; t < 128; ++t) { auto tScS = mma.get_thread_slice(t).partition_C(cS); for (int i = 0; i < size(tScS); ++i) held[get<0>(tScS(i)) * Bc + get<1>(tScS(i))]++; }
    for (int x : held) if (x != 1) ++bad;
    printf("D=%d fragment checks: %d bad\n", D, bad);
    // the global -> shared copy: every (key, column) of a (Bc, D) tile moved by exactly one thread
    auto gmem_copy = make_tiled_copy(Copy_Atom<UniversalCopy<uint128_t>, cutlass::half_t>{},
                                     Layout<Shape<Int<16>, _8>, Stride<_8, _1>>{}, Layout<Shape<_1, _8>>{});
    std::vector<int> moved(Bc * D, 0);
    for (int t = 0; t < 128; ++t) {
        auto c = gmem_copy.get_thread_slice(t).partition_S(make_identity_tensor(Shape<Int<Bc>, Int<D>>{}));
        for (int i = 0; i < size(c); ++i) moved[get<0>(c(i)) * D + get<1>(c(i))]++;
    }
    int copy_bad = 0;
    for (int x : moved) if (x != 1) ++copy_bad;
    printf("D=%d copy coverage: %d bad\n", D, copy_bad);
    bad += copy_bad;
    // control: the A view with its two halves swapped must disagree (the check can fail)
    int control = 0;
    for (int t = 0; t < 128; ++t) {
        auto thr = mma.get_thread_slice(t);
        auto tScS = thr.partition_C(cS);
        auto split = logical_divide(tScS.layout(), Shape<Underscore, Underscore, _2>{});
        auto wrong = make_layout(make_layout(get<0>(split), get<2, 1>(split)), get<1>(split), get<2, 0>(split));
        auto w = make_tensor(tScS.data(), wrong);
        auto tOcP = thr.partition_A(cS);
        for (int i = 0; i < size(tOcP) && i < size(w); ++i) if (w(i) != tOcP(i)) ++control;
    }
    printf("D=%d control (a wrong A view): %d mismatches, must be > 0\n", D, control);
    if (control == 0) ++bad;
    return bad;
}
int main() { int bad = check<64>() + check<128>(); printf(bad ? "FAIL\n" : "OK\n"); return bad != 0; }
