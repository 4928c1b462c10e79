// Causal grouped-query attention on tensor cores for bf16 (mma.sync m16n8k16
// with f32 accumulators), forward and backward: what attention.cu launches
// for bf16 heads of up to 128 (a multiple of 8). Included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

namespace meshtrain::kernels::cuda::ops {

// One attention launch: sequence t (queries and keys, in position order),
// hq query heads over hkv key/value heads of size d, tensors [B, T, H, D].
struct AttentionShape {
  int t, hq, hkv, d;
  float scale;
};

// Whether the tensor-core kernels take heads of size d, each of `ptrs` 16-byte aligned.
bool tensor_cores_take(int64_t d, std::initializer_list<const void*> ptrs);

// out = softmax(scale Q K^T, causal) V and lse (f32, [B, Hq, T]) for b sequences.
void launch_attention_tensor_cores(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                                   __nv_bfloat16* out, float* lse, int64_t b, const AttentionShape& s,
                                   cudaStream_t stream);

// dq, dk, dv from the forward's lse and delta = rowsum(dO * O) (f32, [B, Hq, T]); deterministic (no atomics).
void launch_attention_backward_tensor_cores(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                                            const __nv_bfloat16* dout, const float* lse, const float* delta,
                                            __nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv, int64_t b,
                                            const AttentionShape& s, cudaStream_t stream);

}  // namespace meshtrain::kernels::cuda::ops
