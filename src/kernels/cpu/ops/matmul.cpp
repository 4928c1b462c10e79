// CPU kernel of matmul (graph/ops/matmul.cpp): OpenBLAS for f32 and f64, oneDNN for bf16.
#include "graph/ops/matmul.h"

#include "kernels/cpu/bf16_matmul.h"
#include "kernels/cpu/ops/families.h"

namespace meshtrain::kernels::cpu::ops {

void add_matmul_kernels(const AddKernel& add) {
  add("matmul", [](const KernelArgs& a) {
    const bool ta = a.attrs.get(attr::transpose_a), tb = a.attrs.get(attr::transpose_b);
    const graph::ops::MatmulDims d = graph::ops::matmul_dims(a.in[0]->shape(), a.in[1]->shape(), ta, tb);
    const int64_t b_stride = d.b_shared ? 0 : d.k * d.n;
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
}

}  // namespace meshtrain::kernels::cpu::ops
