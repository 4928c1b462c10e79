// CPU kernels of rope and attention (graph/ops/attention.cpp); the attention
// loops themselves are in kernels/cpu/attention.cpp.
#include "kernels/cpu/ops/families.h"

namespace meshtrain::kernels::cpu::ops {

void add_attention_kernels(const AddKernel& add) {
  add("rope", [](const KernelArgs& a) {
    const auto& s = a.in[0]->shape();
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      rope(in_ptr<T>(a, 0), out_ptr<T>(a), s[0], s[1], s[2], s[3], a.attrs.get(attr::theta),
           a.attrs.get(attr::inverse));
    });
  });
  add("attention", [](const KernelArgs& a) {
    const auto& q = a.in[0]->shape();
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      attention(in_ptr<T>(a, 0), in_ptr<T>(a, 1), in_ptr<T>(a, 2), out_ptr<T>(a, 0), out_ptr<Acc<T>>(a, 1), q[0], q[1],
                q[2], a.in[1]->shape()[2], q[3], a.attrs.get(attr::scale));
    });
  });
  add("attention_backward", [](const KernelArgs& a) {
    const auto& q = a.in[0]->shape();
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      attention_backward(in_ptr<T>(a, 0), in_ptr<T>(a, 1), in_ptr<T>(a, 2), in_ptr<T>(a, 3), in_ptr<Acc<T>>(a, 4),
                         in_ptr<T>(a, 5), out_ptr<T>(a, 0), out_ptr<T>(a, 1), out_ptr<T>(a, 2), q[0], q[1], q[2],
                         a.in[1]->shape()[2], q[3], a.attrs.get(attr::scale));
    });
  });
}

}  // namespace meshtrain::kernels::cpu::ops
