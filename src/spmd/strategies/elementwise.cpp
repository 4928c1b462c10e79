// Strategies of the elementwise ops (graph/ops/elementwise.cpp): any tensor
// dim sharded alike on every operand; Partial(sum) kept by the ops that are
// linear in it. A constant (full) or a broadcast scalar is built in any
// dim's shard (its local shape by localize).
#include "graph/attrs.h"
#include "spmd/strategies/families.h"

namespace meshtrain::spmd::strategies {

std::vector<DimStrategy> same_shard_below(const StrategyQuery& q, int rank) {
  std::vector<DimStrategy> out;
  for (int d = 0; d < rank; ++d)
    out.push_back({std::vector<Placement>(q.out.size(), S(d)), std::vector<Placement>(q.in.size(), S(d))});
  return out;
}

std::vector<DimStrategy> same_shard_everywhere(const StrategyQuery& q) {
  return same_shard_below(q, static_cast<int>(q.out[0].shape.rank()));
}

std::vector<DimStrategy> same_shard_but_last(const StrategyQuery& q) {
  return same_shard_below(q, static_cast<int>(q.out[0].shape.rank()) - 1);
}

void add_elementwise_rules(const AddRule& add) {
  for (const char* op : {"sqrt", "silu", "swiglu", "silu_backward", "swiglu_backward"}) add(op, same_shard_everywhere);
  add("add", [](const StrategyQuery& q) {  // a sum of partial sums
    auto out = same_shard_everywhere(q);
    out.push_back({{P()}, {P(), P()}});
    return out;
  });
  add("mul", [](const StrategyQuery& q) {  // linear in either factor
    auto out = same_shard_everywhere(q);
    out.push_back({{P()}, {P(), R()}});
    out.push_back({{P()}, {R(), P()}});
    return out;
  });
  add("scale", [](const StrategyQuery& q) {
    auto out = same_shard_everywhere(q);
    out.push_back({{P()}, {P()}});
    return out;
  });
  add("scale_by", [](const StrategyQuery& q) {  // x * a one-element scalar
    std::vector<DimStrategy> out;
    for (int d = 0; d < static_cast<int>(q.out[0].shape.rank()); ++d) out.push_back({{S(d)}, {S(d), R()}});
    out.push_back({{P()}, {P(), R()}});
    return out;
  });
  // full (no inputs) and broadcast_scalar (one scalar): the output in any
  // dim's shard; a broadcast partial sum stays one.
  auto shard_built = [](const StrategyQuery& q) {
    std::vector<DimStrategy> out;
    for (int d = 0; d < static_cast<int>(q.out[0].shape.rank()); ++d)
      out.push_back({{S(d)}, std::vector<Placement>(q.in.size(), R())});
    return out;
  };
  add("full", shard_built);
  add("broadcast_scalar", [shard_built](const StrategyQuery& q) {
    auto out = shard_built(q);
    out.push_back({{P()}, {P()}});
    return out;
  });
  for (const char* op : {"full", "broadcast_scalar"}) add.localize(op, with_local_shape);
  add("cast", [](const StrategyQuery& q) {
    auto out = same_shard_everywhere(q);
    // Widening is exact, so partial sums may be cast before they are reduced
    // (bf16 gradients reduced in f32); narrowing would round each part.
    if (dtype_size(q.out[0].dtype) >= dtype_size(q.in[0].dtype)) out.push_back({{P()}, {P()}});
    return out;
  });
}

}  // namespace meshtrain::spmd::strategies
