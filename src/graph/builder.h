// Builder: one typed function per op, so model code reads like the math.
// Each call adds a node to the graph and returns its output value.
#pragma once

#include "graph/graph.h"

namespace meshtrain::graph {

class Builder {
 public:
  explicit Builder(Graph& g) : g_(g) {}
  Graph& graph() { return g_; }

  // Adds a node of a registered op by name: its one output, or all of them.
  ValueId op(const std::string& name, const std::vector<ValueId>& inputs, const Attrs& attrs = {});
  std::vector<ValueId> op_outputs(const std::string& name, const std::vector<ValueId>& inputs, const Attrs& attrs = {});

  ValueId full(const Shape& shape, DType dtype, double value);  // a constant
  ValueId cast(ValueId x, DType dtype);                         // its backward casts the gradient back
  ValueId add(ValueId a, ValueId b);
  ValueId mul(ValueId a, ValueId b);
  ValueId scale(ValueId a, double alpha);
  // [..., M, K] @ [K, N] (weights shared over the batch) or [..., K, N];
  // transpose_a / transpose_b read a as [..., K, M], b as [N, K].
  ValueId matmul(ValueId a, ValueId b, bool transpose_a = false, bool transpose_b = false);
  // FP8 (graph/ops/matmul.cpp): matmul on a and b each quantised to an FP8
  // format with the scale of its amax; `fp8` holds format_a, format_b,
  // grad_format (of the output's gradient), pow2_scale, tensor (the layer)
  // and operand_a, operand_b (their roles in it, for errors).
  ValueId fp8_matmul(ValueId a, ValueId b, ValueId amax_a, ValueId amax_b, bool transpose_a, bool transpose_b,
                     Attrs fp8);
  // The largest magnitude of x's elements (f32 scalar; +inf when one is NaN
  // or infinite); `tensor` says what x is.
  ValueId amax(ValueId x, const std::string& tensor);
  ValueId sum(ValueId a);   // all elements -> scalar
  ValueId mean(ValueId a);  // all elements -> scalar
  ValueId broadcast_scalar(ValueId scalar, const Shape& shape);
  ValueId reshape(ValueId a, const Shape& shape);
  ValueId transpose(ValueId a, int dim0, int dim1);
  ValueId silu(ValueId x);
  ValueId softmax(ValueId x);                               // over the last dim
  ValueId rms_norm(ValueId x, ValueId weight, double eps);  // over the last dim
  // Mean over rows whose target != ignore_index; targets i64.
  // The mean over the rows whose target is not ignore_index: count_valid,
  // then cross_entropy. `count` (f64 scalar): divide by it instead (the
  // valid targets of a whole batch these rows are part of).
  ValueId cross_entropy(ValueId logits, ValueId targets, int64_t ignore_index = -100, ValueId count = {});
  // The same mean in parts that each sum over the vocabulary (row_max,
  // sum_exp, pick, nll_mean; graph/ops/loss.cpp), for logits split by
  // vocabulary; its gradient is one op (split_loss_backward).
  ValueId cross_entropy_split(ValueId logits, ValueId targets, int64_t ignore_index = -100, ValueId count = {});
  ValueId embedding(ValueId table, ValueId ids);  // ids i64 -> [..., dim]

