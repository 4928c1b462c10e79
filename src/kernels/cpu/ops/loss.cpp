// CPU kernels of the loss ops (graph/ops/loss.cpp): the loss accumulates in double.
#include "kernels/cpu/ops/families.h"

namespace meshtrain::kernels::cpu::ops {

void add_loss_kernels(const AddKernel& add) {
  add("count_valid", [](const KernelArgs& a) {
    const int64_t ignore = a.attrs.get(attr::ignore_index), n = a.in[0]->numel();
    const int64_t* targets = in_ptr<int64_t>(a, 0);
    int64_t counted = 0;
    for (int64_t i = 0; i < n; ++i) counted += targets[i] != ignore;
    a.out[0]->set(0, static_cast<double>(counted));
  });
  // The sum over this part's rows divided by the count of the whole batch's.
  auto per_token = [](const KernelArgs& a, size_t count_input) {
    const double count = a.in[count_input]->get(0);
    return count > 0 ? 1.0 / count : 0.0;
  };
  add("cross_entropy", [per_token](const KernelArgs& a) {
    const auto [rows, vocab] = rows_of(*a.in[0]);
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      *out_ptr<Acc<T>>(a) = static_cast<Acc<T>>(
          cross_entropy(in_ptr<T>(a, 0), in_ptr<int64_t>(a, 1), rows, vocab, a.attrs.get(attr::ignore_index)) *
          per_token(a, 2));
    });
  });
  add("cross_entropy_backward", [per_token](const KernelArgs& a) {
    const auto [rows, vocab] = rows_of(*a.in[0]);
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      cross_entropy_backward(in_ptr<T>(a, 0), in_ptr<int64_t>(a, 1), *in_ptr<Acc<T>>(a, 2) * per_token(a, 3),
                             out_ptr<T>(a), rows, vocab, a.attrs.get(attr::ignore_index));
    });
  });
}

}  // namespace meshtrain::kernels::cpu::ops
