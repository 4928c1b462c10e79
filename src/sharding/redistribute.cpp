#include "sharding/redistribute.h"

#include <cstring>
#include <numeric>

#include <fmt/ranges.h>

#include "sharding/local_chunk.h"

namespace meshtrain::sharding {

namespace {

// A tensor seen as [outer, len, inner] around dim d (inner in bytes).
struct Around {
  int64_t outer = 1, len = 0, inner_bytes = 0;
};
Around around(const Shape& shape, int d, size_t elem) {
  const AroundDim a = around_dim(shape, static_cast<size_t>(d));
  return {a.outer, a.dim, a.inner * static_cast<int64_t>(elem)};
}

// dst[o, k] = src[o, rows[k]] along dim d; dst has len = rows.size().
void take_rows(const std::byte* src, const Shape& src_shape, int d, size_t elem,
               const std::vector<int64_t>& rows, std::byte* dst) {
  const Around a = around(src_shape, d, elem);
  const auto n = static_cast<int64_t>(rows.size());
  for (int64_t o = 0; o < a.outer; ++o)
    for (int64_t k = 0; k < n; ++k)
      std::memcpy(dst + (o * n + k) * a.inner_bytes, src + (o * a.len + rows[k]) * a.inner_bytes,
                  static_cast<size_t>(a.inner_bytes));
}

// dst[o, rows[k]] = src[o, k] along dim d; src has len = rows.size().
void put_rows(const std::byte* src, std::byte* dst, const Shape& dst_shape, int d, size_t elem,
              const std::vector<int64_t>& rows) {
  const Around a = around(dst_shape, d, elem);
  const auto n = static_cast<int64_t>(rows.size());
  for (int64_t o = 0; o < a.outer; ++o)
    for (int64_t k = 0; k < n; ++k)
      std::memcpy(dst + (o * a.len + rows[k]) * a.inner_bytes, src + (o * n + k) * a.inner_bytes,
                  static_cast<size_t>(a.inner_bytes));
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

Shape with_dim(const Shape& shape, int d, int64_t len) {
  std::vector<int64_t> dims = shape.dims();
  dims[static_cast<size_t>(d)] = len;
  return Shape(std::move(dims));
}

struct StepContext {
  const Shape& global_shape;
  const PlanStep& step;
  MeshGroups& groups;
  Shape before_shape, after_shape;
  size_t elem;
  int group_rank = 0;
  int group_size = 1;
  // Positions, within the parent list along dim d, of member j's part.
  std::vector<int64_t> member_rows(int64_t parent_len, const Placement& p, int j) const {
    // Merged steps only happen where the nested split equals a flat one.
    return split_indices(iota(parent_len), p, group_size, j);
  }
};

// Each member's rows of a parent list of length parent_len split by p.
std::vector<std::vector<int64_t>> rows_by_member(const StepContext& c, int64_t parent_len, const Placement& p) {
  std::vector<std::vector<int64_t>> rows;
  for (int j = 0; j < c.group_size; ++j) rows.push_back(c.member_rows(parent_len, p, j));
  return rows;
}

// Elements of each member's block: `shape` with dim d cut to its rows.
std::vector<int64_t> block_counts(const Shape& shape, int d, const std::vector<std::vector<int64_t>>& rows) {
  std::vector<int64_t> counts;
  for (const auto& r : rows) counts.push_back(with_dim(shape, d, static_cast<int64_t>(r.size())).numel());
  return counts;
}

// One flat buffer of blocks, block j = rows[j] of `cur` along dim d.
Tensor pack_blocks(const Tensor& cur, const Shape& shape, int d, size_t elem,
                   const std::vector<std::vector<int64_t>>& rows) {
  Tensor packed = Tensor::empty({cur.numel()}, cur.dtype());
  int64_t offset = 0;
  for (size_t j = 0; j < rows.size(); ++j) {
    take_rows(static_cast<const std::byte*>(cur.raw()), shape, d, elem, rows[j],
              static_cast<std::byte*>(packed.raw()) + offset * static_cast<int64_t>(elem));
    offset += with_dim(shape, d, static_cast<int64_t>(rows[j].size())).numel();
  }
  return packed;
}

// The inverse: block j of `blocks` (counts[j] elements) goes to rows[j] of a new tensor of `shape` along dim d.
Tensor unpack_blocks(const Tensor& blocks, const std::vector<int64_t>& counts, const Shape& shape, int d,
                     size_t elem, const std::vector<std::vector<int64_t>>& rows) {
  Tensor out = Tensor::empty(shape, blocks.dtype());
  int64_t offset = 0;
  for (size_t j = 0; j < rows.size(); ++j) {
    put_rows(static_cast<const std::byte*>(blocks.raw()) + offset * static_cast<int64_t>(elem),
             static_cast<std::byte*>(out.raw()), shape, d, elem, rows[j]);
    offset += counts[j];
  }
  return out;
}

Tensor all_gather_step(const Tensor& cur, StepContext& c) {
  const int d = c.step.from.dim;
  const auto rows = rows_by_member(c, c.after_shape[d], c.step.from);
  const auto counts = block_counts(c.before_shape, d, rows);
  Tensor gathered = Tensor::empty({std::accumulate(counts.begin(), counts.end(), int64_t{0})}, cur.dtype());
  c.groups.merged_group(c.step.mesh_dims).all_gather(cur.reshape({cur.numel()}), gathered, counts)->wait();
  return unpack_blocks(gathered, counts, c.after_shape, d, c.elem, rows);
}

Tensor reduce_scatter_step(const Tensor& cur, StepContext& c) {
  const int d = c.step.to.dim;
  const auto rows = rows_by_member(c, c.before_shape[d], c.step.to);
  Tensor out = Tensor::empty(c.after_shape, cur.dtype());
  Tensor flat = out.reshape({out.numel()});
  c.groups.merged_group(c.step.mesh_dims)
      .reduce_scatter(pack_blocks(cur, c.before_shape, d, c.elem, rows), flat, c.step.from.reduce,
                      block_counts(c.before_shape, d, rows))
      ->wait();
  return out;
}

Tensor all_to_all_step(const Tensor& cur, StepContext& c) {
  const int a = c.step.from.dim, b = c.step.to.dim;
  // To member j: its part of dim b, with all of my part of dim a.
  const auto b_rows = rows_by_member(c, c.before_shape[b], c.step.to);
  // From member j: its part of dim a, with my part of dim b.
  const auto a_rows = rows_by_member(c, c.after_shape[a], c.step.from);
  const auto recv_counts = block_counts(c.after_shape, a, a_rows);
  Tensor received = Tensor::empty({std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0})}, cur.dtype());
  c.groups.merged_group(c.step.mesh_dims)
      .all_to_all(pack_blocks(cur, c.before_shape, b, c.elem, b_rows), received,
                  block_counts(c.before_shape, b, b_rows), recv_counts)
      ->wait();
  return unpack_blocks(received, recv_counts, c.after_shape, a, c.elem, a_rows);
}

Tensor local_step(const Tensor& cur, StepContext& c) {
  const PlanStep& s = c.step;
  if (s.to.is_partial()) {
    // R -> P: the group must reduce back to the value. Sum: group rank 0
    // keeps it and the others hold zero (exact; PyTorch divides by n, which
    // rounds). avg, max, min: every rank keeps it.
    Tensor out = cur.clone();
    if (s.to.reduce == ReduceOp::sum && c.group_rank != 0) std::memset(out.raw(), 0, out.nbytes());
    return out;
  }
  // R -> S / SS: keep this rank's part of the dim.
  const int d = s.to.dim;
  const auto rows = c.member_rows(c.before_shape[d], s.to, c.group_rank);
  Tensor out = Tensor::empty(c.after_shape, cur.dtype());
  take_rows(static_cast<const std::byte*>(cur.raw()), c.before_shape, d, c.elem, rows, static_cast<std::byte*>(out.raw()));
  return out;
}

}  // namespace

