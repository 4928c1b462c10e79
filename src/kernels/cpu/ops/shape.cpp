// CPU kernels of the shape ops (graph/ops/shape.cpp); reshape is a view and has none.
#include <cstring>

#include "kernels/cpu/ops/families.h"

namespace meshtrain::kernels::cpu::ops {

void add_shape_kernels(const AddKernel& add) {
  add("transpose", [](const KernelArgs& a) {
    const auto& dims = a.in[0]->shape().dims();
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      transpose(in_ptr<T>(a, 0), out_ptr<T>(a), dims.data(), static_cast<int>(dims.size()),
                static_cast<int>(a.attrs.get(attr::dim0)), static_cast<int>(a.attrs.get(attr::dim1)));
    });
  });
  add("slice", [](const KernelArgs& a) {  // float values, or i64 ids (a microbatch of tokens)
    const AroundDim s = around_dim(a.in[0]->shape(), static_cast<size_t>(a.attrs.get(attr::dim)));
    const int64_t length = a.attrs.get(attr::length), start = a.attrs.get(attr::start);
    if (a.in[0]->dtype() == DType::i64)
      return copy_slice(in_ptr<int64_t>(a, 0), out_ptr<int64_t>(a), s.outer, s.dim, length, start, 0, length, s.inner);
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      copy_slice(in_ptr<T>(a, 0), out_ptr<T>(a), s.outer, s.dim, length, start, 0, length, s.inner);
    });
  });
  add("slice_backward", [](const KernelArgs& a) {
    const AroundDim s = around_dim(a.in[0]->shape(), static_cast<size_t>(a.attrs.get(attr::dim)));
    std::memset(a.out[0]->raw(), 0, a.out[0]->nbytes());
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      copy_slice(in_ptr<T>(a, 0), out_ptr<T>(a), s.outer, s.dim, a.attrs.get(attr::full_size), 0,
                 a.attrs.get(attr::start), s.dim, s.inner);
    });
  });
  add("concat", [](const KernelArgs& a) {
    const auto d = static_cast<size_t>(a.attrs.get(attr::dim));
    const AroundDim o = around_dim(a.out[0]->shape(), d);
    int64_t start = 0;
    for (const Tensor* x : a.in) {
      const AroundDim s = around_dim(x->shape(), d);
      by_float_type(x->dtype(), [&](auto z) {
        using T = decltype(z);
        copy_slice(static_cast<const T*>(x->raw()), out_ptr<T>(a), s.outer, s.dim, o.dim, 0, start, s.dim, s.inner);
      });
      start += s.dim;
    }
  });
}

}  // namespace meshtrain::kernels::cpu::ops
