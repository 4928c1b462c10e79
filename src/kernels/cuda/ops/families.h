// The CUDA kernels of the built-in op families, one file each under
// kernels/cuda/ops/ (the same families as graph/ops/ and kernels/cpu/ops/),
// and what they share: dtype dispatch, f32 loads and stores of bf16, launch
// checks. Included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "core/error.h"
#include "kernels/cuda/op_kernels.h"
#include "kernels/cuda/ops/registry.h"

namespace meshtrain::kernels::cuda::ops {

namespace attr = graph::attr;  // the typed attribute keys kernels read

// Throws meshtrain::Error naming the call and CUDA's message when `status` is not success.
void check_cuda(cudaError_t status, const char* what);
// After a launch: throws when the launch failed (bad configuration, no kernel image for this GPU).
inline void check_launch(const char* kernel) { check_cuda(cudaGetLastError(), kernel); }

inline cudaStream_t stream_of(const LaunchContext& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

// Blocks of `threads` covering n elements (at least one block), capped so
// that a grid-stride loop covers the rest.
inline unsigned blocks_for(int64_t n, int threads = 256) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

// Run fn with a value of the device type that stores a float dtype: float
// or __nv_bfloat16 (computed in f32 by the kernels, rounded once per output).
template <typename Fn>
void by_float_type(DType t, Fn&& fn) {
  if (t == DType::f32) return fn(float{});
  if (t == DType::bf16) return fn(__nv_bfloat16{});
  throw InvalidArgument(fmt::format("no CUDA kernel for dtype {} (the GPU computes in f32 and bf16)", dtype_name(t)));
}

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);  // round to nearest even, as the CPU's bfloat16
}

template <typename T>
T* out_ptr(const KernelArgs& a, size_t i = 0) {
  return static_cast<T*>(a.out[i]->raw());
}
template <typename T>
const T* in_ptr(const KernelArgs& a, size_t i) {
  return static_cast<const T*>(a.in[i]->raw());
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

// Rows and row length of a tensor reduced over its last dim.
inline std::pair<int64_t, int64_t> rows_of(const Tensor& t) {
  const int64_t d = t.shape().rank() ? t.shape().dim(-1) : 1;
  return {d ? t.numel() / d : 0, d};
}

// Scratch from the launch context, checked to be large enough.
template <typename T>
T* scratch_of(const LaunchContext& ctx, size_t count, const char* kernel) {
  const size_t bytes = count * sizeof(T);
  MT_CHECK(bytes <= ctx.scratch_bytes, "{}: needs {} bytes of scratch, the context has {}", kernel, bytes,
           ctx.scratch_bytes);
  return static_cast<T*>(ctx.scratch);
}

}  // namespace meshtrain::kernels::cuda::ops
