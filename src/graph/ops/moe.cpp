// Mixture-of-experts ops: routing (top-k of the router's probabilities and
// their renormalised weights), the permutation of tokens into runs by
// expert, the grouped GEMM over those runs, the weighted combine back to
// token order, expert counts and the load-balancing (aux) loss.
//
// Tokens are [..., N, D]: each index of the leading dims is a group of N
// tokens (a sequence) that is sorted by expert on its own, so that every op
// is a function of its group alone and a layout that shards a leading dim
// computes the single-rank numbers. Each token's k slots are flattened to
// the group's M = N k rows, slot s = t k + j; `order` [..., M] lists for
// each permuted row the slot it holds, `row_expert` [..., M] its expert (or
// n_experts: dropped, over capacity). Rows are in expert order, ties in slot
// order (a stable sort).
//
// Expert parallelism splits the experts into B blocks of E / B: dispatch
// packs each group's rows of block b (a run, the rows being in expert order)
// to the front of [b, group] of a [B, ..., M, D] tensor, zeros after them;
// laid out by block, each rank holds the rows of its experts, and a grouped
// GEMM with `expert_blocks` B computes them on its experts' weights.
// Undispatch puts them back in their groups' order.
#include <cmath>

#include "graph/ops/families.h"
#include "graph/ops/op_support.h"

