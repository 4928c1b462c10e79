// Redistribution checks shared by the local-backend unit test and the
// mpirun test: every rank builds its source piece of a known global tensor
// (Partial sources from known per-rank contributions that reduce exactly to
// it), redistributes, and compares with slicing the global tensor.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "sharding/local_chunk.h"
#include "sharding/redistribute.h"

namespace mtest {

using namespace meshtrain;
using namespace meshtrain::sharding;

// Integer-valued f32 so that every reduction is exact in any order.
inline float global_value(int64_t flat) { return static_cast<float>((flat * 37) % 101 - 50); }

// Row-major flat index of a multi-index.
inline int64_t flat_index(const std::vector<int64_t>& idx, const std::vector<int64_t>& shape) {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + idx[d];
  return f;
}

// This rank's piece of the global tensor under `layout` (ignoring partials).
inline Tensor slice_global(const std::vector<int64_t>& shape, const Layout& layout, const DeviceMesh& mesh,
                           const std::vector<int>& coord) {
  std::vector<std::vector<int64_t>> idx;
  std::vector<int64_t> local_shape;
  for (size_t d = 0; d < shape.size(); ++d) {
    idx.push_back(shard_indices(shape[d], layout, static_cast<int>(d), mesh, coord));
    local_shape.push_back(static_cast<int64_t>(idx.back().size()));
  }
  Tensor t = Tensor::empty(Shape(local_shape), DType::f32);
  auto data = t.data<float>();
  std::vector<int64_t> pos(shape.size(), 0), global(shape.size());
  for (int64_t i = 0; i < t.numel(); ++i) {
    for (size_t d = 0; d < shape.size(); ++d) global[d] = idx[d][pos[d]];
    data[i] = global_value(flat_index(global, shape));
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      if (++pos[d] < local_shape[d]) break;
      pos[d] = 0;
    }
  }
  return t;
}

// Index of this rank among the ranks a partial value is spread over, and
// their count: row-major over the mesh dims that hold a Partial.
inline std::pair<int, int> partial_index(const Layout& layout, const DeviceMesh& mesh, const std::vector<int>& coord) {
  int t = 0, count = 1;
  for (int m = 0; m < mesh.ndim(); ++m)
    if (layout.placements[m].is_partial()) {
      t = t * mesh.size(m) + coord[m];
      count *= mesh.size(m);
    }
  return {t, count};
}

// Contribution of partial index t (of `count`) so that the reduction over
// all t gives x exactly: sum: x on t = 0 plus offsets summing to zero;
// avg: x plus offsets summing to zero; max: below x except on the last.
inline float contribution(float x, ReduceOp op, int t, int count) {
  const float delta = static_cast<float>(2 * t - (count - 1));
  switch (op) {
    case ReduceOp::sum:
      return (t == 0 ? x : 0.0f) + delta;
    case ReduceOp::avg:
      return x + delta;
    case ReduceOp::max:
      return t == count - 1 ? x : x - 1.0f - std::abs(delta);
    case ReduceOp::min:
      return t == count - 1 ? x : x + 1.0f + std::abs(delta);
  }
  return x;
}

inline Tensor source_piece(const std::vector<int64_t>& shape, const Layout& layout, const DeviceMesh& mesh,
                           const std::vector<int>& coord) {
  Tensor t = slice_global(shape, layout, mesh, coord);
  if (!layout.has_partial()) return t;
  ReduceOp op = ReduceOp::sum;
  for (const auto& p : layout.placements)
    if (p.is_partial()) op = p.reduce;
  const auto [index, count] = partial_index(layout, mesh, coord);
  for (float& v : t.data<float>()) v = contribution(v, op, index, count);
  return t;
}

