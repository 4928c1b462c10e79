// CPU kernels of embedding (graph/ops/embedding.cpp).
#include "kernels/cpu/ops/families.h"

namespace meshtrain::kernels::cpu::ops {

void add_embedding_kernels(const AddKernel& add) {
  add("embedding", [](const KernelArgs& a) {
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      const int64_t rows = a.in[0]->shape().dim(0);
      const TablePart part = table_part(a, rows);
      embedding(in_ptr<T>(a, 0), in_ptr<int64_t>(a, 1), out_ptr<T>(a), a.in[1]->numel(), rows, a.in[0]->shape().dim(1),
                part.start, part.total);
    });
  });
  add("embedding_backward", [](const KernelArgs& a) {
    by_float_type(a.in[1]->dtype(), [&](auto z) {
      using T = decltype(z);
      embedding_backward(in_ptr<int64_t>(a, 0), in_ptr<T>(a, 1), out_ptr<T>(a), a.in[0]->numel(),
                         a.out[0]->shape().dim(0), a.out[0]->shape().dim(1), table_part(a, 0).start);
    });
  });
}

}  // namespace meshtrain::kernels::cpu::ops