namespace meshtrain::graph::ops {

namespace {

void check_i64(const ValueInfo& v, const char* what) {
  MT_CHECK(v.dtype == DType::i64, "{} must be i64, got {}", what, dtype_name(v.dtype));
}

// Shapes: the last dim replaced; the leading dims, `drop` dims short; dims appended.
Shape with_last(const Shape& s, int64_t last) {
  std::vector<int64_t> dims = s.dims();
  dims.back() = last;
  return Shape(dims);
}
Shape leading(const Shape& s, size_t drop) {
  return Shape(std::vector<int64_t>(s.dims().begin(), s.dims().end() - static_cast<std::ptrdiff_t>(drop)));
}
Shape append(Shape s, std::initializer_list<int64_t> tail) {
  std::vector<int64_t> dims = s.dims();
  dims.insert(dims.end(), tail);
  return Shape(dims);
}

// Tokens x [..., N, D] and their permuted rows [..., M, D] (M = N k): equal
// leading dims and row length, M a multiple of N.
void check_token_rows(const ValueInfo& tokens, const ValueInfo& rows, int64_t k) {
  MT_CHECK(tokens.shape.rank() >= 2 && rows.shape.rank() == tokens.shape.rank(),
           "tokens must be [..., N, D] and their rows [..., N k, D] alike, got {} and {}", tokens.shape.to_string(),
           rows.shape.to_string());
  MT_CHECK(leading(tokens.shape, 2) == leading(rows.shape, 2) && tokens.shape.dim(-1) == rows.shape.dim(-1) &&
               rows.shape.dim(-2) == tokens.shape.dim(-2) * k,
           "tokens {} and rows {} do not match for top_k {}", tokens.shape.to_string(), rows.shape.to_string(), k);
}
// order [..., M] for rows [..., M, D].
void check_order(const ValueInfo& order, const ValueInfo& rows) {
  check_i64(order, "order");
  MT_CHECK(order.shape == leading(rows.shape, 1), "order must be {} for rows {}, got {}",
           leading(rows.shape, 1).to_string(), rows.shape.to_string(), order.shape.to_string());
}
// weights [..., N, k] for tokens [..., N, D].
void check_weights(const ValueInfo& weights, const ValueInfo& tokens, int64_t k) {
  MT_CHECK(weights.shape == with_last(tokens.shape, k) && weights.dtype == tokens.dtype,
           "weights must be {} {} for tokens {}, got {} {}", dtype_name(tokens.dtype),
           with_last(tokens.shape, k).to_string(), tokens.shape.to_string(), dtype_name(weights.dtype),
           weights.shape.to_string());
}
int64_t top_k_of(const Attrs& at) {
  const int64_t k = at.get(attr::top_k);
  MT_CHECK(k >= 1, "top_k must be >= 1, got {}", k);
  return k;
}

// grouped_matmul's dims: rows [..., M, K] @ w[e]^T ([E, N, K]) or @ w[e] ([E, K, N]).
struct GroupedDims {
  int64_t experts, n, k;
};
GroupedDims grouped_dims(const ValueInfos& in, bool tb) {
  check_float(in[0], "grouped_matmul rows");
  MT_CHECK(in[1].dtype == in[0].dtype && in[1].shape.rank() == 3,
           "grouped_matmul weights must be [experts, out, in] in the rows' dtype {}, got {} {}",
           dtype_name(in[0].dtype), dtype_name(in[1].dtype), in[1].shape.to_string());
  check_i64(in[2], "row_expert");
  MT_CHECK(in[0].shape.rank() >= 1 && in[2].shape == leading(in[0].shape, 1),
           "row_expert must be {} for rows {}, got {}", in[0].shape.rank() ? leading(in[0].shape, 1).to_string() : "",
           in[0].shape.to_string(), in[2].shape.to_string());
  const Shape& w = in[1].shape;
  const GroupedDims d{w[0], tb ? w[1] : w[2], tb ? w[2] : w[1]};
  MT_CHECK(in[0].shape.dim(-1) == d.k, "grouped_matmul: rows of {} do not meet weights {} (transpose_b {})",
           in[0].shape.dim(-1), w.to_string(), tb);
  return d;
}

// Rows [b, ..., M, K] of b of the B blocks rows were dispatched into (B
// globally, fewer on a rank that holds some blocks), over as many blocks'
// experts (0: not dispatched).
int64_t expert_blocks_of(const Attrs& at, const ValueInfo& rows, int64_t experts) {
  const int64_t blocks = at.get_or(attr::expert_blocks, int64_t{0});
  MT_CHECK(blocks >= 0, "expert_blocks must be >= 0, got {}", blocks);
  if (blocks == 0) return 0;
  const int64_t here = rows.shape.rank() >= 3 ? rows.shape.dim(0) : 0;
  MT_CHECK(here >= 1 && blocks % here == 0 && experts % here == 0,
           "rows dispatched into {} blocks must be [blocks, ..., M, K] with blocks dividing {} and the {} experts; "
           "got rows {}",
           blocks, blocks, experts, rows.shape.to_string());
  return blocks;
}
// Rows that carry work: a dispatched tensor's B blocks hold each row once,
// so 1 / B of any block's rows on average.
double working_rows_share(const Attrs& at) {
  const int64_t blocks = at.get_or(attr::expert_blocks, int64_t{0});
  return blocks > 0 ? 1.0 / static_cast<double>(blocks) : 1.0;
}

std::vector<ValueId> grouped_matmul_backward(Builder& b, const Node& n, const std::vector<ValueId>& g) {
  const ValueId x = n.inputs[0], w = n.inputs[1], re = n.inputs[2];
  const bool tb = n.attrs.get(attr::transpose_b);
  const int64_t experts = b.graph().value(w).info.shape.dim(0);
  Attrs dx_attrs{attr::transpose_b(!tb)}, wgrad{attr::n_experts(experts)};
  if (const int64_t blocks = n.attrs.get_or(attr::expert_blocks, int64_t{0}); blocks > 0) {
    dx_attrs.set(attr::expert_blocks, blocks);
    wgrad.set(attr::expert_blocks, blocks);
  }
  const ValueId dx = b.op("grouped_matmul", {g[0], w, re}, dx_attrs);
  const ValueId dw =
      tb ? b.op("grouped_matmul_wgrad", {g[0], x, re}, wgrad) : b.op("grouped_matmul_wgrad", {x, g[0], re}, wgrad);
  return {dx, dw, ValueId{}};
}

// permute and combine are each other's transpose: permute(x, order, w) puts
// w[s] x[t] in row p; combine(y, order, w) sums w[s] y[p] into token t.
std::vector<ValueId> permute_backward(Builder& b, const Node& n, const std::vector<ValueId>& g) {
  std::vector<ValueId> in{g[0], n.inputs[1]};
  if (n.inputs.size() == 3) in.push_back(n.inputs[2]);
  std::vector<ValueId> out{b.op("moe_combine", in, n.attrs), ValueId{}};
  if (n.inputs.size() == 3) out.push_back(b.op("moe_combine_weight_grad", {n.inputs[0], g[0], n.inputs[1]}, n.attrs));
  return out;
}
std::vector<ValueId> combine_backward(Builder& b, const Node& n, const std::vector<ValueId>& g) {
  std::vector<ValueId> in{g[0], n.inputs[1]};
  if (n.inputs.size() == 3) in.push_back(n.inputs[2]);
  std::vector<ValueId> out{b.op("moe_permute", in, n.attrs), ValueId{}};
  if (n.inputs.size() == 3) out.push_back(b.op("moe_combine_weight_grad", {g[0], n.inputs[0], n.inputs[1]}, n.attrs));
  return out;
}

void add_routing_ops(std::vector<OpDef>& ops) {
  ops.push_back({
      .name = "moe_topk",  // probs [..., E] -> the k largest's experts [..., k] i64, ties to the lower index
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            check_float(in[0], "moe_topk probabilities");
            const int64_t k = top_k_of(at);
            MT_CHECK(in[0].shape.rank() >= 1 && k <= in[0].shape.dim(-1), "top_k {} is more than the {} experts of {}",
                     k, in[0].shape.rank() ? in[0].shape.dim(-1) : 0, in[0].shape.to_string());
            return ValueInfos{{with_last(in[0].shape, k), DType::i64}};
          },
      .flops = [](const ValueInfos& in, const ValueInfos& out,
                  const Attrs&) { return numel(in[0]) * static_cast<double>(out[0].shape.dim(-1)); },
  });
  ops.push_back({
      .name = "moe_route_weights",  // probs [..., E], experts [..., k] -> their probs renormalised to sum to 1
      .num_inputs = 2,
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            check_float(in[0], "moe_route_weights probabilities");
            check_i64(in[1], "experts");
            MT_CHECK(in[0].shape.rank() >= 1 && in[1].shape == with_last(in[0].shape, in[1].shape.dim(-1)),
                     "experts must be [..., k] over probabilities {}, got {}", in[0].shape.to_string(),
                     in[1].shape.to_string());
            return ValueInfos{{in[1].shape, in[0].dtype}};
          },
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            return std::vector<ValueId>{b.op("moe_route_weights_backward", {n.inputs[0], n.inputs[1], g[0]}),
                                        ValueId{}};
          },
      .flops = elementwise_flops(2),
  });
  ops.push_back({
      .name = "moe_route_weights_backward",  // probs, experts, dweights -> dprobs
      .num_inputs = 3,
      .infer = [](const ValueInfos& in, const Attrs&) { return ValueInfos{in[0]}; },
      .flops = elementwise_flops(1),
  });
  ops.push_back({
      .name = "moe_sort",  // experts [..., N, k] -> order, row_expert [..., N k]: each group's slots by expert
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            check_i64(in[0], "experts");
            MT_CHECK(in[0].shape.rank() >= 2, "experts must be [..., N, k], got {}", in[0].shape.to_string());
            MT_CHECK(at.get(attr::n_experts) >= 1 && std::isfinite(at.get(attr::capacity_factor)) &&
                         at.get(attr::capacity_factor) >= 0,
                     "moe_sort needs n_experts >= 1 and a finite capacity_factor >= 0");
            const Shape rows = append(leading(in[0].shape, 2), {in[0].shape.dim(-2) * in[0].shape.dim(-1)});
            return ValueInfos{{rows, DType::i64}, {rows, DType::i64}};
          },
  });
  ops.push_back({
      .name = "moe_expert_counts",  // experts [...] -> f32 [n_experts]: how many entries name each
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            check_i64(in[0], "experts");
            MT_CHECK(at.get(attr::n_experts) >= 1, "n_experts must be >= 1");
            return ValueInfos{{Shape{at.get(attr::n_experts)}, DType::f32}};
          },
  });
}

