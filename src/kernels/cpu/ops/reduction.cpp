// CPU kernels of the reductions (graph/ops/reduction.cpp).
#include <cmath>
#include <limits>

#include "kernels/cpu/kernel_support.h"
#include "kernels/cpu/ops/families.h"

namespace meshtrain::kernels::cpu::ops {

void add_reduction_kernels(const AddKernel& add) {
  add("sum", [](const KernelArgs& a) {
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      *out_ptr<T>(a) = store<T>(sum(in_ptr<T>(a, 0), a.in[0]->numel()));
    });
  });
  add("sum_squares", [](const KernelArgs& a) {
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      *out_ptr<double>(a) = sum_squares(in_ptr<T>(a, 0), a.in[0]->numel());
    });
  });
  add("amax", [](const KernelArgs& a) {
    const int64_t n = a.in[0]->numel();
    float largest = 0;
    int64_t non_finite = 0;
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      const T* x = in_ptr<T>(a, 0);
#pragma omp parallel for reduction(max : largest) reduction(+ : non_finite) if (n > kParallelElements)
      for (int64_t i = 0; i < n; ++i) {
        const auto v = std::fabs(load(x[i]));
        non_finite += std::isfinite(v) ? 0 : 1;
        largest = std::max(largest, static_cast<float>(v));
      }
    });
    *out_ptr<float>(a) = non_finite > 0 ? std::numeric_limits<float>::infinity() : largest;
  });
  add("mean", [](const KernelArgs& a) {
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      *out_ptr<T>(a) = store<T>(sum(in_ptr<T>(a, 0), a.in[0]->numel()) / static_cast<double>(a.in[0]->numel()));
    });
  });
  add("softmax", [](const KernelArgs& a) {
    const auto [rows, d] = rows_of(*a.in[0]);
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      softmax(in_ptr<T>(a, 0), out_ptr<T>(a), rows, d);
    });
  });
  add("softmax_backward", [](const KernelArgs& a) {
    const auto [rows, d] = rows_of(*a.in[0]);
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      softmax_backward(in_ptr<T>(a, 0), in_ptr<T>(a, 1), out_ptr<T>(a), rows, d);
    });
  });
  add("rms_norm", [](const KernelArgs& a) {
    const auto [rows, d] = rows_of(*a.in[0]);
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      rms_norm(in_ptr<T>(a, 0), in_ptr<T>(a, 1), out_ptr<T>(a), rows, d, a.attrs.get(attr::eps));
    });
  });
  add("rms_norm_backward", [](const KernelArgs& a) {
    const auto [rows, d] = rows_of(*a.in[0]);
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      rms_norm_backward(in_ptr<T>(a, 0), in_ptr<T>(a, 1), in_ptr<T>(a, 2), out_ptr<T>(a, 0), out_ptr<T>(a, 1), rows, d,
                        a.attrs.get(attr::eps));
    });
  });
}

}  // namespace meshtrain::kernels::cpu::ops
