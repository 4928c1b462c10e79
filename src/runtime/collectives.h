// The collective nodes of a lowered graph (graph/ops/collective.cpp) as the
// executor runs them: each node's attributes give back the plan step it
// came from, which sharding::start_step starts on the mesh groups (its wait
// node completes it).
#pragma once

#include <optional>

#include "graph/graph.h"
#include "sharding/planner.h"

namespace meshtrain::runtime {

struct CollectiveStep {
  sharding::PlanStep step;
  Shape global_shape;
  // A bucket's coalesced all_gather or reduce_scatter: each member's block
  // per rank (graph::attr::member_blocks); empty for any other collective.
  std::vector<int64_t> member_blocks;
  // An all_to_all of expert parallelism's dispatched rows (inputs 1 and 2:
  // their experts before and after; sharding::RaggedRows): the experts'
  // padding value, n_experts. nullopt for any other collective.
  std::optional<int64_t> ragged_padding;
  // A ring_shift (sharding::start_ring_shift over step.mesh_dims[0], to the
  // rank ring_distance places on): no layouts, the step's collective a send.
  bool ring_shift = false;
  int ring_distance = 1;
};

// The step of a collective node, or nullopt for any other op. Fails naming
// the node when its attributes do not fit the mesh.
std::optional<CollectiveStep> collective_step(const graph::Node& node, const sharding::DeviceMesh& mesh);

}  // namespace meshtrain::runtime
