// The CPU kernels of the built-in op families, one file each under
// kernels/cpu/ops/ (the same families as graph/ops/), and what they share.
#pragma once

#include <functional>
#include <string>
#include <utility>

#include "core/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/op_kernels.h"

namespace meshtrain::kernels::cpu::ops {

namespace attr = graph::attr;  // the typed attribute keys kernels read

using AddKernel = std::function<void(const std::string& op, CpuKernel kernel)>;
void add_elementwise_kernels(const AddKernel& add);
void add_matmul_kernels(const AddKernel& add);
void add_reduction_kernels(const AddKernel& add);
void add_shape_kernels(const AddKernel& add);
void add_embedding_kernels(const AddKernel& add);
void add_loss_kernels(const AddKernel& add);
void add_attention_kernels(const AddKernel& add);
void add_optimizer_kernels(const AddKernel& add);
void add_moe_kernels(const AddKernel& add);
void add_collective_kernels(const AddKernel& add);  // the bucket ops

// Run fn with a value of the C++ type that stores a float dtype (bf16:
// bfloat16, computed in f32 by the kernels).
template <typename Fn>
void by_float_type(DType t, Fn&& fn) {
  if (t == DType::f32) return fn(float{});
  if (t == DType::f64) return fn(double{});
  if (t == DType::bf16) return fn(bfloat16{});
  throw InvalidArgument(fmt::format("no CPU kernel for dtype {}", dtype_name(t)));
}

}  // namespace meshtrain::kernels::cpu::ops
