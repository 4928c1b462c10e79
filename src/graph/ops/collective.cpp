// The steps of a redistribution in a lowered (per-rank) graph: one node per
// step of the planner's plan. all_gather, reduce_scatter, all_reduce and
// all_to_all communicate over the group of the mesh dims they name, and run
// asynchronously: the node starts the collective, writing into its outputs
// (the result and a staging buffer, empty where the blocks need no packing;
// an all_reduce takes its input's bytes where nothing reads them after it),
// and a `wait` node completes it where the result is first needed. wait's
// inputs are the result, the buffer and, where the collective reads it until
// it completes, the collective's input, so that all of them stay alive and
// untouched while it runs; its output is the result (a view).
// shard_locally keeps this rank's part of a replicated value (R -> S), or
// its share of a pending sum (R -> P), with no communication, at once. Each
// node carries the layouts before and after, the global shape and its local
// output shape (uneven shards differ by rank), so it runs without a plan.
#include "graph/ops/families.h"
#include "graph/ops/op_support.h"

namespace meshtrain::graph::ops {

namespace {

void read_collective_attrs(const Attrs& at) {
  at.get(attr::mesh_dims);
  at.get(attr::group);
  at.get(attr::layout_before);
  at.get(attr::layout_after);
  at.get(attr::global_shape);
}

}  // namespace

void add_collective_ops(std::vector<OpDef>& ops) {
  for (const std::string name : {"all_gather", "reduce_scatter", "all_reduce", "all_to_all"})
    ops.push_back({
        .name = name,
        .infer =
            [](const ValueInfos& in, const Attrs& at) {
              read_collective_attrs(at);
              const int64_t buffer = at.get(attr::buffer_elements);
              MT_CHECK(buffer >= 0, "a collective's staging buffer cannot have {} elements", buffer);
              return ValueInfos{{Shape(at.get(attr::shape)), in[0].dtype}, {Shape({buffer}), in[0].dtype}};
            },
        .is_collective = true,
        .starts_async = true,
        .in_place = name == "all_reduce" ? std::vector<OpDef::InPlace>{{0, 0}} : std::vector<OpDef::InPlace>{},  // reduced in place where its input dies
    });
  ops.push_back({
      .name = "shard_locally",
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            read_collective_attrs(at);
            return ValueInfos{{Shape(at.get(attr::shape)), in[0].dtype}};
          },
      .is_collective = true,
  });
  ops.push_back({
      .name = "wait",
      .num_inputs = OpDef::kVariadic,
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            MT_CHECK(in.size() == 2 || in.size() == 3,
                     "wait takes a started collective's result and buffer (and the input it reads), got {} inputs",
                     in.size());
            return ValueInfos{in[0]};
          },
      .is_view = true,
      .is_wait = true,
  });
}

}  // namespace meshtrain::graph::ops
