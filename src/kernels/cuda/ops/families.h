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
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include "core/error.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/op_kernels.h"
#include "kernels/cuda/ops/registry.h"

namespace meshtrain::kernels::cuda::ops {

namespace attr = graph::attr;  // the typed attribute keys kernels read

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

// double <-> the element types: to double exactly (i64 rounded to nearest),
// from double rounded once as the CPU's Tensor::set (integers as its
// round_to_int: NaN -> 0, ties to even, saturating).
__device__ __forceinline__ double to_f64(float x) { return x; }
__device__ __forceinline__ double to_f64(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ double to_f64(int32_t x) { return static_cast<double>(x); }
__device__ __forceinline__ double to_f64(int64_t x) { return static_cast<double>(x); }
__device__ __forceinline__ double to_f64(double x) { return x; }
template <typename I>
__device__ __forceinline__ I round_to_int(double v) {
  if (isnan(v)) return 0;
  const double r = rint(v);
  constexpr I kMax = std::numeric_limits<I>::max(), kMin = std::numeric_limits<I>::min();
  if (r >= static_cast<double>(kMax)) return kMax;
  if (r <= static_cast<double>(kMin)) return kMin;
  return static_cast<I>(r);
}
template <typename D>
__device__ __forceinline__ D from_f64(double v);
template <>
__device__ __forceinline__ float from_f64<float>(double v) {
  return __double2float_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f64<__nv_bfloat16>(double v) {
  return __double2bfloat16(v);  // rounds to nearest even from double (no double rounding through f32)
}
template <>
__device__ __forceinline__ int32_t from_f64<int32_t>(double v) {
  return round_to_int<int32_t>(v);
}
template <>
__device__ __forceinline__ int64_t from_f64<int64_t>(double v) {
  return round_to_int<int64_t>(v);
}
template <>
__device__ __forceinline__ double from_f64<double>(double v) {
  return v;
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Runs launch(std::true_type) when rows of `row_length` T starting at each
// of ptrs are all 16-byte aligned (16-byte loads), else launch(std::false_type).
template <typename T, typename Launch>
void with_row_access(int64_t row_length, std::initializer_list<const void*> ptrs, Launch&& launch) {
  bool vec = row_length % static_cast<int64_t>(16 / sizeof(T)) == 0;
  for (const void* p : ptrs) vec = vec && aligned16(p);
  if (vec)
    launch(std::true_type{});
  else
    launch(std::false_type{});
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
