// sharding/: layouts, local shapes, the cost model and the planner, checked
// against PyTorch DTensor's published cases (the test or docstring each
// comes from is named) and against an exhaustive all-pairs search.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "sharding/local_chunk.h"
#include "sharding/planner.h"
#include "test_util.h"

using namespace meshtrain;
using namespace meshtrain::sharding;
using mtest::contains;
using mtest::message_of;

namespace {

std::vector<std::vector<int64_t>> all_indices(int64_t len, const Placement& p, int n) {
  std::vector<int64_t> parent(static_cast<size_t>(len));
  for (int64_t i = 0; i < len; ++i) parent[i] = i;
  std::vector<std::vector<int64_t>> out;
  for (int r = 0; r < n; ++r) out.push_back(split_indices(parent, p, n, r));
  return out;
}

Planner make_planner(std::vector<int> mesh, double a2a_penalty = 0.0) {
  DeviceMesh m(std::move(mesh));
  CostModel model = CostModel::for_mesh(m, 8);
  model.all_to_all_penalty_us = a2a_penalty;
  return Planner(m, model);
}

std::string trace(Planner& p, const Shape& shape, const std::string& from, const std::string& to,
                  PlanOptions options = {}) {
  const int n = p.mesh().ndim();
  const Layout src = Layout::parse(from, n);
  return p.plan(shape, 4, src, Layout::parse(to, n), options)->trace(src);
}

}  // namespace

TEST(Layout, ParsesAndPrintsPyTorchNotation) {
  EXPECT_EQ(Layout::parse("S(0)[1]S(0)[0]R", 3).to_string(), "S(0)[1]S(0)[0]R");
  EXPECT_EQ(Layout::parse("S(0)S(0)", 2).to_string(), "S(0)[0]S(0)[1]");  // default order
  EXPECT_EQ(Layout::parse("_S(0, 3)S(0)", 2).to_string(), "_S(0, 3)[0]S(0)[1]");
  EXPECT_EQ(Layout::parse("P(sum) S(1), R", 3).to_string(), "P(sum)S(1)R");
  EXPECT_EQ(Layout::parse("P", 1).to_string(), "P(sum)");
  // PyTorch's format_shard_order_str example: P, S(1), S(1), R with order (1, (2, 1)).
  const Layout l = Layout::parse("P(sum)S(1)[1]S(1)[0]R", 4);
  EXPECT_EQ(l.shard_sequence(1), (std::vector<int>{2, 1}));
  EXPECT_EQ(l.to_string(), "P(sum)S(1)[1]S(1)[0]R");
}

TEST(Layout, BadTextIsAClearError) {
  EXPECT_TRUE(contains(message_of([] { Layout::parse("S(0)S(0)", 3); }), "has 2 placements but the mesh has 3 dims"));
  EXPECT_TRUE(contains(message_of([] { Layout::parse("S(0)[0]S(0)", 2); }), "only 1 carry an order index"));
  EXPECT_TRUE(contains(message_of([] { Layout::parse("S(0)[0]S(0)[0]", 2); }), "must be 0..1, each once"));
  EXPECT_TRUE(contains(message_of([] { Layout::parse("Q", 1); }), "unknown placement"));
  EXPECT_TRUE(contains(message_of([] { Layout::parse("_S(0, 1)", 1); }), "split factor >= 2"));
  EXPECT_TRUE(contains(message_of([] { Layout::parse("P(prod)", 1); }), "unknown partial reduce op 'prod'"));
  EXPECT_TRUE(contains(message_of([] { Layout::parse("R[0]", 1); }), "only shards take a [k]"));
  EXPECT_TRUE(contains(message_of([] { Layout::parse("P(sum)P(max)", 2).validate(1); }), "mixes partial reduce types"));
  EXPECT_TRUE(contains(message_of([] { Layout::parse("S(2)", 1).validate(2); }), "the tensor has 2 dims"));
  EXPECT_TRUE(contains(message_of([] { Layout::parse("S(99999999999999)", 1); }), "99999999999999 is out of range"));
}

