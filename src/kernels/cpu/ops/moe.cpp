// CPU kernels of the mixture-of-experts ops (graph/ops/moe.cpp); the loops
// are in kernels/cpu/moe.cpp.
#include "kernels/cpu/moe.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/ops/families.h"

namespace meshtrain::kernels::cpu::ops {

namespace {

int64_t dim_from_end(const Tensor& t, int from_end) {
  return t.shape().rank() >= static_cast<size_t>(from_end) ? t.shape().dim(-from_end) : 1;
}
// Groups of a [..., N, D] tensor: how many (N, D) blocks it holds (0 when empty).
int64_t groups_of(const Tensor& t) {
  const int64_t block = dim_from_end(t, 2) * dim_from_end(t, 1);
  return block ? t.numel() / block : 0;
}

void add_routing_kernels(const AddKernel& add) {
  add("moe_topk", [](const KernelArgs& a) {
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      const auto [rows, e] = rows_of(*a.in[0]);
      moe_topk(in_ptr<T>(a, 0), out_ptr<int64_t>(a), rows, e, a.attrs.get(attr::top_k));
    });
  });
  add("moe_route_weights", [](const KernelArgs& a) {
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      const auto [rows, e] = rows_of(*a.in[0]);
      moe_route_weights(in_ptr<T>(a, 0), in_ptr<int64_t>(a, 1), out_ptr<T>(a), rows, e, dim_from_end(*a.in[1], 1));
    });
  });
  add("moe_route_weights_backward", [](const KernelArgs& a) {
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      const auto [rows, e] = rows_of(*a.in[0]);
      moe_route_weights_backward(in_ptr<T>(a, 0), in_ptr<int64_t>(a, 1), in_ptr<T>(a, 2), out_ptr<T>(a), rows, e,
                                 dim_from_end(*a.in[1], 1));
    });
  });
  add("moe_sort", [](const KernelArgs& a) {
    const Tensor& experts = *a.in[0];
    moe_sort(in_ptr<int64_t>(a, 0), out_ptr<int64_t>(a, 0), out_ptr<int64_t>(a, 1), groups_of(experts),
             dim_from_end(experts, 2), dim_from_end(experts, 1), a.attrs.get(attr::n_experts),
             a.attrs.get(attr::capacity_factor));
  });
  add("moe_expert_counts", [](const KernelArgs& a) {
    moe_expert_counts(in_ptr<int64_t>(a, 0), out_ptr<float>(a), a.in[0]->numel(), a.attrs.get(attr::n_experts));
  });
}

void add_permutation_kernels(const AddKernel& add) {
  add("moe_permute", [](const KernelArgs& a) {  // x [..., N, D], order (, weights)
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      const T* w = a.in.size() == 3 ? in_ptr<T>(a, 2) : nullptr;
      moe_permute(in_ptr<T>(a, 0), in_ptr<int64_t>(a, 1), w, out_ptr<T>(a), groups_of(*a.in[0]),
                  dim_from_end(*a.in[0], 2), a.attrs.get(attr::top_k), dim_from_end(*a.in[0], 1));
    });
  });
  add("moe_combine", [](const KernelArgs& a) {  // rows [..., M, D], order (, weights) -> [..., N, D]
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      const T* w = a.in.size() == 3 ? in_ptr<T>(a, 2) : nullptr;
      moe_combine(in_ptr<T>(a, 0), in_ptr<int64_t>(a, 1), w, out_ptr<T>(a), groups_of(*a.out[0]),
                  dim_from_end(*a.out[0], 2), a.attrs.get(attr::top_k), dim_from_end(*a.out[0], 1));
    });
  });
  add("moe_combine_weight_grad", [](const KernelArgs& a) {  // a [..., N, D], rows, order -> [..., N, k]
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      moe_combine_weight_grad(in_ptr<T>(a, 0), in_ptr<T>(a, 1), in_ptr<int64_t>(a, 2), out_ptr<T>(a),
                              groups_of(*a.in[0]), dim_from_end(*a.in[0], 2), a.attrs.get(attr::top_k),
                              dim_from_end(*a.in[0], 1));
    });
  });
}

