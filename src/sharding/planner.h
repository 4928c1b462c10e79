// The redistribution planner: the cheapest sequence of collectives that turns
// one Layout into another, by Dijkstra over layout states (PyTorch's
// DTensorRedistributePlanner, same edges and tie-breaking), or PyTorch's
// greedy planner for comparison. Plans are cached.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/types.h"
#include "core/shape.h"
#include "sharding/cost_model.h"
#include "sharding/layout.h"

namespace meshtrain::sharding {

struct PlanStep {
  // One mesh dim, or several adjacent ones merged into one collective over
  // their flattened group (ascending; group rank row-major over them).
  std::vector<int> mesh_dims;
  Placement from, to;
  // all_gather, reduce_scatter, all_reduce or all_to_all; nullopt for a
  // local step (a chunk or a Partial taken locally, no communication).
  std::optional<comm::OpType> collective;
  double bytes = 0;  // the collective's buffer per rank (nccl-tests convention); 0 for local steps
  double cost_us = 0;
  Layout before, after;
};

struct Plan {
  std::vector<PlanStep> steps;
  double total_cost_us = 0;
  // PyTorch's debug form: layouts joined by "->" ("-->" into a merged step).
  std::string trace(const Layout& src) const;
};

enum class PlannerKind : uint8_t { dijkstra, greedy };
PlannerKind parse_planner_kind(std::string_view name);

struct PlanOptions {
  PlannerKind kind = PlannerKind::dijkstra;
  bool merge = true;  // merge consecutive same collectives on adjacent mesh dims
  // Dijkstra skips states that cannot lie on a cheapest path (the same plan,
  // sooner); false searches them all, for checking that it is the same.
  bool prune = true;
};

class Planner {
 public:
  Planner(DeviceMesh mesh, CostModel model);

  // Cached. Throws InvalidArgument for illegal requests (a Partial target the
  // source does not already have on that mesh dim, mixed reduce ops, a tensor
  // dim out of range, greedy with non-default shard orders).
  std::shared_ptr<const Plan> plan(const Shape& global_shape, size_t element_size, const Layout& src, const Layout& dst,
                                   PlanOptions options = {});
  Plan plan_uncached(const Shape& global_shape, size_t element_size, const Layout& src, const Layout& dst,
                     PlanOptions options = {}) const;

  // A lower bound of plan(...)->total_cost_us, without searching: one
  // collective's launch if any is needed, and the bandwidth of the
  // all_gathers that bring each rank from its source bytes to its target
  // bytes (nothing else raises them). For pruning what is not worth planning.
  double lower_bound_us(const Shape& global_shape, size_t element_size, const Layout& src, const Layout& dst) const;

  // Cost of one step between layouts that differ on exactly one mesh dim
  // (infinity when no single collective does it). For checks and tests.
  double step_cost(const Shape& global_shape, size_t element_size, const Layout& from, const Layout& to) const;
  // Every layout one step away from `from` (the planner's edges, in order).
  std::vector<Layout> neighbours(const Layout& from, int tensor_rank, const Layout& dst) const;

  const DeviceMesh& mesh() const { return mesh_; }
  const CostModel& cost_model() const { return model_; }
  size_t cache_size() const;

 private:
  struct CacheKey {
    Shape shape;
    size_t element_size;
    Layout src, dst;
    PlanOptions options;
    bool operator==(const CacheKey& o) const;
  };
  struct CacheKeyHash {
    size_t operator()(const CacheKey& k) const;
  };

  DeviceMesh mesh_;
  CostModel model_;
  mutable std::mutex mu_;
  std::unordered_map<CacheKey, std::shared_ptr<const Plan>, CacheKeyHash> cache_;
};

// The planner of `mesh` (with CostModel::for_mesh) that every caller in the
// process shares, so that compiling many steps on one mesh (autoplan's
// search, a pipeline's stages) plans each redistribution once.
std::shared_ptr<Planner> shared_planner(const DeviceMesh& mesh);

}  // namespace meshtrain::sharding
