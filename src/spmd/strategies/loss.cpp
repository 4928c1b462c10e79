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

void add_split_loss_rules(const AddRule& add);

void add_loss_rules(const AddRule& add) {
  add_split_loss_rules(add);
  add("count_valid", [](const StrategyQuery& q) {  // targets -> count
    std::vector<DimStrategy> out;
    for (int d = 0; d < static_cast<int>(q.in[0].shape.rank()); ++d) out.push_back({{P()}, {S(d)}});
    return out;
  });
  add("cross_entropy", [](const StrategyQuery& q) {  // logits [..., V], targets [...], count -> loss
    std::vector<DimStrategy> out;
    for (int d = 0; d < static_cast<int>(q.in[1].shape.rank()); ++d) out.push_back({{P()}, {S(d), S(d), R()}});
    return out;
  });
  add("cross_entropy_backward", [](const StrategyQuery& q) {  // logits, targets, dloss, count -> dlogits
    std::vector<DimStrategy> out;
    for (int d = 0; d < static_cast<int>(q.in[1].shape.rank()); ++d) out.push_back({{S(d)}, {S(d), S(d), R(), R()}});
    return out;
  });
}

namespace {
// Every row dim d of rows-shaped values: each operand S(d).
std::vector<DimStrategy> by_rows(const StrategyQuery& q, int row_rank) {
  std::vector<DimStrategy> out;
  for (int d = 0; d < row_rank; ++d)
    out.push_back({std::vector<Placement>(q.out.size(), S(d)), std::vector<Placement>(q.in.size(), S(d))});
  return out;
}
int row_rank(const StrategyQuery& q) { return static_cast<int>(q.in[0].shape.rank()) - 1; }  // of logits [..., V]

// A vocab-parallel part's first vocabulary index and the whole size, from
// the logits' part (input `k`) or the gradient's (output `k`).
graph::Attrs with_vocab_part(const LocalNode& n, const sharding::LocalChunk& part, int64_t total) {
  graph::Attrs local = n.attrs;
  local.set(graph::attr::start, part.offset.back());
  local.set(graph::attr::full_size, total);
  return local;
}
}  // namespace

void add_split_loss_rules(const AddRule& add) {
  add("row_max", [](const StrategyQuery& q) {
    auto out = by_rows(q, row_rank(q));
    out.push_back({{Placement::partial(sharding::ReduceOp::max)}, {S(row_rank(q))}});
    return out;
  });
  add("sum_exp", [](const StrategyQuery& q) {  // logits, shift
    auto out = by_rows(q, row_rank(q));
    out.push_back({{P()}, {S(row_rank(q)), R()}});
    return out;
  });
  add("pick", [](const StrategyQuery& q) {  // logits, targets
    auto out = by_rows(q, row_rank(q));
    out.push_back({{P()}, {S(row_rank(q)), R()}});
    return out;
  });
  add.localize("pick", [](const LocalNode& n) { return with_vocab_part(n, n.in[0], n.global_in[0].shape.dim(-1)); });
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
  add.localize("split_loss_backward",
               [](const LocalNode& n) { return with_vocab_part(n, n.in[0], n.global_in[0].shape.dim(-1)); });
}

}  // namespace meshtrain::spmd::strategies
