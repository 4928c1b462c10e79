// The comm layer on the in-process `local` backend (ranks as threads).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "collective_checks.h"
#include "comm/fr_analyze.h"
#include "comm/local_backend.h"
#include "comm/reduce.h"
#include "test_util.h"

using namespace meshtrain;
using namespace meshtrain::comm;
using namespace std::chrono_literals;
using mtest::contains;
using mtest::message_of;

namespace {

std::string fresh_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / fmt::format("meshtrain_{}_{}", name, getpid());
  std::filesystem::remove_all(dir);
  return dir.string();
}

}  // namespace

TEST(Reduce, DisplacementsArePrefixSums) { EXPECT_EQ(displacements({3, 0, 2}), (std::vector<int64_t>{0, 3, 3})); }

class LocalCollectives : public ::testing::TestWithParam<int> {};

TEST_P(LocalCollectives, EveryCollectiveDtypeAndReduceOp) {
  LocalWorld world(GetParam());
  world.run([](ProcessGroup& pg) { mtest::check_every_collective(pg); });
}

TEST_P(LocalCollectives, SubGroups) {
  LocalWorld world(GetParam());
  world.run([](ProcessGroup& pg) { mtest::check_subgroups(pg); });
}

INSTANTIATE_TEST_SUITE_P(Ranks, LocalCollectives, ::testing::Values(1, 2, 3, 4));

TEST(LocalErrors, MismatchedSizesFailOnEveryRankAndGroupStaysUsable) {
  LocalWorld world(3);
  world.run([](ProcessGroup& pg) {
    Tensor t = Tensor::zeros({pg.rank() == 1 ? 6 : 8}, DType::f32);
    const auto msg = message_of([&] { pg.all_reduce(t)->wait(); });
    EXPECT_TRUE(contains(msg, "ranks disagree on the element count of all_reduce (seq 1) on group 'world'")) << msg;
    EXPECT_TRUE(contains(msg, "rank 1: 6")) << msg;
    mtest::check_all_reduce(pg, DType::f32, ReduceOp::sum, 4);  // still in step
  });
}

TEST(LocalErrors, MismatchedDtypeAcrossRanks) {
  LocalWorld world(2);
  world.run([](ProcessGroup& pg) {
    Tensor t = Tensor::zeros({4}, pg.rank() == 0 ? DType::f32 : DType::bf16);
    const auto msg = message_of([&] { pg.all_reduce(t)->wait(); });
    EXPECT_TRUE(contains(msg, "ranks disagree on the dtype")) << msg;
  });
}

TEST(LocalErrors, MismatchedAllToAllCounts) {
  LocalWorld world(2);
  world.run([](ProcessGroup& pg) {
    Tensor in = Tensor::zeros({4}, DType::f32), out = Tensor::zeros({4}, DType::f32);
    const std::vector<int64_t> send = pg.rank() == 0 ? std::vector<int64_t>{1, 3} : std::vector<int64_t>{2, 2};
    const auto msg = message_of([&] { pg.all_to_all(in, out, send, {2, 2})->wait(); });
    EXPECT_TRUE(contains(msg, "rank 0 sends 1 elements to rank 0, which expects 2 from it")) << msg;
  });
}

TEST(LocalErrors, MismatchedCoalescedMembersFailOnEveryRank) {
  LocalWorld world(2);
  world.run([](ProcessGroup& pg) {
    // The same bytes per rank, cut into different members: the blocks would land in the wrong places.
    Tensor in = Tensor::zeros({8}, DType::f32), out = Tensor::zeros({16}, DType::f32);
    const std::vector<int64_t> members = pg.rank() == 0 ? std::vector<int64_t>{3, 5} : std::vector<int64_t>{4, 4};
    const auto msg = message_of([&] { pg.all_gather_coalesced(in, out, members)->wait(); });
    EXPECT_TRUE(contains(msg, "ranks disagree on the per-rank counts or coalesced members of all_gather (seq 1)"))
        << msg;
    mtest::check_all_gather_coalesced(pg, DType::f32);  // still in step
  });
  LocalWorld one(1);
  ProcessGroup& pg = *one.group(0);
  Tensor in = Tensor::zeros({8}, DType::f32), out = Tensor::zeros({8}, DType::f32);
  EXPECT_TRUE(contains(message_of([&] {
                         pg.all_gather_coalesced(in, out, {3, 4});
                       }),
                       "members of 7 elements per rank in all (1 ranks) need 7 elements on this rank's side"));
  EXPECT_TRUE(contains(message_of([&] { pg.reduce_scatter_coalesced(in, out, {}); }), "needs at least one member"));
  EXPECT_TRUE(contains(message_of([&] {
                         pg.reduce_scatter_coalesced(in, out, {9, -1});
                       }),
                       "member 1 has a block of -1 elements; a block has 0 or more"));
}

