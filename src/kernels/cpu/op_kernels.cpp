#include "kernels/cpu/op_kernels.h"

#include <omp.h>
#include <sched.h>

#include <thread>

#include "core/error.h"
#include "core/name_registry.h"
#include "kernels/cpu/ops/families.h"

namespace meshtrain::kernels::cpu {

namespace {

// Never destroyed: executors hold pointers to its kernels past static destruction.
NameRegistry<CpuKernel>& table() {
  static auto* t = [] {
    auto* tab = new NameRegistry<CpuKernel>;
    for (auto add :
         {ops::add_elementwise_kernels, ops::add_matmul_kernels, ops::add_reduction_kernels, ops::add_shape_kernels,
          ops::add_embedding_kernels, ops::add_loss_kernels, ops::add_attention_kernels, ops::add_optimizer_kernels,
          ops::add_moe_kernels, ops::add_collective_kernels})
      add([&](const std::string& op, CpuKernel k) {  // built-in, before any register_cpu_kernel: a clash is ours
        const bool added = tab->add(op, std::move(k));
        MT_ASSERT(added, "built-in op '{}' has two CPU kernels", op);
      });
    return tab;
  }();
  return *t;
}

}  // namespace

const CpuKernel* find_cpu_kernel(const std::string& op) { return table().find(op); }

void register_cpu_kernel(const std::string& op, CpuKernel kernel) {
  MT_CHECK(static_cast<bool>(kernel), "register_cpu_kernel: empty kernel for op '{}'", op);
  MT_CHECK(table().add(op, std::move(kernel)), "register_cpu_kernel: op '{}' already has a CPU kernel", op);
}

void set_cpu_threads(int threads) {
  MT_CHECK(threads >= 1, "set_cpu_threads: {} threads; at least 1", threads);
  omp_set_num_threads(threads);
}

int cpu_threads() { return omp_get_max_threads(); }

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace meshtrain::kernels::cpu
