// Strategies of the loss ops (graph/ops/loss.cpp), by rows: targets sharded
// give a partial count of valid tokens; logits and targets sharded alike
// over a row dim, with the whole batch's count, give each rank's share of
// the mean (a partial sum); the gradient of rows is sharded alike.
#include "spmd/strategies/families.h"

namespace meshtrain::spmd::strategies {

void add_loss_rules(const AddRule& add) {
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

}  // namespace meshtrain::spmd::strategies
