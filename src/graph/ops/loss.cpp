// The loss: cross_entropy, the mean over the rows whose target is not
// ignore_index, as the sum over rows divided by count_valid of the whole
// batch (so that a part of the rows gives its share of the global mean).
// The same loss in parts (Builder::cross_entropy_split), each a sum over
// the vocabulary, so that logits split by vocabulary never need gathering
// (Megatron's vocab-parallel cross-entropy): row_max, sum_exp of the logits
// shifted by it, pick of the target's logit, nll_mean of the three.
#include <string_view>

#include "graph/ops/families.h"
#include "graph/ops/op_support.h"

namespace meshtrain::graph::ops {

namespace {

// The rows of x [..., V]: its shape without the last dim, in the accumulator dtype.
ValueInfo rows_info(const ValueInfo& x, const char* what) {
  check_float(x, what);
  MT_CHECK(x.shape.rank() >= 1, "{} must have a vocabulary dim, got {}", what, x.shape.to_string());
  std::vector<int64_t> dims = x.shape.dims();
  dims.pop_back();
  return {Shape(dims), accumulator_dtype(x.dtype)};
}

void check_rows(const ValueInfo& row_value, const ValueInfo& rows, std::string_view what) {
  MT_CHECK(row_value.shape == rows.shape, "{} must be {} (one per row), got {}", what, rows.shape.to_string(),
           row_value.shape.to_string());
}

// The divisor of a mean over valid targets (count_valid's output).
void check_count(const ValueInfo& count) {
  MT_CHECK(count.shape.numel() == 1 && count.dtype == DType::f64, "count must be one f64 element, got {}{}",
           dtype_name(count.dtype), count.shape.to_string());
}

void add_split_loss_ops(std::vector<OpDef>& ops) {
  ops.push_back({
      .name = "row_max",  // x [..., V] -> [...]: the largest of each row (not differentiated: nll_mean's gradient is
                          // the logits')
      .infer = [](const ValueInfos& in, const Attrs&) { return ValueInfos{rows_info(in[0], "row_max input")}; },
      .flops = [](const ValueInfos& in, const ValueInfos&, const Attrs&) { return numel(in[0]); },
  });
  ops.push_back({
      .name = "sum_exp",  // logits [..., V], shift [...] -> [...]: sum over v of exp(logits - shift)
      .num_inputs = 2,
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            const ValueInfo rows = rows_info(in[0], "sum_exp logits");
            check_rows(in[1], rows, "sum_exp shift");
            return ValueInfos{rows};
          },
      .flops = elementwise_flops(0),
  });
  ops.push_back({
      // logits [..., V], targets [...] -> [...]: each row's target logit (0 where ignored), in the accumulator dtype
      .name = "pick",
      .num_inputs = 2,
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            const ValueInfo rows = rows_info(in[0], "pick logits");
            MT_CHECK(in[1].dtype == DType::i64, "targets must be i64, got {}", dtype_name(in[1].dtype));
            check_rows(in[1], {rows.shape, DType::i64}, "pick targets");
            at.get(attr::ignore_index);
            return ValueInfos{rows};
          },
  });
  ops.push_back({
      // logits, sum_exp, shift, target logit, targets, count -> the mean over
      // valid rows of log(sum_exp) + shift - target logit. It reads the logits
      // only to differentiate them: the gradient goes straight to the logits
      // (split_loss_backward), not through the parts.
      .name = "nll_mean",
      .num_inputs = 6,
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            const ValueInfo rows = rows_info(in[0], "nll_mean logits");
            for (size_t k = 1; k < 5; ++k) check_rows(in[k], rows, fmt::format("nll_mean input {}", k));
            check_count(in[5]);
            at.get(attr::ignore_index);
            return ValueInfos{{Shape{}, rows.dtype}};
          },
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            const ValueId dlogits =
                b.op("split_loss_backward", {n.inputs[0], n.inputs[4], n.inputs[2], n.inputs[1], g[0], n.inputs[5]},
                     {attr::ignore_index(n.attrs.get(attr::ignore_index))});
            return std::vector<ValueId>{dlogits, ValueId{}, ValueId{}, ValueId{}, ValueId{}, ValueId{}};
          },
      .flops = [](const ValueInfos&, const ValueInfos&, const Attrs&) { return 0.0; },
  });
  ops.push_back({
      // logits, targets, shift, sum_exp, dloss, count -> dlogits =
      // (exp(logits - shift) / sum_exp - onehot(target)) * dloss / count on
      // valid rows, 0 on ignored ones
      .name = "split_loss_backward",
      .num_inputs = 6,
      .infer = [](const ValueInfos& in, const Attrs&) { return ValueInfos{in[0]}; },
      .flops = elementwise_flops(4),
  });
}

}  // namespace

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
            check_count(in[2]);
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
  add_split_loss_ops(ops);
}

}  // namespace meshtrain::graph::ops
