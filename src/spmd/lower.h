// SPMD lowering: one rank's local graph from the global graph and its
// sharding. Every value gets this rank's local shape (the torch.chunk rule,
// so uneven shards need no padding); every redistribution the sharding asks
// for becomes one node per step of the planner's plan (graph/ops/
// collective.cpp), on this rank's groups; ring attention becomes its ring
// steps (spmd/ring_attention.h). Any rank's graph can be lowered
// on any machine, without running anything.
#pragma once

#include <map>
#include <vector>

#include "graph/graph.h"
#include "spmd/propagate.h"

namespace meshtrain::spmd {

struct LoweredGraph {
  graph::Graph graph;                               // this rank's
  std::map<graph::ValueId, graph::ValueId> values;  // global value -> its local value
  int rank = 0;
};

struct LowerOptions {
  // false: FSDP keeps a parameter gathered from its first use to its last
  // (forward to backward), one redistribution per parameter (and per bf16
  // copy of one) and layout; true: gathered again at each use in forward,
  // and once per stretch of backward (a block's recomputed forward and its
  // backward share it), so the gathered weights are freed between forward
  // and backward.
  bool reshard_after_forward = true;
  // Expert parallelism's dispatched rows [blocks, ..., M, D] (and their
  // gradients) -> their experts [blocks, ..., M] (moe_dispatch_experts'
  // output): an all_to_all of such rows sends only the rows that carry
  // tokens (sharding::RaggedRows), where the experts' local values in the
  // step's layouts before and after exist by then; otherwise whole blocks.
  std::map<graph::ValueId, graph::ValueId> ragged_rows;
};

// The graph outputs of the local graph are the global outputs, delivered in
// the sharding's output layouts. Fails naming the node when an op's local
// output shape differs from its layout's local shape.
LoweredGraph lower(const graph::Graph& g, const Sharding& s, sharding::Planner& planner, int rank,
                   const LowerOptions& options = {});

// The rank's graph as text (graph::to_text): every value with its local
// shape, and where it stands for a global value, that value's layout (and
// "replicated: no strategy rule" for the outputs of ops that have none);
// every collective with its group, mesh dims, layouts before and after and
// bytes. `g`: the global graph `lowered` was lowered from.
std::string to_text(const graph::Graph& g, const LoweredGraph& lowered, const Sharding& s);

// The collectives of a rank's graph by phase, op and group, each with the
// count and the bytes they move, one "# " line each (the order: forward,
// backward, optimizer; then op, mesh dims, group), then the totals.
std::string collective_summary(const graph::Graph& local, const sharding::DeviceMesh& mesh);

}  // namespace meshtrain::spmd
