// Pipeline schedules: the orders of the reference's re-simulation of
// PyTorch's generators, the published bubble formulas, activation peaks, and
// deadlock-free lowering for every schedule, pp and microbatch count.
#include "parallel/pipeline_schedule.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "core/error.h"
#include "test_util.h"

using namespace meshtrain;
using namespace meshtrain::parallel;
using mtest::contains;

namespace {

std::string order(const PpSchedule& s, int rank) {
  std::vector<std::string> parts;
  for (const PpAction& a : s.actions[static_cast<size_t>(rank)]) parts.push_back(to_string(a));
  return fmt::format("{}", fmt::join(parts, " "));
}

}  // namespace

// Per-rank orders for p = 4, m = 8 as listed in the reference notes
// (shared/reference/pipeline.md §1.8, re-derived there from PyTorch's
// generators), compared action by action.
TEST(PipelineSchedule, OrdersMatchTheReferenceForFourRanksEightMicrobatches) {
  const PpSchedule f1b = make_pp_schedule(PpScheduleKind::one_f_one_b, 4, 8, 1);
  EXPECT_EQ(order(f1b, 0), "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7");
  EXPECT_EQ(order(f1b, 3), "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7");
  const PpSchedule inter = make_pp_schedule(PpScheduleKind::interleaved_1f1b, 4, 8, 2);
  EXPECT_EQ(order(inter, 0),
            "0F0 0F1 0F2 0F3 4F0 4F1 4F2 4F3 0F4 0F5 0F6 4B0 0F7 4B1 4F4 4B2 4F5 4B3 4F6 0B0 4F7 "
            "0B1 0B2 0B3 4B4 4B5 4B6 4B7 0B4 0B5 0B6 0B7");
  EXPECT_EQ(order(inter, 2),
            "2F0 2F1 2F2 2F3 6F0 6F1 6F2 6B0 6F3 6B1 2F4 6B2 2F5 6B3 2F6 2B0 2F7 2B1 6F4 2B2 6F5 "
            "2B3 6F6 6B4 6F7 6B5 6B6 6B7 2B4 2B5 2B6 2B7");
  const PpSchedule zb2 = make_pp_schedule(PpScheduleKind::zero_bubble, 4, 8, 2);
  EXPECT_EQ(order(zb2, 3),
            "3F0 3F1 3F2 3F3 7F0 7I0 7F1 7I1 7F2 7I2 7F3 7I3 7W0 3F4 3I0 7W1 3F5 3I1 7W2 3F6 3I2 "
            "7W3 3F7 3I3 3W0 7F4 7I4 3W1 7F5 7I5 3W2 7F6 7I6 3W3 7F7 7I7 7W4 3I4 7W5 3I5 7W6 3I6 "
            "7W7 3I7 3W4 3W5 3W6 3W7");
  const PpSchedule zbv = make_pp_schedule(PpScheduleKind::zbv, 4, 8, 2);
  EXPECT_EQ(order(zbv, 0),
            "0F0 0F1 0F2 0F3 0F4 0F5 0F6 7F0 7I0 7W0 7F1 7I1 7W1 7F2 7I2 7W2 7F3 7I3 7W3 0F7 0I0 "
            "0W0 7F4 7I4 7W4 0I1 0W1 7F5 7I5 7W5 0I2 0W2 7F6 7I6 7W6 0I3 0W3 7F7 7I7 7W7 0I4 0W4 "
            "0I5 0W5 0I6 0W6 0I7 0W7");
  EXPECT_EQ(order(zbv, 3),
            "3F0 4F0 3F1 4F1 3F2 4F2 3F3 4F3 4I0 4W0 3F4 3I0 3W0 4F4 4I1 4W1 3F5 3I1 3W1 4F5 4I2 "
            "4W2 3F6 3I2 3W2 4F6 4I3 4W3 3F7 3I3 3W3 4F7 4I4 4W4 3I4 4I5 3I5 4I6 3I6 4I7 3I7 3W4 "
            "4W5 4W6 4W7 3W5 3W6 3W7");
  EXPECT_EQ(zbv.rank_of_stage, (std::vector<int>{0, 1, 2, 3, 3, 2, 1, 0}));
}