void add_dispatch_kernels(const AddKernel& add) {
  add("moe_dispatch", [](const KernelArgs& a) {  // rows [..., M, D], row_expert -> [B, ..., M, D]
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      moe_dispatch(in_ptr<T>(a, 0), in_ptr<int64_t>(a, 1), out_ptr<T>(a), groups_of(*a.in[0]),
                   dim_from_end(*a.in[0], 2), dim_from_end(*a.in[0], 1), a.attrs.get(attr::n_experts),
                   a.attrs.get(attr::expert_blocks), store<T>(0.0));
    });
  });
  add("moe_undispatch", [](const KernelArgs& a) {  // [B, ..., M, D], row_expert -> rows [..., M, D]
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      moe_undispatch(in_ptr<T>(a, 0), in_ptr<int64_t>(a, 1), out_ptr<T>(a), groups_of(*a.out[0]),
                     dim_from_end(*a.out[0], 2), dim_from_end(*a.out[0], 1), a.attrs.get(attr::n_experts),
                     a.attrs.get(attr::expert_blocks));
    });
  });
  add("moe_dispatch_experts", [](const KernelArgs& a) {  // row_expert [..., M] -> [B, ..., M], n_experts after
    const Tensor& re = *a.in[0];
    const int64_t m = dim_from_end(re, 1), e = a.attrs.get(attr::n_experts);
    moe_dispatch(in_ptr<int64_t>(a, 0), in_ptr<int64_t>(a, 0), out_ptr<int64_t>(a),
                 re.numel() / std::max<int64_t>(m, 1), m, 1, e, a.attrs.get(attr::expert_blocks), e);
  });
}

void add_grouped_matmul_kernels(const AddKernel& add) {
  add("grouped_matmul", [](const KernelArgs& a) {
    const bool tb = a.attrs.get(attr::transpose_b);
    const Shape& w = a.in[1]->shape();
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      grouped_matmul(in_ptr<T>(a, 0), in_ptr<T>(a, 1), in_ptr<int64_t>(a, 2), out_ptr<T>(a), a.in[2]->numel(), w[0],
                     tb ? w[1] : w[2], tb ? w[2] : w[1], tb, a.attrs.get_or(attr::first_expert, int64_t{0}));
    });
  });
  add("grouped_matmul_wgrad", [](const KernelArgs& a) {
    const Shape& out = a.out[0]->shape();
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      grouped_matmul_wgrad(in_ptr<T>(a, 0), in_ptr<T>(a, 1), in_ptr<int64_t>(a, 2), out_ptr<T>(a), a.in[2]->numel(),
                           out[0], out[1], out[2], a.attrs.get_or(attr::first_expert, int64_t{0}));
    });
  });
}

void add_aux_loss_kernels(const AddKernel& add) {
  add("moe_router_stats", [](const KernelArgs& a) {  // probs, experts -> [picks; probability sums]
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      const auto [rows, e] = rows_of(*a.in[0]);
      const T* probs = in_ptr<T>(a, 0);
      const int64_t* experts = in_ptr<int64_t>(a, 1);
      std::vector<double> picks(static_cast<size_t>(e)), sums(static_cast<size_t>(e));
      for (int64_t i = 0; i < a.in[1]->numel(); ++i) {
        MT_ASSERT(experts[i] >= 0 && experts[i] < e, "moe_router_stats: expert {} of {}", experts[i], e);
        picks[static_cast<size_t>(experts[i])] += 1;
      }
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t x = 0; x < e; ++x) sums[static_cast<size_t>(x)] += load(probs[r * e + x]);
      T* out = out_ptr<T>(a);
      for (int64_t x = 0; x < e; ++x) {
        out[x] = store<T>(picks[static_cast<size_t>(x)]);
        out[e + x] = store<T>(sums[static_cast<size_t>(x)]);
      }
    });
  });
  add("moe_router_stats_backward", [](const KernelArgs& a) {  // probs, dstats -> every row dstats[1]
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      const auto [rows, e] = rows_of(*a.in[0]);
      const T* dsums = in_ptr<T>(a, 1) + e;
      T* out = out_ptr<T>(a);
      for (int64_t r = 0; r < rows; ++r) std::copy(dsums, dsums + e, out + r * e);
    });
  });
  add("moe_aux_loss", [](const KernelArgs& a) {  // scale * picks . probability sums
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      const int64_t e = a.in[0]->shape().dim(1);
      const T* stats = in_ptr<T>(a, 0);
      double total = 0;
      for (int64_t x = 0; x < e; ++x) total += static_cast<double>(load(stats[x])) * load(stats[e + x]);
      *out_ptr<T>(a) = store<T>(a.attrs.get(attr::scale) * total);
    });
  });
  add("moe_aux_loss_backward", [](const KernelArgs& a) {  // stats, dloss -> dloss * scale * [sums; picks]
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      const int64_t e = a.in[0]->shape().dim(1);
      const T* stats = in_ptr<T>(a, 0);
      const double g = a.attrs.get(attr::scale) * load(*in_ptr<T>(a, 1));
      T* out = out_ptr<T>(a);
      for (int64_t x = 0; x < e; ++x) {
        out[x] = store<T>(g * load(stats[e + x]));
        out[e + x] = store<T>(g * load(stats[x]));
      }
    });
  });
}

}  // namespace

void add_moe_kernels(const AddKernel& add) {
  add_routing_kernels(add);
  add_permutation_kernels(add);
  add_dispatch_kernels(add);
  add_grouped_matmul_kernels(add);
  add_aux_loss_kernels(add);
}

}  // namespace meshtrain::kernels::cpu::ops