void add_permutation_ops(std::vector<OpDef>& ops) {
  ops.push_back({
      .name = "moe_permute",  // x [..., N, D], order [..., M] (, weights [..., N, k]) -> rows [..., M, D]
      .num_inputs = OpDef::kVariadic,
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            MT_CHECK(in.size() == 2 || in.size() == 3, "moe_permute takes x, order and optional weights");
            check_float(in[0], "moe_permute x");
            const int64_t k = top_k_of(at);
            MT_CHECK(in[0].shape.rank() >= 2, "x must be [..., N, D], got {}", in[0].shape.to_string());
            const ValueInfo rows{append(leading(in[0].shape, 2), {in[0].shape.dim(-2) * k, in[0].shape.dim(-1)}),
                                 in[0].dtype};
            check_order(in[1], rows);
            if (in.size() == 3) check_weights(in[2], in[0], k);
            return ValueInfos{rows};
          },
      .backward = permute_backward,
      .flops = elementwise_flops(1),
  });
  ops.push_back({
      .name = "moe_combine",  // rows [..., M, D], order [..., M] (, weights [..., N, k]) -> [..., N, D]
      .num_inputs = OpDef::kVariadic,
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            MT_CHECK(in.size() == 2 || in.size() == 3, "moe_combine takes rows, order and optional weights");
            check_float(in[0], "moe_combine rows");
            const int64_t k = top_k_of(at);
            MT_CHECK(in[0].shape.rank() >= 2 && in[0].shape.dim(-2) % k == 0,
                     "rows must be [..., N k, D] for top_k {}, got {}", k, in[0].shape.to_string());
            const ValueInfo tokens{append(leading(in[0].shape, 2), {in[0].shape.dim(-2) / k, in[0].shape.dim(-1)}),
                                   in[0].dtype};
            check_order(in[1], in[0]);
            if (in.size() == 3) check_weights(in[2], tokens, k);
            return ValueInfos{tokens};
          },
      .backward = combine_backward,
      .flops = elementwise_flops(2),
  });
  ops.push_back({
      .name = "moe_combine_weight_grad",  // a [..., N, D], rows [..., M, D], order -> [..., N, k] of a[t] . rows[p]
      .num_inputs = 3,
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            const int64_t k = top_k_of(at);
            check_float(in[0], "moe_combine_weight_grad a");
            check_token_rows(in[0], in[1], k);
            check_order(in[2], in[1]);
            return ValueInfos{{with_last(in[0].shape, k), in[0].dtype}};
          },
      .flops = [](const ValueInfos& in, const ValueInfos&, const Attrs&) { return 2 * numel(in[1]); },
  });
}

