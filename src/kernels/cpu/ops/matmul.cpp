// CPU kernels of matmul and rows_matmul (graph/ops/matmul.cpp): OpenBLAS for f32 and f64, oneDNN for bf16.
#include "graph/ops/matmul.h"

#include <cstring>

#include "kernels/cpu/bf16_matmul.h"
#include "kernels/cpu/ops/families.h"

namespace meshtrain::kernels::cpu::ops {

void add_matmul_kernels(const AddKernel& add) {
  add("matmul", [](const KernelArgs& a) {
    const bool ta = a.attrs.get(attr::transpose_a), tb = a.attrs.get(attr::transpose_b);
    const graph::ops::MatmulDims d = graph::ops::matmul_dims(a.in[0]->shape(), a.in[1]->shape(), ta, tb);
    const int64_t b_stride = d.b_shared ? 0 : d.k * d.n;
    if (d.k == 0) {  // an empty sum (a shard of no rows of the contracted dim): zeros, which a GEMM need not write
      std::memset(a.out[0]->raw(), 0, a.out[0]->nbytes());
      return;
    }
    switch (a.in[0]->dtype()) {
      case DType::bf16:
        return matmul_bf16(in_ptr<bfloat16>(a, 0), in_ptr<bfloat16>(a, 1), out_ptr<bfloat16>(a), d.batch, d.m, d.n, d.k,
                           ta, tb, d.m * d.k, b_stride);
      case DType::f32:
        return matmul(in_ptr<float>(a, 0), in_ptr<float>(a, 1), out_ptr<float>(a), d.batch, d.m, d.n, d.k, ta, tb,
                      d.m * d.k, b_stride);
      case DType::f64:
        return matmul(in_ptr<double>(a, 0), in_ptr<double>(a, 1), out_ptr<double>(a), d.batch, d.m, d.n, d.k, ta, tb,
                      d.m * d.k, b_stride);
      default:
        // matmul's shape rule admits f32, f64 and bf16 only (check_float), A and B alike.
        MT_ASSERT(false, "no CPU GEMM for dtype {}", dtype_name(a.in[0]->dtype()));
    }
  });
  add("rows_matmul", [](const KernelArgs& a) {  // x^T y over every row: one GEMM with transpose_a
    const int64_t p = a.in[0]->shape().dim(-1), q = a.in[1]->shape().dim(-1);
    const int64_t rows = p > 0 ? a.in[0]->numel() / p : 0;
    if (rows == 0) {  // an empty shard's sum: zeros (a GEMM over no rows need not write them)
      std::memset(a.out[0]->raw(), 0, a.out[0]->nbytes());
      return;
    }
    switch (a.in[0]->dtype()) {
      case DType::bf16:
        return matmul_bf16(in_ptr<bfloat16>(a, 0), in_ptr<bfloat16>(a, 1), out_ptr<bfloat16>(a), 1, p, q, rows, true,
                           false, 0, 0);
      case DType::f32:
        return matmul(in_ptr<float>(a, 0), in_ptr<float>(a, 1), out_ptr<float>(a), 1, p, q, rows, true, false, 0, 0);
      case DType::f64:
        return matmul(in_ptr<double>(a, 0), in_ptr<double>(a, 1), out_ptr<double>(a), 1, p, q, rows, true, false, 0, 0);
      default:
        MT_ASSERT(false, "no CPU GEMM for dtype {}", dtype_name(a.in[0]->dtype()));
    }
  });
}

}  // namespace meshtrain::kernels::cpu::ops
