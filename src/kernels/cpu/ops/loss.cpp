// CPU kernels of cross_entropy (graph/ops/loss.cpp): the loss accumulates in Acc<T>.
#include "kernels/cpu/ops/families.h"

namespace meshtrain::kernels::cpu::ops {

void add_loss_kernels(const AddKernel& add) {
  add("cross_entropy", [](const KernelArgs& a) {
    const auto [rows, vocab] = rows_of(*a.in[0]);
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      *out_ptr<Acc<T>>(a) = static_cast<Acc<T>>(
          cross_entropy(in_ptr<T>(a, 0), in_ptr<int64_t>(a, 1), rows, vocab, a.attrs.get(attr::ignore_index)));
    });
  });
  add("cross_entropy_backward", [](const KernelArgs& a) {
    const auto [rows, vocab] = rows_of(*a.in[0]);
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      cross_entropy_backward(in_ptr<T>(a, 0), in_ptr<int64_t>(a, 1), *in_ptr<Acc<T>>(a, 2), out_ptr<T>(a), rows, vocab,
                             a.attrs.get(attr::ignore_index));
    });
  });
}

}  // namespace meshtrain::kernels::cpu::ops