// Dispatch's blocks: B >= 1 dividing the experts.
int64_t dispatch_blocks(const Attrs& at) {
  const int64_t blocks = at.get(attr::expert_blocks), experts = at.get(attr::n_experts);
  MT_CHECK(blocks >= 1 && experts >= 1 && experts % blocks == 0,
           "expert_blocks {} must be >= 1 and divide n_experts {}", blocks, experts);
  return blocks;
}
Shape prepend(const Shape& s, int64_t head) {
  std::vector<int64_t> dims{head};
  dims.insert(dims.end(), s.dims().begin(), s.dims().end());
  return Shape(dims);
}
// rows [..., M, D] and row_expert [..., M].
void check_rows_experts(const ValueInfo& rows, const ValueInfo& row_expert) {
  check_i64(row_expert, "row_expert");
  MT_CHECK(rows.shape.rank() >= 2 && row_expert.shape == leading(rows.shape, 1),
           "rows must be [..., M, D] and row_expert [..., M], got {} and {}", rows.shape.to_string(),
           row_expert.shape.to_string());
}

void add_dispatch_ops(std::vector<OpDef>& ops) {
  ops.push_back({
      .name = "moe_dispatch",  // rows [..., M, D], row_expert [..., M] -> [B, ..., M, D] by block of experts
      .num_inputs = 2,
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            check_float(in[0], "moe_dispatch rows");
            check_rows_experts(in[0], in[1]);
            return ValueInfos{{prepend(in[0].shape, dispatch_blocks(at)), in[0].dtype}};
          },
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            return std::vector<ValueId>{b.op("moe_undispatch", {g[0], n.inputs[1]}, n.attrs), ValueId{}};
          },
      .flops = elementwise_flops(0),
  });
  ops.push_back({
      .name = "moe_undispatch",  // [B, ..., M, D], row_expert [..., M] -> rows [..., M, D]; dropped rows 0
      .num_inputs = 2,
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            check_float(in[0], "moe_undispatch rows");
            const int64_t blocks = dispatch_blocks(at);
            MT_CHECK(in[0].shape.rank() >= 3 && in[0].shape.dim(0) == blocks,
                     "moe_undispatch takes [{}, ..., M, D], got {}", blocks, in[0].shape.to_string());
            const ValueInfo rows{Shape(std::vector<int64_t>(in[0].shape.dims().begin() + 1, in[0].shape.dims().end())),
                                 in[0].dtype};
            check_rows_experts(rows, in[1]);
            return ValueInfos{rows};
          },
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            return std::vector<ValueId>{b.op("moe_dispatch", {g[0], n.inputs[1]}, n.attrs), ValueId{}};
          },
      .flops = elementwise_flops(0),
  });
  ops.push_back({
      .name = "moe_dispatch_experts",  // row_expert [..., M] -> [B, ..., M]: each block's, then n_experts
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            check_i64(in[0], "row_expert");
            MT_CHECK(in[0].shape.rank() >= 1, "row_expert must be [..., M], got {}", in[0].shape.to_string());
            return ValueInfos{{prepend(in[0].shape, dispatch_blocks(at)), DType::i64}};
          },
  });
}

