// The machine's GEMM peak as meshtrain sees it: the best of a few large f32
// GEMMs (2048^3) through the same OpenBLAS, in GFLOP/s. Used by bench/train.sh.
#include <chrono>
#include <cstdio>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

int main() {
  const int64_t n = 2048;
  std::vector<float> a(static_cast<size_t>(n * n), 0.5f), b(a), c(a.size());
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    meshtrain::kernels::cpu::matmul(a.data(), b.data(), c.data(), 1, n, n, n, false, false, 0, 0);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n / s / 1e9);
  }
  std::printf("%.1f\n", best);
  return 0;
}
