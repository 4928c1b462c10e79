// Attention: rotary position embedding (HF rotate-half) and fused causal
// grouped-query attention, which also returns its rows' log-sum-exp.
#include "graph/ops/families.h"
#include "graph/ops/op_support.h"

namespace meshtrain::graph::ops {

namespace {

void check_attention(const ValueInfos& in) {
  for (const auto& v : in) MT_CHECK(v.shape.rank() == 4, "q, k, v must be [B, T, H, D], got {}", v.shape.to_string());
  MT_CHECK(in[1].shape == in[2].shape, "k {} and v {} differ", in[1].shape.to_string(), in[2].shape.to_string());
  const auto& q = in[0].shape;
  const auto& k = in[1].shape;
  MT_CHECK(q[0] == k[0] && q[1] == k[1] && q[3] == k[3], "q {} and k {} must agree on B, T and D", q.to_string(),
           k.to_string());
  MT_CHECK(k[2] > 0 && q[2] % k[2] == 0, "query heads {} must be a multiple of key/value heads {}", q[2], k[2]);
}

// QK^T and PV over the causal half, times `passes` (1 forward, 2 backward).
double attention_flops(const Shape& q, double passes) {
  return passes * 2.0 * static_cast<double>(q[0] * q[2] * q[3]) * static_cast<double>(q[1]) *
         static_cast<double>(q[1] + 1);
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
            return ValueInfos{in[0]};
          },
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            // The rotation's transpose is the rotation by the opposite angle.
            return std::vector<ValueId>{b.op(
                "rope", {g[0]}, {attr::theta(n.attrs.get(attr::theta)), attr::inverse(!n.attrs.get(attr::inverse))})};
          },
      .flops = elementwise_flops(3),
  });

  ops.push_back({
      .name = "attention",
      .num_inputs = 3,
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            check_float(in[0], "attention q");
            check_attention(in);
            at.get(attr::scale);
            const auto& q = in[0].shape;
            // out, and the row log-sum-exp, kept in f32 for bf16 (as flash attention does)
            return ValueInfos{in[0], {Shape{q[0], q[2], q[1]}, accumulator_dtype(in[0].dtype)}};
          },
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            MT_CHECK(is_zeros(b.graph(), g[1]),
                     "the loss depends on attention's second output, the log-sum-exp, whose gradient attention's "
                     "backward does not take: read only its first output");
            return b.attention_backward(n.inputs[0], n.inputs[1], n.inputs[2], n.outputs[0], n.outputs[1], g[0],
                                        n.attrs.get(attr::scale));
          },
      .flops = [](const ValueInfos& in, const ValueInfos&, const Attrs&) { return attention_flops(in[0].shape, 1); },
  });
  ops.push_back({
      .name = "attention_backward",
      .num_inputs = 6,
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            return ValueInfos{in[0], in[1], in[2]};
          },
      .flops = [](const ValueInfos& in, const ValueInfos&, const Attrs&) { return attention_flops(in[0].shape, 2); },
  });
}

}  // namespace meshtrain::graph::ops