// The simulated bubble is the published one: GPipe and 1F1B (p-1)/(m+p-1),
// interleaved (p-1)/(v m+p-1), ZB-H1 (p-1)(F+I-W) over the makespan; also
// with a backward twice the forward, and across pp and m.
TEST(PipelineSchedule, SimulatedBubbleIsThePublishedFormula) {
  for (const PpCosts costs : {PpCosts{1, 1, 1, 0}, PpCosts{1, 1.5, 0.5, 0}, PpCosts{2, 2, 1, 0}})
    for (int p : {2, 3, 4, 8})
      for (int m : {p, 2 * p, 3 * p}) {
        const std::vector<std::pair<PpScheduleKind, int>> kinds{{PpScheduleKind::gpipe, 1},
                                                                {PpScheduleKind::one_f_one_b, 1},
                                                                {PpScheduleKind::interleaved_1f1b, 2},
                                                                {PpScheduleKind::interleaved_1f1b, 4},
                                                                {PpScheduleKind::zero_bubble, 1}};
        for (const auto& [kind, v] : kinds) {
          const PpSchedule s = make_pp_schedule(kind, p, m, v);
          const PpSimulation sim = simulate_pp_schedule(s, costs);
          const double published = published_bubble_fraction(s, costs);
          EXPECT_NEAR(sim.bubble_fraction, published, 1e-12)
              << pp_schedule_name(kind) << " p " << p << " m " << m << " v " << v << " F " << costs.forward << " I "
              << costs.backward_input << " W " << costs.backward_weight;
        }
      }
  // The closed forms themselves, for p 4, m 8, F = I = W = 1.
  EXPECT_DOUBLE_EQ(published_bubble_fraction(make_pp_schedule(PpScheduleKind::one_f_one_b, 4, 8, 1)), 3.0 / 11);
  EXPECT_DOUBLE_EQ(published_bubble_fraction(make_pp_schedule(PpScheduleKind::interleaved_1f1b, 4, 8, 2)), 3.0 / 19);
  EXPECT_DOUBLE_EQ(published_bubble_fraction(make_pp_schedule(PpScheduleKind::zero_bubble, 4, 8, 1)), 3.0 / 27);
}

// Makespans and activation peaks of the reference's re-simulation (p 4,
// m 8, F = I = W = 1), including the two without a closed form.
TEST(PipelineSchedule, MakespanAndActivationPeaksMatchTheReference) {
  struct Row {
    PpScheduleKind kind;
    int v;
    double makespan;
    std::vector<int> peak;
  };
  const std::vector<Row> rows{{PpScheduleKind::gpipe, 1, 33.0, {8, 8, 8, 8}},
                              {PpScheduleKind::one_f_one_b, 1, 33.0, {4, 3, 2, 1}},
                              {PpScheduleKind::interleaved_1f1b, 2, 28.5, {11, 9, 7, 5}},
                              {PpScheduleKind::zero_bubble, 1, 27.0, {4, 4, 4, 4}},
                              {PpScheduleKind::zero_bubble, 2, 25.5, {8, 8, 8, 8}},
                              {PpScheduleKind::zbv, 2, 25.5, {8, 8, 8, 8}}};
  for (const Row& row : rows) {
    const PpSimulation sim = simulate_pp_schedule(make_pp_schedule(row.kind, 4, 8, row.v));
    EXPECT_DOUBLE_EQ(sim.makespan, row.makespan) << pp_schedule_name(row.kind) << " v " << row.v;
    EXPECT_EQ(sim.peak_activations, row.peak) << pp_schedule_name(row.kind) << " v " << row.v;
  }
}

// Every schedule the generator accepts lowers to sends and receives that run
// in order without deadlock, each transfer once and in the same order on
// both sides; p2p latency only lengthens the step.
TEST(PipelineSchedule, EveryScheduleLowersWithoutDeadlock) {
  int lowered = 0;
  for (int p = 1; p <= 6; ++p)
    for (int m = 1; m <= 13; ++m)
      for (int k = 0; k < 5; ++k)
        for (int v = 1; v <= 3; ++v) {
          const auto kind = static_cast<PpScheduleKind>(k);
          PpSchedule s;
          try {
            s = make_pp_schedule(kind, p, m, v);
          } catch (const InvalidArgument&) {
            continue;  // a combination the schedule refuses (tested below)
          }
          const PpSchedule with_comms = add_pp_communication(s);
          ++lowered;
          // Each cross-rank edge has one send and one receive, pairwise in the same order.
          for (int a = 0; a < p; ++a)
            for (int b = 0; b < p; ++b) {
              if (a == b) continue;
              std::vector<std::string> sends, recvs;
              for (const PpAction& x : with_comms.actions[static_cast<size_t>(a)])
                if ((x.type == PpActionType::send_f &&
                     with_comms.rank_of_stage[static_cast<size_t>(x.stage + 1)] == b) ||
                    (x.type == PpActionType::send_b && with_comms.rank_of_stage[static_cast<size_t>(x.stage - 1)] == b))
                  sends.push_back(fmt::format("{}{}", x.type == PpActionType::send_f ? "F" : "B", x.microbatch));
              for (const PpAction& x : with_comms.actions[static_cast<size_t>(b)])
                if ((x.type == PpActionType::recv_f &&
                     with_comms.rank_of_stage[static_cast<size_t>(x.stage - 1)] == a) ||
                    (x.type == PpActionType::recv_b && with_comms.rank_of_stage[static_cast<size_t>(x.stage + 1)] == a))
                  recvs.push_back(fmt::format("{}{}", x.type == PpActionType::recv_f ? "F" : "B", x.microbatch));
              EXPECT_EQ(sends, recvs) << pp_schedule_name(kind) << " p " << p << " m " << m << " v " << v;
            }
          const double plain = simulate_pp_schedule(s).makespan;
          EXPECT_GE(simulate_pp_schedule(s, {1, 1, 1, 0.5}).makespan, plain);
        }
  EXPECT_GT(lowered, 500);
}

