// The loss: cross_entropy, the mean over the rows whose target is not
// ignore_index, as the sum over rows divided by count_valid of the whole
// batch (so that a part of the rows gives its share of the global mean).
#include "graph/ops/families.h"
#include "graph/ops/op_support.h"

namespace meshtrain::graph::ops {

void add_loss_ops(std::vector<OpDef>& ops) {
  ops.push_back({
      .name = "count_valid",  // targets (i64) -> the number of them that are not ignore_index, f64
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            MT_CHECK(in[0].dtype == DType::i64, "targets must be i64, got {}", dtype_name(in[0].dtype));
            at.get(attr::ignore_index);
            return ValueInfos{{Shape{}, DType::f64}};
          },
  });
  ops.push_back({
      .name = "cross_entropy",  // logits [..., V], targets [...], count (f64 scalar) -> loss
      .num_inputs = 3,
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            check_float(in[0], "cross_entropy logits");
            MT_CHECK(in[1].dtype == DType::i64, "targets must be i64, got {}", dtype_name(in[1].dtype));
            MT_CHECK(in[2].shape.numel() == 1 && in[2].dtype == DType::f64, "count must be one f64 element, got {}{}",
                     dtype_name(in[2].dtype), in[2].shape.to_string());
            MT_CHECK(in[0].shape.rank() >= 1 && in[0].shape.numel() == in[1].shape.numel() * in[0].shape.dim(-1),
                     "logits {} must be targets {} plus a vocabulary dim", in[0].shape.to_string(),
                     in[1].shape.to_string());
            at.get(attr::ignore_index);
            // The loss of bf16 logits is f32, as under PyTorch's autocast.
            return ValueInfos{{Shape{}, accumulator_dtype(in[0].dtype)}};
          },
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            return std::vector<ValueId>{
                b.cross_entropy_backward(n.inputs[0], n.inputs[1], g[0], n.inputs[2], n.attrs.get(attr::ignore_index)),
                ValueId{}, ValueId{}};
          },
      .flops = elementwise_flops(4),
  });
  ops.push_back({
      .name = "cross_entropy_backward",  // logits, targets, dloss, count -> dlogits
      .num_inputs = 4,
      .infer = [](const ValueInfos& in, const Attrs&) { return ValueInfos{in[0]}; },
      .flops = elementwise_flops(6),
  });
}

}  // namespace meshtrain::graph::ops
