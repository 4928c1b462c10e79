// How the built-in CUDA kernel families attach to ops (plain C++: the
// registry in op_kernels.cpp includes it; the .cu files through families.h).
#pragma once

#include <functional>
#include <string>

#include "kernels/cuda/op_kernels.h"

namespace meshtrain::kernels::cuda::ops {

using AddKernel = std::function<void(const std::string& op, CudaKernel kernel)>;
void add_elementwise_kernels(const AddKernel& add);
void add_matmul_kernels(const AddKernel& add);
void add_reduction_kernels(const AddKernel& add);
void add_shape_kernels(const AddKernel& add);
void add_embedding_kernels(const AddKernel& add);
void add_loss_kernels(const AddKernel& add);
void add_attention_kernels(const AddKernel& add);
void add_optimizer_kernels(const AddKernel& add);
void add_collective_kernels(const AddKernel& add);  // the bucket ops

inline void add_builtin_kernels(const AddKernel& add) {
  for (auto family :
       {add_elementwise_kernels, add_matmul_kernels, add_reduction_kernels, add_shape_kernels, add_embedding_kernels,
        add_loss_kernels, add_attention_kernels, add_optimizer_kernels, add_collective_kernels})
    family(add);
}

}  // namespace meshtrain::kernels::cuda::ops