// The lowering places each receive where its send is issued; for 1F1B on
// 2 ranks and 3 microbatches this is the order the reference derives from
// PyTorch's lowering (shared/reference/pipeline.md §1.4).
TEST(PipelineSchedule, LoweringPlacesEachReceiveWhereItsSendIsIssued) {
  const PpSchedule s = add_pp_communication(make_pp_schedule(PpScheduleKind::one_f_one_b, 2, 3, 1));
  EXPECT_EQ(order(s, 0), "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0F2 0SEND_F2 0RECV_B1 0B1 0RECV_B2 0B2");
  EXPECT_EQ(order(s, 1), "1RECV_F0 1F0 1RECV_F1 1B0 1SEND_B0 1F1 1RECV_F2 1B1 1SEND_B1 1F2 1B2 1SEND_B2");
}

TEST(PipelineSchedule, BadRequestsNameTheKey) {
  auto msg = [](const std::function<void()>& f) { return mtest::message_of(f); };
  EXPECT_TRUE(contains(msg([] { parse_pp_schedule("1F1B"); }),
                       "pp_schedule '1F1B' is not a pipeline schedule; choose one of gpipe, 1f1b, interleaved_1f1b, "
                       "zero_bubble, zbv"));
  EXPECT_TRUE(contains(msg([] { make_pp_schedule(PpScheduleKind::one_f_one_b, 4, 3, 1); }),
                       "needs pp_microbatches >= pp (got 3 microbatches for 4 stages)"));
  EXPECT_TRUE(contains(msg([] { make_pp_schedule(PpScheduleKind::interleaved_1f1b, 4, 9, 2); }),
                       "pp_microbatches = 9 splits into 2 runs unevenly"));
  EXPECT_TRUE(contains(msg([] { make_pp_schedule(PpScheduleKind::zbv, 4, 8, 3); }), "exactly 2 stages"));
  EXPECT_TRUE(contains(msg([] { make_pp_schedule(PpScheduleKind::gpipe, 4, 8, 2); }), "one stage per rank"));
  EXPECT_TRUE(contains(msg([] { make_pp_schedule(PpScheduleKind::interleaved_1f1b, 4, 8, 1); }),
                       "needs pp_stages_per_rank >= 2"));
  EXPECT_TRUE(contains(msg([] { make_pp_schedule(PpScheduleKind::gpipe, 0, 8, 1); }), "pp = 0"));
  EXPECT_TRUE(contains(msg([] { make_pp_schedule(PpScheduleKind::gpipe, 1024, 65536, 1); }), "actions to schedule"));
  // A hand-made schedule that breaks the rules is refused before it runs.
  PpSchedule s = make_pp_schedule(PpScheduleKind::one_f_one_b, 2, 2, 1);
  std::swap(s.actions[1][0], s.actions[1][1]);  // 1B0 before 1F0
  EXPECT_TRUE(contains(msg([&] { validate_pp_schedule(s); }), "rank 1 runs 1B0 before that microbatch's forward"));
  s = make_pp_schedule(PpScheduleKind::one_f_one_b, 2, 2, 1);
  s.actions[0].pop_back();
  EXPECT_TRUE(contains(msg([&] { validate_pp_schedule(s); }), "stage 0 microbatch 1 has 1 F, 0 B"));
  // Rank 0 waits for 0B0's gradient before it sends 0F1; rank 1 takes
  // microbatch 1 first: each waits for the other.
  s = make_pp_schedule(PpScheduleKind::gpipe, 2, 2, 1);
  s.actions[0] = {{0, PpActionType::forward, 0},
                  {0, PpActionType::backward, 0},
                  {0, PpActionType::forward, 1},
                  {0, PpActionType::backward, 1}};
  s.actions[1] = {{1, PpActionType::forward, 1},
                  {1, PpActionType::backward, 1},
                  {1, PpActionType::forward, 0},
                  {1, PpActionType::backward, 0}};
  const std::string stuck = msg([&] { add_pp_communication(s); });
  EXPECT_TRUE(contains(stuck, "cannot proceed: rank 0 at 0B0, rank 1 at 1F1")) << stuck;
  EXPECT_TRUE(contains(msg([&] { simulate_pp_schedule(s); }), "cannot proceed: rank 0 at 0B0, rank 1 at 1F1"));
}