Tensor execute_step(const Tensor& local, const Shape& global_shape, const PlanStep& step, MeshGroups& groups) {
  const DeviceMesh& mesh = groups.mesh();
  const auto& coord = groups.coordinate();
  StepContext c{global_shape, step, groups, local_chunk(global_shape, step.before, mesh, coord).shape,
                local_chunk(global_shape, step.after, mesh, coord).shape, dtype_size(local.dtype())};
  for (int m : step.mesh_dims) {
    c.group_rank = c.group_rank * mesh.size(m) + coord[m];
    c.group_size *= mesh.size(m);
  }
  if (c.group_size == 1) return local;  // a one-rank group holds the whole tensor under any placement
  if (!step.collective) return local_step(local, c);
  switch (*step.collective) {
    case comm::OpType::all_gather: return all_gather_step(local, c);
    case comm::OpType::reduce_scatter: return reduce_scatter_step(local, c);
    case comm::OpType::all_to_all: return all_to_all_step(local, c);
    case comm::OpType::all_reduce: {
      Tensor out = local.clone();
      groups.merged_group(step.mesh_dims).all_reduce(out, step.from.reduce)->wait();
      return out;
    }
    default:
      throw Error(fmt::format("redistribute: a plan step cannot be a {}", comm::op_type_name(*step.collective)));
  }
}

Tensor execute_plan(const Tensor& local, const Shape& global_shape, const Plan& plan, MeshGroups& groups) {
  Tensor cur = local;
  for (const PlanStep& step : plan.steps) cur = execute_step(cur, global_shape, step, groups);
  return cur;
}

Tensor redistribute(const Tensor& local, const Shape& global_shape, const Layout& src, const Layout& dst,
                    MeshGroups& groups, Planner& planner) {
  MT_CHECK(groups.mesh() == planner.mesh(), "redistribute: the planner's mesh {} is not the groups' mesh {}",
           planner.mesh().describe(), groups.mesh().describe());
  const auto expected = local_chunk(global_shape, src, groups.mesh(), groups.coordinate()).shape;
  MT_CHECK(local.shape() == expected,
           "redistribute: the local tensor {} does not match layout {} of global shape {} at mesh coordinate [{}], "
           "which gives local shape {}",
           local.describe(), src.to_string(), global_shape.to_string(), fmt::join(groups.coordinate(), ","),
           expected.to_string());
  const auto plan = planner.plan(global_shape, dtype_size(local.dtype()), src, dst);
  return execute_plan(local, global_shape, *plan, groups);
}

}  // namespace meshtrain::sharding
