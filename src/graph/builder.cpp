#include "graph/builder.h"

#include "core/error.h"

namespace meshtrain::graph {

ValueId Builder::op(const std::string& name, const std::vector<ValueId>& inputs, const Attrs& attrs) {
  return g_.only_output(g_.add_node(name, inputs, attrs));
}
std::vector<ValueId> Builder::op_outputs(const std::string& name, const std::vector<ValueId>& inputs,
                                         const Attrs& attrs) {
  return g_.node(g_.add_node(name, inputs, attrs)).outputs;
}

ValueId Builder::full(const Shape& shape, DType dtype, double value) {
  return op("full", {}, {attr::shape(shape.dims()), attr::dtype(dtype), attr::value(value)});
}
ValueId Builder::cast(ValueId x, DType dtype) { return op("cast", {x}, {attr::dtype(dtype)}); }
ValueId Builder::add(ValueId a, ValueId b) { return op("add", {a, b}); }
ValueId Builder::mul(ValueId a, ValueId b) { return op("mul", {a, b}); }
ValueId Builder::scale(ValueId a, double alpha) { return op("scale", {a}, {attr::alpha(alpha)}); }
ValueId Builder::matmul(ValueId a, ValueId b, bool ta, bool tb) {
  return op("matmul", {a, b}, {attr::transpose_a(ta), attr::transpose_b(tb)});
}
ValueId Builder::fp8_matmul(ValueId a, ValueId b, ValueId amax_a, ValueId amax_b, bool ta, bool tb, Attrs fp8) {
  fp8.set(attr::transpose_a, ta).set(attr::transpose_b, tb);
  return op("fp8_matmul", {a, b, amax_a, amax_b}, fp8);
}
ValueId Builder::amax(ValueId x, const std::string& tensor) { return op("amax", {x}, {attr::tensor(tensor)}); }
ValueId Builder::sum(ValueId a) { return op("sum", {a}); }
ValueId Builder::mean(ValueId a) { return op("mean", {a}); }
ValueId Builder::broadcast_scalar(ValueId s, const Shape& shape) {
  return op("broadcast_scalar", {s}, {attr::shape(shape.dims())});
}
ValueId Builder::reshape(ValueId a, const Shape& shape) { return op("reshape", {a}, {attr::shape(shape.dims())}); }
ValueId Builder::transpose(ValueId a, int d0, int d1) { return op("transpose", {a}, {attr::dim0(d0), attr::dim1(d1)}); }
ValueId Builder::silu(ValueId x) { return op("silu", {x}); }
ValueId Builder::softmax(ValueId x) { return op("softmax", {x}); }
ValueId Builder::rms_norm(ValueId x, ValueId w, double eps) { return op("rms_norm", {x, w}, {attr::eps(eps)}); }
ValueId Builder::cross_entropy(ValueId logits, ValueId targets, int64_t ignore_index, ValueId count) {
  if (!count.valid()) count = op("count_valid", {targets}, {attr::ignore_index(ignore_index)});
  return op("cross_entropy", {logits, targets, count}, {attr::ignore_index(ignore_index)});
}
ValueId Builder::cross_entropy_split(ValueId logits, ValueId targets, int64_t ignore_index, ValueId count) {
  const Attrs ignore{attr::ignore_index(ignore_index)};
  if (!count.valid()) count = op("count_valid", {targets}, ignore);
  const ValueId shift = op("row_max", {logits});
  const ValueId sum_exp = op("sum_exp", {logits, shift});
  const ValueId target_logit = op("pick", {logits, targets}, ignore);
  return op("nll_mean", {logits, sum_exp, shift, target_logit, targets, count}, ignore);
}
ValueId Builder::embedding(ValueId table, ValueId ids) { return op("embedding", {table, ids}); }

ValueId Builder::silu_backward(ValueId x, ValueId dy) { return op("silu_backward", {x, dy}); }
ValueId Builder::softmax_backward(ValueId y, ValueId dy) { return op("softmax_backward", {y, dy}); }
std::vector<ValueId> Builder::rms_norm_backward(ValueId x, ValueId w, ValueId dy, double eps) {
  return op_outputs("rms_norm_backward", {x, w, dy}, {attr::eps(eps)});
}
ValueId Builder::cross_entropy_backward(ValueId logits, ValueId targets, ValueId dloss, ValueId count,
                                        int64_t ignore_index) {
  return op("cross_entropy_backward", {logits, targets, dloss, count}, {attr::ignore_index(ignore_index)});
}
ValueId Builder::embedding_backward(ValueId ids, ValueId dout, int64_t vocab) {
  return op("embedding_backward", {ids, dout}, {attr::vocab(vocab)});
}

ValueId Builder::rope(ValueId x, double theta, int64_t seq_chunks) {
  Attrs attrs{attr::theta(theta), attr::inverse(false)};
  if (seq_chunks > 1) attrs.set(attr::seq_chunks, seq_chunks);
  return op("rope", {x}, attrs);
}
ValueId Builder::attention(ValueId q, ValueId k, ValueId v, double scale, int64_t seq_chunks, bool ring) {
  Attrs attrs{attr::scale(scale)};
  if (seq_chunks > 1) attrs.set(attr::seq_chunks, seq_chunks);
  if (ring) attrs.set(attr::ring, true);
  return op_outputs("attention", {q, k, v}, attrs)[0];
}
ValueId Builder::reorder_sequence(ValueId x, int64_t seq_chunks, bool inverse) {
  return op("reorder_sequence", {x}, {attr::seq_chunks(seq_chunks), attr::inverse(inverse)});
}
ValueId Builder::swiglu(ValueId gate, ValueId up) { return op("swiglu", {gate, up}); }
ValueId Builder::moe_topk(ValueId probs, int64_t k) { return op("moe_topk", {probs}, {attr::top_k(k)}); }
ValueId Builder::moe_route_weights(ValueId probs, ValueId experts) { return op("moe_route_weights", {probs, experts}); }
Builder::MoeSort Builder::moe_sort(ValueId experts, int64_t n_experts, double capacity_factor) {
  const auto out =
      op_outputs("moe_sort", {experts}, {attr::n_experts(n_experts), attr::capacity_factor(capacity_factor)});
  return {out[0], out[1]};
}
ValueId Builder::moe_permute(ValueId x, ValueId order, int64_t k) {
  return op("moe_permute", {x, order}, {attr::top_k(k)});
}
ValueId Builder::grouped_matmul(ValueId rows, ValueId w, ValueId row_expert, bool transpose_b, int64_t expert_blocks) {
  Attrs at{attr::transpose_b(transpose_b)};
  if (expert_blocks > 0) at.set(attr::expert_blocks, expert_blocks);
  return op("grouped_matmul", {rows, w, row_expert}, at);
}
ValueId Builder::moe_dispatch(ValueId rows, ValueId row_expert, int64_t blocks, int64_t n_experts) {
  return op("moe_dispatch", {rows, row_expert}, {attr::expert_blocks(blocks), attr::n_experts(n_experts)});
}
ValueId Builder::moe_dispatch_experts(ValueId row_expert, int64_t blocks, int64_t n_experts) {
  return op("moe_dispatch_experts", {row_expert}, {attr::expert_blocks(blocks), attr::n_experts(n_experts)});
}
ValueId Builder::moe_undispatch(ValueId blocks_of_rows, ValueId row_expert, int64_t blocks, int64_t n_experts) {
  return op("moe_undispatch", {blocks_of_rows, row_expert}, {attr::expert_blocks(blocks), attr::n_experts(n_experts)});
}
ValueId Builder::moe_combine(ValueId rows, ValueId order, ValueId weights, int64_t k) {
  return op("moe_combine", {rows, order, weights}, {attr::top_k(k)});
}
ValueId Builder::moe_expert_counts(ValueId experts, int64_t n_experts) {
  return op("moe_expert_counts", {experts}, {attr::n_experts(n_experts)});
}
ValueId Builder::moe_router_stats(ValueId probs, ValueId experts) { return op("moe_router_stats", {probs, experts}); }

ValueId Builder::moe_aux_loss(ValueId router_stats, double scale) {
  return op("moe_aux_loss", {router_stats}, {attr::scale(scale)});
}
ValueId Builder::slice(ValueId x, int dim, int64_t start, int64_t length) {
  return op("slice", {x}, {attr::dim(dim), attr::start(start), attr::length(length)});
}
ValueId Builder::concat(const std::vector<ValueId>& xs, int dim) { return op("concat", xs, {attr::dim(dim)}); }
ValueId Builder::ring_shift(ValueId x, int64_t mesh_dim, const std::vector<int64_t>& group, int64_t distance) {
  const ValueInfo info = g_.value(x).info;
  Attrs at{attr::mesh_dims({mesh_dim}), attr::group(group),
           attr::comm_bytes(static_cast<double>(info.shape.numel() * dtype_size(info.dtype)))};
  if (distance != 1) at.set(attr::ring_distance, distance);
  std::vector<ValueId> wait_inputs = g_.node(g_.add_node("ring_shift", {x}, at)).outputs;
  wait_inputs.push_back(x);
  return op("wait", wait_inputs);
}
ValueId Builder::global_norm(const std::vector<ValueId>& xs) {
  MT_CHECK(!xs.empty(), "global_norm needs at least one tensor");
  return norm_from_sum_of_squares(sum_of_squares(xs), g_.value(xs[0]).info.dtype);
}
ValueId Builder::sum_of_squares(const std::vector<ValueId>& xs) {
  MT_CHECK(!xs.empty(), "sum_of_squares needs at least one tensor");
  ValueId total = op("sum_squares", {xs[0]});
  for (size_t i = 1; i < xs.size(); ++i) total = add(total, op("sum_squares", {xs[i]}));
  return total;
}
ValueId Builder::norm_from_sum_of_squares(ValueId total, DType dtype) { return cast(op("sqrt", {total}), dtype); }
ValueId Builder::clip_coefficient(ValueId norm, double max_norm) {
  return op("clip_coefficient", {norm}, {attr::max_norm(max_norm)});
}
ValueId Builder::scale_by(ValueId x, ValueId scalar) { return op("scale_by", {x, scalar}); }
std::vector<ValueId> Builder::adamw(ValueId param, ValueId grad, ValueId m, ValueId v, ValueId lr, ValueId step,
                                    double beta1, double beta2, double eps, double weight_decay,
                                    ValueId apply_if_finite) {
  std::vector<ValueId> inputs{param, grad, m, v, lr, step};
  if (apply_if_finite.valid()) inputs.push_back(apply_if_finite);
  return op_outputs("adamw", inputs,
                    {attr::beta1(beta1), attr::beta2(beta2), attr::eps(eps), attr::weight_decay(weight_decay)});
}
std::vector<ValueId> Builder::attention_backward(ValueId q, ValueId k, ValueId v, ValueId out, ValueId lse,
                                                 ValueId dout, double scale) {
  return op_outputs("attention_backward", {q, k, v, out, lse, dout}, {attr::scale(scale)});
}
std::vector<ValueId> Builder::swiglu_backward(ValueId gate, ValueId up, ValueId dout) {
  return op_outputs("swiglu_backward", {gate, up, dout});
}
ValueId Builder::slice_backward(ValueId dout, int dim, int64_t start, int64_t full_size) {
  return op("slice_backward", {dout}, {attr::dim(dim), attr::start(start), attr::full_size(full_size)});
}

}  // namespace meshtrain::graph
