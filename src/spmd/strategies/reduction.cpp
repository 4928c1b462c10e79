// Strategies of the reduction and row ops (graph/ops/reduction.cpp). sum
// and sum_squares of a shard are partial sums, amax a partial max; mean of an even shard is a
// partial average. Row ops (softmax, rms_norm) reduce over the last
// dim: any other dim may be sharded; rms_norm's weight gradient, summed over
// rows, is then a partial sum.
#include "spmd/strategies/families.h"

namespace meshtrain::spmd::strategies {

std::vector<DimStrategy> partial_sum_of_shards(const StrategyQuery& q) {
  std::vector<DimStrategy> out;
  for (int d = 0; d < static_cast<int>(q.in[0].shape.rank()); ++d) out.push_back({{P()}, {S(d)}});
  return out;
}

void add_reduction_rules(const AddRule& add) {
  add("sum", [](const StrategyQuery& q) {
    auto out = partial_sum_of_shards(q);
    out.push_back({{P()}, {P()}});  // a sum of partial sums
    return out;
  });
  add("sum_squares", partial_sum_of_shards);
  add("amax", [](const StrategyQuery& q) {  // a shard's largest magnitude: a partial max
    std::vector<DimStrategy> out;
    for (int d = 0; d < static_cast<int>(q.in[0].shape.rank()); ++d)
      out.push_back({{Placement::partial(sharding::ReduceOp::max)}, {S(d)}});
    return out;
  });
  add("mean", [](const StrategyQuery& q) {
    std::vector<DimStrategy> out;
    for (int d = 0; d < static_cast<int>(q.in[0].shape.rank()); ++d)
      out.push_back({{Placement::partial(sharding::ReduceOp::avg)}, {S(d)}, {{0, d, 1}}});  // equal parts
    out.push_back({{P()}, {P()}});  // the mean of a sum is the sum of the means
    return out;
  });
  for (const char* op : {"softmax", "softmax_backward"}) add(op, same_shard_but_last);
  add("rms_norm", [](const StrategyQuery& q) {  // x, weight
    std::vector<DimStrategy> out;
    for (int d = 0; d + 1 < static_cast<int>(q.in[0].shape.rank()); ++d) out.push_back({{S(d)}, {S(d), R()}});
    return out;
  });
  add("rms_norm_backward", [](const StrategyQuery& q) {  // x, weight, dy -> dx, dweight
    std::vector<DimStrategy> out;
    for (int d = 0; d + 1 < static_cast<int>(q.in[0].shape.rank()); ++d)
      out.push_back({{S(d), P()}, {S(d), R(), S(d)}});
    return out;
  });
}

}  // namespace meshtrain::spmd::strategies
