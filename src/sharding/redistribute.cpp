#include "sharding/redistribute.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/copy.h"
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

// Runs of consecutive rows: (first row, position in `rows`, length). A
// shard's rows are one run, so a row copy is one memcpy per outer index
// (along the last dim a row is a single element: copied one at a time, a
// 393 KiB all_to_all's packing took 0.3 ms).
struct RowRun {
  int64_t first = 0, at = 0, len = 0;
};
std::vector<RowRun> row_runs(const std::vector<int64_t>& rows) {
  std::vector<RowRun> runs;
  for (size_t k = 0; k < rows.size(); ++k) {
    if (!runs.empty() && rows[k] == runs.back().first + runs.back().len) {
      ++runs.back().len;
      continue;
    }
    runs.push_back({rows[k], static_cast<int64_t>(k), 1});
  }
  return runs;
}

// dst[o, k] = src[o, rows[k]] along dim d; dst has len = rows.size().
void take_rows(const std::byte* src, const Shape& src_shape, int d, size_t elem, const std::vector<int64_t>& rows,
               std::byte* dst) {
  const Around a = around(src_shape, d, elem);
  const auto n = static_cast<int64_t>(rows.size());
  const std::vector<RowRun> runs = row_runs(rows);
  for (int64_t o = 0; o < a.outer; ++o)
    for (const RowRun& r : runs)
      copy_bytes(dst + (o * n + r.at) * a.inner_bytes, src + (o * a.len + r.first) * a.inner_bytes,
                 static_cast<size_t>(r.len * a.inner_bytes));
}

