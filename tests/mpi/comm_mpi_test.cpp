// The comm layer on the `mpi` backend, one process per rank under mpirun.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <numeric>
#include <string>
#include <string_view>
#include <thread>

#include "collective_checks.h"
#include "comm/mpi_backend.h"
#include "mpi_world.h"
#include "test_util.h"

using namespace meshtrain;
using namespace meshtrain::comm;
using mtest::contains;
using mtest::message_of;
using mtest::mpi_world;

TEST(MpiCollectives, EveryCollectiveDtypeAndReduceOp) {
  ASSERT_EQ(mpi_world().backend_name(), "mpi");
  ASSERT_TRUE(mpi_world().options().verify);
  mtest::check_every_collective(mpi_world());
}

TEST(MpiCollectives, CoalescedOverTheirMembersPlaces) {
  for (DType dtype : {DType::f32, DType::bf16, DType::i64}) {
    mtest::check_all_gather_coalesced(mpi_world(), dtype);
    mtest::check_reduce_scatter_coalesced(mpi_world(), dtype, ReduceOp::sum);
  }
}

// Reductions move in segments of 1 MiB per rank: blocks of several segments,
// uneven ones, and coalesced members that cross segment boundaries.
TEST(MpiCollectives, LargeReduceScatterInSegments) {
  const int n = mpi_world().size();
  std::vector<int64_t> uneven(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) uneven[static_cast<size_t>(r)] = r == 1 ? 0 : 150001 + 7 * r;
  mtest::check_reduce_scatter(mpi_world(), DType::f32, ReduceOp::sum, true, uneven);
  mtest::check_reduce_scatter(mpi_world(), DType::f32, ReduceOp::max, true, std::vector<int64_t>(n, 262145));
  mtest::check_reduce_scatter(mpi_world(), DType::bf16, ReduceOp::sum, true, std::vector<int64_t>(n, 300001));
  mtest::check_reduce_scatter_coalesced(mpi_world(), DType::f32, ReduceOp::sum, {70000, 3, 0, 90001, 65536});
  mtest::check_all_reduce(mpi_world(), DType::bf16, ReduceOp::sum, 1500007);
}

TEST(MpiCollectives, SubGroups) { mtest::check_subgroups(mpi_world()); }

TEST(MpiCollectives, LargeBf16AllReduceIsExactAgainstSerialReference) {
  // Large enough for several chunks per rank, odd so chunks are uneven.
  mtest::check_all_reduce(mpi_world(), DType::bf16, ReduceOp::sum, 100003);
  mtest::check_all_reduce(mpi_world(), DType::f8e4m3, ReduceOp::avg, 4099);
}

TEST(MpiCollectives, ManyCollectivesInFlightCompleteInOrder) {
  ProcessGroup& pg = mpi_world();
  std::vector<Tensor> tensors;
  std::vector<WorkPtr> works;
  for (int k = 0; k < 16; ++k) {
    tensors.push_back(mtest::make_input(pg.rank(), 1000 + k, k % 2 ? DType::bf16 : DType::f32, 1));
    works.push_back(pg.all_reduce(tensors.back()));
  }
  for (auto& w : works) w->wait();
  for (int k = 0; k < 16; ++k) {
    const DType dt = k % 2 ? DType::bf16 : DType::f32;
    for (int64_t i = 0; i < tensors[k].numel(); i += 97)
      mtest::expect_reduced(tensors[k].get(i), mtest::reference_reduce(pg.size(), i, dt, ReduceOp::sum, 1), dt,
                            ReduceOp::sum, fmt::format("tensor {} i {}", k, i));
  }
}