TEST(PipelineSchedule, TimelinePrintsEveryActionWhereItRuns) {
  const PpSchedule s = make_pp_schedule(PpScheduleKind::one_f_one_b, 2, 2, 1);
  const std::string text = pp_timeline_text(s, simulate_pp_schedule(s), 1);
  EXPECT_EQ(text,
            "rank 0 | 0F0 0F1 ... ... 0B0 --- ... 0B1 ---\n"
            "rank 1 | ... 1F0 1B0 --- 1F1 1B1 --- ... ...\n")
      << text;
}

// FSDP's actions: each stage's UNSHARD before anything, its REDUCE_GRAD
// after the action completing its last microbatch's weight gradients and the
// sends that action makes, its RESHARD last; the rest in the same order.
TEST(PipelineSchedule, FsdpActionsGatherOnceAndReduceAfterTheLastBackward) {
  const PpSchedule lowered = add_pp_communication(make_pp_schedule(PpScheduleKind::one_f_one_b, 2, 3, 1));
  const PpSchedule with = add_pp_fsdp_actions(lowered);
  auto text = [](const std::vector<PpAction>& list) {
    std::vector<std::string> parts;
    for (const PpAction& a : list) parts.push_back(to_string(a));
    return fmt::format("{}", fmt::join(parts, " "));
  };
  EXPECT_EQ(text(with.actions[0]), "0UNSHARD " + text(lowered.actions[0]) + " 0REDUCE_GRAD 0RESHARD");
  EXPECT_EQ(text(with.actions[1]),
            "1UNSHARD 1RECV_F0 1F0 1RECV_F1 1B0 1SEND_B0 1F1 1RECV_F2 1B1 1SEND_B1 1F2 1B2 1SEND_B2 1REDUCE_GRAD "
            "1RESHARD");
  // Zero-bubble: the stage's gradients are complete after its last W, not its last I.
  const PpSchedule zb =
      add_pp_fsdp_actions(add_pp_communication(make_pp_schedule(PpScheduleKind::zero_bubble, 2, 4, 1)));
  for (const auto& list : zb.actions) {
    const auto reduce =
        std::find_if(list.begin(), list.end(), [](const PpAction& a) { return a.type == PpActionType::reduce_grad; });
    ASSERT_NE(reduce, list.end());
    for (auto it = reduce + 1; it != list.end(); ++it) EXPECT_FALSE(is_compute(it->type)) << to_string(*it);
    EXPECT_EQ(
        std::count_if(list.begin(), reduce, [](const PpAction& a) { return a.type == PpActionType::backward_weight; }),
        4);
  }
  validate_pp_schedule(zb);  // the compute actions are as they were
  EXPECT_EQ(simulate_pp_schedule(zb).makespan,
            simulate_pp_schedule(make_pp_schedule(PpScheduleKind::zero_bubble, 2, 4, 1)).makespan);
}

