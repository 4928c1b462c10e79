#include "kernels/cpu/bf16_dot.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <type_traits>

#include "core/error.h"

namespace meshtrain::kernels::cpu {

namespace {
bool cpu_has_bf16_dot() {  // every ISA that MESHTRAIN_AVX512_BF16 names
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bf16");
}
std::atomic<bool> g_enabled{cpu_has_bf16_dot()};

// One tile: ROWS rows of C against up to 32 columns (two 16-lane vectors,
// masked at the edge), accumulated in registers over all pairs of k.
template <int ROWS>
[[MESHTRAIN_AVX512_BF16]] void tile(int64_t pairs, const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb,
                                    float* c, int64_t ldc, __mmask16 lo, __mmask16 hi, bool accumulate) {
  __m512 acc[ROWS][2];
#pragma GCC unroll 8
  for (int r = 0; r < ROWS; ++r) {
    acc[r][0] = accumulate ? _mm512_maskz_loadu_ps(lo, c + r * ldc) : _mm512_setzero_ps();
    acc[r][1] = accumulate ? _mm512_maskz_loadu_ps(hi, c + r * ldc + 16) : _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < pairs; ++p) {
    const auto b0 = (__m512bh)_mm512_maskz_loadu_epi32(lo, b + p * ldb);
    const auto b1 = (__m512bh)_mm512_maskz_loadu_epi32(hi, b + p * ldb + 16);
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; ++r) {
      const auto ar = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r * lda + p]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], ar, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], ar, b1);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < ROWS; ++r) {
    _mm512_mask_storeu_ps(c + r * ldc, lo, acc[r][0]);
    _mm512_mask_storeu_ps(c + r * ldc + 16, hi, acc[r][1]);
  }
}

using TileFn = void (*)(int64_t, const uint32_t*, int64_t, const uint32_t*, int64_t, float*, int64_t, __mmask16,
                        __mmask16, bool);
constexpr int kTileRows = 8;
constexpr TileFn kTiles[kTileRows + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>,
                                          tile<5>, tile<6>, tile<7>, tile<8>};

__mmask16 lane_mask(int64_t lanes) {
  return lanes >= 16 ? __mmask16(0xffff) : lanes <= 0 ? __mmask16(0) : __mmask16((1u << lanes) - 1);
}
}  // namespace

bool bf16_dot_enabled() { return g_enabled.load(std::memory_order_relaxed); }
bool set_bf16_dot_enabled(bool enabled) { return g_enabled.exchange(enabled && cpu_has_bf16_dot()); }

namespace {
uint32_t bits(bfloat16 x) { return static_cast<uint16_t>(x); }
uint32_t bits(float x) { return bits(f32_to_bf16(x)); }
uint32_t pair_word(uint32_t low, uint32_t high) { return low | high << 16; }

// From f32, 16 values at a time with the CPU's own rounding (vcvtneps2bf16:
// to nearest even, NaN stays NaN; unlike f32_to_bf16 it flushes f32
// subnormals to zero), each bf16 in the low half of a 32-bit lane.
[[MESHTRAIN_AVX512_BF16]] __m512i bf16_lanes(const float* x, __mmask16 lanes) {
  return _mm512_maskz_cvtepu16_epi32(lanes, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(lanes, x)));
}

[[MESHTRAIN_AVX512_BF16]] void pack_rows_f32(const float* x, int64_t ldx, int64_t m, int64_t k, uint32_t* dst) {
  const int64_t pairs = (k + 1) / 2;
  for (int64_t i = 0; i < m; ++i) {
    auto* out = reinterpret_cast<__m256i*>(dst + i * pairs);  // a row of words is its k bf16 in order
    for (int64_t j = 0; j < k; j += 16) {
      const __mmask16 lanes = lane_mask(k - j);
      _mm256_mask_storeu_epi16(reinterpret_cast<char*>(out) + 2 * j, lanes,
                               (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(lanes, x + i * ldx + j)));
    }
    if (k % 2) dst[i * pairs + k / 2] &= 0xffffu;  // the pad
  }
}

[[MESHTRAIN_AVX512_BF16]] void pack_pairs_f32(const float* x, int64_t ldx, int64_t k, int64_t n, uint32_t* dst) {
  for (int64_t p = 0; p < (k + 1) / 2; ++p) {
    const float* even = x + 2 * p * ldx;
    const float* odd = 2 * p + 1 < k ? even + ldx : nullptr;
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 lanes = lane_mask(n - j);
      __m512i words = bf16_lanes(even + j, lanes);
      if (odd) words = _mm512_or_si512(words, _mm512_maskz_slli_epi32(lanes, bf16_lanes(odd + j, lanes), 16));
      _mm512_mask_storeu_epi32(dst + p * n + j, lanes, words);
    }
  }
}
}  // namespace

