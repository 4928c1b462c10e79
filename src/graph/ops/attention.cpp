// Attention: rotary position embedding (HF rotate-half) and fused causal
// grouped-query attention, which also returns its rows' log-sum-exp; and the
// sequence moved into context parallelism's load-balanced order and back.
// rope and attention read each query's position in that order from their
// seq_* attributes (graph/sequence_order.h); attention's keys are in
// position order: the whole sequence, or a block of it from key_first (a
// ring step's, whose partial results attention_merge combines).
#include <algorithm>
#include <optional>

#include "graph/ops/families.h"
#include "graph/ops/op_support.h"
#include "graph/sequence_order.h"

namespace meshtrain::graph::ops {

namespace {

void check_attention(const ValueInfos& in, bool key_block) {
  for (const auto& v : in) MT_CHECK(v.shape.rank() == 4, "q, k, v must be [B, T, H, D], got {}", v.shape.to_string());
  MT_CHECK(in[1].shape == in[2].shape, "k {} and v {} differ", in[1].shape.to_string(), in[2].shape.to_string());
  const auto& q = in[0].shape;
  const auto& k = in[1].shape;
  // A part of the queries (context parallelism) sees all the keys, or a block of them (key_first).
  MT_CHECK(q[0] == k[0] && (key_block || q[1] <= k[1]) && q[3] == k[3],
           "q {} and k {} must agree on B and D, with no more queries than keys (but for a block of keys)",
           q.to_string(), k.to_string());
  MT_CHECK(k[2] > 0 && q[2] % k[2] == 0, "query heads {} must be a multiple of key/value heads {}", q[2], k[2]);
}

// `keys` (attention's; none for rope) contiguous positions from `key_first`:
// the whole sequence, or with a key_first attribute, a block of it.
void check_sequence_order(const SequenceOrder& order, int64_t rows, int64_t keys,
                          std::optional<int64_t> key_first = std::nullopt) {
  MT_CHECK(order.chunks >= 1 && order.total % order.chunks == 0 && (order.chunks == 1 || order.chunks % 2 == 0),
           "a sequence of {} in {} load-balanced chunks: the chunks must be 1 or even and divide it", order.total,
           order.chunks);
  MT_CHECK(order.first >= 0 && order.first + rows <= order.total,
           "rows [{}, {}) do not fit the sequence of {}: the rows must lie within it", order.first, order.first + rows,
           order.total);
  if (key_first)
    MT_CHECK(*key_first >= 0 && *key_first + keys <= order.total,
             "keys at positions [{}, {}) do not fit the sequence of {}", *key_first, *key_first + keys, order.total);
  else
    MT_CHECK(keys == 0 || keys == order.total,
             "{} keys for a sequence of {}: the keys must be all of it (or a block from key_first)", keys, order.total);
}

// QK^T and PV over the (query, key) pairs the causal mask keeps, times
// `passes` (1 forward, 2 backward): each query sees the keys up to its
// position, of the whole sequence or of a block from key_first.
double attention_flops(const ValueInfos& in, const Attrs& at, double passes) {
  const Shape &q = in[0].shape, &k = in[1].shape;
  const SequenceOrder order = sequence_order(at, k[1]);
  const int64_t key_first = at.get_or(attr::key_first, int64_t{0});
  double pairs = 0;
  for (int64_t i = 0; i < q[1]; ++i)
    pairs += static_cast<double>(std::clamp<int64_t>(order.position(i) - key_first + 1, 0, k[1]));
  return passes * 4.0 * static_cast<double>(q[0] * q[2] * q[3]) * pairs;
}

// The seq_* attributes a backward node takes from its forward node.
Attrs with_sequence_order(Attrs out, const Attrs& from) {
  for (const auto& key : {attr::seq_chunks, attr::seq_first, attr::seq_total, attr::key_first})
    if (from.has(key.name)) out.set(key, from.get(key));
  if (from.get_or(attr::ring, false)) out.set(attr::ring, true);
  return out;
}

// Whether `v` is a gradient autodiff filled with zeros (a `full` of 0):
// no term of the loss reads the output it belongs to.
bool is_zeros(const Graph& g, ValueId v) {
  const NodeId producer = g.value(v).producer;
  if (!producer.valid()) return false;
  const Node& n = g.node(producer);
  return n.op->name == "full" && n.attrs.get(attr::value) == 0.0;
}

}  // namespace

void add_attention_ops(std::vector<OpDef>& ops) {
  ops.push_back({
      .name = "rope",
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            check_float(in[0], "rope input");
            MT_CHECK(in[0].shape.rank() == 4 && in[0].shape[3] % 2 == 0, "x must be [B, T, H, D] with D even, got {}",
                     in[0].shape.to_string());
            MT_CHECK(at.get(attr::theta) > 0, "theta must be positive");
            check_sequence_order(sequence_order(at, in[0].shape[1]), in[0].shape[1], 0);
            return ValueInfos{in[0]};
          },
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            // The rotation's transpose is the rotation by the opposite angle.
            return std::vector<ValueId>{b.op(
                "rope", {g[0]},
                with_sequence_order({attr::theta(n.attrs.get(attr::theta)), attr::inverse(!n.attrs.get(attr::inverse))},
                                    n.attrs))};
          },
      .flops = elementwise_flops(3),
  });

  ops.push_back({
      .name = "attention",
      .num_inputs = 3,
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            check_float(in[0], "attention q");
            check_attention(in, at.has(attr::key_first.name));
            at.get(attr::scale);
            const std::optional<int64_t> key_first =
                at.has(attr::key_first.name) ? std::optional(at.get(attr::key_first)) : std::nullopt;
            check_sequence_order(sequence_order(at, in[1].shape[1]), in[0].shape[1], in[1].shape[1], key_first);
            MT_CHECK(!at.get_or(attr::ring, false) || (!key_first && at.get_or(attr::seq_chunks, int64_t{1}) > 1),
                     "attention's ring (keys in the queries' load-balanced order) needs seq_chunks and no key_first");
            const auto& q = in[0].shape;
            // out, and the row log-sum-exp, kept in f32 for bf16 (as flash attention does)
            return ValueInfos{in[0], {Shape{q[0], q[2], q[1]}, accumulator_dtype(in[0].dtype)}};
          },
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            MT_CHECK(is_zeros(b.graph(), g[1]),
                     "the loss depends on attention's second output, the log-sum-exp, whose gradient attention's "
                     "backward does not take: read only its first output");
            return b.op_outputs("attention_backward",
                                {n.inputs[0], n.inputs[1], n.inputs[2], n.outputs[0], n.outputs[1], g[0]},
                                with_sequence_order({attr::scale(n.attrs.get(attr::scale))}, n.attrs));
          },
      .flops = [](const ValueInfos& in, const ValueInfos&, const Attrs& at) { return attention_flops(in, at, 1); },
  });
  ops.push_back({
      .name = "attention_backward",
      .num_inputs = 6,
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            return ValueInfos{in[0], in[1], in[2]};
          },
      .flops = [](const ValueInfos& in, const ValueInfos&, const Attrs& at) { return attention_flops(in, at, 2); },
  });
  // Partial attentions of the same queries over disjoint blocks of the keys
  // (a ring's steps), as (out, lse) pairs, merged by their log-sum-exps:
  // out = sum_i exp(lse_i - lse) out_i, lse = log sum_i exp(lse_i). A row no
  // block sees stays 0 with an lse of -inf. Lowering makes it after
  // autodiff, so it has no backward.
  ops.push_back({
      .name = "attention_merge",
      .num_inputs = OpDef::kVariadic,
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            MT_CHECK(in.size() >= 2 && in.size() % 2 == 0, "attention_merge takes (out, lse) pairs, got {} inputs",
                     in.size());
            check_float(in[0], "attention_merge out");
            const Shape& o = in[0].shape;
            MT_CHECK(o.rank() == 4, "attention_merge: out must be [B, T, H, D], got {}", o.to_string());
            const ValueInfo lse{Shape{o[0], o[2], o[1]}, accumulator_dtype(in[0].dtype)};
            for (size_t i = 0; i < in.size(); i += 2)
              MT_CHECK(
                  in[i] == in[0] && in[i + 1] == lse,
                  "attention_merge: pair {} is out {} {} and lse {} {}; every pair must be out {} {} and lse {} {}",
                  i / 2, in[i].shape.to_string(), dtype_name(in[i].dtype), in[i + 1].shape.to_string(),
                  dtype_name(in[i + 1].dtype), o.to_string(), dtype_name(in[0].dtype), lse.shape.to_string(),
                  dtype_name(lse.dtype));
            return ValueInfos{in[0], lse};
          },
      .flops = elementwise_flops(4),
  });
  // x [B, T, ...] in position order -> its rows [start, start + length) in
  // the load-balanced order of seq_chunks chunks (all of them in the global
  // graph: lowering gives each rank its own), or with `inverse`, the whole
  // sequence from the load-balanced order back to position order.
  ops.push_back({
      .name = "reorder_sequence",
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            MT_CHECK(in[0].shape.rank() >= 2, "reorder_sequence: x must be [batch, seq, ...], got {}",
                     in[0].shape.to_string());
            const int64_t seq = in[0].shape[1];
            const SequenceOrder order{seq, at.get(attr::seq_chunks), at.get_or(attr::start, int64_t{0})};
            const int64_t length = at.get_or(attr::length, seq);
            check_sequence_order(order, length, seq);
            MT_CHECK(!at.get(attr::inverse) || length == seq, "reorder_sequence: the inverse takes the whole sequence");
            std::vector<int64_t> dims = in[0].shape.dims();
            dims[1] = length;
            return ValueInfos{{Shape(std::move(dims)), in[0].dtype}};
          },
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            return std::vector<ValueId>{
                b.reorder_sequence(g[0], n.attrs.get(attr::seq_chunks), !n.attrs.get(attr::inverse))};
          },
      .bytes = [](const ValueInfos&, const ValueInfos& out, const Attrs&) { return 2 * bytes_of(out[0]); },
  });
}

}  // namespace meshtrain::graph::ops