// max_active_stages K: walking each rank's list, at most K of its stages
// are gathered at once, every compute action's stage is gathered when it
// runs, every UNSHARD is of a stage not gathered and every RESHARD of one
// that is, nothing stays gathered at the end; the compute order is
// untouched. K at or above the stages per rank is the plain list.
TEST(PipelineSchedule, MaxActiveStagesBoundsTheGatheredStages) {
  for (const auto& [kind, per_rank] :
       {std::pair{PpScheduleKind::interleaved_1f1b, 3}, {PpScheduleKind::zero_bubble, 4}, {PpScheduleKind::zbv, 2}})
    for (const int k : {1, 2, 3}) {
      const PpSchedule lowered = add_pp_communication(make_pp_schedule(kind, 2, 4, per_rank));
      const PpSchedule with = add_pp_fsdp_actions(lowered, k);
      const std::string what = fmt::format("{} v {} K {}", pp_schedule_name(kind), per_rank, k);
      for (int r = 0; r < 2; ++r) {
        std::set<int> gathered;
        size_t peak = 0;
        std::vector<PpAction> rest;
        for (const PpAction& a : with.actions[static_cast<size_t>(r)]) {
          if (a.type == PpActionType::unshard) {
            EXPECT_TRUE(gathered.insert(a.stage).second) << what << " " << to_string(a);
          } else if (a.type == PpActionType::reshard) {
            EXPECT_EQ(gathered.erase(a.stage), 1u) << what << " " << to_string(a);
          } else if (a.type != PpActionType::reduce_grad) {
            if (is_compute(a.type)) {
              EXPECT_TRUE(gathered.contains(a.stage)) << what << " " << to_string(a);
            }
            rest.push_back(a);
          }
          peak = std::max(peak, gathered.size());
        }
        EXPECT_TRUE(gathered.empty()) << what;
        EXPECT_EQ(peak, static_cast<size_t>(std::min(k, per_rank))) << what;
        EXPECT_EQ(rest, lowered.actions[static_cast<size_t>(r)]) << what;
      }
    }
  const PpSchedule lowered = add_pp_communication(make_pp_schedule(PpScheduleKind::interleaved_1f1b, 2, 4, 2));
  EXPECT_EQ(add_pp_fsdp_actions(lowered, 2).actions, add_pp_fsdp_actions(lowered).actions);
  EXPECT_EQ(add_pp_fsdp_actions(lowered, 5).actions, add_pp_fsdp_actions(lowered, 0).actions);
  EXPECT_TRUE(contains(mtest::message_of([&] { add_pp_fsdp_actions(lowered, -1); }), "pp_max_active_stages = -1"));
}

// A schedule of one's own as CSV: every generated schedule written out and
// read back is the same schedule (its stages' ranks, stages per rank and
// microbatches read from the actions), and every action's text parses back.
TEST(PipelineSchedule, CsvRoundTripsEverySchedule) {
  for (const auto& [kind, per_rank] : {std::pair{PpScheduleKind::gpipe, 1},
                                       {PpScheduleKind::one_f_one_b, 1},
                                       {PpScheduleKind::interleaved_1f1b, 2},
                                       {PpScheduleKind::zero_bubble, 1},
                                       {PpScheduleKind::zero_bubble, 3},
                                       {PpScheduleKind::zbv, 2}})
    for (const int ranks : {1, 2, 4})
      for (const int m : {4, 8}) {
        const PpSchedule s = make_pp_schedule(kind, ranks, m, per_rank);
        const PpSchedule back = pp_schedule_from_csv("# a comment\n\n" + pp_schedule_csv(s), ranks);
        const std::string what = fmt::format("{} pp {} v {} m {}", pp_schedule_name(kind), ranks, per_rank, m);
        EXPECT_EQ(back.kind, PpScheduleKind::csv) << what;
        EXPECT_EQ(back.actions, s.actions) << what;
        EXPECT_EQ(back.rank_of_stage, s.rank_of_stage) << what;
        EXPECT_EQ(back.stages_per_rank, per_rank) << what;
        EXPECT_EQ(back.microbatches, m) << what;
        const PpSchedule lowered = add_pp_fsdp_actions(add_pp_communication(s));
        for (const auto& actions : lowered.actions)
          for (const PpAction& a : actions) EXPECT_EQ(parse_pp_action(to_string(a)), a) << to_string(a);
      }
  EXPECT_EQ(pp_schedule_name(PpScheduleKind::csv), "csv");
  EXPECT_FALSE(contains(pp_schedule_names(), "csv"));  // not a schedule one can name: it comes from a file
}

