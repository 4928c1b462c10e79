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
// ring_shift passes a tensor to the next rank of a group (context
// parallelism's ring attention). shard_locally keeps this rank's part of a replicated value (R -> S), or
// its share of a pending sum (R -> P), with no communication, at once. Each
// node carries the layouts before and after, the global shape and its local
// output shape (uneven shards differ by rank), so it runs without a plan.
// bucket_pack lays several tensors out one after another as one buffer
// [1, elements] for one collective (sched's bucket_collectives);
// bucket_unpack takes them back out of such a buffer (of any 2-d shape).
// A bucket's all_gather or reduce_scatter is coalesced (its member_blocks
// attribute): it keeps each member whole on the side that holds every
// rank's block, so neither op ever cuts a member into pieces. An all_to_all
// of expert parallelism's dispatched rows also takes their experts in the
// layouts before and after (sharding::RaggedRows) and sends only the rows
// that carry tokens.
#include "graph/ops/collective.h"

#include <fmt/ranges.h>

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

// A coalesced all_gather's or reduce_scatter's member blocks (where the
// bucket pass set them) add up to the rank's own side: the input it gathers,
// or the output it reduces into.
void check_member_blocks(const std::string& op, const Attrs& at, int64_t own_side) {
  const std::vector<int64_t> blocks = at.get_or(attr::member_blocks, {});
  if (blocks.empty()) return;
  MT_CHECK(op == "all_gather" || op == "reduce_scatter",
           "{}: member_blocks are for a coalesced all_gather or "
           "reduce_scatter",
           op);
  int64_t total = 0;
  for (int64_t b : blocks) {
    MT_CHECK(b >= 0, "{}: a member block of {} elements", op, b);
    total += b;
  }
  MT_CHECK(total == own_side, "{}: member blocks of {} elements in all for {} elements on this rank's side", op, total,
           own_side);
}

}  // namespace

std::vector<Shape> bucket_member_shapes(const Attrs& at) {
  const std::vector<int64_t>& flat = at.get(attr::member_shapes);
  std::vector<Shape> shapes;
  for (size_t i = 0; i < flat.size();) {
    const auto rank = static_cast<size_t>(flat[i]);
    MT_CHECK(i + 1 + rank <= flat.size(), "bucket member shapes {}: member {} claims rank {} past the end",
             fmt::join(flat, ","), shapes.size(), rank);
    shapes.emplace_back(std::vector<int64_t>(flat.begin() + static_cast<std::ptrdiff_t>(i + 1),
                                             flat.begin() + static_cast<std::ptrdiff_t>(i + 1 + rank)));
    i += 1 + rank;
  }
  return shapes;
}

std::vector<int64_t> bucket_member_shapes_attr(const std::vector<Shape>& shapes) {
  std::vector<int64_t> flat;
  for (const Shape& s : shapes) {
    flat.push_back(static_cast<int64_t>(s.rank()));
    flat.insert(flat.end(), s.dims().begin(), s.dims().end());
  }
  return flat;
}

void add_collective_ops(std::vector<OpDef>& ops) {
  for (const std::string name : {"all_gather", "reduce_scatter", "all_reduce", "all_to_all"})
    ops.push_back({
        .name = name,
        .num_inputs = name == "all_to_all" ? OpDef::kVariadic : 1,
        .infer =
            [name](const ValueInfos& in, const Attrs& at) {
              read_collective_attrs(at);
              if (name == "all_to_all") {  // rows, or ragged rows and their experts before and after
                MT_CHECK(in.size() == 1 || (in.size() == 3 && in[1].dtype == DType::i64 && in[2].dtype == DType::i64),
                         "all_to_all takes a tensor, or ragged rows and their i64 experts before and after");
                if (in.size() == 3) at.get(attr::n_experts);
              }
              const int64_t buffer = at.get(attr::buffer_elements);
              MT_CHECK(buffer >= 0, "a collective's staging buffer cannot have {} elements", buffer);
              const Shape out(at.get(attr::shape));
              check_member_blocks(name, at, name == "all_gather" ? in[0].shape.numel() : out.numel());
              return ValueInfos{{out, in[0].dtype}, {Shape({buffer}), in[0].dtype}};
            },
        .is_collective = true,
        .starts_async = true,
        .in_place = name == "all_reduce" ? std::vector<OpDef::InPlace>{{0, 0}}
                                         : std::vector<OpDef::InPlace>{},  // reduced in place where its input dies
    });
  // Context parallelism's and async TP's ring: each rank of the group over
  // mesh_dims sends its tensor to the rank ring_distance (default 1) places
  // on in the group and takes the tensor of the rank as many places back
  // (group order, wrapping around), started and waited on as the other
  // collectives are (outputs: the result and an empty staging buffer); it
  // reads its input until it completes.
  ops.push_back({
      .name = "ring_shift",
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            MT_CHECK(at.get(attr::mesh_dims).size() == 1, "ring_shift runs over one mesh dim");
            MT_CHECK(at.get(attr::group).size() >= 2, "ring_shift needs a group of two ranks or more");
            const int64_t distance = at.get_or(attr::ring_distance, int64_t{1});
            MT_CHECK(distance >= 1 && distance < static_cast<int64_t>(at.get(attr::group).size()),
                     "ring_shift's ring_distance must be from 1 to the group's size - 1, got {}", distance);
            at.get(attr::comm_bytes);
            return ValueInfos{in[0], {Shape({0}), in[0].dtype}};
          },
      .is_collective = true,
      .starts_async = true,
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
      .name = "bucket_pack",
      .num_inputs = OpDef::kVariadic,
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            MT_CHECK(!in.empty(), "bucket_pack needs at least one member");
            int64_t total = 0;
            for (const ValueInfo& m : in) {
              MT_CHECK(m.dtype == in[0].dtype, "bucket_pack: members of {} and {}: one dtype per bucket",
                       dtype_name(in[0].dtype), dtype_name(m.dtype));
              total += m.shape.numel();
            }
            return ValueInfos{{Shape({1, total}), in[0].dtype}};
          },
  });
  ops.push_back({
      .name = "bucket_unpack",
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            ValueInfos out;
            int64_t total = 0;
            for (const Shape& s : bucket_member_shapes(at)) {
              out.push_back({s, in[0].dtype});
              total += s.numel();
            }
            MT_CHECK(!out.empty() && in[0].shape.rank() == 2 && in[0].shape.numel() == total,
                     "bucket_unpack: a bucket of {} for members of {} elements in all", in[0].shape.to_string(), total);
            return out;
          },
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