void add_grouped_matmul_ops(std::vector<OpDef>& ops) {
  ops.push_back({
      .name = "grouped_matmul",  // rows [..., M, K], w [E, N, K] (or [E, K, N]), row_expert [..., M] -> [..., M, N]
      .num_inputs = 3,
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            const GroupedDims d = grouped_dims(in, at.get(attr::transpose_b));
            expert_blocks_of(at, in[0], d.experts);
            return ValueInfos{{with_last(in[0].shape, d.n), in[0].dtype}};
          },
      .backward = grouped_matmul_backward,
      .flops =
          [](const ValueInfos& in, const ValueInfos& out, const Attrs& at) {
            return 2.0 * numel(out[0]) * static_cast<double>(in[0].shape.dim(-1)) * working_rows_share(at);
          },
      .bytes =  // the rows in and out, and each expert's weights once
      [](const ValueInfos& in, const ValueInfos& out, const Attrs&) {
        return bytes_of(in[0]) + bytes_of(in[1]) + bytes_of(in[2]) + bytes_of(out[0]);
      },
  });
  ops.push_back({
      .name = "grouped_matmul_wgrad",  // a [..., M, P], b [..., M, Q], row_expert -> [E, P, Q], each expert's a^T b
      .num_inputs = 3,
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            check_float(in[0], "grouped_matmul_wgrad a");
            MT_CHECK(in[1].dtype == in[0].dtype && in[0].shape.rank() >= 1 &&
                         in[1].shape.rank() == in[0].shape.rank() && leading(in[0].shape, 1) == leading(in[1].shape, 1),
                     "grouped_matmul_wgrad needs rows of one dtype and count, got {} and {}", in[0].shape.to_string(),
                     in[1].shape.to_string());
            check_i64(in[2], "row_expert");
            MT_CHECK(in[2].shape == leading(in[0].shape, 1), "row_expert must be {}, got {}",
                     leading(in[0].shape, 1).to_string(), in[2].shape.to_string());
            expert_blocks_of(at, in[0], at.get(attr::n_experts));
            return ValueInfos{{Shape{at.get(attr::n_experts), in[0].shape.dim(-1), in[1].shape.dim(-1)}, in[0].dtype}};
          },
      .flops =
          [](const ValueInfos& in, const ValueInfos&, const Attrs& at) {
            return 2.0 * numel(in[0]) * static_cast<double>(in[1].shape.dim(-1)) * working_rows_share(at);
          },
  });
}

