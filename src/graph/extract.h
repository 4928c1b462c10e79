// A part of a graph as a graph of its own: some of its nodes, copied in
// order, with every value they read from outside the part as an input. How a
// pipeline stage's step is cut into the programs its schedule runs one at a
// time (forward, backward for inputs, backward for weights).
#pragma once

#include <map>
#include <vector>

#include "graph/graph.h"

namespace meshtrain::graph {

struct ExtractedGraph {
  Graph graph;
  std::map<ValueId, ValueId> values;  // a value of the source graph -> its value here
  // The source values this part reads but does not compute (inputs and
  // parameters of the source, or values another part computes), in the order
  // they were met; each is an input here (a parameter where it was one),
  // named as in the source or "%<id>" for a computed value.
  std::vector<ValueId> reads;
  std::vector<ValueId> outputs;  // the source values the part's outputs are, in order
};

// `nodes` (live nodes of `g`) copied in g's order with their attributes,
// scope and phase; `outputs` (values of g those nodes compute, or read) as the
// part's outputs, in that order. Throws naming the value when an output is
// neither computed nor read by the part.
ExtractedGraph extract_graph(const Graph& g, const std::vector<NodeId>& nodes, const std::vector<ValueId>& outputs);

// The live nodes of `g` that `targets` depend on, restricted to `among`
// (whose inputs from outside `among` are not followed further), in g's order.
std::vector<NodeId> nodes_needed_for(const Graph& g, const std::vector<ValueId>& targets,
                                     const std::vector<NodeId>& among);

// What `g` computes from its parameters alone: the live nodes that read
// only parameters or values so computed (forward nodes only, unless
// `through_backward`), in g's order, and per value (by index) whether it
// is a parameter or such a node's output. A pipeline stage's unshard
// program is these nodes, run once a step.
struct FromParameters {
  std::vector<NodeId> nodes;
  std::vector<bool> values;
};
FromParameters from_parameters(const Graph& g, bool through_backward);

}  // namespace meshtrain::graph
