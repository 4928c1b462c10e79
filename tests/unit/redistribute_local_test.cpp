// Redistribution on the local backend (threads): every legal pair of a
// layout set on a 2x2 mesh, uneven shapes. The mpirun test covers more.
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
