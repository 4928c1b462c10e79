// Elementwise ops: constants, casts, arithmetic and activations, each output
// element from the same element of each input.
#include "graph/ops/families.h"
#include "graph/ops/op_support.h"

namespace meshtrain::graph::ops {

void add_elementwise_ops(std::vector<OpDef>& ops) {
  ops.push_back({
      .name = "full",
      .num_inputs = 0,
      .infer =
          [](const ValueInfos&, const Attrs& at) {
            const auto dtype = at.get(attr::dtype);
            check_float({Shape{}, dtype}, "full dtype");
            at.get(attr::value);
            return ValueInfos{{Shape(at.get(attr::shape)), dtype}};
          },
      .backward = [](Builder&, const Node&, const std::vector<ValueId>&) { return std::vector<ValueId>{}; },
  });

  ops.push_back({
      .name = "cast",
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            const auto dtype = at.get(attr::dtype);
            check_float(in[0], "cast input");
            check_float({Shape{}, dtype}, "cast target");
            return ValueInfos{{in[0].shape, dtype}};
          },
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            return std::vector<ValueId>{b.cast(g[0], b.graph().value(n.inputs[0]).info.dtype)};
          },
      .flops = elementwise_flops(1),
  });

  ops.push_back({
      .name = "add",
      .num_inputs = 2,
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            check_float(in[0], "add input");
            check_same(in[0], in[1]);
            return ValueInfos{in[0]};
          },
      .backward =
          [](Builder&, const Node&, const std::vector<ValueId>& g) {
            return std::vector<ValueId>{g[0], g[0]};
          },
      .flops = elementwise_flops(1),
  });

  // Σ of its inputs in order, accumulated in f32 for bf16 (f64 in f64) and
  // rounded once: the sum a reduce_scatter's reduction computes
  // (comm/reduce.h), for async TP's partial sums (sched/passes/async_tp.h).
  ops.push_back({
      .name = "add_n",
      .num_inputs = OpDef::kVariadic,
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            MT_CHECK(in.size() >= 2, "add_n takes two inputs or more, got {}", in.size());
            check_float(in[0], "add_n input");
            for (const ValueInfo& v : in) check_same(in[0], v);
            return ValueInfos{in[0]};
          },
      .flops = [](const ValueInfos& in, const ValueInfos& out,
                  const Attrs&) { return static_cast<double>(in.size() - 1) * numel(out[0]); },
  });

  ops.push_back({
      .name = "mul",
      .num_inputs = 2,
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            check_float(in[0], "mul input");
            check_same(in[0], in[1]);
            return ValueInfos{in[0]};
          },
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            return std::vector<ValueId>{b.mul(g[0], n.inputs[1]), b.mul(g[0], n.inputs[0])};
          },
      .flops = elementwise_flops(1),
  });

  ops.push_back({
      .name = "scale",
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            check_float(in[0], "scale input");
            at.get(attr::alpha);
            return ValueInfos{in[0]};
          },
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            return std::vector<ValueId>{b.scale(g[0], n.attrs.get(attr::alpha))};
          },
      .flops = elementwise_flops(1),
  });

  ops.push_back({
      .name = "scale_by",  // x * a one-element tensor (not differentiated: the optimizer's clipping)
      .num_inputs = 2,
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            check_float(in[0], "scale_by input");
            MT_CHECK(in[1].shape.numel() == 1, "the scale must be one element, got {}", in[1].shape.to_string());
            return ValueInfos{in[0]};
          },
      .flops = elementwise_flops(1),
  });

  ops.push_back({
      .name = "broadcast_scalar",
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            check_float(in[0], "broadcast_scalar input");
            MT_CHECK(in[0].shape.numel() == 1, "input must hold one element, has shape {}", in[0].shape.to_string());
            return ValueInfos{{Shape(at.get(attr::shape)), in[0].dtype}};
          },
      // The sum, in the input's shape ([1] as well as a scalar).
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            const Shape shape = b.graph().value(n.inputs[0]).info.shape;  // a copy: b.sum grows the graph
            const ValueId total = b.sum(g[0]);
            return std::vector<ValueId>{shape.rank() == 0 ? total : b.reshape(total, shape)};
          },
  });

  ops.push_back({
      .name = "sqrt",  // not differentiated (the gradient norm)
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            check_float(in[0], "sqrt input");
            return ValueInfos{in[0]};
          },
      .flops = elementwise_flops(1),
  });
  ops.push_back({
      .name = "silu",
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            check_float(in[0], "silu input");
            return ValueInfos{in[0]};
          },
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            return std::vector<ValueId>{b.silu_backward(n.inputs[0], g[0])};
          },
      .flops = elementwise_flops(4),
  });
  ops.push_back({
      .name = "silu_backward",
      .num_inputs = 2,
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            check_same(in[0], in[1]);
            return ValueInfos{in[0]};
          },
      .flops = elementwise_flops(7),
  });

  ops.push_back({
      .name = "swiglu",
      .num_inputs = 2,
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            check_float(in[0], "swiglu gate");
            check_same(in[0], in[1]);
            return ValueInfos{in[0]};
          },
      .backward = [](Builder& b, const Node& n,
                     const std::vector<ValueId>& g) { return b.swiglu_backward(n.inputs[0], n.inputs[1], g[0]); },
      .flops = elementwise_flops(5),
  });
  ops.push_back({
      .name = "swiglu_backward",
      .num_inputs = 3,
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            return ValueInfos{in[0], in[1]};
          },
      .flops = elementwise_flops(9),
  });
}

}  // namespace meshtrain::graph::ops
