// Context parallelism's ring attention in a rank's lowered graph. An
// attention or attention_backward node with the `ring` attribute whose keys
// are split on the sequence over a mesh dim (graph/ops/attention.cpp) runs
// as ring steps: at step r the rank holds the keys and values of the rank r
// back in the ring, computes its queries against each of that rank's two
// load-balanced chunks (attention with key_first, skipping a chunk wholly
// after its queries) while ring_shift passes the block on, and merges the
// partial results by their log-sum-exps (attention_merge). The backward
// takes the merged out and lse, sums dQ over the steps, and passes each
// block's dK and dV accumulators around the ring with the block, one shift
// more bringing them home.
#pragma once

#include <optional>
#include <vector>

#include "graph/builder.h"
#include "sharding/device_mesh.h"
#include "spmd/propagate.h"

namespace meshtrain::spmd {

// Where a node's ring runs on this rank.
struct RingPlace {
  int mesh_dim = -1;
  int64_t size = 0;   // ranks in the ring
  int64_t index = 0;  // this rank's place in it
  std::vector<int64_t> group;
};

// The ring of a node with the `ring` attribute whose keys are split on the
// sequence over a mesh dim of more than one rank; nullopt for any other.
std::optional<RingPlace> ring_place(const graph::Node& node, const NodeSharding& ns, const sharding::DeviceMesh& mesh,
                                    const std::vector<int>& coord);

// The node's local outputs (attention: out, lse; attention_backward: dq,
// dk, dv) built as ring steps from its local inputs, with `local_attrs` its
// localized attributes (seq_first set for this rank's queries).
std::vector<graph::ValueId> expand_ring_attention(graph::Builder& b, const graph::Node& node, const RingPlace& ring,
                                                  const std::vector<graph::ValueId>& inputs,
                                                  const graph::Attrs& local_attrs);

}  // namespace meshtrain::spmd
