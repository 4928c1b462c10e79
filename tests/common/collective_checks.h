// Collective checks shared by the local-backend unit tests and the mpirun
// tests. Each rank builds every rank's input from a formula, so it can
// compute the serial reference for the whole group by itself.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "comm/process_group.h"
#include "comm/reduce.h"
#include "core/tensor.h"

namespace mtest {

using namespace meshtrain;
using comm::ProcessGroup;
using comm::ReduceOp;

// Element i of rank r's input, already rounded to dtype (values with
// fractional parts for floats, so that rounding is exercised).
inline double input_value(int rank, int64_t i, DType dtype, int salt = 0) {
  const int64_t h = (rank * 7919 + i * 104729 + salt * 1299709) % 2003;
  if (!is_floating(dtype)) return static_cast<double>(h % 101 - 50);
  double v = (static_cast<double>(h) - 1001.0) / 257.0;  // in (-3.9, 3.9)
  uint64_t slot = 0;
  store_from_double(&slot, dtype, 0, v);
  return load_as_double(&slot, dtype, 0);
}

inline Tensor make_input(int rank, int64_t n, DType dtype, int salt = 0) {
  Tensor t = Tensor::empty({n}, dtype);
  for (int64_t i = 0; i < n; ++i) t.set(i, input_value(rank, i, dtype, salt));
  return t;
}

// Serial reference: f32 accumulation in rank order for floats (i64 for
// integers), one rounding to the dtype at the end.
inline double reference_reduce(int group_size, int64_t i, DType dtype, ReduceOp op, int salt = 0) {
  if (!is_floating(dtype)) {
    int64_t acc = static_cast<int64_t>(input_value(0, i, dtype, salt));
    for (int k = 1; k < group_size; ++k) {
      const auto x = static_cast<int64_t>(input_value(k, i, dtype, salt));
      acc = op == ReduceOp::max ? std::max(acc, x) : op == ReduceOp::min ? std::min(acc, x) : acc + x;
    }
    return static_cast<double>(acc);
  }
  if (dtype == DType::f64) {
    double acc = input_value(0, i, dtype, salt);
    for (int k = 1; k < group_size; ++k) {
      const double x = input_value(k, i, dtype, salt);
      acc = op == ReduceOp::max ? std::max(acc, x) : op == ReduceOp::min ? std::min(acc, x) : acc + x;
    }
    return op == ReduceOp::avg ? acc / group_size : acc;
  }
  float acc = static_cast<float>(input_value(0, i, dtype, salt));
  for (int k = 1; k < group_size; ++k) {
    const auto x = static_cast<float>(input_value(k, i, dtype, salt));
    acc = op == ReduceOp::max ? std::max(acc, x) : op == ReduceOp::min ? std::min(acc, x) : acc + x;
  }
  if (op == ReduceOp::avg) acc /= static_cast<float>(group_size);
  uint64_t slot = 0;
  store_from_double(&slot, dtype, 0, acc);
  return load_as_double(&slot, dtype, 0);
}

// f32/f64 sums may be reduced in any order by MPI; every other case is exact.
inline void expect_reduced(double got, double want, DType dtype, ReduceOp op, const std::string& where) {
  if ((dtype == DType::f32 || dtype == DType::f64) && (op == ReduceOp::sum || op == ReduceOp::avg))
    EXPECT_NEAR(got, want, (dtype == DType::f32 ? 1e-5 : 1e-12) * (1.0 + std::fabs(want))) << where;
  else
    EXPECT_EQ(got, want) << where;
}

inline std::vector<ReduceOp> reduce_ops_for(DType dtype) {
  if (is_floating(dtype)) return {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};
  return {ReduceOp::sum, ReduceOp::max, ReduceOp::min};
}

// Uneven per-rank counts with an empty block when the group has 3+ ranks.
inline std::vector<int64_t> uneven_counts(int n) {
  std::vector<int64_t> c(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) c[r] = (r * 5 + 3) % 7;  // 3, 1, 6, 4, ...
  if (n >= 3) c[1] = 0;
  return c;
}

inline void check_all_reduce(ProcessGroup& pg, DType dtype, ReduceOp op, int64_t numel) {
  Tensor t = make_input(pg.rank(), numel, dtype, 1);
  pg.all_reduce(t, op)->wait();
  for (int64_t i = 0; i < numel; ++i)
    expect_reduced(t.get(i), reference_reduce(pg.size(), i, dtype, op, 1), dtype, op,
                   fmt::format("all_reduce {} {} n={} i={} rank {}", dtype_name(dtype), comm::reduce_op_name(op), numel,
                               i, pg.rank()));
}

// `blocks`: these per-rank counts, passed (uneven) or not.
inline void check_reduce_scatter(ProcessGroup& pg, DType dtype, ReduceOp op, bool uneven,
                                 std::vector<int64_t> blocks = {}) {
  const int n = pg.size();
  const std::vector<int64_t> counts = !blocks.empty() ? blocks : uneven ? uneven_counts(n) : std::vector<int64_t>(n, 5);
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const int64_t offset = comm::displacements(counts)[pg.rank()];
  Tensor in = make_input(pg.rank(), total, dtype, 2);
  Tensor out = Tensor::zeros({counts[pg.rank()]}, dtype);
  pg.reduce_scatter(in, out, op, uneven ? counts : std::vector<int64_t>{})->wait();
  for (int64_t i = 0; i < counts[pg.rank()]; ++i)
    expect_reduced(out.get(i), reference_reduce(n, offset + i, dtype, op, 2), dtype, op,
                   fmt::format("reduce_scatter {} {} uneven={} i={} rank {}", dtype_name(dtype),
                               comm::reduce_op_name(op), uneven, i, pg.rank()));
}

inline void check_all_gather(ProcessGroup& pg, DType dtype, bool uneven) {
  const int n = pg.size();
  const std::vector<int64_t> counts = uneven ? uneven_counts(n) : std::vector<int64_t>(n, 6);
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  Tensor in = make_input(pg.rank(), counts[pg.rank()], dtype, 3);
  Tensor out = Tensor::zeros({total}, dtype);
  pg.all_gather(in, out, uneven ? counts : std::vector<int64_t>{})->wait();
  const auto disp = comm::displacements(counts);
  for (int k = 0; k < n; ++k)
    for (int64_t i = 0; i < counts[k]; ++i)
      ASSERT_EQ(out.get(disp[k] + i), input_value(k, i, dtype, 3))
          << "all_gather " << dtype_name(dtype) << " from rank " << k << " i=" << i;
}

// Coalesced: members of 3, 0 and 5 elements per rank, each member whole on
// the gathered side (its blocks in rank order), one after another.
inline const std::vector<int64_t> kCoalescedMembers{3, 0, 5};

inline void check_all_gather_coalesced(ProcessGroup& pg, DType dtype) {
  const int n = pg.size();
  const std::vector<int64_t>& members = kCoalescedMembers;
  const int64_t per_rank = std::accumulate(members.begin(), members.end(), int64_t{0});
  Tensor in = make_input(pg.rank(), per_rank, dtype, 7);
  Tensor out = Tensor::zeros({n * per_rank}, dtype);
  pg.all_gather_coalesced(in, out, members)->wait();
  const auto from = comm::displacements(members);
  int64_t at = 0;
  for (size_t m = 0; m < members.size(); ++m)
    for (int k = 0; k < n; ++k)
      for (int64_t i = 0; i < members[m]; ++i, ++at)
        ASSERT_EQ(out.get(at), input_value(k, from[m] + i, dtype, 7))
            << "all_gather_coalesced " << dtype_name(dtype) << " member " << m << " from rank " << k << " i=" << i;
}

inline void check_reduce_scatter_coalesced(ProcessGroup& pg, DType dtype, ReduceOp op,
                                           const std::vector<int64_t>& members = kCoalescedMembers) {
  const int n = pg.size();
  const int64_t per_rank = std::accumulate(members.begin(), members.end(), int64_t{0});
  Tensor in = make_input(pg.rank(), n * per_rank, dtype, 8);
  Tensor out = Tensor::zeros({per_rank}, dtype);
  pg.reduce_scatter_coalesced(in, out, members, op)->wait();
  int64_t member_start = 0, at = 0;
  for (size_t m = 0; m < members.size(); ++m) {
    for (int64_t i = 0; i < members[m]; ++i, ++at)
      expect_reduced(out.get(at), reference_reduce(n, member_start + pg.rank() * members[m] + i, dtype, op, 8), dtype,
                     op,
                     fmt::format("reduce_scatter_coalesced {} {} member {} i={} rank {}", dtype_name(dtype),
                                 comm::reduce_op_name(op), m, i, pg.rank()));
    member_start += n * members[m];
  }
}

// Rank i sends (i + 2j) % 4 elements to rank j (0 for some pairs).
inline int64_t a2a_count(int from, int to) { return (from + 2 * to) % 4; }

inline void check_all_to_all(ProcessGroup& pg, DType dtype, bool uneven) {
  const int n = pg.size(), me = pg.rank();
  std::vector<int64_t> send(n), recv(n);
  for (int j = 0; j < n; ++j) {
    send[j] = uneven ? a2a_count(me, j) : 3;
    recv[j] = uneven ? a2a_count(j, me) : 3;
  }
  const int64_t send_total = std::accumulate(send.begin(), send.end(), int64_t{0});
  const int64_t recv_total = std::accumulate(recv.begin(), recv.end(), int64_t{0});
  Tensor in = make_input(me, send_total, dtype, 4);
  Tensor out = Tensor::zeros({recv_total}, dtype);
  if (uneven)
    pg.all_to_all(in, out, send, recv)->wait();
  else
    pg.all_to_all(in, out)->wait();
  const auto rdisp = comm::displacements(recv);
  for (int k = 0; k < n; ++k) {
    // Rank k's block for me starts after its blocks for ranks < me.
    int64_t k_offset = 0;
    for (int j = 0; j < me; ++j) k_offset += uneven ? a2a_count(k, j) : 3;
    for (int64_t i = 0; i < recv[k]; ++i)
      ASSERT_EQ(out.get(rdisp[k] + i), input_value(k, k_offset + i, dtype, 4))
          << "all_to_all " << dtype_name(dtype) << " from rank " << k << " i=" << i;
  }
}

inline void check_broadcast(ProcessGroup& pg, DType dtype, int root) {
  Tensor t = make_input(pg.rank(), 9, dtype, 5);
  pg.broadcast(t, root)->wait();
  for (int64_t i = 0; i < 9; ++i) ASSERT_EQ(t.get(i), input_value(root, i, dtype, 5));
}

inline void check_send_recv_ring(ProcessGroup& pg, DType dtype) {
  const int n = pg.size(), me = pg.rank();
  if (n < 2) return;
  Tensor out = make_input(me, 11, dtype, 6);
  Tensor in = Tensor::zeros({11}, dtype);
  auto r = pg.recv(in, (me + n - 1) % n, 3);
  auto s = pg.send(out, (me + 1) % n, 3);
  s->wait();
  r->wait();
  for (int64_t i = 0; i < 11; ++i) ASSERT_EQ(in.get(i), input_value((me + n - 1) % n, i, dtype, 6));
}

// Every collective, every dtype and reduce op, equal and uneven splits.
inline void check_every_collective(ProcessGroup& pg) {
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : reduce_ops_for(dtype)) {
      check_all_reduce(pg, dtype, op, 1);
      check_all_reduce(pg, dtype, op, 37);  // not divisible by 2, 3 or 4
      check_reduce_scatter(pg, dtype, op, false);
      check_reduce_scatter(pg, dtype, op, true);
      check_reduce_scatter_coalesced(pg, dtype, op);
    }
    check_all_gather(pg, dtype, false);
    check_all_gather(pg, dtype, true);
    check_all_gather_coalesced(pg, dtype);
    check_all_to_all(pg, dtype, false);
    check_all_to_all(pg, dtype, true);
    for (int root = 0; root < pg.size(); ++root) check_broadcast(pg, dtype, root);
    check_send_recv_ring(pg, dtype);
  }
  pg.barrier()->wait();
}

