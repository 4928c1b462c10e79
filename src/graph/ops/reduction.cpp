// Reductions: over all elements (sum, sum_squares, mean, amax) and over the last dim (softmax, RMSNorm).
#include "graph/ops/families.h"
#include "graph/ops/op_support.h"

namespace meshtrain::graph::ops {

void add_reduction_ops(std::vector<OpDef>& ops) {
  ops.push_back({
      .name = "sum",
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            check_float(in[0], "sum input");
            return ValueInfos{{Shape{}, in[0].dtype}};
          },
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            return std::vector<ValueId>{b.broadcast_scalar(g[0], b.graph().value(n.inputs[0]).info.shape)};
          },
      .flops = [](const ValueInfos& in, const ValueInfos&, const Attrs&) { return numel(in[0]); },
  });

  ops.push_back({
      .name = "sum_squares",  // x -> the sum of its squared elements, accumulated and returned in f64
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            check_float(in[0], "sum_squares input");
            return ValueInfos{{Shape{}, DType::f64}};
          },
      .flops = [](const ValueInfos& in, const ValueInfos&, const Attrs&) { return 2 * numel(in[0]); },
  });

  // The largest magnitude of the elements, in f32 (an FP8 scale's source;
  // graph/ops/matmul.cpp): not differentiable, as FP8 training's scales are
  // not. A NaN or infinity gives +inf, which a max over ranks keeps, so that
  // every rank's FP8 GEMM refuses it alike. Attr `tensor`: what it reads.
  ops.push_back({
      .name = "amax",
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            check_float(in[0], "amax input");
            return ValueInfos{{Shape{}, DType::f32}};
          },
      .flops = [](const ValueInfos& in, const ValueInfos&, const Attrs&) { return numel(in[0]); },
  });

  ops.push_back({
      .name = "mean",
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            check_float(in[0], "mean input");
            MT_CHECK(in[0].shape.numel() > 0, "mean of an empty tensor");
            return ValueInfos{{Shape{}, in[0].dtype}};
          },
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            const Shape s = b.graph().value(n.inputs[0]).info.shape;  // a copy: adding nodes moves the values
            return std::vector<ValueId>{b.scale(b.broadcast_scalar(g[0], s), 1.0 / static_cast<double>(s.numel()))};
          },
      .flops = [](const ValueInfos& in, const ValueInfos&, const Attrs&) { return numel(in[0]); },
  });

  ops.push_back({
      .name = "softmax",
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            check_float(in[0], "softmax input");
            MT_CHECK(in[0].shape.rank() >= 1, "softmax needs rank >= 1");
            return ValueInfos{in[0]};
          },
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            return std::vector<ValueId>{b.softmax_backward(n.outputs[0], g[0])};
          },
      .flops = elementwise_flops(5),
  });
  ops.push_back({
      .name = "softmax_backward",
      .num_inputs = 2,
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            check_same(in[0], in[1]);
            return ValueInfos{in[0]};
          },
      .flops = elementwise_flops(4),
  });

  ops.push_back({
      .name = "rms_norm",
      .num_inputs = 2,
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            check_float(in[0], "rms_norm input");
            MT_CHECK(in[0].shape.rank() >= 1 && in[1].shape == Shape{in[0].shape.dim(-1)} && in[1].dtype == in[0].dtype,
                     "weight must be a {} vector of the last dim's size {}, got {}{}", dtype_name(in[0].dtype),
                     in[0].shape.rank() ? in[0].shape.dim(-1) : 0, dtype_name(in[1].dtype), in[1].shape.to_string());
            MT_CHECK(at.get(attr::eps) >= 0, "eps must be >= 0");
            return ValueInfos{in[0]};
          },
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            return b.rms_norm_backward(n.inputs[0], n.inputs[1], g[0], n.attrs.get(attr::eps));
          },
      .flops = elementwise_flops(4),
  });
  ops.push_back({
      .name = "rms_norm_backward",
      .num_inputs = 3,
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            check_same(in[0], in[2]);
            return ValueInfos{in[0], in[1]};
          },
      .flops = elementwise_flops(8),
  });
}

}  // namespace meshtrain::graph::ops