// dst[o, rows[k]] = src[o, k] along dim d; src has len = rows.size().
void put_rows(const std::byte* src, std::byte* dst, const Shape& dst_shape, int d, size_t elem,
              const std::vector<int64_t>& rows) {
  const Around a = around(dst_shape, d, elem);
  const auto n = static_cast<int64_t>(rows.size());
  const std::vector<RowRun> runs = row_runs(rows);
  for (int64_t o = 0; o < a.outer; ++o)
    for (const RowRun& r : runs)
      copy_bytes(dst + (o * a.len + r.first) * a.inner_bytes, src + (o * n + r.at) * a.inner_bytes,
                 static_cast<size_t>(r.len * a.inner_bytes));
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
  const PlanStep& step;
  Shape before_shape, after_shape;
  size_t elem;
  int group_rank = 0;
  int group_size = 1;
  StepContext(const Shape& global_shape, const PlanStep& s, const DeviceMesh& mesh, const std::vector<int>& coord,
              size_t elem_size)
      : step(s),
        before_shape(local_chunk(global_shape, s.before, mesh, coord).shape),
        after_shape(local_chunk(global_shape, s.after, mesh, coord).shape),
        elem(elem_size) {
    for (int m : s.mesh_dims) {
      group_rank = group_rank * mesh.size(m) + coord[static_cast<size_t>(m)];
      group_size *= mesh.size(m);
    }
  }
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

// Whether the blocks, one per member in member order, are already the
// tensor's bytes in order (nothing before dim d, each member's rows a run
// following the previous member's), so a collective reads or writes it as is.
bool blocks_in_place(const Shape& shape, int d, const std::vector<std::vector<int64_t>>& rows) {
  if (around(shape, d, 1).outer != 1) return false;
  int64_t next = 0;
  for (const auto& r : rows)
    for (int64_t row : r)
      if (row != next++) return false;
  return true;
}

// blocks_in_place of the members' rows split by `p`, without listing them
// where p is a plain shard (its members' rows are runs in member order).
bool split_in_place(const StepContext& c, const Shape& shape, int d, const Placement& p) {
  if (p.kind == Placement::Kind::shard) return around(shape, d, 1).outer == 1;
  return blocks_in_place(shape, d, rows_by_member(c, shape[d], p));
}

// Blocks j = rows[j] of `cur` along dim d, one after another into `dst`.
void pack_blocks(const Tensor& cur, const Shape& shape, int d, size_t elem,
                 const std::vector<std::vector<int64_t>>& rows, std::byte* dst) {
  for (const auto& r : rows) {
    take_rows(static_cast<const std::byte*>(cur.raw()), shape, d, elem, r, dst);
    dst += with_dim(shape, d, static_cast<int64_t>(r.size())).numel() * static_cast<int64_t>(elem);
  }
}

// The inverse: block j of `blocks` (counts[j] elements) goes to rows[j] of `out` along dim d.
void unpack_blocks(const std::byte* blocks, const std::vector<int64_t>& counts, Tensor& out, int d, size_t elem,
                   const std::vector<std::vector<int64_t>>& rows) {
  for (size_t j = 0; j < rows.size(); ++j) {
    put_rows(blocks, static_cast<std::byte*>(out.raw()), out.shape(), d, elem, rows[j]);
    blocks += counts[j] * static_cast<int64_t>(elem);
  }
}

Tensor flat(const Tensor& t) { return t.reshape({t.numel()}); }

// A view of `n` elements of the staging buffer from element `offset`; fails
// when the buffer the caller gave is too small or of another dtype.
Tensor staging(const Tensor& buffer, int64_t offset, int64_t n, const Tensor& cur, const StepContext& c) {
  MT_CHECK(buffer.numel() >= offset + n && buffer.dtype() == cur.dtype(),
           "redistribution step {} -> {}: needs a buffer of {} {} elements, got {}", c.step.before.to_string(),
           c.step.after.to_string(), offset + n, dtype_name(cur.dtype()), buffer.describe());
  return Tensor::view(static_cast<std::byte*>(const_cast<void*>(buffer.raw())) +
                          offset * static_cast<int64_t>(dtype_size(buffer.dtype())),
                      {n}, buffer.dtype());
}

InFlightStep start_all_gather(const Tensor& cur, Tensor& out, const Tensor& buffer, const StepContext& c,
                              comm::ProcessGroup& group) {
  const int d = c.step.from.dim;
  auto rows = rows_by_member(c, c.after_shape[d], c.step.from);
  auto counts = block_counts(c.before_shape, d, rows);
  if (blocks_in_place(c.after_shape, d, rows)) {
    Tensor target = flat(out);
    return {group.all_gather(flat(cur), target, counts), {}};
  }
  Tensor target = staging(buffer, 0, c.after_shape.numel(), cur, c);
  InFlightStep s{group.all_gather(flat(cur), target, counts), {}};
  s.finish = [out, target, d, elem = c.elem, counts = std::move(counts), rows = std::move(rows)]() mutable {
    unpack_blocks(static_cast<const std::byte*>(target.raw()), counts, out, d, elem, rows);
  };
  return s;
}

InFlightStep start_reduce_scatter(const Tensor& cur, Tensor& out, const Tensor& buffer, const StepContext& c,
                                  comm::ProcessGroup& group) {
  const int d = c.step.to.dim;
  const auto rows = rows_by_member(c, c.before_shape[d], c.step.to);
  Tensor send = flat(cur);
  if (!blocks_in_place(c.before_shape, d, rows)) {
    send = staging(buffer, 0, c.before_shape.numel(), cur, c);
    pack_blocks(cur, c.before_shape, d, c.elem, rows, static_cast<std::byte*>(send.raw()));
  }
  Tensor target = flat(out);
  return {group.reduce_scatter(send, target, c.step.from.reduce, block_counts(c.before_shape, d, rows)), {}};
}

InFlightStep start_all_to_all(const Tensor& cur, Tensor& out, const Tensor& buffer, const StepContext& c,
                              comm::ProcessGroup& group) {
  const int a = c.step.from.dim, b = c.step.to.dim;
  // To member j: its part of dim b, with all of my part of dim a.
  const auto b_rows = rows_by_member(c, c.before_shape[b], c.step.to);
  // From member j: its part of dim a, with my part of dim b.
  auto a_rows = rows_by_member(c, c.after_shape[a], c.step.from);
  auto recv_counts = block_counts(c.after_shape, a, a_rows);
  Tensor send = staging(buffer, 0, c.before_shape.numel(), cur, c);
  Tensor received = staging(buffer, c.before_shape.numel(), c.after_shape.numel(), cur, c);
  pack_blocks(cur, c.before_shape, b, c.elem, b_rows, static_cast<std::byte*>(send.raw()));
  InFlightStep s{group.all_to_all(send, received, block_counts(c.before_shape, b, b_rows), recv_counts), {}};
  s.finish = [out, received, a, elem = c.elem, counts = std::move(recv_counts), rows = std::move(a_rows)]() mutable {
    unpack_blocks(static_cast<const std::byte*>(received.raw()), counts, out, a, elem, rows);
  };
  return s;
}

// RaggedRows of a tensor of `shape` [..., M, D] split along leading dim d:
// for each member, in pack_blocks' order (outer, its rows along d, the
// leading dims after d), each block of M rows' data rows.
struct RowBlocks {
  int64_t m = 0, row = 0;                  // rows per block, elements per row
  std::vector<std::vector<int64_t>> runs;  // per member: (block, data rows) pairs, flattened
  std::vector<int64_t> counts;             // per member: data elements
};
RowBlocks ragged_blocks(const Shape& shape, const Tensor& experts, int64_t padding, int d,
                        const std::vector<std::vector<int64_t>>& rows) {
  MT_CHECK(shape.rank() >= 3 && d < static_cast<int>(shape.rank()) - 2 &&
               experts.shape() == Shape(std::vector<int64_t>(shape.dims().begin(), shape.dims().end() - 1)),
           "a ragged all_to_all moves rows [..., M, D] along a leading dim with their experts [..., M], got {} along "
           "dim {} with experts {}",
           shape.to_string(), d, experts.shape().to_string());
  RowBlocks r{shape[shape.rank() - 2], shape[shape.rank() - 1], {}, {}};
  const Shape leading(std::vector<int64_t>(shape.dims().begin(), shape.dims().end() - 2));
  const AroundDim a = around_dim(leading, static_cast<size_t>(d));
  const int64_t* e = experts.data<const int64_t>().data();
  for (const auto& member : rows) {
    std::vector<int64_t> runs;
    int64_t count = 0;
    for (int64_t o = 0; o < a.outer; ++o)
      for (int64_t k : member)
        for (int64_t in = 0; in < a.inner; ++in) {
          const int64_t block = (o * a.dim + k) * a.inner + in;
          const int64_t data = r.m - std::count(e + block * r.m, e + (block + 1) * r.m, padding);
          runs.insert(runs.end(), {block, data});
          count += data * r.row;
        }
    r.runs.push_back(std::move(runs));
    r.counts.push_back(count);
  }
  return r;
}

InFlightStep start_ragged_all_to_all(const Tensor& cur, Tensor& out, const Tensor& buffer, const StepContext& c,
                                     comm::ProcessGroup& group, const RaggedRows& ragged) {
  const int a = c.step.from.dim, b = c.step.to.dim;
  const RowBlocks send =
      ragged_blocks(c.before_shape, *ragged.before, ragged.padding, b, rows_by_member(c, c.before_shape[b], c.step.to));
  RowBlocks recv =
      ragged_blocks(c.after_shape, *ragged.after, ragged.padding, a, rows_by_member(c, c.after_shape[a], c.step.from));
  const int64_t sent = std::accumulate(send.counts.begin(), send.counts.end(), int64_t{0});
  const int64_t arriving = std::accumulate(recv.counts.begin(), recv.counts.end(), int64_t{0});
  Tensor packed = staging(buffer, 0, sent, cur, c);
  Tensor received = staging(buffer, c.before_shape.numel(), arriving, cur, c);
  const auto row_bytes = static_cast<size_t>(send.row) * c.elem;
  auto* to = static_cast<std::byte*>(packed.raw());
  const auto* from = static_cast<const std::byte*>(cur.raw());
  for (const auto& runs : send.runs)
    for (size_t i = 0; i < runs.size(); i += 2) {
      const auto bytes = static_cast<size_t>(runs[i + 1]) * row_bytes;
      copy_bytes(to, from + static_cast<size_t>(runs[i] * send.m) * row_bytes, bytes);
      to += bytes;
    }
  InFlightStep s{group.all_to_all(packed, received, send.counts, recv.counts), {}};
  s.finish = [out, received, row_bytes, recv = std::move(recv)]() mutable {
    auto* dst = static_cast<std::byte*>(out.raw());
    std::memset(dst, 0, out.nbytes());
    const auto* src = static_cast<const std::byte*>(received.raw());
    for (const auto& runs : recv.runs)
      for (size_t i = 0; i < runs.size(); i += 2) {
        const auto bytes = static_cast<size_t>(runs[i + 1]) * row_bytes;
        copy_bytes(dst + static_cast<size_t>(runs[i] * recv.m) * row_bytes, src, bytes);
        src += bytes;
      }
  };
  return s;
}

InFlightStep start_all_reduce(const Tensor& cur, Tensor& out, const StepContext& c, comm::ProcessGroup& group) {
  if (out.raw() != cur.raw()) copy_bytes(out.raw(), cur.raw(), out.nbytes());
  return {group.all_reduce(out, c.step.from.reduce), {}};
}

void local_step(const Tensor& cur, Tensor& out, const StepContext& c) {
  const PlanStep& s = c.step;
  if (s.to.is_partial()) {
    // R -> P: the group must reduce back to the value. Sum: group rank 0
    // keeps it and the others hold zero (exact; PyTorch divides by n, which
    // rounds). avg, max, min: every rank keeps it.
    if (s.to.reduce == ReduceOp::sum && c.group_rank != 0)
      std::memset(out.raw(), 0, out.nbytes());
    else if (out.raw() != cur.raw())
      copy_bytes(out.raw(), cur.raw(), out.nbytes());
    return;
  }
  // R -> S / SS: keep this rank's part of the dim.
  const int d = s.to.dim;
  const auto rows = c.member_rows(c.before_shape[d], s.to, c.group_rank);
  take_rows(static_cast<const std::byte*>(cur.raw()), c.before_shape, d, c.elem, rows,
            static_cast<std::byte*>(out.raw()));
}

}  // namespace