TEST(LocalErrors, BadArgumentsAreRejectedBeforeCommunicating) {
  LocalWorld world(1);
  ProcessGroup& pg = *world.group(0);
  Tensor f = Tensor::zeros({4}, DType::f32), b = Tensor::zeros({4}, DType::bf16);
  Tensor ints = Tensor::zeros({4}, DType::i32);
  EXPECT_TRUE(contains(message_of([&] { pg.all_gather(f, b); }), "output dtype bf16 differs from input dtype f32"));
  EXPECT_TRUE(contains(message_of([&] { pg.broadcast(f, 3); }), "root 3 is outside group 'world'"));
  EXPECT_TRUE(contains(message_of([&] { pg.send(f, 5); }), "destination 5 is not another rank"));
  EXPECT_TRUE(
      contains(message_of([&] { pg.all_reduce(ints, ReduceOp::avg); }), "avg is not defined for integer dtype i32"));
  EXPECT_TRUE(contains(message_of([&] { pg.all_gather(f, b, {1, 2}); }), "differs"));
  Tensor out3 = Tensor::zeros({3}, DType::f32);
  EXPECT_TRUE(contains(message_of([&] { pg.reduce_scatter(f, out3); }), "expected group size 1 x output 3"));
  EXPECT_TRUE(contains(message_of([&] { pg.all_gather(f, out3, {2}); }), "counts[0] = 2 but this rank's input has 4"));
  Tensor undefined;
  EXPECT_TRUE(contains(message_of([&] { pg.all_reduce(undefined); }), "undefined"));
}

TEST(LocalErrors, SubgroupWithRankOutsideTheGroupFailsOnEveryRank) {
  LocalWorld world(3);
  world.run([](ProcessGroup& pg) {
    const auto msg = message_of([&] { pg.new_subgroup({0, 7}); });
    EXPECT_TRUE(contains(msg, "passed an invalid member list")) << msg;
    if (pg.rank() == 0) {
      EXPECT_TRUE(contains(msg, "rank 7 is outside group 'world'")) << msg;
    }
    const auto msg2 = message_of([&] {
      pg.new_subgroup(pg.rank() == 2 ? std::vector<int>{0, 2} : std::vector<int>{0, 1});
    });
    EXPECT_TRUE(contains(msg2, "passed different member lists")) << msg2;
  });
}

TEST(LocalErrors, UnknownBackend) {
  const auto msg = message_of([] { create_world("gloo"); });
  EXPECT_TRUE(contains(msg, "unknown communication backend 'gloo': available backends are mpi, local")) << msg;
  EXPECT_TRUE(contains(message_of([] { create_world("local"); }), "LocalWorld"));
}

