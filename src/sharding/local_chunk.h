// Which part of a global tensor each rank holds under a Layout: the global
// indices along every tensor dim (torch.chunk rule, strided shards, several
// mesh dims on one tensor dim in shard order), local shape and global offset.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/reduce.h"
#include "core/shape.h"
#include "core/tensor.h"
#include "sharding/device_mesh.h"
#include "sharding/layout.h"

namespace meshtrain::sharding {

using comm::torch_chunk_sizes;  // torch.chunk's split rule (comm/reduce.h)

// Split `parent` (global indices, in local storage order) over n ranks by
// placement p and return rank i's part. Shard: torch.chunk. Strided shard
// (sf): chunk into sf pieces, chunk each piece into n parts, take part i of
// every piece in order.
std::vector<int64_t> split_indices(const std::vector<int64_t>& parent, const Placement& p, int n, int i);

// Global indices along tensor dim d held at mesh coordinate `coord`.
std::vector<int64_t> shard_indices(int64_t dim_size, const Layout& layout, int tensor_dim, const DeviceMesh& mesh,
                                   const std::vector<int>& coord);

struct LocalChunk {
  Shape shape;
  // First global index per dim; an empty shard's offset is the dim size (PyTorch).
  std::vector<int64_t> offset;
};
LocalChunk local_chunk(const Shape& global_shape, const Layout& layout, const DeviceMesh& mesh,
                       const std::vector<int>& coord);

// The part of a whole (global) tensor that mesh coordinate `coord` holds
// under `layout`, as a new tensor; a Partial placement takes the whole value
// (the caller decides how a pending sum is split).
Tensor local_piece(const Tensor& global, const Layout& layout, const DeviceMesh& mesh, const std::vector<int>& coord);

}  // namespace meshtrain::sharding
