// Strategies of the loss ops (graph/ops/loss.cpp), by rows: targets sharded
// give a partial count of valid tokens; logits and targets sharded alike
// over a row dim, with the whole batch's count, give each rank's share of
// the mean (a partial sum); the gradient of rows is sharded alike. The
// split loss's parts also take logits split by vocabulary (Megatron's
// vocab-parallel cross-entropy): the row max is then a partial max, the sum
// of exponentials and the target's logit partial sums, and the logits'
// gradient split by vocabulary like them.
#include "spmd/strategies/families.h"

namespace meshtrain::spmd::strategies {

namespace {

int row_rank(const StrategyQuery& q) { return static_cast<int>(q.in[0].shape.rank()) - 1; }  // of logits [..., V]

// The part of the vocabulary this rank's logits hold.
graph::Attrs with_vocab_part(const LocalNode& n) {
  return with_part_of_input0(n, static_cast<int>(n.global_in[0].shape.rank()) - 1);
}

void add_split_loss_rules(const AddRule& add) {
  add("row_max", [](const StrategyQuery& q) {
    auto out = same_shard_below(q, row_rank(q));
    out.push_back({{Placement::partial(sharding::ReduceOp::max)}, {S(row_rank(q))}});
    return out;
  });
  for (const char* op : {"sum_exp", "pick"})  // logits, shift / targets
    add(op, [](const StrategyQuery& q) {
      auto out = same_shard_below(q, row_rank(q));
      out.push_back({{P()}, {S(row_rank(q)), R()}});
      return out;
    });
  add.localize("pick", with_vocab_part);
  add("nll_mean", [](const StrategyQuery& q) {  // logits, sum_exp, shift, target logit, targets, count -> loss
    std::vector<DimStrategy> out;
    for (int d = 0; d < row_rank(q); ++d) out.push_back({{P()}, {S(d), S(d), S(d), S(d), S(d), R()}});
    // The logits are not read: any split of them, the rows whole.
    out.push_back({{R()}, {S(row_rank(q)), R(), R(), R(), R(), R()}});
    return out;
  });
  add("split_loss_backward", [](const StrategyQuery& q) {  // logits, targets, shift, sum_exp, dloss, count -> dlogits
    std::vector<DimStrategy> out;
    for (int d = 0; d < row_rank(q); ++d) out.push_back({{S(d)}, {S(d), S(d), S(d), S(d), R(), R()}});
    out.push_back({{S(row_rank(q))}, {S(row_rank(q)), R(), R(), R(), R(), R()}});
    return out;
  });
  add.localize("split_loss_backward", with_vocab_part);
}

}  // namespace

void add_loss_rules(const AddRule& add) {
  add_split_loss_rules(add);
  add("count_valid", partial_sum_of_shards);         // targets -> count
  add("cross_entropy", [](const StrategyQuery& q) {  // logits [..., V], targets [...], count -> loss
    std::vector<DimStrategy> out;
    for (int d = 0; d < row_rank(q); ++d) out.push_back({{P()}, {S(d), S(d), R()}});
    return out;
  });
  add("cross_entropy_backward", [](const StrategyQuery& q) {  // logits, targets, dloss, count -> dlogits
    std::vector<DimStrategy> out;
    for (int d = 0; d < row_rank(q); ++d) out.push_back({{S(d)}, {S(d), S(d), R(), R()}});
    return out;
  });
}

}  // namespace meshtrain::spmd::strategies