TEST(DeviceMesh, RowMajorCoordinatesAndValidation) {
  DeviceMesh m({2, 3}, {"dp", "tp"});
  EXPECT_EQ(m.coordinate(4), (std::vector<int>{1, 1}));
  EXPECT_EQ(m.rank_at({1, 2}), 5);
  EXPECT_EQ(m.dim_index("tp"), 1);
  EXPECT_TRUE(contains(message_of([&] { m.dim_index("pp"); }), "has no dim named 'pp'"));
  EXPECT_TRUE(contains(message_of([] { DeviceMesh({2, 2}, {"a", "a"}); }), "'a' is used twice"));
  EXPECT_TRUE(contains(message_of([] { DeviceMesh({2, 0}); }), "mesh dim 1 has size 0"));
  EXPECT_TRUE(contains(message_of([] { DeviceMesh({}); }), "at least one dimension"));
  EXPECT_TRUE(contains(message_of([] { DeviceMesh({2, 2}, {"a"}); }), "got 1 names"));
  EXPECT_TRUE(contains(message_of([&] { m.coordinate(6); }), "rank 6 is outside mesh"));
  // More ranks than an int counts: an error, not a wrapped count.
  EXPECT_TRUE(contains(message_of([] { DeviceMesh({65536, 65536}); }), "more than 16777216 ranks"));
  EXPECT_EQ(parse_mesh_shape("4,2"), (std::vector<int>{4, 2}));
  EXPECT_TRUE(
      contains(message_of([] { parse_mesh_shape("4,x"); }), "cannot read mesh shape '4,x': 'x' is not an integer"));
  EXPECT_TRUE(contains(message_of([] { parse_mesh_shape("99999999999"); }), "99999999999 ranks along a dim"));
  EXPECT_TRUE(contains(message_of([] { parse_mesh_shape("4,"); }), "'' is not an integer"));
}