StepBuffers step_buffers(const Shape& global_shape, const PlanStep& step, const DeviceMesh& mesh,
                         const std::vector<int>& coord) {
  const StepContext c(global_shape, step, mesh, coord, 1);
  if (c.group_size == 1 || !step.collective) return {};
  switch (*step.collective) {
    case comm::OpType::all_gather: {
      const int d = step.from.dim;
      const bool in_place = split_in_place(c, c.after_shape, d, step.from);
      return {in_place ? 0 : c.after_shape.numel(), true};
    }
    case comm::OpType::reduce_scatter: {
      const int d = step.to.dim;
      const bool in_place = split_in_place(c, c.before_shape, d, step.to);
      return {in_place ? 0 : c.before_shape.numel(), in_place};
    }
    case comm::OpType::all_to_all:
      return {c.before_shape.numel() + c.after_shape.numel(), false};
    default:
      return {};  // all_reduce: on the output, which starts as a copy of the input
  }
}

void InFlightStep::complete() {
  if (work) work->wait();
  if (finish) finish();
}

InFlightStep start_ring_shift(const Tensor& local, Tensor& out, int mesh_dim, MeshGroups& groups, int distance) {
  MT_CHECK(out.shape() == local.shape() && out.dtype() == local.dtype(),
           "ring_shift: the output {} {} must be the input's {} {}", out.shape().to_string(), dtype_name(out.dtype()),
           local.shape().to_string(), dtype_name(local.dtype()));
  comm::ProcessGroup& pg = groups.merged_group({mesh_dim}, CommStream::main);
  const int n = pg.size(), r = pg.rank();
  MT_CHECK(distance >= 1 && distance < n, "ring_shift: a distance of {} on a ring of {} ranks", distance, n);
  // The group carries nothing else point to point; a pair's messages arrive in the order they were sent.
  constexpr int kRingTag = 1;
  comm::WorkPtr arriving = pg.recv(out, (r + n - distance) % n, kRingTag);
  comm::WorkPtr leaving = pg.send(local, (r + distance) % n, kRingTag);
  return {std::move(arriving), [leaving] { leaving->wait(); }};
}

