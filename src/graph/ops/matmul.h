// matmul's operand geometry, shared by its definition and its kernels.
#pragma once

#include "core/shape.h"

namespace meshtrain::graph::ops {

// C = op(A) op(B) over a batch: A [..., M, K] (transpose_a: [..., K, M]) and
// B [K, N] shared over the batch or [..., K, N] (transpose_b: [N, K] / [..., N, K]).
struct MatmulDims {
  int64_t batch, m, n, k;
  bool b_shared;
};
MatmulDims matmul_dims(const Shape& a, const Shape& b, bool transpose_a, bool transpose_b);

}  // namespace meshtrain::graph::ops
