// The machine's GEMM peak as meshtrain sees it: the best of a few large
// GEMMs (2048^3) in GFLOP/s, through the same library a training step uses,
// oneDNN, for f32 (`gemm_peak` or `gemm_peak float32`) and bf16
// (`gemm_peak bfloat16`). Used by bench/train.sh, which also asks it for the
// core type OpenBLAS (PyTorch's f32 GEMM) picks here (`gemm_peak --blas-core`).
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/bf16_matmul.h"
#include "kernels/cpu/cpu_kernels.h"

namespace {
template <typename T, typename Gemm>
double best_gflops(int64_t n, T fill, Gemm gemm) {
  std::vector<T> a(static_cast<size_t>(n * n), fill), b(a), c(a.size());
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    gemm(a.data(), b.data(), c.data());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * static_cast<double>(n * n * n) / s / 1e9);
  }
  return best;
}
}  // namespace

extern "C" char* openblas_get_corename(void);  // OpenBLAS's own extension, not in every cblas.h

int main(int argc, char** argv) {
  const std::string dtype = argc > 1 ? argv[1] : "float32";
  const int64_t n = 2048;
  namespace k = meshtrain::kernels::cpu;
  if (dtype == "--blas-core") {
    std::printf("%s\n", openblas_get_corename());
  } else if (dtype == "bfloat16") {
    std::printf("%.1f\n",
                best_gflops<meshtrain::bfloat16>(n, meshtrain::f32_to_bf16(0.5f), [&](auto* a, auto* b, auto* c) {
                  k::matmul_bf16(a, b, c, 1, n, n, n, false, false, 0, 0);
                }));
  } else if (dtype == "float32") {
    std::printf("%.1f\n", best_gflops<float>(n, 0.5f, [&](auto* a, auto* b, auto* c) {
                  k::matmul(a, b, c, 1, n, n, n, false, false, 0, 0);
                }));
  } else {
    std::fprintf(stderr, "gemm_peak: unknown dtype '%s'; use float32, bfloat16 or --blas-core\n", dtype.c_str());
    return 2;
  }
  return 0;
}
