// Sharding propagation: a layout for every value of a graph, from the
// layouts of its inputs and parameters (what a parallel plan assigns). Each
// node, in order, takes the strategy (one DimStrategy per mesh dim) of least
// cost: redistributing its inputs to the layouts the strategy needs (the
// planner's cost) plus its compute on the shard it computes, plus one step
// of look-ahead: what its outputs' readers must at least pay to read them
// as they come out. Ties go to the first candidate, so every rank
// propagates alike.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "graph/graph.h"
#include "sharding/planner.h"
#include "spmd/strategy.h"

namespace meshtrain::spmd {

using sharding::Layout;

struct NodeSharding {
  std::vector<Layout> inputs;   // the layout each input is redistributed to
  std::vector<Layout> outputs;  // the layout each output comes out in
  double redistribute_us = 0;   // the planner's cost of those redistributions
  double compute_us = 0;        // the node's FLOPs on its shard, at PropagationOptions::flops_per_us
  bool has_rule = true;         // false: the op has no strategy rule and runs replicated
};

struct Sharding {
  // Every value's layout: inputs as given, a pinned value as pinned (its
  // producer's output redistributed to it at once), others as produced.
  std::map<graph::ValueId, Layout> values;
  std::map<graph::NodeId, NodeSharding> nodes;
  // Graph outputs and the layout each is delivered in (a parameter's update
  // in the parameter's layout, the loss replicated).
  std::map<graph::ValueId, Layout> outputs;
};

// Nodes' choices of strategy that propagations on one planner share: a
// layer's nodes choose alike in every pipeline stage, plan and screen that a
// search lays out on the same mesh, so each is costed once. Keyed by all
// that a choice depends on (choice_key in propagate.cpp, and the options).
// Thread-safe; emptied when it holds kMaxChoices.
class ChoiceCache {
 public:
  using Choice = std::pair<NodeSharding, double>;  // the choice and its cost (infinity: none is legal)
  static constexpr size_t kMaxChoices = 100000;
  std::optional<Choice> find(const std::string& key) const;
  void add(const std::string& key, const Choice& choice);
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, Choice> choices_;
};

// The cache every propagation on `planner` (sharding::shared_planner's)
// shares; it keeps the planner alive, so that no other takes its place.
std::shared_ptr<ChoiceCache> shared_choices(const std::shared_ptr<sharding::Planner>& planner);

struct PropagationOptions {
  double flops_per_us = 1e5;  // compute speed for the compute term (100 GFLOP/s)
  // What computing from the parameters alone costs against the rest, per
  // run of the graph: a pipeline stage's programs run once per microbatch
  // but gather and cast its weights once for all of them (its unshard
  // program), so there this is 1 / microbatches. Scales the compute of
  // nodes that read only parameters (or values so computed), and the
  // redistribution of such a value where it changes only on
  // parameter_gather_dims (FSDP's: dp_shard and cp); gathering it over
  // another dim (tp) would hold it whole there all step, which the cost
  // does not see, so that costs in full.
  double parameter_share = 1;
  std::vector<int> parameter_gather_dims;
  // Whether backward nodes' redistributions of such values count at that
  // share too (their caller computes them once as well); else in full.
  bool share_in_backward = true;
  // Choices shared with other propagations on the same planner (null: this
  // propagation's own only).
  std::shared_ptr<ChoiceCache> choices;
};

// `given`: the layouts of inputs and parameters (the others are Replicate),
// and of any intermediate value the plan pins (Megatron's residual stream:
// Replicate over tp, or Shard(1) under sequence parallelism): its producer
// counts the redistribution to the pinned layout in its cost, and every
// reader sees the pinned layout. A value pinned as a pending sum (Partial)
// is read as it is: no reader may reduce it (its reduction belongs to a
// later op, e.g. after a bf16 gradient is widened to f32).
// `deliver`: layouts some graph outputs must be delivered in; the other
// outputs stay as produced. Fails naming the node when no candidate is legal
// (cannot happen while all-Replicate is one: every layout redistributes to
// Replicate) or an output cannot be delivered as asked.
Sharding propagate(const graph::Graph& g, sharding::Planner& planner, const std::map<graph::ValueId, Layout>& given,
                   const std::map<graph::ValueId, Layout>& deliver = {}, const PropagationOptions& options = {});

// The graph as text (graph::to_text's lines) with each value's layout and,
// where a node's inputs are redistributed, from which layout to which.
std::string to_text(const graph::Graph& g, const Sharding& s);

}  // namespace meshtrain::spmd
