// CPU kernels of rope, attention, attention_merge and reorder_sequence (graph/ops/attention.cpp);
// the attention loops themselves are in kernels/cpu/attention.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/copy.h"
#include "graph/sequence_order.h"
#include "kernels/cpu/ops/families.h"

namespace meshtrain::kernels::cpu::ops {

namespace {
AttentionShape attention_shape(const KernelArgs& a) {
  const auto& q = a.in[0]->shape();
  const auto& k = a.in[1]->shape();
  return {q[0],
          q[1],
          k[1],
          q[2],
          k[2],
          q[3],
          graph::sequence_order(a.attrs, k[1]),
          a.attrs.get_or(attr::key_first, int64_t{0})};
}

// attention_merge (graph/ops/attention.cpp): each row of each head from its
// (out, lse) pairs, in the accumulation type.
template <typename T>
void attention_merge(const KernelArgs& a) {
  using A = Acc<T>;
  const Shape& o = a.in[0]->shape();
  const int64_t b = o[0], t = o[1], h = o[2], d = o[3], parts = static_cast<int64_t>(a.in.size()) / 2;
  T* out = out_ptr<T>(a, 0);
  A* lse = out_ptr<A>(a, 1);
  const auto neg_inf = -std::numeric_limits<A>::infinity();
#pragma omp parallel
  {
    std::vector<A> acc(static_cast<size_t>(d));  // a row's weighted sum, one per thread
#pragma omp for collapse(2)
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t i = 0; i < t; ++i)
        for (int64_t hh = 0; hh < h; ++hh) {
          const int64_t row = ((bi * t + i) * h + hh) * d, at = (bi * h + hh) * t + i;
          A top = neg_inf;
          for (int64_t p = 0; p < parts; ++p) top = std::max(top, in_ptr<A>(a, 2 * p + 1)[at]);
          std::fill(acc.begin(), acc.end(), A(0));
          A total = 0;
          if (top != neg_inf)
            for (int64_t p = 0; p < parts; ++p) {
              const A weight = std::exp(in_ptr<A>(a, 2 * p + 1)[at] - top);
              const T* part = in_ptr<T>(a, 2 * p) + row;
              total += weight;
              for (int64_t c = 0; c < d; ++c) acc[static_cast<size_t>(c)] += weight * load(part[c]);
            }
          const A inv = total > 0 ? A(1) / total : A(0);
          for (int64_t c = 0; c < d; ++c) out[row + c] = store<T>(acc[static_cast<size_t>(c)] * inv);
          lse[at] = total > 0 ? top + std::log(total) : neg_inf;
        }
  }
}

// Rows [start, start + length) of the load-balanced order from x in position
// order, or (inverse) the whole sequence back: each row of dim 1 a block of
// `row_bytes`, copied whole.
void reorder_sequence(const KernelArgs& a) {
  const Shape& in = a.in[0]->shape();
  const int64_t outer = in[0], seq = in[1], length = a.out[0]->shape()[1];
  if (a.out[0]->numel() == 0) return;  // an empty shard
  const auto row_bytes = static_cast<size_t>(in.numel() / (outer * seq)) * dtype_size(a.in[0]->dtype());
  const graph::SequenceOrder order{seq, a.attrs.get(attr::seq_chunks), a.attrs.get_or(attr::start, int64_t{0})};
  const bool inverse = a.attrs.get(attr::inverse);
  const auto* src = static_cast<const char*>(a.in[0]->raw());
  auto* dst = static_cast<char*>(a.out[0]->raw());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t r = 0; r < length; ++r) {
      // forward: out row r is the row at position order.position(r); inverse: out row p the stored row of p
      const int64_t from = inverse ? order.stored_index(r) : order.position(r);
      copy_bytes(dst + static_cast<size_t>(o * length + r) * row_bytes,
                 src + static_cast<size_t>(o * seq + from) * row_bytes, row_bytes);
    }
}
// Attention with the ring attribute, whole on one rank (unlowered, as a
// reference): its keys and values, in the queries' load-balanced order, are
// put in position order for the kernels, and their gradients back.
void reorder_keys(const Tensor& x, Tensor& out, int64_t chunks, bool to_position) {
  const graph::Attrs at{attr::seq_chunks(chunks), attr::start(0), attr::length(x.shape()[1]),
                        attr::inverse(to_position)};
  reorder_sequence(KernelArgs{{&x}, {&out}, at});
}
Tensor keys_in_position_order(const Tensor& x, int64_t chunks) {
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  reorder_keys(x, out, chunks, true);
  return out;
}

void attention_kernel(const KernelArgs& a) {
  if (a.attrs.get_or(attr::ring, false)) {
    const int64_t chunks = a.attrs.get(attr::seq_chunks);
    const Tensor k = keys_in_position_order(*a.in[1], chunks), v = keys_in_position_order(*a.in[2], chunks);
    graph::Attrs whole = a.attrs;
    whole.set(attr::ring, false);
    return attention_kernel(KernelArgs{{a.in[0], &k, &v}, a.out, whole});
  }
  by_float_type(a.in[0]->dtype(), [&](auto z) {
    using T = decltype(z);
    attention(in_ptr<T>(a, 0), in_ptr<T>(a, 1), in_ptr<T>(a, 2), out_ptr<T>(a, 0), out_ptr<Acc<T>>(a, 1),
              attention_shape(a), a.attrs.get(attr::scale));
  });
}

void attention_backward_kernel(const KernelArgs& a) {
  if (a.attrs.get_or(attr::ring, false)) {
    const int64_t chunks = a.attrs.get(attr::seq_chunks);
    const Tensor k = keys_in_position_order(*a.in[1], chunks), v = keys_in_position_order(*a.in[2], chunks);
    Tensor dk = Tensor::empty(k.shape(), k.dtype()), dv = Tensor::empty(v.shape(), v.dtype());
    graph::Attrs whole = a.attrs;
    whole.set(attr::ring, false);
    attention_backward_kernel(KernelArgs{{a.in[0], &k, &v, a.in[3], a.in[4], a.in[5]}, {a.out[0], &dk, &dv}, whole});
    reorder_keys(dk, *a.out[1], chunks, false);
    reorder_keys(dv, *a.out[2], chunks, false);
    return;
  }
  by_float_type(a.in[0]->dtype(), [&](auto z) {
    using T = decltype(z);
    attention_backward(in_ptr<T>(a, 0), in_ptr<T>(a, 1), in_ptr<T>(a, 2), in_ptr<T>(a, 3), in_ptr<Acc<T>>(a, 4),
                       in_ptr<T>(a, 5), out_ptr<T>(a, 0), out_ptr<T>(a, 1), out_ptr<T>(a, 2), attention_shape(a),
                       a.attrs.get(attr::scale));
  });
}

}  // namespace

void add_attention_kernels(const AddKernel& add) {
  add("rope", [](const KernelArgs& a) {
    const auto& s = a.in[0]->shape();
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      rope(in_ptr<T>(a, 0), out_ptr<T>(a), s[0], s[1], s[2], s[3], a.attrs.get(attr::theta), a.attrs.get(attr::inverse),
           graph::sequence_order(a.attrs, s[1]));
    });
  });
  add("attention", attention_kernel);
  add("attention_backward", attention_backward_kernel);
  add("attention_merge",
      [](const KernelArgs& a) { by_float_type(a.in[0]->dtype(), [&](auto z) { attention_merge<decltype(z)>(a); }); });
  add("reorder_sequence", reorder_sequence);
}

}  // namespace meshtrain::kernels::cpu::ops
