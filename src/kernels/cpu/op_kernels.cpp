#include "kernels/cpu/op_kernels.h"

#include <map>
#include <mutex>

#include "core/error.h"
#include "kernels/cpu/ops/families.h"

namespace meshtrain::kernels::cpu {

namespace {

struct KernelTable {
  std::mutex mu;
  std::map<std::string, CpuKernel> kernels;  // node-based: pointers stay valid as kernels are added
};

KernelTable& table() {
  static KernelTable* t = [] {
    auto* tab = new KernelTable;  // never destroyed: executors hold pointers into it
    for (auto add : {ops::add_elementwise_kernels, ops::add_matmul_kernels, ops::add_reduction_kernels,
                     ops::add_shape_kernels, ops::add_embedding_kernels, ops::add_loss_kernels,
                     ops::add_attention_kernels, ops::add_optimizer_kernels})
      add([&](const std::string& op, CpuKernel k) {
        MT_CHECK(tab->kernels.emplace(op, std::move(k)).second, "op '{}' has two CPU kernels", op);
      });
    return tab;
  }();
  return *t;
}

}  // namespace

const CpuKernel* find_cpu_kernel(const std::string& op) {
  KernelTable& t = table();
  std::lock_guard lock(t.mu);
  auto it = t.kernels.find(op);
  return it == t.kernels.end() ? nullptr : &it->second;
}

void register_cpu_kernel(const std::string& op, CpuKernel kernel) {
  MT_CHECK(static_cast<bool>(kernel), "register_cpu_kernel: empty kernel for op '{}'", op);
  KernelTable& t = table();
  std::lock_guard lock(t.mu);
  MT_CHECK(t.kernels.emplace(op, std::move(kernel)).second, "register_cpu_kernel: op '{}' already has a CPU kernel", op);
}

}  // namespace meshtrain::kernels::cpu
