#include "kernels/cuda/op_kernels.h"

#include "core/error.h"
#include "core/name_registry.h"
#include "kernels/cuda/ops/registry.h"

namespace meshtrain::kernels::cuda {

namespace {

// Never destroyed: executors hold pointers to its kernels past static destruction.
NameRegistry<CudaKernel>& table() {
  static auto* t = [] {
    auto* tab = new NameRegistry<CudaKernel>;
    ops::add_builtin_kernels([&](const std::string& op, CudaKernel k) {
      const bool added = tab->add(op, std::move(k));
      MT_ASSERT(added, "built-in op '{}' has two CUDA kernels", op);
    });
    return tab;
  }();
  return *t;
}

}  // namespace

const CudaKernel* find_cuda_kernel(const std::string& op) { return table().find(op); }

void register_cuda_kernel(const std::string& op, CudaKernel kernel) {
  MT_CHECK(static_cast<bool>(kernel), "register_cuda_kernel: empty kernel for op '{}'", op);
  MT_CHECK(table().add(op, std::move(kernel)), "register_cuda_kernel: op '{}' already has a CUDA kernel", op);
}

}  // namespace meshtrain::kernels::cuda
