// Sharding strategies: for each op, the placements its inputs may have on
// one mesh dim and what its outputs then are (DTensor's single-dim
// strategies; a layout on a mesh picks one per mesh dim). They attach to ops
// by name, one file per op family under spmd/strategies/ (mirroring
// graph/ops/); an op without a rule runs replicated, which is always legal.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "graph/op_registry.h"
#include "sharding/layout.h"
#include "sharding/local_chunk.h"

namespace meshtrain::spmd {

using sharding::Placement;

// An input tensor dim that must split evenly for a strategy to hold: its
// extent must divide by (the ranks sharding it) x `multiple`. Attention heads
// (so each rank's query heads meet their own kv heads), or a reshape's split
// dim (so each rank's rows stay whole rows of the output).
struct EvenSplit {
  int input = 0;
  int dim = 0;
  int64_t multiple = 1;
  bool operator==(const EvenSplit&) const = default;
};

// One mesh dim's choice for a node: each output's placement, and the
// placement each input must have for the op to compute it locally.
struct DimStrategy {
  std::vector<Placement> outputs;
  std::vector<Placement> inputs;
  std::vector<EvenSplit> even_splits;
  bool operator==(const DimStrategy&) const = default;
  std::string to_string() const;  // "S(0), R -> S(0)"
};

// What a rule sees: the op, its operands' global shapes and dtypes, its attrs.
struct StrategyQuery {
  const graph::OpDef& op;
  const graph::ValueInfos& in;
  const graph::ValueInfos& out;
  const graph::Attrs& attrs;
};
using StrategyRule = std::function<std::vector<DimStrategy>(const StrategyQuery& q)>;

// The node's strategies on one mesh dim: its op's rule's, in the rule's
// order, then all-Replicate unless the rule listed it. An op without a rule
// has all-Replicate only.
std::vector<DimStrategy> dim_strategies(const StrategyQuery& q);
bool has_strategy_rule(const std::string& op);

// Attaches a rule to an op defined outside graph/ops. Fails if it has one.
void register_strategy_rule(const std::string& op, StrategyRule rule);

// What lowering knows of a node on one rank: its global attributes and
// operands, and the part of each operand this rank holds in the strategy
// chosen and of each output (local shape, global offset).
struct LocalNode {
  const graph::OpDef& op;
  const graph::Attrs& attrs;
  const graph::ValueInfos& global_in;
  const std::vector<sharding::LocalChunk>& in;
  const std::vector<sharding::LocalChunk>& out;
};
// The attributes of an op's local node, for ops whose attributes name
// global sizes or positions (reshape's target shape, a vocab-parallel
// table's first row). It attaches to the op by name beside its strategy rule.
using LocalizeRule = std::function<graph::Attrs(const LocalNode& node)>;

// The local node's attributes: the op's localize rule's, or the global ones.
graph::Attrs local_attrs(const LocalNode& node);

}  // namespace meshtrain::spmd
