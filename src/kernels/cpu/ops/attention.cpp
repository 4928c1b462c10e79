// CPU kernels of rope, attention and reorder_sequence (graph/ops/attention.cpp);
// the attention loops themselves are in kernels/cpu/attention.cpp.
#include <cstring>

#include "graph/sequence_order.h"
#include "kernels/cpu/ops/families.h"

namespace meshtrain::kernels::cpu::ops {

namespace {
AttentionShape attention_shape(const KernelArgs& a) {
  const auto& q = a.in[0]->shape();
  const auto& k = a.in[1]->shape();
  return {q[0], q[1], k[1], q[2], k[2], q[3], graph::sequence_order(a.attrs, k[1])};
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
      std::memcpy(dst + static_cast<size_t>(o * length + r) * row_bytes,
                  src + static_cast<size_t>(o * seq + from) * row_bytes, row_bytes);
    }
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
  add("attention", [](const KernelArgs& a) {
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      attention(in_ptr<T>(a, 0), in_ptr<T>(a, 1), in_ptr<T>(a, 2), out_ptr<T>(a, 0), out_ptr<Acc<T>>(a, 1),
                attention_shape(a), a.attrs.get(attr::scale));
    });
  });
  add("attention_backward", [](const KernelArgs& a) {
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      attention_backward(in_ptr<T>(a, 0), in_ptr<T>(a, 1), in_ptr<T>(a, 2), in_ptr<T>(a, 3), in_ptr<Acc<T>>(a, 4),
                         in_ptr<T>(a, 5), out_ptr<T>(a, 0), out_ptr<T>(a, 1), out_ptr<T>(a, 2), attention_shape(a),
                         a.attrs.get(attr::scale));
    });
  });
  add("reorder_sequence", reorder_sequence);
}

}  // namespace meshtrain::kernels::cpu::ops
