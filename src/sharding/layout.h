// Placements (how a tensor lies along one mesh dimension) and Layout (one
// placement per mesh dimension plus the order in which mesh dimensions shard
// a tensor dimension), with PyTorch DTensor's text notation.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "comm/types.h"

namespace meshtrain::sharding {

using comm::ReduceOp;

struct Placement {
  enum class Kind : uint8_t { replicate, shard, strided_shard, partial };
  Kind kind = Kind::replicate;
  int dim = -1;                     // tensor dim of shard / strided_shard
  int split_factor = 1;             // strided_shard: shards the dim already has from the right (>= 2)
  ReduceOp reduce = ReduceOp::sum;  // partial

  static Placement replicate() { return {}; }
  static Placement shard(int dim) { return {Kind::shard, dim, 1, ReduceOp::sum}; }
  static Placement strided_shard(int dim, int split_factor) {
    return {Kind::strided_shard, dim, split_factor, ReduceOp::sum};
  }
  static Placement partial(ReduceOp op = ReduceOp::sum) { return {Kind::partial, -1, 1, op}; }

  bool is_replicate() const { return kind == Kind::replicate; }
  bool is_partial() const { return kind == Kind::partial; }
  // Shard or strided shard: the mesh dim splits tensor dim `dim`.
  bool is_sharding() const { return kind == Kind::shard || kind == Kind::strided_shard; }
  std::string to_string() const;  // R, S(0), _S(0, 3), P(sum)
  bool operator==(const Placement&) const = default;
};

struct Layout {
  std::vector<Placement> placements;  // one per mesh dim
  // For a sharding placement on mesh dim m: its position in the order that
  // shards its tensor dim (0 = applied first, on the full dim); -1 otherwise.
  std::vector<int> order;

  // "S(0)[1]S(0)[0]R", "_S(0, 3)S(0)", "P(sum)R": one placement per mesh dim;
  // [k] gives the shard order where several mesh dims shard one tensor dim
  // (all or none of them; none = mesh-dim order). Throws with what is wrong.
  static Layout parse(std::string_view text, int mesh_ndim);
  // Placements with the default (mesh-dim) order.
  static Layout from_placements(std::vector<Placement> placements);
  // PyTorch's format_shard_order_str: [k] wherever a tensor dim has several shards.
  std::string to_string() const;

  int mesh_ndim() const { return static_cast<int>(placements.size()); }
  // Mesh dims sharding tensor dim d, in the order they apply.
  std::vector<int> shard_sequence(int tensor_dim) const;
  bool has_partial() const;
  // Throws unless every sharded tensor dim is < tensor_rank and every partial
  // uses one reduce op.
  void validate(int tensor_rank) const;
  bool operator==(const Layout&) const = default;
};

}  // namespace meshtrain::sharding
