// Bucketing: collectives of one kind over one group and dtype merged into
// one (XLA's combiners, FSDP's per-block all-gather and reduce-scatter,
// DDP's gradient buckets), so a step pays one collective's latency and
// cross-rank check where it paid several. The members are laid one after
// another in one flat buffer (bucket_pack), the collective runs on it
// (all_gather and reduce_scatter coalesced, each member whole where every
// rank's block is: graph::attr::member_blocks), and bucket_unpack takes
// them back out; the memory plan makes members views of the bucket where it
// can, so those are not copied. Every result is bitwise what the members
// computed apart (reduce_scatter sums in rank order whatever its size).
#pragma once

#include <functional>
#include <string_view>

#include "graph/graph.h"

namespace meshtrain::sched {

enum class BucketMode {
  none,
  per_block,  // the collectives of one pass through a block (scope "layers.<i>", or a top-level scope)
  size_cap,   // consecutive collectives up to cap_bytes
  automatic,  // whichever of per_block and size_cap at a few caps the runtime estimate finds fastest
};
std::string_view bucket_mode_name(BucketMode mode);

struct BucketOptions {
  BucketMode mode = BucketMode::none;
  double cap_bytes = 25.0 * (1 << 20);  // size_cap: a bucket's bytes (the collectives' buffers per rank)
  int mesh_ndim = 1;                    // the mesh the graph was lowered on
  // Members as views of their bucket where the memory plan can (no copy in
  // or out; a gradient bucket then lives from its first member); false:
  // always copied (graph::attr::copy_members on the pack and unpack).
  bool member_views = true;
  // automatic: the estimated step time of a graph in its current order.
  std::function<double(const graph::Graph&)> step_us;
};

// Merges all_gathers (a shard of each member to the whole), reduce_scatters
// (the whole to a shard) and all_reduces whose blocks need no packing
// (buffer_elements 0), shards even, over one mesh dim: consecutive ones of
// one kind, group, dtype and phase, the weights' apart from the
// activations' (an input from parameters alone or not), as the mode groups
// them, as long as every member's input can be computed before the first
// member's result is read (what computes an all_gather's input from parameters alone, a cast,
// moves up with it). The bucket's collective starts where its last
// member's input is ready and is waited on before the first member's result
// is read. Run before sink_waits, on lowering's output. Returns whether the
// graph changed.
bool bucket_collectives(graph::Graph& g, const BucketOptions& options);

}  // namespace meshtrain::sched
