// cross_entropy: mean loss over the rows whose target is not ignore_index.
#include "graph/ops/families.h"
#include "graph/ops/op_support.h"

namespace meshtrain::graph::ops {

void add_loss_ops(std::vector<OpDef>& ops) {
  ops.push_back({
      .name = "cross_entropy",
      .num_inputs = 2,
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            check_float(in[0], "cross_entropy logits");
            MT_CHECK(in[1].dtype == DType::i64, "targets must be i64, got {}", dtype_name(in[1].dtype));
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
                b.cross_entropy_backward(n.inputs[0], n.inputs[1], g[0], n.attrs.get(attr::ignore_index)), ValueId{}};
          },
      .flops = elementwise_flops(4),
  });
  ops.push_back({
      .name = "cross_entropy_backward",
      .num_inputs = 3,
      .infer = [](const ValueInfos& in, const Attrs&) { return ValueInfos{in[0]}; },
      .flops = elementwise_flops(6),
  });
}

}  // namespace meshtrain::graph::ops