TEST(PipelineSchedule, BadCsvSchedulesNameTheLineAndCell) {
  auto error = [](std::string_view text, int ranks) {
    return mtest::message_of([&] { add_pp_communication(pp_schedule_from_csv(text, ranks)); });
  };
  EXPECT_TRUE(contains(error("0F0,0X0\n1F0,1B0\n", 2), "line 1, cell 2: pipeline action '0X0': 'X' is no action type"));
  EXPECT_TRUE(contains(error("0F0,0B0\n0F1,1B0\n", 2), "line 2, cell 1: stage 0 is on rank 0 (line 1) already"));
  EXPECT_TRUE(contains(error("0F0,0SEND_F0\n1F0\n", 2), "0SEND_F0 is not a compute action"));
  EXPECT_TRUE(contains(error("0F0,0B0\n", 2), "1 lines of actions for pp = 2 ranks"));
  EXPECT_TRUE(contains(error("0F0,0B0\n1F0,1B0\n2F0,2B0\n", 2), "line 3: more than the pp = 2 lines"));
  EXPECT_TRUE(contains(error("0F0,0B0\n2F0,2B0\n", 2), "not all of them"));
  EXPECT_TRUE(contains(error("0F0,0B0\n1F0,1B0,2F0,2B0\n", 2), "3 stages over 2 ranks: every rank must hold as many"));
  EXPECT_TRUE(contains(error("0F0,0B0,2F0,2B0,3F0,3B0\n1F0,1B0\n", 2), "rank 0 holds 3 stages, but 4 stages over 2"));
  EXPECT_TRUE(contains(error("0B0,0F0\n1F0,1B0\n", 2), "rank 0 runs 0B0 before that microbatch's forward"));
  EXPECT_TRUE(contains(error("0F0,0B0\n1F0\n", 2), "stage 1 microbatch 0 has 1 F, 0 B"));  // a backward missing
  EXPECT_TRUE(contains(error("0F0,0F99999999999\n1F0\n", 2), "does not end with a microbatch number"));
  // Each stage's actions in a possible order, but the ranks wait on each other: the reader names both.
  EXPECT_TRUE(contains(error("2F0,0F0,2B0,0B0\n1F0,3F0,3B0,1B0\n", 2),
                       "rank 0 at 2F0, rank 1 at 1F0 each wait for an input no rank will produce"));
}

// Regressions the pp_schedule fuzzer found (fuzz/corpus/pp_schedule/regression_*): the reader accepted
// a schedule whose ranks wait on each other (lowering failed later, and `pp-schedule --from-csv --csv`
// printed it without a word), lines with no actions (0 stages, 0 microbatches: a division by zero in
// the pipeline's batch check), and a few cells naming 9 stages x 65536 microbatches (validating takes
// a cell per pair: 64 KiB of text asked for 4 GiB).
TEST(PipelineSchedule, CsvReaderRefusesWhatCannotRun) {
  auto error = [](std::string_view text, int ranks) {
    return mtest::message_of([&] { pp_schedule_from_csv(text, ranks); });
  };
  // Interleaved 1F1B with rank 1 taking stage 3's microbatch 1 before 0.
  const std::string stuck = error(
      "0F0,0F1,2F0,2F1,0F2,2B0,0F3,2B1,2F2,0B0,2F3,0B1,2B2,2B3,0B2,0B3\n"
      "1F0,3F1,3F0,3B0,1F1,3B1,1F2,1B0,1F3,1B1,3F2,3B2,3F3,3B3,1B2,1B3\n",
      2);
  EXPECT_TRUE(contains(stuck, "cannot proceed: rank 0 at 2F1, rank 1 at 3F1 each wait for an input")) << stuck;
  EXPECT_TRUE(contains(error(",\n,\n", 2), "no actions on any of the 2 lines")) << error(",\n,\n", 2);
  EXPECT_TRUE(contains(error(" , ", 0), "no actions on any of the 1 lines"));
  std::string wide;
  for (int stage = 0; stage < 9; ++stage) wide += fmt::format("{}F0,{}B0,", stage, stage);
  const std::string big = error(wide + "0F65535", 1);
  EXPECT_TRUE(contains(big, "9 stages x 65536 microbatches needs more than the 1048576 actions")) << big;
  // What it accepts lowers: the generated schedules' text, as before.
  const PpSchedule s = pp_schedule_from_csv(pp_schedule_csv(make_pp_schedule(PpScheduleKind::zbv, 3, 5, 2)), 3);
  EXPECT_EQ(s.stages_per_rank, 2);
  EXPECT_NO_THROW(add_pp_communication(s));
}

// The stages a rank gathers before its first compute and drops after its
// last stay gathered between runs of an accumulated step: all of them when
// every stage is gathered for the step, only those with K below.
TEST(PipelineSchedule, StagesKeptBetweenRunsAreGatheredFirstAndDroppedLast) {
  const PpSchedule lowered = add_pp_communication(make_pp_schedule(PpScheduleKind::interleaved_1f1b, 2, 4, 3));
  EXPECT_EQ(pp_stages_kept_between_runs(add_pp_fsdp_actions(lowered), 0), (std::set<int>{0, 2, 4}));
  EXPECT_EQ(pp_stages_kept_between_runs(add_pp_fsdp_actions(lowered), 1), (std::set<int>{1, 3, 5}));
  // K 1: rank 0 gathers stage 0 first and drops it last (its backward ends the step), stages 2 and 4 in between.
  const PpSchedule one = add_pp_fsdp_actions(lowered, 1);
  EXPECT_EQ(one.actions[0].front(), (PpAction{0, PpActionType::unshard, 0}));
  EXPECT_EQ(pp_stages_kept_between_runs(one, 0), (std::set<int>{0}));
  // K 2 on rank 1: stages 1 and 3 gathered first; the last compute is 1B3, after which only 1 is dropped.
  const PpSchedule two = add_pp_fsdp_actions(lowered, 2);
  EXPECT_EQ(pp_stages_kept_between_runs(two, 1), (std::set<int>{1}));
}