// Redistribute src -> dst and compare; returns false (with gtest failures) on a mismatch.
inline bool check_redistribute(MeshGroups& groups, Planner& planner, const std::vector<int64_t>& shape,
                               const Layout& src, const Layout& dst) {
  const DeviceMesh& mesh = groups.mesh();
  const auto& coord = groups.coordinate();
  const std::string where = fmt::format("{} -> {} shape ({}) rank coord [{}]", src.to_string(), dst.to_string(),
                                        fmt::join(shape, ","), fmt::join(coord, ","));
  Tensor out;
  try {
    out = redistribute(source_piece(shape, src, mesh, coord), Shape(shape), src, dst, groups, planner);
  } catch (const std::exception& e) {
    ADD_FAILURE() << where << ": " << e.what();
    return false;
  }
  // A Partial target keeps the pending reduction: reduce it to compare.
  std::vector<int> partial_dims;
  for (int m = 0; m < mesh.ndim(); ++m)
    if (dst.placements[m].is_partial()) partial_dims.push_back(m);
  if (!partial_dims.empty()) {
    out = out.clone();
    groups.merged_group(partial_dims).all_reduce(out, dst.placements[partial_dims[0]].reduce)->wait();
  }
  const Tensor want = slice_global(shape, dst, mesh, coord);
  EXPECT_EQ(out.shape(), want.shape()) << where;
  if (out.shape() != want.shape()) return false;
  const auto got = out.data<const float>(), expect = want.data<const float>();
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != expect[i]) {
      ADD_FAILURE() << where << ": element " << i << " is " << got[i] << ", expected " << expect[i];
      return false;
    }
  }
  return true;
}

// A layout set covering each placement kind on each mesh dim: R, S(d) for
// every tensor dim, strided shards with split factors 2 and 3, P(sum),
// P(max), P(avg), and both shard orders where two mesh dims share a tensor
// dim. For an n-d mesh, combinations are drawn so the set stays near `limit`.
inline std::vector<Layout> layout_set(int mesh_ndim, int tensor_rank, size_t limit) {
  std::vector<Placement> kinds{Placement::replicate()};
  for (int d = 0; d < tensor_rank; ++d) kinds.push_back(Placement::shard(d));
  kinds.push_back(Placement::strided_shard(0, 2));
  kinds.push_back(Placement::strided_shard(tensor_rank - 1, 3));
  kinds.push_back(Placement::partial(ReduceOp::sum));
  kinds.push_back(Placement::partial(ReduceOp::max));
  kinds.push_back(Placement::partial(ReduceOp::avg));
  std::vector<Layout> all;
  std::vector<size_t> pick(static_cast<size_t>(mesh_ndim), 0);
  for (;;) {
    std::vector<Placement> ps;
    for (size_t k : pick) ps.push_back(kinds[k]);
    Layout l = Layout::from_placements(ps);
    bool valid = true;
    try {
      l.validate(tensor_rank);
    } catch (const std::exception&) {
      valid = false;
    }
    if (valid) {
      all.push_back(l);
      // The reversed order of every tensor dim sharded by several mesh dims.
      Layout reversed = l;
      bool differs = false;
      for (int d = 0; d < tensor_rank; ++d) {
        const auto seq = l.shard_sequence(d);
        for (size_t k = 0; k < seq.size(); ++k) reversed.order[seq[k]] = static_cast<int>(seq.size() - 1 - k);
        differs |= seq.size() > 1;
      }
      if (differs) all.push_back(reversed);
    }
    size_t m = 0;
    while (m < pick.size() && ++pick[m] == kinds.size()) pick[m++] = 0;
    if (m == pick.size()) break;
  }
  if (all.size() <= limit) return all;
  // Keep every kind on every mesh dim: a deterministic stride through the list.
  std::vector<Layout> chosen;
  const double stride = static_cast<double>(all.size()) / static_cast<double>(limit);
  for (size_t i = 0; i < limit; ++i) chosen.push_back(all[static_cast<size_t>(static_cast<double>(i) * stride)]);
  return chosen;
}

// Whether dst is a legal target from src (Partial only where src has it).
inline bool legal_pair(const Layout& src, const Layout& dst) {
  for (int m = 0; m < src.mesh_ndim(); ++m)
    if (dst.placements[m].is_partial() && !(src.placements[m] == dst.placements[m])) return false;
  return true;
}

}  // namespace mtest
