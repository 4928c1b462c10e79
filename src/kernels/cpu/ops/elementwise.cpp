// CPU kernels of the elementwise ops (graph/ops/elementwise.cpp).
#include <cmath>

#include "kernels/cpu/ops/families.h"

namespace meshtrain::kernels::cpu::ops {

void add_elementwise_kernels(const AddKernel& add) {
  add("full", [](const KernelArgs& a) {
    by_float_type(a.out[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      cpu::fill(a.attrs.get(attr::value), out_ptr<T>(a), a.out[0]->numel());
    });
  });
  add("cast", [](const KernelArgs& a) {
    convert(a.in[0]->raw(), a.in[0]->dtype(), a.out[0]->raw(), a.out[0]->dtype(),
            static_cast<size_t>(a.in[0]->numel()));
  });
  add("add", [](const KernelArgs& a) {
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      cpu::add(in_ptr<T>(a, 0), in_ptr<T>(a, 1), out_ptr<T>(a), a.out[0]->numel());
    });
  });
  add("add_n", [](const KernelArgs& a) {
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      const int64_t n = a.out[0]->numel();
      T* out = out_ptr<T>(a);
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
      for (int64_t i = 0; i < n; ++i) {
        Acc<T> total = load(in_ptr<T>(a, 0)[i]);
        for (size_t k = 1; k < a.in.size(); ++k) total += load(in_ptr<T>(a, k)[i]);
        out[i] = store<T>(total);
      }
    });
  });
  add("mul", [](const KernelArgs& a) {
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      cpu::mul(in_ptr<T>(a, 0), in_ptr<T>(a, 1), out_ptr<T>(a), a.out[0]->numel());
    });
  });
  add("scale", [](const KernelArgs& a) {
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      cpu::scale(in_ptr<T>(a, 0), a.attrs.get(attr::alpha), out_ptr<T>(a), a.out[0]->numel());
    });
  });
  add("scale_by", [](const KernelArgs& a) {
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      cpu::scale(in_ptr<T>(a, 0), a.in[1]->get(0), out_ptr<T>(a), a.out[0]->numel());
    });
  });
  add("broadcast_scalar", [](const KernelArgs& a) {
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      cpu::fill(static_cast<double>(cpu::load(*in_ptr<T>(a, 0))), out_ptr<T>(a), a.out[0]->numel());
    });
  });
  add("sqrt", [](const KernelArgs& a) {
    for (int64_t i = 0; i < a.out[0]->numel(); ++i) a.out[0]->set(i, std::sqrt(a.in[0]->get(i)));
  });
  add("silu", [](const KernelArgs& a) {
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      cpu::silu(in_ptr<T>(a, 0), out_ptr<T>(a), a.out[0]->numel());
    });
  });
  add("silu_backward", [](const KernelArgs& a) {
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      cpu::silu_backward(in_ptr<T>(a, 0), in_ptr<T>(a, 1), out_ptr<T>(a), a.out[0]->numel());
    });
  });
  add("swiglu", [](const KernelArgs& a) {
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      cpu::swiglu(in_ptr<T>(a, 0), in_ptr<T>(a, 1), out_ptr<T>(a), a.out[0]->numel());
    });
  });
  add("swiglu_backward", [](const KernelArgs& a) {
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      cpu::swiglu_backward(in_ptr<T>(a, 0), in_ptr<T>(a, 1), in_ptr<T>(a, 2), out_ptr<T>(a, 0), out_ptr<T>(a, 1),
                           a.out[0]->numel());
    });
  });
}

}  // namespace meshtrain::kernels::cpu::ops
