// bf16 GEMM through oneDNN (native AVX512_BF16 kernels where the CPU has
// them): C = op(A) @ op(B) in bf16 with f32 accumulation, batched as
// kernels::cpu::matmul. Primitives are built once per shape and reused.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace meshtrain::kernels::cpu {

void matmul_bf16(const bfloat16* a, const bfloat16* b, bfloat16* c, int64_t batch, int64_t m, int64_t n, int64_t k,
                 bool transpose_a, bool transpose_b, int64_t a_stride, int64_t b_stride);

}  // namespace meshtrain::kernels::cpu