InFlightStep start_step(const Tensor& local, Tensor& out, const Tensor& buffer, const Shape& global_shape,
                        const PlanStep& step, MeshGroups& groups, const RaggedRows* ragged) {
  const StepContext c(global_shape, step, groups.mesh(), groups.coordinate(), dtype_size(local.dtype()));
  MT_CHECK(local.shape() == c.before_shape && out.shape() == c.after_shape && out.dtype() == local.dtype(),
           "redistribution step {} -> {}: expects {} in and {} out on this rank, got {} and {}",
           step.before.to_string(), step.after.to_string(), c.before_shape.to_string(), c.after_shape.to_string(),
           local.describe(), out.describe());
  if (c.group_size == 1) {  // a one-rank group holds the whole tensor under any placement
    if (out.raw() != local.raw()) copy_bytes(out.raw(), local.raw(), out.nbytes());
    return {};
  }
  if (!step.collective) {
    local_step(local, out, c);
    return {};
  }
  comm::ProcessGroup& group = groups.merged_group(step.mesh_dims, comm_stream(*step.collective));
  switch (*step.collective) {
    case comm::OpType::all_gather:
      return start_all_gather(local, out, buffer, c, group);
    case comm::OpType::reduce_scatter:
      return start_reduce_scatter(local, out, buffer, c, group);
    case comm::OpType::all_to_all:
      return ragged ? start_ragged_all_to_all(local, out, buffer, c, group, *ragged)
                    : start_all_to_all(local, out, buffer, c, group);
    case comm::OpType::all_reduce:
      return start_all_reduce(local, out, c, group);
    default:
      throw Error(fmt::format("redistribute: a plan step cannot be a {}", comm::op_type_name(*step.collective)));
  }
}

