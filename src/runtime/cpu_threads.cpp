#include "runtime/cpu_threads.h"

#include <fmt/format.h>
#include <pthread.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "core/error.h"
#include "kernels/cpu/op_kernels.h"

namespace meshtrain::runtime {

namespace {
constexpr rlim_t kMinStack = rlim_t{1} << 20;   // oneDNN's kernel generation overflowed 128 KiB
constexpr rlim_t kGoodStack = rlim_t{8} << 20;  // Linux's usual default

std::string kib(rlim_t bytes) { return bytes == RLIM_INFINITY ? "unlimited" : fmt::format("{} KiB", bytes >> 10); }

// The main thread's stack grows to the soft limit as it is when it grows;
// threads started later get the default that pthread_setattr_default_np sets.
std::vector<std::string> fit_stack() {
  rlimit stack{};
  if (getrlimit(RLIMIT_STACK, &stack) != 0 || stack.rlim_cur == RLIM_INFINITY || stack.rlim_cur >= kMinStack) return {};
  MT_CHECK(stack.rlim_max == RLIM_INFINITY || stack.rlim_max >= kMinStack,
           "the stack limit is {} and cannot be raised past {} (ulimit -Hs): meshtrain's kernels need at least {}; "
           "run it where `ulimit -s 8192` is allowed",
           kib(stack.rlim_cur), kib(stack.rlim_max), kib(kMinStack));
  const rlim_t was = stack.rlim_cur;
  stack.rlim_cur = std::min(kGoodStack, stack.rlim_max);
  MT_CHECK(setrlimit(RLIMIT_STACK, &stack) == 0, "could not raise the stack limit from {} to {}", kib(was),
           kib(stack.rlim_cur));
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, stack.rlim_cur);
  pthread_setattr_default_np(&attr);
  pthread_attr_destroy(&attr);
  return {fmt::format("the stack limit (ulimit -s) was {}: raised to {}, as meshtrain's kernels need more than {}",
                      kib(was), kib(stack.rlim_cur), kib(kMinStack))};
}

std::vector<std::string> fit_threads() {
  const char* set = std::getenv("OMP_NUM_THREADS");
  const int cores = kernels::cpu::available_cores();
  if (set == nullptr || kernels::cpu::cpu_threads() <= cores) return {};
  kernels::cpu::set_cpu_threads(cores);
  return {fmt::format("OMP_NUM_THREADS={} is more kernel threads than the {} cores this process may use: {} it is", set,
                      cores, cores)};
}
// The cores one of `local_ranks` ranks on this host may use: its share of
// the host's, and no more than its affinity mask allows.
int cores_per_rank(int local_ranks) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, std::min(kernels::cpu::available_cores(), cores / std::max(1, local_ranks)));
}
}  // namespace

std::vector<std::string> fit_cpu_resources() {
  std::vector<std::string> notes = fit_stack();
  for (std::string& note : fit_threads()) notes.push_back(std::move(note));
  return notes;
}

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
