// Redistribution under mpirun, one process per rank: every legal pair of a
// generated layout set, on meshes (4) and (2,2) with 4 ranks and (2,2,2)
// with 8, for tensors of uneven shapes, against slicing the global tensor.
#include <gtest/gtest.h>

#include <set>

#include "mpi_world.h"
#include "redistribute_checks.h"

using namespace meshtrain;

namespace {

void check_mesh(const std::vector<int>& mesh_shape, size_t layouts_per_rank,
                const std::vector<std::vector<int64_t>>& shapes) {
  comm::ProcessGroup& world = mtest::mpi_world();
  const sharding::DeviceMesh mesh(mesh_shape);
  sharding::MeshGroups groups(mesh, world.shared_from_this());
  sharding::Planner planner(mesh, sharding::CostModel::for_mesh(mesh));
  int pairs = 0;
  for (const auto& shape : shapes) {
    const auto layouts = mtest::layout_set(mesh.ndim(), static_cast<int>(shape.size()), layouts_per_rank);
    // The set holds every placement kind on every mesh dim, and both orders.
    std::set<std::pair<int, std::string>> kinds;
    bool reordered = false;
    for (const auto& l : layouts) {
      for (int m = 0; m < mesh.ndim(); ++m) kinds.emplace(m, l.placements[m].to_string());
      for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
        const auto seq = l.shard_sequence(d);
        reordered |= seq.size() > 1 && seq.front() > seq.back();
      }
    }
    const size_t kinds_per_dim = 1 + shape.size() + 2 + 3;  // R, S(d) per tensor dim, two strided, three partials
    EXPECT_EQ(kinds.size(), kinds_per_dim * static_cast<size_t>(mesh.ndim())) << mesh.describe();
    if (mesh.ndim() > 1) {
      EXPECT_TRUE(reordered) << mesh.describe();
    }
    for (const auto& src : layouts)
      for (const auto& dst : layouts) {
        if (!mtest::legal_pair(src, dst)) continue;
        ASSERT_TRUE(mtest::check_redistribute(groups, planner, shape, src, dst));
        ++pairs;
      }
  }
  if (world.rank() == 0)
    std::printf("mesh %s: %d layout pairs redistributed exactly\n", mesh.describe().c_str(), pairs);
}

}  // namespace

TEST(RedistributeMpi, EveryPairOfALayoutSet) {
  const int n = mtest::mpi_world().size();
  const std::vector<std::vector<int64_t>> shapes{{5, 8}, {13, 3}, {31, 13, 11}};
  if (n == 4) {
    check_mesh({4}, 100, shapes);
    check_mesh({2, 2}, 200, shapes);
  } else if (n == 8) {
    check_mesh({2, 2, 2}, 90, shapes);
  } else {
    GTEST_SKIP() << "runs with 4 or 8 ranks";
  }
}