template <typename S>
void pack_rows(const S* x, int64_t ldx, int64_t m, int64_t k, uint32_t* dst) {
  if constexpr (std::is_same_v<S, float>) return pack_rows_f32(x, ldx, m, k, dst);
  if constexpr (std::is_same_v<S, bfloat16>)
    if (k % 2 == 0) {  // a bf16 row of even length already is its words
      for (int64_t i = 0; i < m; ++i) std::memcpy(dst + i * k / 2, x + i * ldx, static_cast<size_t>(k) * sizeof(S));
      return;
    }
  const int64_t full = k / 2, pairs = (k + 1) / 2;
  for (int64_t i = 0; i < m; ++i) {
    const S* row = x + i * ldx;
    uint32_t* out = dst + i * pairs;
    for (int64_t p = 0; p < full; ++p) out[p] = pair_word(bits(row[2 * p]), bits(row[2 * p + 1]));
    if (k % 2) out[full] = bits(row[k - 1]);
  }
}

template <typename S>
void pack_columns(const S* x, int64_t ldx, int64_t k, int64_t m, uint32_t* dst) {
  const int64_t pairs = (k + 1) / 2;
  for (int64_t p = 0; p < pairs; ++p) {
    const S* even = x + 2 * p * ldx;
    if (2 * p + 1 < k) {
      const S* odd = even + ldx;
      for (int64_t i = 0; i < m; ++i) dst[i * pairs + p] = pair_word(bits(even[i]), bits(odd[i]));
    } else {
      for (int64_t i = 0; i < m; ++i) dst[i * pairs + p] = bits(even[i]);
    }
  }
}

template <typename S>
void pack_pairs(const S* x, int64_t ldx, int64_t k, int64_t n, uint32_t* dst) {
  if constexpr (std::is_same_v<S, float>) return pack_pairs_f32(x, ldx, k, n, dst);
  for (int64_t p = 0; p < k / 2; ++p) {
    const S* even = x + 2 * p * ldx;
    const S* odd = even + ldx;
    uint32_t* out = dst + p * n;
    for (int64_t j = 0; j < n; ++j) out[j] = pair_word(bits(even[j]), bits(odd[j]));
  }
  if (k % 2) {
    const S* last = x + (k - 1) * ldx;
    uint32_t* out = dst + (k / 2) * n;
    for (int64_t j = 0; j < n; ++j) out[j] = bits(last[j]);
  }
}

template <typename S>
void pack_pairs_transposed(const S* x, int64_t ldx, int64_t n, int64_t k, uint32_t* dst) {
  const int64_t full = k / 2;
  for (int64_t j = 0; j < n; ++j) {
    const S* row = x + j * ldx;
    for (int64_t p = 0; p < full; ++p) dst[p * n + j] = pair_word(bits(row[2 * p]), bits(row[2 * p + 1]));
    if (k % 2) dst[full * n + j] = bits(row[k - 1]);
  }
}

#define MESHTRAIN_INSTANTIATE(S)                                                 \
  template void pack_rows<S>(const S*, int64_t, int64_t, int64_t, uint32_t*);    \
  template void pack_columns<S>(const S*, int64_t, int64_t, int64_t, uint32_t*); \
  template void pack_pairs<S>(const S*, int64_t, int64_t, int64_t, uint32_t*);   \
  template void pack_pairs_transposed<S>(const S*, int64_t, int64_t, int64_t, uint32_t*);
MESHTRAIN_INSTANTIATE(bfloat16)
MESHTRAIN_INSTANTIATE(float)
#undef MESHTRAIN_INSTANTIATE

void gemm_bf16_pairs(int64_t m, int64_t n, int64_t pairs, const uint32_t* a, int64_t lda, const uint32_t* b,
                     int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  MT_CHECK(bf16_dot_enabled(), "gemm_bf16_pairs: this CPU has no AVX512_BF16 (or the path is switched off)");
  for (int64_t i = 0; i < m; i += kTileRows) {
    const TileFn fn = kTiles[std::min<int64_t>(kTileRows, m - i)];
    for (int64_t j = 0; j < n; j += 32)
      fn(pairs, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc, lane_mask(n - j), lane_mask(n - j - 16),
         accumulate);
  }
}

}  // namespace meshtrain::kernels::cpu