// A piece longer than what the first message of a collective carries
// (mpi::FirstStage::kFirstMessageBytes) follows in a second message: blocks on both
// sides of that length, between every pair of ranks.
TEST(MpiCollectives, AllToAllAcrossTheInlineLimit) {
  ProcessGroup& pg = mpi_world();
  const int n = pg.size(), me = pg.rank();
  auto count = [](int from, int to) -> int64_t { return (from + to) % 2 ? 3000 + 17 * from : 5 + to; };
  auto value = [](int from, int to, int64_t k) { return static_cast<float>(10000 * from + 1000 * to + k % 997); };
  std::vector<int64_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) send[r] = count(me, r), recv[r] = count(r, me);
  Tensor in = Tensor::empty({std::accumulate(send.begin(), send.end(), int64_t{0})}, DType::f32);
  Tensor out = Tensor::empty({std::accumulate(recv.begin(), recv.end(), int64_t{0})}, DType::f32);
  for (int r = 0, at = 0; r < n; ++r)
    for (int64_t k = 0; k < send[r]; ++k) in.data<float>()[at++] = value(me, r, k);
  pg.all_to_all(in, out, send, recv)->wait();
  for (int r = 0, at = 0; r < n; ++r)
    for (int64_t k = 0; k < recv[r]; ++k)
      ASSERT_EQ(out.data<float>()[at++], value(r, me, k)) << "from rank " << r << " element " << k;
}

// Ranks that disagree across the inline limit: second messages that a peer
// does not expect, and receives of second messages that never come. Every
// rank fails with the same error, and the group goes on.
TEST(MpiErrors, MismatchedSizesAcrossTheInlineLimit) {
  ProcessGroup& pg = mpi_world();
  const int n = pg.size();
  Tensor t = Tensor::zeros({pg.rank() == 1 ? 40000 : 8}, DType::f32);
  const auto msg = message_of([&] { pg.all_reduce(t)->wait(); });
  EXPECT_TRUE(contains(msg, "ranks disagree on the element count of all_reduce")) << msg;
  EXPECT_TRUE(contains(msg, "rank 1: 40000")) << msg;
  // An op whose first stage carries nothing against one with long pieces.
  Tensor small = Tensor::zeros({4}, DType::f32), in = Tensor::zeros({20000}, DType::f32),
         out = Tensor::zeros({20000 * n}, DType::f32);
  const auto msg2 = message_of([&] {
    if (pg.rank() == 0)
      pg.broadcast(small, 0)->wait();
    else
      pg.all_gather(in, out)->wait();
  });
  EXPECT_TRUE(contains(msg2, "ranks disagree on the operation")) << msg2;
  mtest::check_all_reduce(pg, DType::f32, ReduceOp::sum, 70001);
  mtest::check_all_gather(pg, DType::bf16, true);
}

TEST(MpiErrors, MismatchedSizesFailOnEveryRankAndGroupStaysUsable) {
  ProcessGroup& pg = mpi_world();
  Tensor t = Tensor::zeros({pg.rank() == 1 ? 6 : 8}, DType::f32);
  const auto msg = message_of([&] { pg.all_reduce(t)->wait(); });
  EXPECT_TRUE(contains(msg, "ranks disagree on the element count of all_reduce")) << msg;
  EXPECT_TRUE(contains(msg, "rank 1: 6")) << msg;
  mtest::check_all_reduce(pg, DType::f32, ReduceOp::sum, 4);
}

TEST(MpiErrors, MismatchedDtypeAndOperation) {
  ProcessGroup& pg = mpi_world();
  Tensor t = Tensor::zeros({4}, pg.rank() == 0 ? DType::bf16 : DType::f32);
  const auto msg = message_of([&] { pg.all_reduce(t)->wait(); });
  EXPECT_TRUE(contains(msg, "ranks disagree on the dtype")) << msg;
  // Rank 1 skips an all_reduce and goes straight to an all_gather.
  Tensor small = Tensor::zeros({2}, DType::f32), big = Tensor::zeros({2 * pg.size()}, DType::f32);
  const auto msg2 = message_of([&] {
    if (pg.rank() == 1)
      pg.all_gather(small, big)->wait();
    else
      pg.all_reduce(small)->wait();
  });
  EXPECT_TRUE(contains(msg2, "ranks disagree on the operation")) << msg2;
  EXPECT_TRUE(contains(msg2, "rank 1: all_gather")) << msg2;
  mtest::check_all_gather(pg, DType::i64, true);
}