TEST(DeviceMesh, GroupRanksShareTheOtherCoordinates) {
  DeviceMesh m({2, 3, 2}, {"pp", "dp", "tp"});  // rank 9 = (1, 1, 1)
  EXPECT_EQ(m.group_ranks(9, {}), (std::vector<int64_t>{9}));
  EXPECT_EQ(m.group_ranks(9, {0}), (std::vector<int64_t>{3, 9}));
  EXPECT_EQ(m.group_ranks(9, {1}), (std::vector<int64_t>{7, 9, 11}));
  EXPECT_EQ(m.group_ranks(9, {2}), (std::vector<int64_t>{8, 9}));
  // Row-major over the dims in the order given: dp outer, tp inner, then the other way round.
  EXPECT_EQ(m.group_ranks(9, {1, 2}), (std::vector<int64_t>{6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(m.group_ranks(9, {2, 1}), (std::vector<int64_t>{6, 8, 10, 7, 9, 11}));
  EXPECT_TRUE(contains(message_of([&] { m.group_ranks(12, {0}); }), "rank 12 outside mesh"));
  EXPECT_TRUE(contains(message_of([&] { m.group_ranks(0, {3}); }), "mesh dim 3 outside mesh"));
}

TEST(Sharding, TorchChunkSizes) {
  EXPECT_EQ(torch_chunk_sizes(10, 4), (std::vector<int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(torch_chunk_sizes(5, 4), (std::vector<int64_t>{2, 2, 1, 0}));
  EXPECT_EQ(torch_chunk_sizes(2, 4), (std::vector<int64_t>{1, 1, 0, 0}));
  EXPECT_EQ(torch_chunk_sizes(0, 3), (std::vector<int64_t>{0, 0, 0}));
}

// torch.chunk sizes, from DTensor's Shard docs (placement_types.py
// Shard._local_shard_size_and_offset) and test_utils.py uneven cases.
TEST(Sharding, ShardFollowsTorchChunk) {
  auto sizes = [](int64_t len, int n) {
    std::vector<int64_t> s;
    for (const auto& idx : all_indices(len, Placement::shard(0), n)) s.push_back(static_cast<int64_t>(idx.size()));
    return s;
  };
  EXPECT_EQ(sizes(5, 4), (std::vector<int64_t>{2, 2, 1, 0}));
  EXPECT_EQ(sizes(6, 4), (std::vector<int64_t>{2, 2, 2, 0}));
  EXPECT_EQ(sizes(2, 4), (std::vector<int64_t>{1, 1, 0, 0}));
  EXPECT_EQ(sizes(13, 4), (std::vector<int64_t>{4, 4, 4, 1}));
  // An empty shard's offset is the dim size.
  const DeviceMesh mesh({4});
  const auto chunk = local_chunk({2, 3}, Layout::parse("S(0)", 1), mesh, {3});
  EXPECT_EQ(chunk.shape, (Shape{0, 3}));
  EXPECT_EQ(chunk.offset, (std::vector<int64_t>{2, 0}));
}

// _StridedShard._split_tensor examples (placement_types.py, newest algorithm).
TEST(Sharding, StridedShardSplit) {
  using V = std::vector<std::vector<int64_t>>;
  EXPECT_EQ(all_indices(9, Placement::strided_shard(0, 2), 4), (V{{0, 1, 5}, {2, 3, 6}, {4, 7}, {8}}));
  EXPECT_EQ(all_indices(8, Placement::strided_shard(0, 2), 4), (V{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(all_indices(5, Placement::strided_shard(0, 2), 2), (V{{0, 1, 3}, {2, 4}}));
}

// Nested and strided layouts on 2-d meshes: _StridedShard's docstring
// ((8,8) on 2x2) and test_shard_order_same_data_as_strided_shard ((8,4) on 4x2).
TEST(Sharding, NestedOrdersAndStridedShardsAgree) {
  const DeviceMesh m22({2, 2});
  for (int r = 0; r < 4; ++r) {
    const auto c = m22.coordinate(r);
    const auto nested = shard_indices(8, Layout::parse("S(0)S(0)", 2), 0, m22, c);
    EXPECT_EQ(nested, (std::vector<int64_t>{4 * c[0] + 2 * c[1], 4 * c[0] + 2 * c[1] + 1}));
  }
  const std::vector<int64_t> first_rows = {0, 4, 2, 6};  // rank0 0-1, rank1 4-5, rank2 2-3, rank3 6-7
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(shard_indices(8, Layout::parse("_S(0, 2)S(0)", 2), 0, m22, m22.coordinate(r)),
              (std::vector<int64_t>{first_rows[r], first_rows[r] + 1}));
  const DeviceMesh m42({4, 2});
  for (int r = 0; r < 8; ++r) {
    const auto c = m42.coordinate(r);
    const std::vector<int64_t> want{4 * c[1] + c[0]};
    EXPECT_EQ(shard_indices(8, Layout::parse("_S(0, 2)S(0)", 2), 0, m42, c), want);
    EXPECT_EQ(shard_indices(8, Layout::parse("S(0)[1]S(0)[0]", 2), 0, m42, c), want);
  }
}

TEST(Sharding, CliExampleUnevenNested) {
  const DeviceMesh mesh({4, 2});
  const std::vector<std::vector<int64_t>> shapes{{3, 2}, {2, 2}, {3, 2}, {2, 2}, {3, 2}, {2, 2}, {2, 2}, {1, 2}};
  const std::vector<int64_t> offsets{0, 3, 5, 8, 10, 13, 15, 17};
  for (int r = 0; r < 8; ++r) {
    const auto chunk = local_chunk({18, 2}, Layout::parse("S(0)S(0)", 2), mesh, mesh.coordinate(r));
    EXPECT_EQ(chunk.shape.dims(), shapes[r]) << r;
    EXPECT_EQ(chunk.offset, (std::vector<int64_t>{offsets[r], 0})) << r;
  }
}

// local_chunk computes each rank's extent and first index in closed form
// (O(mesh dims)); shard_indices lists the indices one by one. They agree on
// every dim size 0..40, mesh and layout with strided shards and orders here.
TEST(Sharding, LocalChunkClosedFormAgreesWithTheIndexList) {
  const std::vector<std::pair<std::vector<int>, std::vector<std::string>>> cases = {
      {{4}, {"S(0)", "_S(0, 2)", "_S(0, 3)", "_S(0, 7)", "_S(0, 50)"}},
      {{2, 3}, {"S(0)S(0)", "S(0)[1]S(0)[0]", "_S(0, 3)S(0)", "_S(0, 2)_S(0, 5)", "S(0)_S(0, 4)"}},
      {{3, 2, 2}, {"S(0)S(0)S(0)", "S(0)[2]S(0)[0]S(0)[1]", "_S(0, 4)S(0)_S(0, 3)", "_S(0, 2)RS(0)"}}};
  int checked = 0;
  for (const auto& [shape, layouts] : cases) {
    const DeviceMesh mesh(shape);
    for (const auto& text : layouts) {
      const Layout layout = Layout::parse(text, mesh.ndim());
      for (int64_t dim = 0; dim <= 40; ++dim)
        for (int r = 0; r < mesh.num_ranks(); ++r) {
          const auto coord = mesh.coordinate(r);
          const auto idx = shard_indices(dim, layout, 0, mesh, coord);
          const auto chunk = local_chunk({dim}, layout, mesh, coord);
          ASSERT_EQ(chunk.shape[0], static_cast<int64_t>(idx.size())) << text << " dim " << dim << " rank " << r;
          ASSERT_EQ(chunk.offset[0], idx.empty() ? dim : idx[0]) << text << " dim " << dim << " rank " << r;
          ++checked;
        }
    }
  }
  EXPECT_GT(checked, 1000);
  // A split factor or dim far beyond the ranks costs nothing extra; the ranks'
  // parts still add up to the dim.
  const DeviceMesh mesh({2, 3});
  const int64_t dim = (int64_t{1} << 50) + 12345;
  int64_t total = 0;
  for (int r = 0; r < mesh.num_ranks(); ++r)
    total += local_chunk({dim}, Layout::parse("_S(0, 20000004)S(0)", 2), mesh, mesh.coordinate(r)).shape[0];
  EXPECT_EQ(total, dim);
}

// One-step costs from PyTorch's cost model (_collective_utils.py), mesh
// (2,2,2), (8,8,8) f32, 8 devices per host; and mesh (4,), (1024,1024).
TEST(CostModel, OneStepCostsMatchPyTorch) {
  Planner p = make_planner({2, 2, 2});
  auto cost = [&](const std::string& a, const std::string& b) {
    return p.step_cost({8, 8, 8}, 4, Layout::parse(a, 3), Layout::parse(b, 3));
  };
  EXPECT_DOUBLE_EQ(cost("S(0)S(0)S(0)", "S(0)S(0)R"), 7.202718569887132);
  EXPECT_DOUBLE_EQ(cost("S(0)RR", "RRR"), 7.210874279548531);
  EXPECT_DOUBLE_EQ(cost("P(sum)RR", "RRR"), 7.821748559097063);
  EXPECT_DOUBLE_EQ(cost("P(sum)RR", "S(0)RR"), 7.210874279548531);
  EXPECT_DOUBLE_EQ(cost("RRR", "S(0)RR"), 0.0);
  EXPECT_DOUBLE_EQ(cost("S(0)RR", "S(1)RR"), 7.205437139774265);  // no +1 all_to_all penalty (#178175)
  Planner old = make_planner({2, 2, 2}, 1.0);
  EXPECT_DOUBLE_EQ(old.step_cost({8, 8, 8}, 4, Layout::parse("S(0)RR", 3), Layout::parse("S(1)RR", 3)),
                   8.205437139774265);
  Planner one = make_planner({4});
  EXPECT_DOUBLE_EQ(one.step_cost({1024, 1024}, 4, Layout::parse("S(0)", 1), Layout::parse("R", 1)), 41.80578677309008);
  EXPECT_DOUBLE_EQ(one.step_cost({1024, 1024}, 4, Layout::parse("P", 1), Layout::parse("R", 1)), 77.01157354618016);
  EXPECT_DOUBLE_EQ(one.step_cost({1024, 1024}, 4, Layout::parse("P", 1), Layout::parse("S(0)", 1)), 41.80578677309008);
  // Inter-host dims: mesh (4,2) with 4 devices per host -> dim 0 crosses hosts.
  const CostModel m = CostModel::for_mesh(DeviceMesh({4, 2}), 4);
  EXPECT_DOUBLE_EQ(m.links[0].bandwidth_gbps, 87.7 * 0.22);
  EXPECT_DOUBLE_EQ(m.links[0].latency_us, 2.7);
  EXPECT_DOUBLE_EQ(m.links[1].bandwidth_gbps, 87.7);
}

// DistributeWithDeviceOrderTest.test_ordered_redistribute and
// test_force_min_cost_redistribution_plan (test_redistribute.py): the traces
// PyTorch expects, produced with its +1 all_to_all penalty; no flattening.
TEST(Planner, ReproducesPyTorchTraces) {
  Planner p = make_planner({2, 2, 2}, 1.0);
  const PlanOptions no_merge{PlannerKind::dijkstra, false};
  const Shape shape{8, 8, 8};
  EXPECT_EQ(trace(p, shape, "S(0)[0]S(0)[1]S(0)[2]", "RS(0)[0]S(0)[1]", no_merge),
            "S(0)[0]S(0)[1]S(0)[2]->S(0)[0]S(0)[1]R->S(0)RR->RRR->RS(0)R->RS(0)[0]S(0)[1]");
  EXPECT_EQ(trace(p, shape, "S(0)[1]S(0)[0]S(0)[2]", "RS(0)[0]S(0)[1]", no_merge),
            "S(0)[1]S(0)[0]S(0)[2]->S(0)[1]S(0)[0]R->RS(0)R->RS(0)[0]S(0)[1]");
  EXPECT_EQ(trace(p, shape, "S(0)[1]S(0)[0]S(0)[2]", "S(0)[0]S(0)[1]R", no_merge),
            "S(0)[1]S(0)[0]S(0)[2]->S(0)[1]S(0)[0]R->RS(0)R->RRR->S(0)RR->S(0)[0]S(0)[1]R");
  EXPECT_EQ(trace(p, shape, "S(0)[0]S(0)[1]R", "RS(1)S(0)", no_merge),
            "S(0)[0]S(0)[1]R->S(0)RR->S(0)S(1)R->RS(1)R->RS(1)S(0)");
  EXPECT_EQ(trace(p, shape, "S(0)S(0)S(0)", "S(1)S(1)S(1)", no_merge),
            "S(0)[0]S(0)[1]S(0)[2]->S(0)[0]S(0)[1]R->S(0)RR->RRR->S(1)RR->S(1)[0]S(1)[1]R->S(1)[0]S(1)[1]S(1)[2]");
  EXPECT_EQ(trace(p, shape, "S(0)S(0)S(0)", "S(1)S(1)S(1)", {PlannerKind::greedy, false}),
            "S(0)[0]S(0)[1]S(0)[2]->S(0)[0]S(0)[1]R->S(0)RR->S(1)RR->S(1)[0]S(1)[1]R->S(1)[0]S(1)[1]S(1)[2]");
  // Without the penalty (PyTorch after #178175) one all_to_all beats gather + chunk.
  Planner now = make_planner({2, 2, 2});
  EXPECT_EQ(trace(now, shape, "S(0)[0]S(0)[1]R", "RS(1)S(0)", no_merge),
            "S(0)[0]S(0)[1]R->S(0)S(1)R->RS(1)R->RS(1)S(0)");
}

// RedistributeTest.test_redistribute_shard_dim_multi_dim_mesh: collectives
// PyTorch's default (greedy) planner issues on a 2x2x2 mesh.
TEST(Planner, GreedyCollectiveCountsMatchPyTorch) {
  Planner p = make_planner({2, 2, 2}, 1.0);
  const std::vector<std::pair<std::string, std::string>> pairs{
      {"S(0)S(0)S(0)", "S(1)S(1)S(1)"}, {"S(0)S(1)S(0)", "S(1)S(0)S(0)"}, {"S(0)S(1)S(2)", "S(2)S(1)S(0)"},
      {"S(1)S(0)S(0)", "RS(0)S(0)"},    {"S(1)RS(0)", "RS(0)S(0)"},       {"S(0)S(0)S(1)", "S(0)S(1)S(2)"}};
  const std::vector<int> counts{3, 3, 2, 1, 2, 2};
  for (size_t i = 0; i < pairs.size(); ++i) {
    const auto plan = p.plan({8, 8, 8}, 4, Layout::parse(pairs[i].first, 3), Layout::parse(pairs[i].second, 3),
                             {PlannerKind::greedy, false});
    int collectives = 0;
    for (const auto& s : plan->steps) collectives += s.collective.has_value();
    EXPECT_EQ(collectives, counts[i]) << pairs[i].first << " -> " << pairs[i].second;
  }
}

TEST(Planner, IllegalRequestsAreClearErrors) {
  Planner p = make_planner({2, 2});
  auto plan = [&](const std::string& a, const std::string& b, PlanOptions o = {}) {
    return message_of([&] { p.plan({8, 8}, 4, Layout::parse(a, 2), Layout::parse(b, 2), o); });
  };
  EXPECT_TRUE(contains(plan("RR", "P(sum)R"), "A target may be Partial only where the source already is"));
  EXPECT_TRUE(contains(plan("P(sum)R", "P(avg)R"), "would become P(avg) from P(sum)"));
  EXPECT_TRUE(contains(plan("S(0)[1]S(0)[0]", "RR", {PlannerKind::greedy, true}), "default shard orders only"));
  EXPECT_TRUE(contains(plan("_S(0, 2)S(0)", "RR", {PlannerKind::greedy, true}), "does not handle strided shards"));
  EXPECT_TRUE(contains(plan("S(2)R", "RR"), "the tensor has 2 dims"));
  EXPECT_TRUE(contains(message_of([] { parse_planner_kind("astar"); }), "unknown planner 'astar'"));
  EXPECT_EQ(p.plan({8, 8}, 4, Layout::parse("P(max)R", 2), Layout::parse("P(max)S(1)", 2))->steps.size(), 1u);
}

TEST(Planner, PlansAreCachedAndChained) {
  Planner p = make_planner({2, 2, 2});
  const Layout a = Layout::parse("_S(0, 2)S(0)P(sum)", 3), b = Layout::parse("S(1)RS(0)", 3);
  const auto first = p.plan({13, 3}, 4, a, b);
  EXPECT_EQ(p.plan({13, 3}, 4, a, b).get(), first.get());
  EXPECT_EQ(p.cache_size(), 1u);
  ASSERT_FALSE(first->steps.empty());
  EXPECT_EQ(first->steps.front().before, a);
  EXPECT_EQ(first->steps.back().after, b);
  for (size_t i = 1; i < first->steps.size(); ++i) EXPECT_EQ(first->steps[i].before, first->steps[i - 1].after);
}

TEST(Planner, MergesAdjacentSameCollectivesOnlyWhenEven) {
  Planner p = make_planner({2, 2, 2});
  const auto merged = p.plan({8, 8}, 4, Layout::parse("S(0)S(0)S(0)", 3), Layout::parse("RRR", 3));
  ASSERT_EQ(merged->steps.size(), 1u);
  EXPECT_EQ(merged->steps[0].mesh_dims, (std::vector<int>{0, 1, 2}));
  const auto unmerged =
      p.plan({8, 8}, 4, Layout::parse("S(0)S(0)S(0)", 3), Layout::parse("RRR", 3), {PlannerKind::dijkstra, false});
  EXPECT_EQ(unmerged->steps.size(), 3u);
  EXPECT_LT(merged->total_cost_us, unmerged->total_cost_us);
  // 13 rows do not split evenly over 8: nested chunks differ from a flat split.
  EXPECT_EQ(p.plan({13, 8}, 4, Layout::parse("S(0)S(0)S(0)", 3), Layout::parse("RRR", 3))->steps.size(), 3u);
  // Even dim, but an outer strided shard leaves uneven pieces (8 -> 5 and 3).
  EXPECT_EQ(p.plan({5, 8}, 4, Layout::parse("_S(1, 3)S(1)S(1)", 3), Layout::parse("RRR", 3))->steps.size(), 3u);
  const auto reduce = p.plan({13, 8}, 4, Layout::parse("P(sum)P(sum)R", 3), Layout::parse("RRR", 3));
  ASSERT_EQ(reduce->steps.size(), 1u);  // all_reduce merges whatever the shape
  EXPECT_EQ(reduce->steps[0].collective, comm::OpType::all_reduce);
}

// Optimality: on every pair of a 2x2x2 set (R, S(0), S(1), P(sum) on each
// mesh dim, every shard order) the Dijkstra plan costs exactly the shortest
// distance found by Floyd-Warshall over the whole reachable state space.
TEST(Planner, OptimalAgainstExhaustiveAllPairsSearch) {
  Planner p = make_planner({2, 2, 2});
  const Shape shape{16, 6};
  const std::vector<Placement> choices{Placement::replicate(), Placement::shard(0), Placement::shard(1),
                                       Placement::partial()};
  std::vector<Layout> set;
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 4; ++b)
      for (int c = 0; c < 4; ++c) {
        Layout base = Layout::from_placements({choices[a], choices[b], choices[c]});
        std::vector<Layout> variants{base};
        for (int d = 0; d < 2; ++d) {
          std::vector<Layout> grown;
          for (const Layout& v : variants) {
            std::vector<int> dims = v.shard_sequence(d);
            std::sort(dims.begin(), dims.end());
            do {
              Layout w = v;
              for (size_t k = 0; k < dims.size(); ++k) w.order[dims[k]] = static_cast<int>(k);
              grown.push_back(w);
            } while (std::next_permutation(dims.begin(), dims.end()));
          }
          variants = grown;
        }
        set.insert(set.end(), variants.begin(), variants.end());
      }
  // Two edge sets: R->P(sum) exists only when the target holds P(sum).
  for (bool partial_target : {false, true}) {
    const Layout edge_probe = partial_target ? Layout::parse("P(sum)RR", 3) : Layout::parse("RRR", 3);
    std::map<std::string, int> id;
    std::vector<Layout> states;
    auto intern = [&](const Layout& l) {
      auto [it, fresh] = id.emplace(l.to_string(), static_cast<int>(states.size()));
      if (fresh) states.push_back(l);
      return it->second;
    };
    for (const Layout& l : set) intern(l);
    // The closure: states grows while it is walked, so every reachable state is in.
    for (size_t i = 0; i < states.size(); ++i)
      for (const Layout& n : p.neighbours(states[i], 2, edge_probe)) intern(n);
    const size_t n = states.size();
    std::vector<double> dist(n * n, std::numeric_limits<double>::infinity());
    for (size_t i = 0; i < n; ++i) {
      dist[i * n + i] = 0;
      for (const Layout& nb : p.neighbours(states[i], 2, edge_probe)) {
        const size_t j = static_cast<size_t>(id.at(nb.to_string()));
        dist[i * n + j] = std::min(dist[i * n + j], p.step_cost(shape, 4, states[i], nb));
      }
    }
    for (size_t k = 0; k < n; ++k)
      for (size_t i = 0; i < n; ++i)
        for (size_t j = 0; j < n; ++j) dist[i * n + j] = std::min(dist[i * n + j], dist[i * n + k] + dist[k * n + j]);
    int checked = 0;
    for (const Layout& src : set)
      for (const Layout& dst : set) {
        if (dst.has_partial() != partial_target) continue;
        bool legal = true;
        for (int m = 0; m < 3; ++m) legal &= !dst.placements[m].is_partial() || src.placements[m] == dst.placements[m];
        if (!legal) continue;
        const auto plan = p.plan_uncached(shape, 4, src, dst, {PlannerKind::dijkstra, false});
        const double best = dist[id.at(src.to_string()) * n + id.at(dst.to_string())];
        ASSERT_NEAR(plan.total_cost_us, best, 1e-9) << src.to_string() << " -> " << dst.to_string();
        ++checked;
      }
    std::printf("optimality: %d pairs checked (partial targets: %d), %zu states\n", checked, partial_target, n);
    EXPECT_GT(checked, partial_target ? 100 : 500);
  }
}

namespace {

// Every layout of a mesh over a 2-d tensor (shards applied in mesh-dim order).
std::vector<Layout> default_order_layouts(int mesh_ndim) {
  const std::vector<Placement> choices{Placement::replicate(), Placement::shard(0), Placement::shard(1),
                                       Placement::partial()};
  std::vector<std::vector<Placement>> all{{}};
  for (int m = 0; m < mesh_ndim; ++m) {
    std::vector<std::vector<Placement>> grown;
    for (const auto& prefix : all)
      for (const Placement& c : choices) {
        grown.push_back(prefix);
        grown.back().push_back(c);
      }
    all = std::move(grown);
  }
  std::vector<Layout> out;
  for (auto& ps : all) out.push_back(Layout::from_placements(std::move(ps)));
  return out;
}

bool legal_pair(const Layout& src, const Layout& dst) {
  for (int m = 0; m < src.mesh_ndim(); ++m)
    if (dst.placements[m].is_partial() && !(src.placements[m] == dst.placements[m])) return false;
  return true;
}

}  // namespace

TEST(Planner, LowerBoundNeverExceedsThePlan) {
  Planner p = make_planner({2, 4, 2});
  const Shape shape{64, 24};
  int checked = 0, informative = 0;
  for (const Layout& src : default_order_layouts(3))
    for (const Layout& dst : default_order_layouts(3)) {
      if (!legal_pair(src, dst)) continue;
      const double bound = p.lower_bound_us(shape, 4, src, dst);
      const double cost = p.plan_uncached(shape, 4, src, dst).total_cost_us;
      ASSERT_LE(bound, cost) << src.to_string() << " -> " << dst.to_string();
      if (src == dst) {
        EXPECT_EQ(bound, 0) << src.to_string();
      }
      informative += bound > 0.5 * cost;
      ++checked;
    }
  EXPECT_GT(checked, 2000);
  EXPECT_GT(informative, checked / 4);  // the bound prunes: it is often close
}

TEST(Planner, PrunedSearchFindsTheSamePlanAsTheFullOne) {
  // Four mesh dims, the outer two across hosts (slower links): every shard
  // order, and tensors small enough that launches decide and large enough
  // that bandwidth does. Pruning may skip states, never change the answer.
  Planner p = make_planner({2, 4, 2, 8});
  const std::vector<Placement> choices{Placement::replicate(), Placement::shard(0), Placement::shard(1),
                                       Placement::shard(2), Placement::partial()};
  std::vector<Layout> layouts;
  for (int code = 0; code < 625; ++code) {
    std::vector<Placement> ps;
    for (int m = 0, c = code; m < 4; ++m, c /= 5) ps.push_back(choices[static_cast<size_t>(c % 5)]);
    Layout l = Layout::from_placements(std::move(ps));
    layouts.push_back(l);
    const std::vector<int> dims = l.shard_sequence(0);
    if (dims.size() >= 2) {  // the same shards of dim 0 in the other order
      for (size_t k = 0; k < dims.size(); ++k) l.order[dims[k]] = static_cast<int>(dims.size() - 1 - k);
      layouts.push_back(l);
    }
  }
  std::mt19937 rng(37);
  std::uniform_int_distribution<size_t> pick(0, layouts.size() - 1);
  int checked = 0;
  for (const Shape& shape : {Shape{16, 8, 8}, Shape{4096, 1024, 512}})
    for (int i = 0; i < 1500; ++i) {
      const Layout& src = layouts[pick(rng)];
      const Layout& dst = layouts[pick(rng)];
      if (!legal_pair(src, dst)) continue;
      const Plan full = p.plan_uncached(shape, 2, src, dst, {.prune = false});
      const Plan pruned = p.plan_uncached(shape, 2, src, dst);
      ASSERT_EQ(pruned.trace(src), full.trace(src)) << src.to_string() << " -> " << dst.to_string();
      ASSERT_EQ(pruned.total_cost_us, full.total_cost_us);
      ++checked;
    }
  EXPECT_GT(checked, 1500);
}

TEST(Planner, OneRankMeshDimLeftReplicatedCostsTheSame) {
  // A one-rank dim Replicate at both ends is not searched: the plans on
  // 2 x 1 x 2 cost what they do on 2 x 2, with the same collectives
  // (unmerged: merging needs adjacent mesh dims, which the one-rank dim parts).
  Planner with_one = make_planner({2, 1, 2}), without = make_planner({2, 2});
  const Shape shape{16, 6};
  int checked = 0;
  for (const Layout& src : default_order_layouts(2))
    for (const Layout& dst : default_order_layouts(2)) {
      if (!legal_pair(src, dst)) continue;
      auto widen = [](const Layout& l) {
        return Layout::from_placements({l.placements[0], Placement::replicate(), l.placements[1]});
      };
      const PlanOptions unmerged{PlannerKind::dijkstra, false};
      const auto a = with_one.plan_uncached(shape, 4, widen(src), widen(dst), unmerged);
      const auto b = without.plan_uncached(shape, 4, src, dst, unmerged);
      ASSERT_NEAR(a.total_cost_us, b.total_cost_us, 1e-9) << src.to_string() << " -> " << dst.to_string();
      std::vector<std::optional<comm::OpType>> ca, cb;
      for (const auto& s : a.steps)
        if (s.collective) ca.push_back(s.collective);
      for (const auto& s : b.steps)
        if (s.collective) cb.push_back(s.collective);
      EXPECT_EQ(ca, cb) << src.to_string() << " -> " << dst.to_string();
      ++checked;
    }
  EXPECT_GT(checked, 100);
}