// Per-stage costs: the link between stages 0 and 1 (costs[0].p2p, 5) is
// crossed twice by one microbatch, its activation forward and its gradient
// back; the last stage's p2p (100) is over no link and never charged.
// GPipe on 2 ranks, 1 microbatch: F0 1, hop 5, F1 2 and B1 3, hop 5, B0 4.
TEST(PipelineSchedule, TheGradientCrossesTheSameLinkBack) {
  const PpSchedule s = make_pp_schedule(PpScheduleKind::gpipe, 2, 1, 1);
  const std::vector<PpCosts> per_stage{{.forward = 1, .backward_input = 2, .backward_weight = 2, .p2p = 5},
                                       {.forward = 2, .backward_input = 1.5, .backward_weight = 1.5, .p2p = 100}};
  const PpSimulation sim = simulate_pp_schedule(s, per_stage);
  EXPECT_DOUBLE_EQ(sim.makespan, 1 + 5 + 2 + 3 + 5 + 4);
  EXPECT_DOUBLE_EQ(sim.busy[0], 1 + 4);
  EXPECT_DOUBLE_EQ(sim.busy[1], 2 + 3);
}

// Ranks sharing one host's cores: with speed k -> ranks / k the host's work
// is conserved (k ranks computing at once run ranks / k times as fast), and
// with no hop between stages some rank always computes, so every schedule's
// makespan is its ranks' total work over the ranks: the bubble vanishes.
// Speeds of 1 give the plain simulation's timeline exactly.
TEST(PipelineSchedule, RanksSharingCoresRunTheirBubbleAway) {
  const std::vector<PpCosts> costs_of_stage{{.forward = 1, .backward_input = 1.5, .backward_weight = 0.5},
                                            {.forward = 2, .backward_input = 1, .backward_weight = 1},
                                            {.forward = 1.5, .backward_input = 2, .backward_weight = 2},
                                            {.forward = 1, .backward_input = 1, .backward_weight = 3}};
  for (const PpScheduleKind kind : {PpScheduleKind::gpipe, PpScheduleKind::one_f_one_b, PpScheduleKind::zero_bubble})
    for (const int ranks : {2, 4})
      for (const int m : {1, 4, 8}) {
        if (m < ranks && kind != PpScheduleKind::gpipe) continue;  // 1F1B and ZB-H1 need m >= pp
        SCOPED_TRACE(fmt::format("{} pp {} m {}", pp_schedule_name(kind), ranks, m));
        const PpSchedule s = make_pp_schedule(kind, ranks, m, 1);
        const std::vector<PpCosts> costs(costs_of_stage.begin(), costs_of_stage.begin() + ranks);
        const PpSimulation plain = simulate_pp_schedule(s, costs);
        const PpSimulation ones = simulate_pp_schedule(s, costs, std::vector<double>(static_cast<size_t>(ranks), 1));
        EXPECT_EQ(ones.makespan, plain.makespan);
        EXPECT_EQ(ones.busy, plain.busy);
        std::vector<double> conserved;
        for (int k = 1; k <= ranks; ++k) conserved.push_back(static_cast<double>(ranks) / k);
        const PpSimulation shared = simulate_pp_schedule(s, costs, conserved);
        double work = 0;
        for (double b : plain.busy) work += b;
        EXPECT_NEAR(shared.makespan, work / ranks, 1e-9 * work);
        EXPECT_LE(shared.makespan, plain.makespan + 1e-9);
      }
}

