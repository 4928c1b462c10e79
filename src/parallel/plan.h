// Parallel plans: they only assign layouts. Given the degrees of data
// parallelism, a plan builds the device mesh (dp_replicate, dp_shard, tp;
// row-major, tp innermost) and says how each parameter, optimizer state and
// batch input of a training step lies on it, and in which layout each step
// output is delivered. Sharding propagation and lowering (spmd/) derive the
// collectives.
#pragma once

#include <map>
#include <utility>
#include <vector>

#include "graph/graph.h"
#include "sharding/device_mesh.h"
#include "sharding/layout.h"

namespace meshtrain::parallel {

// The [parallel] config section.
struct ParallelConfig {
  int64_t dp_replicate = 1;  // DDP: parameters replicated, gradients reduced
  int64_t dp_shard = -1;     // FSDP / ZeRO-3: parameters, gradients and states Shard(0); -1: the ranks left over
  int64_t tp = 1;            // tensor parallel (not implemented yet: must be 1)
  bool sequence_parallel = false;
  bool loss_parallel = false;
  bool reshard_after_forward = true;  // false (keep gathered weights for backward) is not implemented yet
};

// The mesh (dp_replicate, dp_shard, tp) for `world_size` ranks. Throws naming
// the [parallel] key when the degrees do not multiply to the world size or
// ask for what is not implemented.
sharding::DeviceMesh make_mesh(const ParallelConfig& config, int world_size);

// The values of a training step a plan lays out.
struct StepRoles {
  std::vector<graph::ValueId> parameters;
  std::vector<std::pair<graph::ValueId, graph::ValueId>> states;   // optimizer state -> its parameter
  std::vector<graph::ValueId> batch_inputs;                        // [batch, ...]: split over data parallel
  std::vector<graph::ValueId> replicated_outputs;                  // loss, gradient norm
  std::vector<std::pair<graph::ValueId, graph::ValueId>> updates;  // updated value -> the parameter or state it replaces
};

struct StepLayouts {
  std::map<graph::ValueId, sharding::Layout> given;    // inputs and parameters
  std::map<graph::ValueId, sharding::Layout> deliver;  // outputs
};

// Data parallel plans (DDP, FSDP, HSDP by the mesh's dp dims): the batch
// Shard(0) over dp_replicate and dp_shard; parameters and states Replicate
// over dp_replicate and Shard(0) over dp_shard; replicated inputs and outputs
// Replicate.
StepLayouts data_parallel_layouts(const sharding::DeviceMesh& mesh, const graph::Graph& g, const StepRoles& roles);

}  // namespace meshtrain::parallel
