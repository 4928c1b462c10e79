// Strategies of the mixture-of-experts ops (graph/ops/moe.cpp). Routing is
// per token: any dim but the experts' splits. The permutation sorts each
// group [..., N, D] of tokens on its own, so its ops split the group dims
// (the batch) only. The grouped GEMM is per row; its weights split
// Megatron-style by output (column parallel) or by input (row parallel, a
// partial sum). Counts and the aux loss are sums over tokens: partial sums of
// sharded tokens.
#include "spmd/strategies/families.h"

namespace meshtrain::spmd::strategies {

namespace {

int rank_of(const StrategyQuery& q, int input) {
  return static_cast<int>(q.in[static_cast<size_t>(input)].shape.rank());
}

std::vector<DimStrategy> grouped_matmul_rule(const StrategyQuery& q) {
  const int last = rank_of(q, 0) - 1;
  const bool tb = q.attrs.get(graph::attr::transpose_b);
  auto out = same_shard_below(q, last);
  for (DimStrategy& s : out) s.inputs[1] = R();           // the weights whole on every row split
  out.push_back({{S(last)}, {R(), S(tb ? 1 : 2), R()}});  // each rank its outputs
  out.push_back({{P()}, {S(last), S(tb ? 2 : 1), R()}});  // each rank its inputs: a partial sum
  return out;
}

std::vector<DimStrategy> grouped_matmul_wgrad_rule(const StrategyQuery& q) {
  const int last = rank_of(q, 0) - 1;
  std::vector<DimStrategy> out;
  for (int d = 0; d < last; ++d) out.push_back({{P()}, {S(d), S(d), S(d)}});
  out.push_back({{S(1)}, {S(last), R(), R()}});
  out.push_back({{S(2)}, {R(), S(last), R()}});
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
  add("grouped_matmul", grouped_matmul_rule);
  add("grouped_matmul_wgrad", grouped_matmul_wgrad_rule);
  add("moe_aux_loss", [](const StrategyQuery& q) {
    std::vector<DimStrategy> out;
    for (int d = 0; d + 1 < rank_of(q, 0); ++d) out.push_back({{P()}, {S(d), R()}});
    return out;
  });
  add("moe_aux_loss_backward", [](const StrategyQuery& q) {
    std::vector<DimStrategy> out;
    for (int d = 0; d + 1 < rank_of(q, 0); ++d) out.push_back({{S(d)}, {S(d), R(), R()}});
    return out;
  });
}

}  // namespace meshtrain::spmd::strategies
