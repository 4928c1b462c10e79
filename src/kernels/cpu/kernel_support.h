// Helpers shared by the CPU kernel files (not a public API): GEMM on
// row-major buffers (f32 through oneDNN, f64 through OpenBLAS), a vectorizable exp, per-thread scratch, and the size
// at which loops go parallel.
#pragma once

#include <cblas.h>
#include <dnnl.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/kernel_errors.h"

namespace meshtrain::kernels::cpu {

// The elementwise and row kernels are built twice, for x86-64-v3 (the
// build's target) and for x86-64-v4 (AVX-512), and the loader picks the
// clone that the CPU runs (GCC function multiversioning). Why AVX-512 only
// here and in bf16_dot.h: the note on GCC 12 in CMakeLists.txt.
// ThreadSanitizer builds (MESHTRAIN_TSAN) keep one build of each: the loader
// runs a clone's resolver before the TSan runtime is set up, and the
// instrumented resolver then crashes the program at load.
#if defined(__SANITIZE_THREAD__)
#define MESHTRAIN_AVX512_CLONES
#else
#define MESHTRAIN_AVX512_CLONES gnu::target_clones("default", "arch=x86-64-v4")
#endif

// Loops over elements or rows run on OpenMP threads once they are big
// enough to pay for it.
constexpr int64_t kParallelElements = 1 << 14;

// C (m x n) = or += op(A) op(B), row-major, rows lda, ldb and ldc elements
// apart. f32 runs on oneDNN's sgemm, which JITs for the CPU it finds
// (AVX-512 where there is one): Debian's OpenBLAS 0.3.21 takes a CPU it does
// not know (AMD Zen 5) for a Haswell and runs AVX2 kernels at half the speed
// (bench/gemm_peak). Inside a parallel region oneDNN runs on the calling
// thread only.
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                 int64_t ldb, float* c, int64_t ldc, bool acc) {
  const dnnl_status_t status =
      dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, acc ? 1.0f : 0.0f, c, ldc);
  if (status != dnnl_success) throw_gemm_failure(status, m, n, k);
}
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b,
                 int64_t ldb, double* c, int64_t ldc, bool acc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), 1.0, a, static_cast<int>(lda), b, static_cast<int>(ldb),
              acc ? 1.0 : 0.0, c, static_cast<int>(ldc));
}
// The same on contiguous operands.
template <typename A>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const A* a, const A* b, A* c, bool acc) {
  gemm(ta, tb, m, n, k, a, ta ? m : k, b, tb ? k : n, c, n, acc);
}

// exp for float, branch-free so that loops over it vectorize: Cephes' expf
// (range reduction by ln 2, degree-6 polynomial; within 2 ulp of std::exp).
// 0 below -87.3 (and for -inf), NaN stays NaN.
[[gnu::always_inline]] inline float exp_fast(float x) {
  const float clamped = x > -88.0f ? (x < 88.3762626647949f ? x : 88.3762626647949f) : -88.0f;  // NaN -> -88
  const float k = (clamped * 1.44269504088896341f + 12582912.0f) - 12582912.0f;                 // round to nearest
  const float r = (clamped - k * 0.693359375f) - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  const float result = p * std::bit_cast<float>(std::max(bits, 0));
  return x != x ? x : (x < -87.33654475f ? 0.0f : result);
}
[[gnu::always_inline]] inline float exp_of(float x) { return exp_fast(x); }
inline double exp_of(double x) { return std::exp(x); }

// The largest of init and x[0, n), as a chain of std::max would give (a NaN
// in x is passed over). Kept in independent lanes, which vectorize; an
// `omp simd reduction(max)` over std::max stays scalar without -ffast-math.
template <typename A>
[[gnu::always_inline]] inline A max_of(const A* x, int64_t n, A init) {
  constexpr int64_t kLanes = 16;
  A lanes[kLanes];
  std::fill(lanes, lanes + kLanes, init);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] = std::max(lanes[l], x[i + l]);
  for (; i < n; ++i) lanes[0] = std::max(lanes[0], x[i]);
  for (int64_t l = 1; l < kLanes; ++l) lanes[0] = std::max(lanes[0], lanes[l]);
  return lanes[0];
}

// Per-thread scratch of n elements in one of a few slots, grown on demand and
// kept, so a warm kernel allocates nothing.
template <typename A>
A* scratch(size_t n, int slot) {
  thread_local std::vector<A> buffers[12];
  auto& buf = buffers[slot];
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}
}  // namespace meshtrain::kernels::cpu
