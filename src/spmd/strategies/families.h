// The strategy rules of the built-in op families, one file each under
// spmd/strategies/ (the same families as graph/ops/), and what they share.
#pragma once

#include <functional>
#include <string>

#include "spmd/strategy.h"

namespace meshtrain::spmd::strategies {

// Attaches a family's rules to its ops by name: add(op, strategy rule);
// add.localize(op, localize rule).
struct AddRule {
  std::function<void(const std::string& op, StrategyRule rule)> strategy;
  std::function<void(const std::string& op, LocalizeRule rule)> localize;
  void operator()(const std::string& op, StrategyRule rule) const { strategy(op, std::move(rule)); }
};
void add_elementwise_rules(const AddRule& add);
void add_matmul_rules(const AddRule& add);
void add_reduction_rules(const AddRule& add);
void add_shape_rules(const AddRule& add);
void add_embedding_rules(const AddRule& add);
void add_attention_rules(const AddRule& add);
void add_optimizer_rules(const AddRule& add);
void add_loss_rules(const AddRule& add);
void add_moe_rules(const AddRule& add);

inline Placement R() { return Placement::replicate(); }
inline Placement S(int dim) { return Placement::shard(dim); }
inline Placement P() { return Placement::partial(sharding::ReduceOp::sum); }

// Every input and output Shard(d), for each tensor dim d < rank.
std::vector<DimStrategy> same_shard_below(const StrategyQuery& q, int rank);
// The same for each tensor dim d of the outputs (pointwise ops on
// same-shape operands).
std::vector<DimStrategy> same_shard_everywhere(const StrategyQuery& q);
// The same, for the tensor dims before the last only (row ops: the last dim
// is what they reduce over).
std::vector<DimStrategy> same_shard_but_last(const StrategyQuery& q);
// A sum over the one input's elements: Shard(d) of any dim d gives P(sum).
std::vector<DimStrategy> partial_sum_of_shards(const StrategyQuery& q);

// Localize helpers: the node's attributes with `shape` set to its local
// output shape (reshape, full, broadcast_scalar); with `start` and
// `full_size` set to input 0's part along tensor dim `dim` (a vocab-parallel
// table or logits: its first index there and the whole extent).
graph::Attrs with_local_shape(const LocalNode& n);
graph::Attrs with_part_of_input0(const LocalNode& n, int dim);

}  // namespace meshtrain::spmd::strategies
