#include "runtime/cpu_threads.h"

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "kernels/cpu/op_kernels.h"

namespace meshtrain::runtime {

namespace {
// The cores one of `local_ranks` ranks on this host may use: its share of
// the host's, and no more than its affinity mask allows.
int cores_per_rank(int local_ranks) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, std::min(kernels::cpu::available_cores(), cores / std::max(1, local_ranks)));
}
}  // namespace

bool spare_core_for_progress(int threads, int local_ranks) { return threads < cores_per_rank(local_ranks); }

int set_threads_per_rank(int local_ranks) {
  if (const char* set = std::getenv("OMP_NUM_THREADS"); set != nullptr && *set != '\0')
    return kernels::cpu::cpu_threads();
  const int threads = cores_per_rank(local_ranks);
  kernels::cpu::set_cpu_threads(threads);
  return threads;
}

double shared_core_slowdown(int local_ranks) {
  const int cores =
      std::min(kernels::cpu::available_cores(), static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  return std::max(1.0, static_cast<double>(local_ranks) * kernels::cpu::cpu_threads() / std::max(1, cores));
}

}  // namespace meshtrain::runtime