TEST(MpiErrors, MismatchedAllToAllCounts) {
  ProcessGroup& pg = mpi_world();
  const int n = pg.size();
  std::vector<int64_t> send(n, 2), recv(n, 2);
  if (pg.rank() == 0) send = std::vector<int64_t>(n, 2), send[1] = 3, send[0] = 1;
  Tensor in = Tensor::zeros({2 * n}, DType::f32), out = Tensor::zeros({2 * n}, DType::f32);
  const auto msg = message_of([&] { pg.all_to_all(in, out, send, recv)->wait(); });
  EXPECT_TRUE(contains(msg, "rank 0 sends 1 elements to rank 0, which expects 2")) << msg;
}

TEST(MpiErrors, RecvOfTheWrongSizeIsAnError) {
  ProcessGroup& pg = mpi_world();
  if (pg.rank() > 1) return;
  Tensor five = Tensor::zeros({5}, DType::f32), six = Tensor::zeros({6}, DType::f32);
  if (pg.rank() == 0) {
    pg.send(five, 1, 7)->wait();
  } else {
    const auto msg = message_of([&] { pg.recv(six, 0, 7)->wait(); });
    EXPECT_TRUE(contains(msg, "received 20 bytes from rank 0 but expected 24")) << msg;
  }
}

TEST(MpiErrors, RankOutsideTheGroup) {
  ProcessGroup& pg = mpi_world();
  Tensor t = Tensor::zeros({3}, DType::f32);
  EXPECT_TRUE(contains(message_of([&] { pg.broadcast(t, pg.size()); }), "is outside group 'world'"));
  EXPECT_TRUE(contains(message_of([&] { pg.send(t, -1); }), "is not another rank"));
  const auto msg = message_of([&] { pg.new_subgroup({0, pg.size() + 3}); });
  EXPECT_TRUE(contains(msg, "passed an invalid member list")) << msg;
  pg.barrier()->wait();
}

// The last rank holds nothing (an empty shard): its counts are all zero, so
// equal, yet it must make the same variable-block call as its peers (it once
// took the equal-block call and the job hung).
TEST(MpiCollectives, AllToAllWithAnEmptyRank) {
  ProcessGroup& pg = mpi_world();
  const int n = pg.size(), me = pg.rank(), last = n - 1;
  std::vector<int64_t> send(static_cast<size_t>(n), 0), recv(static_cast<size_t>(n), 0);
  for (int r = 0; r < last; ++r)
    if (me != last) send[static_cast<size_t>(r)] = recv[static_cast<size_t>(r)] = 1;
  Tensor in = Tensor::empty({me == last ? 0 : last}, DType::f32),
         out = Tensor::empty({me == last ? 0 : last}, DType::f32);
  for (int r = 0; r < (me == last ? 0 : last); ++r)
    in.data<float>()[static_cast<size_t>(r)] = static_cast<float>(100 * me + r);
  pg.all_to_all(in, out, send, recv)->wait();
  for (int r = 0; r < (me == last ? 0 : last); ++r)
    EXPECT_EQ(out.data<float>()[static_cast<size_t>(r)], 100.0f * r + me);
  pg.barrier()->wait();  // and the group goes on
}

// One-host groups pass their first messages, and pieces that fit a slot,
// through shared memory; the _tcp runs, which stand for ranks on different
// hosts (OMPI_MCA_btl=tcp,self), send them all as MPI messages.
TEST(MpiCollectives, SharedMemoryWhereTheRanksShareAHost) {
  ProcessGroup& pg = mpi_world();
  const char* btl = std::getenv("OMPI_MCA_btl");
  const bool tcp_only = btl != nullptr && std::string_view(btl) == "tcp,self";
  EXPECT_EQ(pg.shares_memory(), !tcp_only);
  auto half = pg.split(pg.rank() % 2);
  ASSERT_NE(half, nullptr);
  EXPECT_EQ(half->shares_memory(), !tcp_only && half->size() >= 2);
  mtest::check_all_reduce(*half, DType::f32, ReduceOp::sum, 1000);
}