// GPipe on 2 ranks, 1 microbatch, each rank alone running twice as fast:
// F0 1, F1 2, B1 3, B0 4 at half their costs, the hops (5 each) unchanged.
TEST(PipelineSchedule, ARankComputingAloneRunsAtItsAloneSpeed) {
  const PpSchedule s = make_pp_schedule(PpScheduleKind::gpipe, 2, 1, 1);
  const std::vector<PpCosts> per_stage{{.forward = 1, .backward_input = 2, .backward_weight = 2, .p2p = 5},
                                       {.forward = 2, .backward_input = 1.5, .backward_weight = 1.5, .p2p = 100}};
  const PpSimulation sim = simulate_pp_schedule(s, per_stage, {2, 1});
  EXPECT_DOUBLE_EQ(sim.makespan, 0.5 + 5 + 1 + 1.5 + 5 + 2);
  EXPECT_DOUBLE_EQ(sim.busy[0], 0.5 + 2);
  EXPECT_THROW(simulate_pp_schedule(s, per_stage, {2}), InvalidArgument);
  EXPECT_THROW(simulate_pp_schedule(s, per_stage, {2, 0}), InvalidArgument);
}

// Without ranks sharing cores, every action of every schedule starts at the
// latest of its rank coming free and its inputs arriving (the stage before's
// forward, the stage after's input backward, each over its link's hop, and
// this stage's own F, or its I for a W), and runs for its stage's cost.
TEST(PipelineSchedule, EachActionStartsWhenItsRankAndItsInputsAreReady) {
  const std::vector<PpCosts> cost_cycle{{.forward = 1, .backward_input = 1.5, .backward_weight = 0.5, .p2p = 0.3},
                                        {.forward = 2, .backward_input = 1, .backward_weight = 1, .p2p = 0.1},
                                        {.forward = 1.5, .backward_input = 2, .backward_weight = 2, .p2p = 0.7}};
  struct Case {
    PpScheduleKind kind;
    int v;
  };
  const std::vector<Case> cases{
      {PpScheduleKind::gpipe, 1},       {PpScheduleKind::one_f_one_b, 1}, {PpScheduleKind::interleaved_1f1b, 2},
      {PpScheduleKind::zero_bubble, 1}, {PpScheduleKind::zero_bubble, 2}, {PpScheduleKind::zbv, 2}};
  int checked = 0;
  for (const Case& c : cases)
    for (const int ranks : {2, 3, 4})
      for (const int m : {4, 8}) {
        SCOPED_TRACE(fmt::format("{} v {} pp {} m {}", pp_schedule_name(c.kind), c.v, ranks, m));
        const PpSchedule s = make_pp_schedule(c.kind, ranks, m, c.v);
        std::vector<PpCosts> costs;
        for (int stage = 0; stage < s.stages(); ++stage) costs.push_back(cost_cycle[stage % cost_cycle.size()]);
        const PpSimulation sim = simulate_pp_schedule(s, costs);
        std::map<std::tuple<int, int, PpActionType>, std::pair<int, double>> ended;  // rank, end
        for (int r = 0; r < ranks; ++r)
          for (const PpTimedAction& t : sim.timeline[r])
            ended[{t.action.stage, t.action.microbatch, t.action.type}] = {r, t.end};
        auto arrival = [&](int r, int stage, int mb, PpActionType type, int link) {
          const auto& [rank, end] = ended.at({stage, mb, type});
          return end + (rank != r ? costs[link].p2p : 0);
        };
        auto input_backward = [&](int stage, int mb) {  // B, or I where the backward is split
          return ended.contains({stage, mb, PpActionType::backward}) ? PpActionType::backward
                                                                     : PpActionType::backward_input;
        };
        for (int r = 0; r < ranks; ++r) {
          double free_at = 0;
          for (const PpTimedAction& t : sim.timeline[r]) {
            const PpAction& a = t.action;
            const PpCosts& own = costs[a.stage];
            double ready = 0, length = own.forward;
            if (a.type == PpActionType::forward) {
              if (a.stage > 0) ready = arrival(r, a.stage - 1, a.microbatch, PpActionType::forward, a.stage - 1);
            } else if (a.type == PpActionType::backward_weight) {
              ready = ended.at({a.stage, a.microbatch, PpActionType::backward_input}).second;
              length = own.backward_weight;
            } else {
              ready = ended.at({a.stage, a.microbatch, PpActionType::forward}).second;
              if (a.stage + 1 < s.stages())
                ready = std::max(
                    ready, arrival(r, a.stage + 1, a.microbatch, input_backward(a.stage + 1, a.microbatch), a.stage));
              length = a.type == PpActionType::backward ? own.backward() : own.backward_input;
            }
            EXPECT_DOUBLE_EQ(t.start, std::max(free_at, ready)) << to_string(a) << " on rank " << r;
            EXPECT_DOUBLE_EQ(t.end, t.start + length) << to_string(a);
            free_at = t.end;
            ++checked;
          }
        }
      }
  EXPECT_GT(checked, 1000);
}