void add_aux_loss_ops(std::vector<OpDef>& ops) {
  // The Switch Transformer load-balancing loss, in two steps so that the
  // statistics of layers on several pipeline stages (and of data-parallel
  // ranks) add up before the loss is formed: each layer's router statistics
  // [2, E] (row 0: the top-k picks of each expert, row 1: the sum over rows
  // of its probability), summed over every MoE layer; then the loss, scale x
  // their dot product (with scale = n_experts / rows^2, Hugging Face's
  // load_balancing_loss_func over the rows of every layer taken together).
  ops.push_back({
      .name = "moe_router_stats",  // probs [..., E], experts [..., k] -> [2, E] (picks; probability sums)
      .num_inputs = 2,
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            check_float(in[0], "moe_router_stats probabilities");
            check_i64(in[1], "experts");
            MT_CHECK(in[0].shape.rank() >= 1 && in[1].shape.rank() == in[0].shape.rank() &&
                         leading(in[0].shape, 1) == leading(in[1].shape, 1),
                     "moe_router_stats needs probabilities [..., E] and experts [..., k] of the same rows, got {} and "
                     "{}",
                     in[0].shape.to_string(), in[1].shape.to_string());
            return ValueInfos{{Shape{2, in[0].shape.dim(-1)}, in[0].dtype}};
          },
      .backward =  // the picks are a top-k choice, constant in the probabilities
      [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
        return std::vector<ValueId>{b.op("moe_router_stats_backward", {n.inputs[0], g[0]}), ValueId{}};
      },
      .flops = [](const ValueInfos& in, const ValueInfos&, const Attrs&) { return numel(in[0]) + numel(in[1]); },
  });
  ops.push_back({
      .name = "moe_router_stats_backward",  // probs (for its shape), dstats [2, E] -> dprobs[r, e] = dstats[1, e]
      .num_inputs = 2,
      .infer = [](const ValueInfos& in, const Attrs&) { return ValueInfos{in[0]}; },
      .flops = elementwise_flops(0),
      .bytes = [](const ValueInfos& in, const ValueInfos& out,
                  const Attrs&) { return bytes_of(in[1]) + bytes_of(out[0]); },
  });
  ops.push_back({
      .name = "moe_aux_loss",  // stats [2, E] -> scale * stats[0] . stats[1]
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            check_float(in[0], "moe_aux_loss statistics");
            MT_CHECK(in[0].shape.rank() == 2 && in[0].shape.dim(0) == 2,
                     "moe_aux_loss needs router statistics [2, n_experts], got {}", in[0].shape.to_string());
            at.get(attr::scale);
            return ValueInfos{{Shape{}, in[0].dtype}};
          },
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            return std::vector<ValueId>{b.op("moe_aux_loss_backward", {n.inputs[0], g[0]}, n.attrs)};
          },
      .flops = elementwise_flops(2),
  });
  ops.push_back({
      .name = "moe_aux_loss_backward",  // stats, dloss -> dloss * scale * [stats[1]; stats[0]]
      .num_inputs = 2,
      .infer = [](const ValueInfos& in, const Attrs&) { return ValueInfos{in[0]}; },
      .flops = elementwise_flops(2),
  });
}

}  // namespace

void add_moe_ops(std::vector<OpDef>& ops) {
  add_routing_ops(ops);
  add_permutation_ops(ops);
  add_dispatch_ops(ops);
  add_grouped_matmul_ops(ops);
  add_aux_loss_ops(ops);
}

}  // namespace meshtrain::graph::ops
