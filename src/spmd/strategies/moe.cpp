// Strategies of the mixture-of-experts ops (graph/ops/moe.cpp). Routing is
// per token: any dim but the experts' splits. The permutation sorts each
// group [..., N, D] of tokens on its own, so its ops split the group dims
// (the batch) only. The grouped GEMM is per row; its weights split
// Megatron-style by output (column parallel) or by input (row parallel, a
// partial sum). Counts and router statistics are sums over tokens: partial
// sums of sharded tokens; the aux loss, their product, needs them whole.
// Expert parallelism: dispatch keeps the groups' split (one dim further in:
// the blocks lead), and rows dispatched into blocks of experts meet the
// weights of those experts when both are split alike (the blocks by dim 0,
// the weights by expert): each rank its experts' rows.
#include "spmd/strategies/families.h"

namespace meshtrain::spmd::strategies {

namespace {

int rank_of(const StrategyQuery& q, int input) {
  return static_cast<int>(q.in[static_cast<size_t>(input)].shape.rank());
}

bool dispatched(const StrategyQuery& q) { return q.attrs.get_or(graph::attr::expert_blocks, int64_t{0}) > 0; }
// Blocks of rows (dim 0 of input 0) on the ranks of their experts (dim 0 of
// input `experts`): both split evenly, so that each rank's blocks and
// experts are the same range.
DimStrategy by_expert_block(const StrategyQuery& q, int experts, Placement weights) {
  std::vector<Placement> inputs(q.in.size(), S(0));
  inputs[static_cast<size_t>(experts)] = weights;
  return {{S(0)}, inputs, {{0, 0, 1}, {experts, 0, 1}}};
}

std::vector<DimStrategy> grouped_matmul_rule(const StrategyQuery& q) {
  const int last = rank_of(q, 0) - 1;
  const bool tb = q.attrs.get(graph::attr::transpose_b);
  auto out = same_shard_below(q, last);
  for (DimStrategy& s : out) s.inputs[1] = R();  // the weights whole on every row split
  if (dispatched(q)) out.insert(out.begin(), by_expert_block(q, 1, S(0)));
  out.push_back({{S(last)}, {R(), S(tb ? 1 : 2), R()}});  // each rank its outputs
  out.push_back({{P()}, {S(last), S(tb ? 2 : 1), R()}});  // each rank its inputs: a partial sum
  return out;
}

std::vector<DimStrategy> grouped_matmul_wgrad_rule(const StrategyQuery& q) {
  const int last = rank_of(q, 0) - 1;
  std::vector<DimStrategy> out;
  if (dispatched(q)) {  // each rank its experts' gradients, whole: every row of them is here
    DimStrategy s = by_expert_block(q, 1, S(0));
    s.inputs[2] = S(0);
    s.even_splits = {{0, 0, 1}};
    out.push_back(s);
  }
  for (int d = 0; d < last; ++d) out.push_back({{P()}, {S(d), S(d), S(d)}});
  out.push_back({{S(1)}, {S(last), R(), R()}});
  out.push_back({{S(2)}, {R(), S(last), R()}});
  return out;
}

// A local grouped GEMM's first expert: where this rank's part of the
// experts starts (`experts`: the tensor whose dim 0 they are).
graph::Attrs with_first_expert(const LocalNode& n, const sharding::LocalChunk& experts) {
  graph::Attrs local = n.attrs;
  local.set(graph::attr::first_expert, experts.offset[0]);
  if (n.attrs.has(graph::attr::n_experts.name)) local.set(graph::attr::n_experts, experts.shape.dim(0));
  return local;
}

// Dispatch and undispatch: the groups' splits, one dim apart; sums pass through.
std::vector<DimStrategy> dispatch_rule(const StrategyQuery& q, bool into_blocks) {
  const int groups = rank_of(q, q.in.size() == 2 ? 1 : 0) - 1;  // row_expert [..., M]: its leading dims
  std::vector<DimStrategy> out;
  for (int d = 0; d < groups; ++d) {
    std::vector<Placement> inputs{into_blocks ? S(d) : S(d + 1), S(d)};
    if (q.in.size() == 1) inputs.resize(1);
    out.push_back({{into_blocks ? S(d + 1) : S(d)}, inputs});
  }
  if (q.in.size() == 2) out.push_back({{P()}, {P(), R()}});
  return out;
}

}  // namespace

void add_moe_rules(const AddRule& add) {
  for (const char* op : {"moe_topk", "moe_route_weights", "moe_route_weights_backward"}) add(op, same_shard_but_last);
  add("moe_sort", [](const StrategyQuery& q) { return same_shard_below(q, rank_of(q, 0) - 2); });
  add("moe_expert_counts", partial_sum_of_shards);
  for (const char* op : {"moe_permute", "moe_combine_weight_grad"})
    add(op, [](const StrategyQuery& q) { return same_shard_below(q, rank_of(q, 0) - 2); });
  add("moe_combine", [](const StrategyQuery& q) {  // linear in the rows: partial rows give a partial sum
    auto out = same_shard_below(q, rank_of(q, 0) - 2);
    std::vector<Placement> inputs(q.in.size(), R());
    inputs[0] = P();
    out.push_back({{P()}, inputs});
    return out;
  });
  add("moe_dispatch", [](const StrategyQuery& q) { return dispatch_rule(q, true); });
  add("moe_undispatch", [](const StrategyQuery& q) { return dispatch_rule(q, false); });
  add("moe_dispatch_experts", [](const StrategyQuery& q) { return dispatch_rule(q, true); });
  add("grouped_matmul", grouped_matmul_rule);
  add.localize("grouped_matmul", [](const LocalNode& n) { return with_first_expert(n, n.in[1]); });
  add("grouped_matmul_wgrad", grouped_matmul_wgrad_rule);
  add.localize("grouped_matmul_wgrad", [](const LocalNode& n) { return with_first_expert(n, n.out[0]); });
  add("moe_router_stats", [](const StrategyQuery& q) {  // sums over rows: a shard's are partial
    std::vector<DimStrategy> out;
    for (int d = 0; d + 1 < rank_of(q, 0); ++d) out.push_back({{P()}, {S(d), S(d)}});
    return out;
  });
  add("moe_router_stats_backward", [](const StrategyQuery& q) {
    std::vector<DimStrategy> out;
    for (int d = 0; d + 1 < rank_of(q, 0); ++d) out.push_back({{S(d)}, {S(d), R()}});
    return out;
  });
  // The aux loss and its backward, a product of sums: on whole statistics only.
  for (const char* op : {"moe_aux_loss", "moe_aux_loss_backward"})
    add(op, [](const StrategyQuery&) { return std::vector<DimStrategy>{}; });
}

}  // namespace meshtrain::spmd::strategies