  // Rotary embedding (HF rotate-half) of x [B, T, H, D] at positions 0..T-1.
  // `seq_chunks` > 1: the sequence (dim 1) is in context parallelism's
  // load-balanced order of that many chunks (graph/sequence_order.h).
  ValueId rope(ValueId x, double theta, int64_t seq_chunks = 1);
  // Causal attention, q [B, T, Hq, D], k/v [B, T, Hkv, D] -> [B, T, Hq, D];
  // q in the load-balanced order of `seq_chunks` chunks, k and v in position order.
  // ring: k and v in q's load-balanced order (context parallelism's ring attention; graph/ops/attention.cpp).
  ValueId attention(ValueId q, ValueId k, ValueId v, double scale, int64_t seq_chunks = 1, bool ring = false);
  // x [B, T, ...] into the load-balanced order of `seq_chunks` chunks, or back.
  ValueId reorder_sequence(ValueId x, int64_t seq_chunks, bool inverse = false);
  ValueId swiglu(ValueId gate, ValueId up);  // silu(gate) * up
  ValueId slice(ValueId x, int dim, int64_t start, int64_t length);
  ValueId concat(const std::vector<ValueId>& xs, int dim);
  // x sent to the rank `distance` places on in `group` (over mesh dim
  // `mesh_dim`) while the tensor of the rank as many back arrives: a
  // ring_shift started and waited on here (sched's sink_waits moves the wait
  // down to the first reader), x read until it completes (graph/ops/collective.cpp).
  ValueId ring_shift(ValueId x, int64_t mesh_dim, const std::vector<int64_t>& group, int64_t distance = 1);
  // Mixture of experts (graph/ops/moe.cpp). Routing: the k most probable
  // experts of each row of probs [..., E] (i64 [..., k]), and their
  // probabilities renormalised to sum to 1.
  ValueId moe_topk(ValueId probs, int64_t k);
  ValueId moe_route_weights(ValueId probs, ValueId experts);
  struct MoeSort {
    ValueId order, row_expert;  // [..., N k] each
  };
  // Each group of experts [..., N, k] sorted by expert (capacity_factor 0: dropless).
  MoeSort moe_sort(ValueId experts, int64_t n_experts, double capacity_factor = 0);
  ValueId moe_permute(ValueId x, ValueId order, int64_t k);  // [..., N, D] -> rows [..., N k, D]
  // Rows [..., M, K] each times its expert's w [E, N, K]^T (or [E, K, N]) -> [..., M, N].
  ValueId grouped_matmul(ValueId rows, ValueId w, ValueId row_expert, bool transpose_b = true,
                         int64_t expert_blocks = 0);
  // Expert parallelism: rows [..., M, D] into `blocks` blocks of experts
  // [blocks, ..., M, D], their row_expert likewise, and back.
  ValueId moe_dispatch(ValueId rows, ValueId row_expert, int64_t blocks, int64_t n_experts);
  ValueId moe_dispatch_experts(ValueId row_expert, int64_t blocks, int64_t n_experts);
  ValueId moe_undispatch(ValueId blocks_of_rows, ValueId row_expert, int64_t blocks, int64_t n_experts);
  // Rows back to tokens, each token's k rows weighted by weights [..., N, k] and summed.
  ValueId moe_combine(ValueId rows, ValueId order, ValueId weights, int64_t k);
  ValueId moe_expert_counts(ValueId experts, int64_t n_experts);  // f32 [n_experts]
  // [2, n_experts]: each expert's top-k picks, and the sum of its probability over the rows.
  ValueId moe_router_stats(ValueId probs, ValueId experts);
  ValueId moe_aux_loss(ValueId router_stats, double scale);  // scale x picks . probability sums
  // Optimizer-side ops (not differentiated).
  // sqrt(sum of squares of all elements) in xs[0]'s dtype: sum_squares of each
  // (f64), added, sqrt, cast, so each tensor's part can be summed where it lies.
  ValueId global_norm(const std::vector<ValueId>& xs);
  // global_norm's two halves: the f64 sum of squares of all elements in xs
  // (each tensor's, added in order), and the norm from such a sum (or from
  // the sum of several ranks' sums) in `dtype`.
  ValueId sum_of_squares(const std::vector<ValueId>& xs);
  ValueId norm_from_sum_of_squares(ValueId total, DType dtype);
  ValueId clip_coefficient(ValueId norm, double max_norm);  // min(1, max_norm / (norm + 1e-6)), as PyTorch
  ValueId scale_by(ValueId x, ValueId scalar);              // x * scalar (a one-element tensor)
  // AdamW (PyTorch semantics); lr f64 and step i64 are scalar inputs -> {param, m, v} updated.
  // `apply_if_finite` (a scalar, the step's gradient norm): where it is NaN
  // or infinite, the outputs are the inputs unchanged (the step is skipped).
  std::vector<ValueId> adamw(ValueId param, ValueId grad, ValueId m, ValueId v, ValueId lr, ValueId step, double beta1,
                             double beta2, double eps, double weight_decay, ValueId apply_if_finite = {});

  // Backward helpers (ops in their own right, used by backward rules).
  ValueId silu_backward(ValueId x, ValueId dy);
  ValueId softmax_backward(ValueId y, ValueId dy);
  std::vector<ValueId> rms_norm_backward(ValueId x, ValueId weight, ValueId dy, double eps);  // {dx, dweight}
  ValueId cross_entropy_backward(ValueId logits, ValueId targets, ValueId dloss, ValueId count, int64_t ignore_index);
  ValueId embedding_backward(ValueId ids, ValueId dout, int64_t vocab);
  std::vector<ValueId> attention_backward(ValueId q, ValueId k, ValueId v, ValueId out, ValueId lse, ValueId dout,
                                          double scale);
  std::vector<ValueId> swiglu_backward(ValueId gate, ValueId up, ValueId dout);
  ValueId slice_backward(ValueId dout, int dim, int64_t start, int64_t full_size);

 private:
  Graph& g_;
};

}  // namespace meshtrain::graph