TEST(SharedMemory, AllowedUnlessTheEnvironmentSaysOtherwise) {
  const auto with = [](const char* shm, const char* btl) {
    const std::string old_shm = std::getenv("MESHTRAIN_SHM") ? std::getenv("MESHTRAIN_SHM") : "";
    const std::string old_btl = std::getenv("OMPI_MCA_btl") ? std::getenv("OMPI_MCA_btl") : "";
    auto set = [](const char* name, const char* v) { v ? setenv(name, v, 1) : unsetenv(name); };
    set("MESHTRAIN_SHM", shm);
    set("OMPI_MCA_btl", btl);
    const bool allowed = shm_allowed();
    set("MESHTRAIN_SHM", old_shm.empty() ? nullptr : old_shm.c_str());
    set("OMPI_MCA_btl", old_btl.empty() ? nullptr : old_btl.c_str());
    return allowed;
  };
  EXPECT_TRUE(with(nullptr, nullptr));
  EXPECT_TRUE(with("1", nullptr));
  EXPECT_FALSE(with("0", nullptr));
  EXPECT_FALSE(with(nullptr, "tcp,self"));
  EXPECT_TRUE(with(nullptr, "self,vader,tcp"));
  EXPECT_TRUE(with(nullptr, "sm,self"));
  EXPECT_TRUE(with(nullptr, "^openib"));
  EXPECT_FALSE(with(nullptr, "^vader,openib"));
  EXPECT_FALSE(with("0", "self,vader"));
}

// A rank far behind its peers: they issue more collectives than the shared
// memory ring holds (8 per pair of ranks) before it issues any, so they
// defer the later first messages until it has read the earlier ones. Small
// pieces (inside the first message), large ones (in a second message) and
// all_gathers, all in flight at once; each completes with its values.
TEST(MpiCollectives, ARankFarBehindWithManyCollectivesInFlight) {
  ProcessGroup& pg = mpi_world();
  const int n = pg.size(), me = pg.rank();
  constexpr int kOps = 30;
  auto per_peer = [](int op) -> int64_t { return op % 3 == 0 ? 20000 : 3 + op; };  // 20000 floats: past a slot
  auto value = [](int op, int from, int to, int64_t k) {
    return static_cast<float>(100000 * op + 1000 * from + 100 * to + k % 97);
  };
  if (me == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::vector<Tensor> ins, outs;
  std::vector<WorkPtr> works;
  for (int op = 0; op < kOps; ++op) {
    const int64_t m = per_peer(op);
    const bool gather = op % 4 == 1;
    ins.push_back(Tensor::empty({gather ? m : m * n}, DType::f32));
    outs.push_back(Tensor::empty({m * n}, DType::f32));
    for (int64_t i = 0; i < ins.back().numel(); ++i)
      ins.back().data<float>()[i] = value(op, me, gather ? 0 : static_cast<int>(i / m), i % m);
    works.push_back(gather ? pg.all_gather(ins.back(), outs.back()) : pg.all_to_all(ins.back(), outs.back()));
  }
  for (auto& w : works) w->wait();
  for (int op = 0; op < kOps; ++op) {
    const int64_t m = per_peer(op);
    const bool gather = op % 4 == 1;
    for (int64_t i = 0; i < m * n; ++i) {
      const int from = static_cast<int>(i / m);
      ASSERT_EQ(outs[op].data<float>()[i], value(op, from, gather ? 0 : me, i % m)) << "op " << op << " i " << i;
    }
  }
}