// Sub-groups: even and odd ranks, then an explicit member list.
inline void check_subgroups(ProcessGroup& pg) {
  const int n = pg.size(), me = pg.rank();
  auto parity = pg.split(me % 2, me, "parity");
  ASSERT_NE(parity, nullptr);
  EXPECT_EQ(parity->size(), (n - me % 2 + 1) / 2);
  EXPECT_EQ(parity->rank(), me / 2);
  EXPECT_EQ(parity->world_ranks()[parity->rank()], pg.world_ranks()[me]);
  Tensor t = Tensor::empty({1}, DType::i64);
  t.data<int64_t>()[0] = me;
  parity->all_reduce(t)->wait();
  int64_t want = 0;
  for (int r = me % 2; r < n; r += 2) want += r;
  EXPECT_EQ(t.data<int64_t>()[0], want);
  check_all_reduce(*parity, DType::bf16, ReduceOp::sum, 13);
  check_all_gather(*parity, DType::f32, true);

  // Reversed member list: new rank order follows the list.
  std::vector<int> members;
  for (int r = n - 1; r >= 0; r -= 2) members.push_back(r);
  auto sub = pg.new_subgroup(members, "reversed");
  const auto pos = std::find(members.begin(), members.end(), me);
  if (pos == members.end()) {
    EXPECT_EQ(sub, nullptr);
  } else {
    ASSERT_NE(sub, nullptr);
    EXPECT_EQ(sub->rank(), pos - members.begin());
    check_all_reduce(*sub, DType::f32, ReduceOp::max, 5);
  }
  pg.barrier()->wait();
}

}  // namespace mtest
