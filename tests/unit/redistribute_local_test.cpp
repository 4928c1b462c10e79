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

// Expert parallelism's ragged all_to_all (sharding::RaggedRows): rows [2
// blocks, 4 groups, 5, 3] of which each block of 5 rows carries data in
// its first 0 to 5 rows; between S(1) and S(0) over 2 ranks, both ways, on
// a (2, 2) mesh's second dim. Only the data rows travel: the padding rows,
// filled with garbage on the sending side, arrive as zeros, and the data
// rows as the whole tensor's.
TEST(RedistributeLocal, RaggedAllToAllSendsOnlyTheDataRows) {
  const sharding::DeviceMesh mesh({2, 2});
  const int64_t padding = 9, m = 5;
  const Shape rows_shape{2, 4, m, 3}, experts_shape{2, 4, m};
  Tensor rows = Tensor::zeros(rows_shape, DType::f32), garbage = Tensor::zeros(rows_shape, DType::f32);
  Tensor experts = Tensor::zeros(experts_shape, DType::i64);
  for (int64_t block = 0; block < 8; ++block) {
    const int64_t data = (block * 3) % (m + 1);  // 0, 3, 0, 3, ... and 5s: empty, partial and full blocks
    for (int64_t r = 0; r < m; ++r) {
      experts.set(block * m + r, r < data ? static_cast<double>(block % 4) : static_cast<double>(padding));
      for (int64_t x = 0; x < 3; ++x) {
        const int64_t i = (block * m + r) * 3 + x;
        rows.set(i, r < data ? 1.0 + static_cast<double>(i) : 0.0);
        garbage.set(i, r < data ? 1.0 + static_cast<double>(i) : -7.0);
      }
    }
  }
  comm::GroupOptions options;
  options.timeout = std::chrono::seconds(20);
  comm::LocalWorld world(4, options);
  std::atomic<int> checked{0};
  world.run([&](comm::ProcessGroup& pg) {
    sharding::MeshGroups groups(mesh, pg.shared_from_this());
    sharding::Planner planner(mesh, sharding::CostModel::for_mesh(mesh));
    const auto coord = groups.coordinate();
    for (const auto& [from, to] : {std::pair{"RS(1)", "RS(0)"}, std::pair{"RS(0)", "RS(1)"}}) {
      const auto before = sharding::Layout::parse(from, 2), after = sharding::Layout::parse(to, 2);
      const auto plan = planner.plan(rows_shape, 4, before, after);
      ASSERT_EQ(plan->steps.size(), 1u);
      const sharding::PlanStep& step = plan->steps[0];
      ASSERT_EQ(step.collective, comm::OpType::all_to_all);
      const Tensor in = sharding::local_piece(garbage, before, mesh, coord);
      const Tensor experts_before = sharding::local_piece(experts, before, mesh, coord);
      const Tensor experts_after = sharding::local_piece(experts, after, mesh, coord);
      const Tensor want = sharding::local_piece(rows, after, mesh, coord);
      Tensor out = Tensor::empty(want.shape(), DType::f32);
      const Tensor buffer =
          Tensor::empty({sharding::step_buffers(rows_shape, step, mesh, coord).buffer_elements}, DType::f32);
      const sharding::RaggedRows ragged{&experts_before, &experts_after, padding};
      sharding::start_step(in, out, buffer, rows_shape, step, groups, &ragged).complete();
      for (int64_t i = 0; i < want.numel(); ++i)
        ASSERT_EQ(out.get(i), want.get(i)) << from << " -> " << to << ", rank " << pg.rank() << ", element " << i;
      ++checked;
    }
  });
  EXPECT_EQ(checked.load(), 8);
}
