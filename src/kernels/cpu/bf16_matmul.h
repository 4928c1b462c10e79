// bf16 GEMM through oneDNN (native AVX512_BF16 kernels where the CPU has
// them): C = op(A) @ op(B) in bf16 with f32 accumulation, batched as
// kernels::cpu::matmul. Primitives are built once per shape and reused. On a
// CPU without AVX-512 oneDNN has no bf16 kernel: matmul_bf16 runs
// matmul_bf16_widened there.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace meshtrain::kernels::cpu {

void matmul_bf16(const bfloat16* a, const bfloat16* b, bfloat16* c, int64_t batch, int64_t m, int64_t n, int64_t k,
                 bool transpose_a, bool transpose_b, int64_t a_stride, int64_t b_stride);

// The same on any CPU: each matrix widened to f32 (exact), the f32 GEMM, the
// result rounded to bf16 once (as oneDNN's kernels accumulate in f32 and
// round once).
void matmul_bf16_widened(const bfloat16* a, const bfloat16* b, bfloat16* c, int64_t batch, int64_t m, int64_t n,
                         int64_t k, bool transpose_a, bool transpose_b, int64_t a_stride, int64_t b_stride);

}  // namespace meshtrain::kernels::cpu
