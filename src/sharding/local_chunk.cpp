#include "sharding/local_chunk.h"

#include <algorithm>
#include <cstring>

#include "comm/reduce.h"
#include "core/error.h"

namespace meshtrain::sharding {

namespace {
// Indices [begin, begin + len) of v.
std::vector<int64_t> slice(const std::vector<int64_t>& v, int64_t begin, int64_t len) {
  return {v.begin() + begin, v.begin() + begin + len};
}
}  // namespace

std::vector<int64_t> split_indices(const std::vector<int64_t>& parent, const Placement& p, int n, int i) {
  const auto len = static_cast<int64_t>(parent.size());
  if (p.kind == Placement::Kind::shard) {
    const auto counts = torch_chunk_sizes(len, n);
    return slice(parent, comm::displacements(counts)[i], counts[i]);
  }
  MT_CHECK(p.kind == Placement::Kind::strided_shard, "split_indices on placement {}", p.to_string());
  std::vector<int64_t> out;
  // torch.chunk's pieces: full ones of `piece` elements, then what is left;
  // a split factor beyond len leaves the rest empty (not visited).
  const int64_t piece = (len + p.split_factor - 1) / p.split_factor;
  for (int64_t start = 0; start < len; start += piece) {
    const int64_t size = std::min(piece, len - start);
    const int64_t part = (size + n - 1) / n;
    const int64_t first = start + std::min(part * i, size);
    const int64_t count = std::clamp<int64_t>(size - part * i, 0, part);
    out.insert(out.end(), parent.begin() + first, parent.begin() + first + count);
  }
  return out;
}

std::vector<int64_t> shard_indices(int64_t dim_size, const Layout& layout, int tensor_dim, const DeviceMesh& mesh,
                                   const std::vector<int>& coord) {
  std::vector<int64_t> idx(static_cast<size_t>(dim_size));
  for (int64_t k = 0; k < dim_size; ++k) idx[k] = k;
  for (int m : layout.shard_sequence(tensor_dim))
    idx = split_indices(idx, layout.placements[m], mesh.size(m), coord[m]);
  return idx;
}

namespace {

// One split of a sequence of `parent_len` elements (a shard or strided shard
// over n ranks, this rank's part i), in closed form: how many elements the
// part holds and which parent position its p-th element is. So a local chunk
// costs O(mesh dims), whatever the dim's size or the split factor.
struct PartOfSplit {
  int64_t parent_len = 0, n = 1, i = 0;
  int64_t pieces_len = 0;  // strided: elements per full piece (torch.chunk); shard: parent_len (one piece)

  // Rank i's run within a piece of `size` elements: its start and length.
  int64_t start_in(int64_t size) const { return std::min((size + n - 1) / n * i, size); }
  int64_t length_in(int64_t size) const {
    const int64_t part = (size + n - 1) / n;
    return std::clamp<int64_t>(size - part * i, 0, part);
  }
  int64_t full_pieces() const { return pieces_len == 0 ? 0 : parent_len / pieces_len; }
  int64_t remainder() const { return parent_len - full_pieces() * pieces_len; }
  int64_t count() const { return full_pieces() * length_in(pieces_len) + length_in(remainder()); }
  int64_t parent_position(int64_t p) const {
    const int64_t per_piece = length_in(pieces_len);
    if (per_piece > 0 && p < full_pieces() * per_piece)
      return p / per_piece * pieces_len + start_in(pieces_len) + p % per_piece;
    return full_pieces() * pieces_len + start_in(remainder()) + (p - full_pieces() * per_piece);
  }
};

PartOfSplit part_of_split(const Placement& p, int64_t parent_len, int n, int i) {
  PartOfSplit s{parent_len, n, i, parent_len};
  if (p.kind == Placement::Kind::strided_shard) s.pieces_len = (parent_len + p.split_factor - 1) / p.split_factor;
  return s;
}

}  // namespace

LocalChunk local_chunk(const Shape& global_shape, const Layout& layout, const DeviceMesh& mesh,
                       const std::vector<int>& coord) {
  MT_CHECK(layout.mesh_ndim() == mesh.ndim(), "layout {} has {} placements for mesh {}", layout.to_string(),
           layout.mesh_ndim(), mesh.describe());
  MT_CHECK(static_cast<int>(coord.size()) == mesh.ndim(), "coordinate of {} dims on mesh {}", coord.size(),
           mesh.describe());
  layout.validate(static_cast<int>(global_shape.rank()));
  std::vector<int64_t> extents;
  LocalChunk chunk;
  for (size_t d = 0; d < global_shape.rank(); ++d) {
    std::vector<PartOfSplit> splits;
    int64_t length = global_shape[d];
    for (int m : layout.shard_sequence(static_cast<int>(d))) {
      splits.push_back(part_of_split(layout.placements[static_cast<size_t>(m)], length, mesh.size(m),
                                     coord[static_cast<size_t>(m)]));
      length = splits.back().count();
    }
    extents.push_back(length);
    // The first element's global index: its position, mapped up through every split.
    int64_t first = 0;
    for (size_t k = splits.size(); k-- > 0;) first = splits[k].parent_position(first);
    chunk.offset.push_back(length == 0 ? global_shape[d] : first);
  }
  chunk.shape = Shape(std::move(extents));
  return chunk;
}

Tensor local_piece(const Tensor& global, const Layout& layout, const DeviceMesh& mesh, const std::vector<int>& coord) {
  const LocalChunk chunk = local_chunk(global.shape(), layout, mesh, coord);
  const size_t rank = global.shape().rank();
  std::vector<std::vector<int64_t>> idx;
  for (size_t d = 0; d < rank; ++d)
    idx.push_back(shard_indices(global.shape()[d], layout, static_cast<int>(d), mesh, coord));
  Tensor out = Tensor::empty(chunk.shape, global.dtype());
  const size_t elem = dtype_size(global.dtype());
  const auto* src = static_cast<const std::byte*>(global.raw());
  auto* dst = static_cast<std::byte*>(out.raw());
  std::vector<int64_t> pos(rank, 0);
  for (int64_t i = 0; i < out.numel(); ++i) {
    int64_t flat = 0;
    for (size_t d = 0; d < rank; ++d) flat = flat * global.shape()[d] + idx[d][static_cast<size_t>(pos[d])];
    std::memcpy(dst + static_cast<size_t>(i) * elem, src + static_cast<size_t>(flat) * elem, elem);
    for (size_t d = rank; d-- > 0;) {
      if (++pos[d] < chunk.shape[d]) break;
      pos[d] = 0;
    }
  }
  return out;
}

}  // namespace meshtrain::sharding