InFlightStep start_coalesced_step(const Tensor& local, Tensor& out, const PlanStep& step,
                                  const std::vector<int64_t>& member_blocks, MeshGroups& groups) {
  const bool gather = step.collective == comm::OpType::all_gather;
  MT_CHECK(gather || step.collective == comm::OpType::reduce_scatter,
           "a coalesced collective is an all_gather or a reduce_scatter, not step {} -> {}", step.before.to_string(),
           step.after.to_string());
  comm::ProcessGroup& group = groups.merged_group(step.mesh_dims, comm_stream(*step.collective));
  Tensor in = flat(local), target = flat(out);
  if (gather) return {group.all_gather_coalesced(in, target, member_blocks), {}};
  return {group.reduce_scatter_coalesced(in, target, member_blocks, step.from.reduce), {}};
}

Tensor execute_step(const Tensor& local, const Shape& global_shape, const PlanStep& step, MeshGroups& groups) {
  const StepContext c(global_shape, step, groups.mesh(), groups.coordinate(), dtype_size(local.dtype()));
  if (c.group_size == 1) return local;
  Tensor out = Tensor::empty(c.after_shape, local.dtype());
  const Tensor buffer = Tensor::empty(
      {step_buffers(global_shape, step, groups.mesh(), groups.coordinate()).buffer_elements}, local.dtype());
  start_step(local, out, buffer, global_shape, step, groups).complete();
  return out;
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
