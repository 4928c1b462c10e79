// The steps of a redistribution in a lowered (per-rank) graph: one node per
// step of the planner's plan. all_gather, reduce_scatter, all_reduce and
// all_to_all communicate over the group of the mesh dims they name;
// shard_locally keeps this rank's part of a replicated value (R -> S), or
// its share of a pending sum (R -> P), with no communication. Each node
// carries the layouts before and after, the global shape and its local
// output shape (uneven shards differ by rank), so it runs without a plan.
#include "graph/ops/families.h"
#include "graph/ops/op_support.h"

namespace meshtrain::graph::ops {

void add_collective_ops(std::vector<OpDef>& ops) {
  for (const char* name : {"all_gather", "reduce_scatter", "all_reduce", "all_to_all", "shard_locally"})
    ops.push_back({
        .name = name,
        .infer =
            [](const ValueInfos& in, const Attrs& at) {
              at.get(attr::mesh_dims);
              at.get(attr::group);
              at.get(attr::layout_before);
              at.get(attr::layout_after);
              at.get(attr::global_shape);
              return ValueInfos{{Shape(at.get(attr::shape)), in[0].dtype}};
            },
        .is_collective = true,
    });
}

}  // namespace meshtrain::graph::ops
