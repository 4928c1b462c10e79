// Optimizer-side ops (not differentiated): PyTorch's clipping coefficient
// and the fused AdamW update, which skips the step (outputs = inputs) where
// its optional seventh input, the gradient norm, is not finite. (The gradient norm is Builder::global_norm.)
#include "graph/ops/families.h"
#include "graph/ops/op_support.h"

namespace meshtrain::graph::ops {

void add_optimizer_ops(std::vector<OpDef>& ops) {
  ops.push_back({
      .name = "clip_coefficient",
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            MT_CHECK(in[0].shape.numel() == 1, "norm must be a scalar");
            MT_CHECK(at.get(attr::max_norm) > 0, "max_norm must be positive");
            return ValueInfos{in[0]};
          },
  });

  ops.push_back({
      .name = "adamw",
      .num_inputs = OpDef::kVariadic,  // param, grad, m, v, lr, step [, apply_if_finite]
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            MT_CHECK(in.size() == 6 || in.size() == 7,
                     "adamw takes param, grad, m, v, lr, step and optionally apply_if_finite; got {} inputs",
                     in.size());
            check_float(in[0], "adamw param");
            check_same(in[0], in[1]);
            // Moments: the param's dtype, or bf16 for f32 params (f32 math either way).
            MT_CHECK(in[2].shape == in[0].shape && in[3] == in[2],
                     "moments must have the param's shape {}, got {} and {}", in[0].shape.to_string(),
                     in[2].shape.to_string(), in[3].shape.to_string());
            MT_CHECK(in[2].dtype == in[0].dtype || (in[0].dtype == DType::f32 && in[2].dtype == DType::bf16),
                     "moments of a {} param must be {}{}, got {}", dtype_name(in[0].dtype), dtype_name(in[0].dtype),
                     in[0].dtype == DType::f32 ? " or bf16" : "", dtype_name(in[2].dtype));
            MT_CHECK(in[4].shape.numel() == 1 && in[4].dtype == DType::f64, "lr must be one f64 element");
            MT_CHECK(in[5].shape.numel() == 1 && in[5].dtype == DType::i64, "step must be one i64 element");
            MT_CHECK(in.size() == 6 || (in[6].shape.numel() == 1 && is_floating(in[6].dtype)),
                     "apply_if_finite must be one floating-point element");
            for (const AttrKey<double>& key : {attr::beta1, attr::beta2, attr::eps, attr::weight_decay}) at.get(key);
            return ValueInfos{in[0], in[2], in[3]};  // param, m, v after the step
          },
      .flops = elementwise_flops(12),
      .in_place = {{0, 0}, {1, 2}, {2, 3}},  // param, m and v updated where they lie
  });
}

}  // namespace meshtrain::graph::ops
