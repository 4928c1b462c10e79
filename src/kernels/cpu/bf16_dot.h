// Small bf16 GEMMs for the fused kernels (the attention blocks), on the
// AVX512_BF16 pair dot product (vdpbf16ps: two bf16 products summed into an
// f32 lane). oneDNN serves the large matmuls (bf16_matmul.h); blocks of 64
// rows are too small for its per-call cost.
//
// Operands travel as 32-bit words that each hold a bf16 pair along the
// reduction dimension k (k is padded to even with a zero):
// - A [m, k/2] words, row-major: a row's k values in order, two per word.
// - B "pair-packed" [k/2, n] words: word (p, j) holds B[2p, j] (low half) and
//   B[2p + 1, j] (high half). pack_pairs / pack_pairs_transposed build it.
#pragma once

#include <cstdint>

#include "core/dtype.h"

// Functions that run only where bf16_dot_enabled() carry this attribute, so
// that the compiler may use AVX-512 in them (and only there: the note on
// GCC 12 in CMakeLists.txt).
#define MESHTRAIN_AVX512_BF16 gnu::target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")

namespace meshtrain::kernels::cpu {

// True when this CPU has AVX512_BF16 and the bf16 dot path is switched on.
bool bf16_dot_enabled();
// Switch the bf16 dot path off (or back on, where the CPU has it), so that
// tests can compare it with the generic path; returns the previous setting.
bool set_bf16_dot_enabled(bool enabled);

// Packing, from bf16 or from f32 (rounded to bf16 on the way); an odd k is
// padded with zeros. Like the GEMM, these require bf16_dot_enabled().
// A = X for X [m, k] row-major (row stride ldx). dst: [m, ceil(k/2)].
template <typename S>
void pack_rows(const S* x, int64_t ldx, int64_t m, int64_t k, uint32_t* dst);
// A = X^T for X [k, m] row-major. dst: [m, ceil(k/2)].
template <typename S>
void pack_columns(const S* x, int64_t ldx, int64_t k, int64_t m, uint32_t* dst);
// B = X for X [k, n] row-major: rows 2p and 2p+1 interleaved. dst: [ceil(k/2), n].
template <typename S>
void pack_pairs(const S* x, int64_t ldx, int64_t k, int64_t n, uint32_t* dst);
// B = X^T for X [n, k] row-major. dst: [ceil(k/2), n].
template <typename S>
void pack_pairs_transposed(const S* x, int64_t ldx, int64_t n, int64_t k, uint32_t* dst);

// C [m, n] (f32, row stride ldc) = or += A B over k = 2 * pairs, A [m, pairs]
// words (row stride lda), B pair-packed [pairs, n] (row stride ldb).
// Requires bf16_dot_enabled().
void gemm_bf16_pairs(int64_t m, int64_t n, int64_t pairs, const uint32_t* a, int64_t lda, const uint32_t* b,
                     int64_t ldb, float* c, int64_t ldc, bool accumulate);

}  // namespace meshtrain::kernels::cpu
