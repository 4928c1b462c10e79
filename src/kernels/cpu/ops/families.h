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

// The part of a table (an embedding's rows, logits' vocabulary) a kernel's
// input holds: its first index and the whole extent (attrs `start` and
// `full_size`, set by lowering for a vocab-parallel part; else the whole).
struct TablePart {
  int64_t start = 0, total = 0;
};
inline TablePart table_part(const KernelArgs& a, int64_t local_extent) {
  return {a.attrs.get_or(attr::start, int64_t{0}), a.attrs.get_or(attr::full_size, local_extent)};
}

template <typename T>
T* out_ptr(const KernelArgs& a, size_t i = 0) {
  return static_cast<T*>(a.out[i]->raw());
}
template <typename T>
const T* in_ptr(const KernelArgs& a, size_t i) {
  return static_cast<const T*>(a.in[i]->raw());
}

// Rows and row length of a tensor reduced over its last dim.
inline std::pair<int64_t, int64_t> rows_of(const Tensor& t) {
  const int64_t d = t.shape().rank() ? t.shape().dim(-1) : 1;
  return {d ? t.numel() / d : 0, d};
}

}  // namespace meshtrain::kernels::cpu::ops
