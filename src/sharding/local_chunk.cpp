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

std::vector<int64_t> torch_chunk_sizes(int64_t total, int n) {
  MT_CHECK(n > 0 && total >= 0, "torch_chunk_sizes({}, {}): need n > 0 and total >= 0", total, n);
  const int64_t chunk = (total + n - 1) / n;
  std::vector<int64_t> sizes(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) sizes[r] = std::clamp<int64_t>(total - chunk * r, 0, chunk);
  return sizes;
}

std::vector<int64_t> split_indices(const std::vector<int64_t>& parent, const Placement& p, int n, int i) {
  const auto len = static_cast<int64_t>(parent.size());
  if (p.kind == Placement::Kind::shard) {
    const auto counts = torch_chunk_sizes(len, n);
    return slice(parent, comm::displacements(counts)[i], counts[i]);
  }
  MT_CHECK(p.kind == Placement::Kind::strided_shard, "split_indices on placement {}", p.to_string());
  std::vector<int64_t> out;
  const auto pieces = torch_chunk_sizes(len, p.split_factor);
  const auto piece_starts = comm::displacements(pieces);
  for (int j = 0; j < p.split_factor; ++j) {
    const auto parts = torch_chunk_sizes(pieces[j], n);
    const int64_t start = piece_starts[j] + comm::displacements(parts)[i];
    out.insert(out.end(), parent.begin() + start, parent.begin() + start + parts[i]);
  }
  return out;
}

std::vector<int64_t> shard_indices(int64_t dim_size, const Layout& layout, int tensor_dim,
                                   const DeviceMesh& mesh, const std::vector<int>& coord) {
  std::vector<int64_t> idx(static_cast<size_t>(dim_size));
  for (int64_t k = 0; k < dim_size; ++k) idx[k] = k;
  for (int m : layout.shard_sequence(tensor_dim)) idx = split_indices(idx, layout.placements[m], mesh.size(m), coord[m]);
  return idx;
}

LocalChunk local_chunk(const Shape& global_shape, const Layout& layout, const DeviceMesh& mesh,
                       const std::vector<int>& coord) {
  MT_CHECK(layout.mesh_ndim() == mesh.ndim(), "layout {} has {} placements for mesh {}", layout.to_string(),
           layout.mesh_ndim(), mesh.describe());
  layout.validate(static_cast<int>(global_shape.rank()));
  std::vector<int64_t> extents;
  LocalChunk chunk;
  for (size_t d = 0; d < global_shape.rank(); ++d) {
    if (layout.shard_sequence(static_cast<int>(d)).empty()) {
      extents.push_back(global_shape[d]);
      chunk.offset.push_back(0);
      continue;
    }
    // Plain shards keep a contiguous range: chunk its start and length (a
    // dim of millions must not become a vector of its indices per call).
    const std::vector<int> sequence = layout.shard_sequence(static_cast<int>(d));
    if (std::all_of(sequence.begin(), sequence.end(),
                    [&](int m) { return layout.placements[static_cast<size_t>(m)].kind == Placement::Kind::shard; })) {
      int64_t start = 0, length = global_shape[d];
      for (int m : sequence) {  // torch_chunk_sizes' block of this coordinate, without listing all n
        const int64_t n = mesh.size(m), i = coord[static_cast<size_t>(m)];
        const int64_t chunk = (length + n - 1) / n;
        start += std::min(chunk * i, length);
        length = std::clamp<int64_t>(length - chunk * i, 0, chunk);
      }
      extents.push_back(length);
      chunk.offset.push_back(length == 0 ? global_shape[d] : start);
      continue;
    }
    const auto idx = shard_indices(global_shape[d], layout, static_cast<int>(d), mesh, coord);
    extents.push_back(static_cast<int64_t>(idx.size()));
    chunk.offset.push_back(idx.empty() ? global_shape[d] : idx[0]);
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
