// Redistribution on the local backend (threads): every legal pair of a
// layout set on a 2x2 mesh, uneven shapes; a 2x1 mesh (a one-rank dim). The
// mpirun test covers more.
#include <gtest/gtest.h>

#include <atomic>

#include "comm/local_backend.h"
#include "redistribute_checks.h"

using namespace meshtrain;

TEST(RedistributeLocal, EveryPairOn2x2) {
  const sharding::DeviceMesh mesh({2, 2});
  const auto layouts = mtest::layout_set(2, 2, 1000);
  comm::GroupOptions options;
  options.timeout = std::chrono::seconds(20);
  comm::LocalWorld world(4, options);
  std::atomic<int> pairs{0};
  world.run([&](comm::ProcessGroup& pg) {
    sharding::MeshGroups groups(mesh, pg.shared_from_this());
    sharding::Planner planner(mesh, sharding::CostModel::for_mesh(mesh));
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{5, 8}, std::vector<int64_t>{13, 3}})
      for (const auto& src : layouts)
        for (const auto& dst : layouts) {
          if (!mtest::legal_pair(src, dst)) continue;
          if (!mtest::check_redistribute(groups, planner, shape, src, dst)) return;
          if (pg.rank() == 0) ++pairs;
        }
  });
  std::printf("redistributed %d layout pairs on a 2x2 mesh (%zu layouts)\n", pairs.load(), layouts.size());
  EXPECT_GT(pairs.load(), 1000);
}

TEST(RedistributeLocal, PairsOn2x2x2) {
  const sharding::DeviceMesh mesh({2, 2, 2});
  comm::GroupOptions options;
  options.timeout = std::chrono::seconds(20);  // a failing rank must not leave the others waiting long
  comm::LocalWorld world(8, options);
  std::atomic<int> pairs{0};
  world.run([&](comm::ProcessGroup& pg) {
    sharding::MeshGroups groups(mesh, pg.shared_from_this());
    sharding::Planner planner(mesh, sharding::CostModel::for_mesh(mesh));
    for (const std::vector<int64_t>& shape :
         {std::vector<int64_t>{5, 8}, std::vector<int64_t>{13, 3}, std::vector<int64_t>{31, 13, 11}}) {
      const auto layouts = mtest::layout_set(3, static_cast<int>(shape.size()), 90);
      for (const auto& src : layouts)
        for (const auto& dst : layouts) {
          if (!mtest::legal_pair(src, dst)) continue;
          if (!mtest::check_redistribute(groups, planner, shape, src, dst)) return;
          if (pg.rank() == 0) ++pairs;
        }
    }
  });
  EXPECT_GT(pairs.load(), 1000);
}

// A one-rank mesh dim holds the whole tensor under any placement: every pair
// redistributes correctly, and no step on that dim is a collective or costs
// anything.
TEST(RedistributeLocal, OneRankMeshDimEmitsNothing) {
  const sharding::DeviceMesh mesh({2, 1});
  const auto layouts = mtest::layout_set(2, 2, 400);
  comm::GroupOptions options;
  options.timeout = std::chrono::seconds(20);
  comm::LocalWorld world(2, options);
  std::atomic<int> pairs{0}, one_rank_steps{0};
  world.run([&](comm::ProcessGroup& pg) {
    sharding::MeshGroups groups(mesh, pg.shared_from_this());
    sharding::Planner planner(mesh, sharding::CostModel::for_mesh(mesh));
    const std::vector<int64_t> shape{5, 8};
    for (const auto& src : layouts)
      for (const auto& dst : layouts) {
        if (!mtest::legal_pair(src, dst)) continue;
        if (!mtest::check_redistribute(groups, planner, shape, src, dst)) return;
        if (pg.rank() != 0) continue;
        ++pairs;
        for (const auto& step : planner.plan(Shape(shape), 4, src, dst)->steps)
          if (step.mesh_dims == std::vector<int>{1}) {
            ++one_rank_steps;
            EXPECT_FALSE(step.collective.has_value()) << src.to_string() << " -> " << dst.to_string();
            EXPECT_EQ(step.cost_us, 0.0);
            EXPECT_EQ(step.bytes, 0.0);
          }
      }
  });
  EXPECT_GT(pairs.load(), 100);
  EXPECT_GT(one_rank_steps.load(), 50);
}