TEST(LocalTimeout, SkippedCollectiveTimesOutAndFrAnalyzeNamesTheRank) {
  const std::string dir = fresh_dir("local_timeout");
  setenv("MESHTRAIN_FR_DIR", dir.c_str(), 1);
  GroupOptions options;
  options.timeout = 400ms;
  LocalWorld world(3, options);
  std::atomic<int> timeouts{0};
  const auto t0 = std::chrono::steady_clock::now();
  world.run([&](ProcessGroup& pg) {
    mtest::check_all_reduce(pg, DType::f32, ReduceOp::sum, 8);  // seq 1 completes
    if (pg.rank() == 2) {
      pg.dump_flight_recorder("test: rank 2 skipped seq 2", dir);
      return;  // skips seq 2
    }
    Tensor t = Tensor::zeros({8}, DType::f32);
    auto work = pg.all_reduce(t);
    try {
      work->wait();
      ADD_FAILURE() << "expected a timeout";
    } catch (const TimeoutError& e) {
      ++timeouts;
      EXPECT_TRUE(contains(e.what(), "all_reduce (seq 2) on group 'world' (3 ranks) timed out after 400 ms"))
          << e.what();
      EXPECT_TRUE(contains(e.what(), "fr-analyze")) << e.what();
    }
    EXPECT_TRUE(pg.aborted());
    EXPECT_THROW(pg.barrier(), CommError);  // the group refuses further work
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(timeouts.load(), 2);
  EXPECT_LT(seconds, 5.0);
  const FrReport report = analyze_flight_records(dir);
  ASSERT_FALSE(report.findings.empty()) << report.to_text();
  const FrFinding& first = report.findings.front();
  EXPECT_EQ(first.kind, FrFinding::Kind::missing_rank) << report.to_text();
  EXPECT_EQ(first.culprits, std::vector<int>{2});
  EXPECT_EQ(first.seq, 2u);
  EXPECT_TRUE(contains(report.to_text(), "rank 2 never joined")) << report.to_text();

  // Without rank 2's dump, the analysis still points at it.
  std::filesystem::remove(dir + "/fr_rank2.json");
  const FrReport partial = analyze_flight_records(dir);
  ASSERT_FALSE(partial.findings.empty());
  EXPECT_EQ(partial.findings.front().kind, FrFinding::Kind::no_dump) << partial.to_text();
  EXPECT_EQ(partial.findings.front().culprits, std::vector<int>{2});
  unsetenv("MESHTRAIN_FR_DIR");
  std::filesystem::remove_all(dir);
}

// A process stopped (SIGSTOP) and continued does not blame its peers for the
// time it was stopped: on SIGCONT, a pending operation's timeout starts again.
TEST(LocalTimeout, ATimeoutRunsFromWhenTheProcessWasContinued) {
  const std::string dir = fresh_dir("local_continued");
  setenv("MESHTRAIN_FR_DIR", dir.c_str(), 1);
  GroupOptions options;
  options.timeout = 400ms;
  LocalWorld world(2, options);
  double waited_ms = 0;
  world.run([&](ProcessGroup& pg) {
    if (pg.rank() == 1) return;  // never joins
    Tensor t = Tensor::zeros({8}, DType::f32);
    const auto issued = std::chrono::steady_clock::now();
    auto work = pg.all_reduce(t);
    std::thread continuer([] {
      std::this_thread::sleep_for(300ms);
      kill(getpid(), SIGCONT);  // as the kernel does when a stopped process is continued
    });
    EXPECT_THROW(work->wait(), TimeoutError);
    waited_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - issued).count();
    continuer.join();
  });
  EXPECT_GE(waited_ms, 700) << "the timeout did not start again at SIGCONT";
  EXPECT_LT(waited_ms, 3000);
  unsetenv("MESHTRAIN_FR_DIR");
  std::filesystem::remove_all(dir);
}

// A waiting thread that did not run for longer than kPauseGap (stopped, and
// resumed before the signal thread could record SIGCONT: the CI run where a
// continued rank declared its own timeout) counts the process as continued.
TEST(LocalTimeout, AWaiterThatDidNotRunDoesNotTimeOut) {
  WorkInfo info;
  info.group = "world";
  info.timeout = 500ms;
  Work work(info, nullptr, 0);
  bool timed_out = false;
  work.set_timeout_handler([&](Work& w) {
    timed_out = true;
    w.fail(std::make_exception_ptr(TimeoutError("timed out")));
  });
  int polls = 0;
  work.set_poller([&] {
    if (++polls == 1) std::this_thread::sleep_for(kPauseGap + 300ms);  // the thread is not running
    if (polls == 500) work.finish();
    return false;
  });
  EXPECT_NO_THROW(work.wait());
  EXPECT_FALSE(timed_out);
  EXPECT_GE(last_continued(), work.issued_at() + kPauseGap);

  Work stuck(info, nullptr, 0);  // and one that is waited on throughout still times out
  stuck.set_timeout_handler([](Work& w) { w.fail(std::make_exception_ptr(TimeoutError("timed out"))); });
  stuck.set_poller([] { return false; });
  EXPECT_THROW(stuck.wait(), TimeoutError);
}

// A rank that stalls inside a collective (stopped mid-transfer): every rank
// issued it, none finished; the dumps agree, and the analysis says so
// instead of "no mismatch".
TEST(FlightRecorder, ACollectiveNoRankFinishedIsReportedAsStalled) {
  const std::string dir = ::testing::TempDir() + "/fr_stalled";
  std::filesystem::remove_all(dir);
  for (int rank = 0; rank < 2; ++rank) {
    FlightRecorder fr(rank, 2);
    fr.add_group("world", {0, 1});
    for (uint64_t seq = 1; seq <= 3; ++seq) {
      FrEntry e;
      e.group = "world";
      e.seq = seq;
      e.op = OpType::all_gather;
      e.signature = "n=8";
      // seq 2 done on rank 0 only: not a stall; seq 3 unfinished everywhere.
      fr.update(fr.record(e), seq == 1 || (seq == 2 && rank == 0) ? FrState::completed : FrState::started);
    }
    fr.dump(dir, "test");
  }
  const FrReport report = analyze_flight_records(dir);
  ASSERT_FALSE(report.findings.empty()) << report.to_text();
  EXPECT_EQ(report.findings.front().kind, FrFinding::Kind::stalled) << report.to_text();
  EXPECT_EQ(report.findings.front().seq, 3u) << report.to_text();
  EXPECT_TRUE(contains(report.to_text(),
                       "seq 3 all_gather: every rank issued it and none finished it "
                       "(rank 0 started, rank 1 started)"))
      << report.to_text();
  EXPECT_FALSE(report.ok());
  std::filesystem::remove_all(dir);
}

// A rank killed mid-step (the CI run of mpi_kill_rank): MPI finished the
// survivor's newer collective (whose data the dead rank had sent) while an
// older one still waits (or failed in MPI). The dead rank left no dump;
// the survivor's oldest collective in flight, else its oldest failed one,
// names it, whatever finished after it.
TEST(FlightRecorder, ACollectiveInFlightBeforeAFinishedOneNamesTheRankWithoutADump) {
  const std::string dir = ::testing::TempDir() + "/fr_in_flight";
  std::filesystem::remove_all(dir);
  auto dump_survivor = [&](std::vector<FrState> states) {
    std::filesystem::remove_all(dir);
    FlightRecorder fr(1, 2);
    fr.add_group("dp", {0, 1});
    for (size_t i = 0; i < states.size(); ++i) {
      FrEntry e;
      e.group = "dp";
      e.seq = i + 1;
      e.op = i == 1 ? OpType::all_reduce : OpType::all_gather;
      e.signature = "n=8";
      fr.update(fr.record(e), states[i]);
    }
    fr.dump(dir, "test");
    return analyze_flight_records(dir);
  };
  const FrReport report = dump_survivor({FrState::completed, FrState::started, FrState::completed, FrState::completed});
  ASSERT_FALSE(report.findings.empty()) << report.to_text();
  EXPECT_EQ(report.findings.front().kind, FrFinding::Kind::no_dump) << report.to_text();
  EXPECT_EQ(report.findings.front().seq, 2u) << report.to_text();
  EXPECT_EQ(report.findings.front().culprits, std::vector<int>{0});
  EXPECT_TRUE(contains(report.to_text(),
                       "group 'dp' seq 2 all_reduce is started on rank 1; rank(s) 0 of this "
                       "group left no dump"))
      << report.to_text();

  const FrReport failed_then_fine =
      dump_survivor({FrState::completed, FrState::failed, FrState::completed, FrState::failed});
  ASSERT_FALSE(failed_then_fine.findings.empty()) << failed_then_fine.to_text();
  EXPECT_EQ(failed_then_fine.findings.front().seq, 2u) << failed_then_fine.to_text();
  EXPECT_EQ(failed_then_fine.findings.front().culprits, std::vector<int>{0});
  const FrReport in_flight_first = dump_survivor({FrState::failed, FrState::completed, FrState::started});
  ASSERT_FALSE(in_flight_first.findings.empty()) << in_flight_first.to_text();
  EXPECT_EQ(in_flight_first.findings.front().seq, 3u) << in_flight_first.to_text();
  EXPECT_TRUE(dump_survivor({FrState::completed, FrState::completed}).findings.empty());
  std::filesystem::remove_all(dir);
}

// Dumps taken at different moments (the CI run of mpi_hung_rank): rank 1
// stopped; rank 0 times out in 'dp' seq 1 and dumps; rank 1, continued,
// finishes it with what rank 0 had sent, issues 'world' seq 2 and dumps
// later. Rank 1 was late; rank 0 "never joined" 'world' seq 2 only because
// it had given up before.
TEST(FlightRecorder, ARankThatFinishedAfterAnotherGaveUpIsNamedLate) {
  const std::string dir = ::testing::TempDir() + "/fr_late";
  std::filesystem::remove_all(dir);
  auto entry = [](const std::string& group, uint64_t seq) {
    FrEntry e;
    e.group = group;
    e.seq = seq;
    e.op = OpType::all_reduce;
    e.signature = "n=2";
    return e;
  };
  auto pause = [] { std::this_thread::sleep_for(std::chrono::milliseconds(3)); };
  FlightRecorder rank0(0, 2), rank1(1, 2);
  for (FlightRecorder* fr : {&rank0, &rank1}) {
    fr->add_group("world", {0, 1});
    fr->add_group("dp", {0, 1});
    fr->update(fr->record(entry("world", 1)), FrState::completed);
  }
  rank0.update(rank0.record(entry("dp", 1)), FrState::started);
  pause();
  rank0.dump(dir, "timed out");
  pause();
  rank1.update(rank1.record(entry("dp", 1)), FrState::completed);
  rank1.update(rank1.record(entry("world", 2)), FrState::started);
  pause();
  rank1.dump(dir, "stop signal");
  const FrReport report = analyze_flight_records(dir);
  ASSERT_EQ(report.findings.size(), 2u) << report.to_text();
  EXPECT_EQ(report.findings.front().kind, FrFinding::Kind::late) << report.to_text();
  EXPECT_EQ(report.findings.front().group, "dp");
  EXPECT_EQ(report.findings.front().culprits, std::vector<int>{1});
  EXPECT_TRUE(contains(report.to_text(), "FIRST MISMATCH: group 'dp' seq 1 all_reduce: rank 0 waited"))
      << report.to_text();
  EXPECT_TRUE(contains(report.to_text(), "rank(s) 1 joined too late")) << report.to_text();
  EXPECT_EQ(report.findings.back().kind, FrFinding::Kind::missing_rank);
  EXPECT_TRUE(contains(report.findings.back().message, "rank 0 last issued seq 1")) << report.to_text();
  EXPECT_TRUE(contains(report.findings.back().message, "and dumped its record")) << report.to_text();
  std::filesystem::remove_all(dir);
}

TEST(FlightRecorder, RingKeepsTheLastEntries) {
  FlightRecorder fr(0, 1, 4);
  for (int i = 0; i < 10; ++i) {
    FrEntry e;
    e.group = "g";
    e.seq = static_cast<uint64_t>(i + 1);
    fr.update(fr.record(e), FrState::completed);
  }
  const auto entries = fr.entries();
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(entries.front().seq, 7u);
  EXPECT_EQ(entries.back().seq, 10u);
  EXPECT_EQ(entries.back().state, FrState::completed);
}

TEST(FrAnalyze, SubGroupsSharingANameAreKeptApart) {
  const std::string dir = fresh_dir("fr_subgroups");
  // Two groups named "row": {0, 1} and {2, 3}. Ranks 2 and 3 are one
  // collective behind ranks 0 and 1, which is fine: they are other groups.
  for (int r = 0; r < 4; ++r) {
    FlightRecorder fr(r, 4);
    const std::vector<int> members = r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    fr.add_group("row", members);
    for (uint64_t seq = 1; seq <= (r < 2 ? 3u : 2u); ++seq) {
      FrEntry e;
      e.group = "row";
      e.seq = seq;
      e.op = seq == 2 ? OpType::all_to_all : OpType::all_gather;
      e.signature = seq == 2 ? fmt::format("all_to_all f32 send=[{}] recv=[{}]", r, r) : "all_gather f32";
      fr.update(fr.record(e), FrState::completed);
    }
    fr.dump(dir, "test");
  }
  const FrReport report = analyze_flight_records(dir);
  EXPECT_TRUE(report.ok()) << report.to_text();
  std::filesystem::remove_all(dir);
}

TEST(FrAnalyze, NamesTheRankWithADifferentSize) {
  const std::string dir = fresh_dir("fr_sizes");
  for (int r = 0; r < 3; ++r) {
    FlightRecorder fr(r, 3);
    fr.add_group("world", {0, 1, 2});
    for (uint64_t seq = 1; seq <= 3; ++seq) {
      FrEntry e;
      e.group = "world";
      e.seq = seq;
      e.op = OpType::all_reduce;
      e.signature = (seq == 2 && r == 1) ? "all_reduce f32 sum numel=12" : "all_reduce f32 sum numel=16";
      fr.update(fr.record(e), seq == 3 ? FrState::started : FrState::completed);
    }
    fr.dump(dir, "test");
  }
  const FrReport report = analyze_flight_records(dir);
  ASSERT_EQ(report.findings.size(), 1u) << report.to_text();
  EXPECT_EQ(report.findings[0].kind, FrFinding::Kind::size_mismatch);
  EXPECT_EQ(report.findings[0].culprits, std::vector<int>{1});
  EXPECT_EQ(report.findings[0].seq, 2u);
  std::filesystem::remove_all(dir);
  EXPECT_THROW(analyze_flight_records(dir), InvalidArgument);  // gone: clear error
}

// The dump reader trusts nothing: seq numbers with a gap (a seq no rank
// holds) and far apart cost nothing and crash nothing, and a dump that
// claims an impossible world, a rank outside it or a group member outside
// it is an error naming the file.
TEST(FrAnalyze, MalformedDumpsAreErrorsNotCrashes) {
  const std::string dir = fresh_dir("fr_malformed");
  for (int r = 0; r < 2; ++r) {
    FlightRecorder fr(r, 2);
    fr.add_group("world", {0, 1});
    for (uint64_t seq : {uint64_t{1}, uint64_t{3}, uint64_t{1} << 62}) {  // 2 is nobody's; then a huge jump
      FrEntry e;
      e.group = "world";
      e.seq = seq;
      e.op = OpType::all_reduce;
      e.signature = "all_reduce f32 8";
      fr.update(fr.record(e), FrState::completed);
    }
    fr.dump(dir, "test");
  }
  const FrReport report = analyze_flight_records(dir);
  EXPECT_TRUE(report.ok()) << report.to_text();
  const auto rewrite = [&](const std::string& key, const nlohmann::json& value) {
    std::ifstream in(dir + "/fr_rank1.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j[key] = value;
    std::ofstream(dir + "/fr_rank1.json") << j.dump();
  };
  rewrite("world_size", 2000000000);
  EXPECT_TRUE(contains(message_of([&] { analyze_flight_records(dir); }),
                       "world_size must be an integer from 1 to 1048576, got 2000000000"));
  rewrite("world_size", 2);
  rewrite("rank", 7);
  EXPECT_TRUE(contains(message_of([&] { analyze_flight_records(dir); }), "rank must be an integer from 0 to 1, got 7"));
  // Found by fuzz/fr_dump_fuzzer: a float where an integer belongs was cast with undefined behaviour.
  rewrite("rank", 6.67e32);
  EXPECT_TRUE(
      contains(message_of([&] { analyze_flight_records(dir); }), "rank must be an integer from 0 to 1, got 6.67e+32"));
  rewrite("rank", 1);
  rewrite("groups", nlohmann::json{{"world", {{"ranks", {0, 5}}}}});
  EXPECT_TRUE(contains(message_of([&] { analyze_flight_records(dir); }),
                       "'ranks' element must be an integer from 0 to 1, got 5"));
  rewrite("groups", nlohmann::json::array());
  EXPECT_TRUE(contains(message_of([&] { analyze_flight_records(dir); }), "key 'groups' must be an object of groups"));
  // Dumps of two jobs, or two dumps of one rank: an error, not a report that drops one.
  rewrite("groups", nlohmann::json{{"world", {{"ranks", {0, 1}}}}});
  rewrite("world_size", 4);
  EXPECT_TRUE(contains(message_of([&] { analyze_flight_records(dir); }), "the dumps disagree on the world size"));
  rewrite("world_size", 2);
  rewrite("rank", 0);
  EXPECT_TRUE(contains(message_of([&] { analyze_flight_records(dir); }), "records rank 0, which fr_rank"));
  std::filesystem::remove_all(dir);
}
