#include "parallel/plan.h"

#include "core/error.h"

namespace meshtrain::parallel {

sharding::DeviceMesh make_mesh(const ParallelConfig& c, int world_size) {
  MT_CHECK(c.dp_replicate >= 1, "parallel.dp_replicate must be >= 1, got {}", c.dp_replicate);
  MT_CHECK(c.tp >= 1, "parallel.tp must be >= 1, got {}", c.tp);
  MT_CHECK(c.dp_shard >= 1 || c.dp_shard == -1, "parallel.dp_shard must be >= 1 or -1 (the ranks left over), got {}",
           c.dp_shard);
  MT_CHECK(c.tp == 1, "parallel.tp = {}: tensor parallelism is not implemented yet; use tp = 1", c.tp);
  MT_CHECK(!c.sequence_parallel, "parallel.sequence_parallel needs parallel.tp > 1");
  MT_CHECK(!c.loss_parallel, "parallel.loss_parallel needs parallel.tp > 1");
  MT_CHECK(c.reshard_after_forward,
           "parallel.reshard_after_forward = false (keeping gathered weights for backward) is not implemented yet");
  int64_t dp_shard = c.dp_shard;
  if (dp_shard == -1) {
    MT_CHECK(world_size % (c.dp_replicate * c.tp) == 0,
             "{} ranks do not divide by parallel.dp_replicate ({}) x parallel.tp ({})", world_size, c.dp_replicate, c.tp);
    dp_shard = world_size / (c.dp_replicate * c.tp);
  }
  MT_CHECK(c.dp_replicate * dp_shard * c.tp == world_size,
           "parallel.dp_replicate ({}) x parallel.dp_shard ({}) x parallel.tp ({}) = {}, but the job has {} ranks",
           c.dp_replicate, dp_shard, c.tp, c.dp_replicate * dp_shard * c.tp, world_size);
  return sharding::DeviceMesh({static_cast<int>(c.dp_replicate), static_cast<int>(dp_shard), static_cast<int>(c.tp)},
                              {"dp_replicate", "dp_shard", "tp"});
}

StepLayouts data_parallel_layouts(const sharding::DeviceMesh& mesh, const graph::Graph& g, const StepRoles& roles) {
  using sharding::Layout;
  using sharding::Placement;
  const int replicate = mesh.dim_index("dp_replicate"), shard = mesh.dim_index("dp_shard");
  std::vector<Placement> batch(static_cast<size_t>(mesh.ndim())), param(static_cast<size_t>(mesh.ndim()));
  batch[static_cast<size_t>(replicate)] = Placement::shard(0);
  batch[static_cast<size_t>(shard)] = Placement::shard(0);
  param[static_cast<size_t>(shard)] = Placement::shard(0);
  const Layout batch_layout = Layout::from_placements(batch), param_layout = Layout::from_placements(param);
  const Layout replicated = Layout::from_placements(std::vector<Placement>(static_cast<size_t>(mesh.ndim())));
  StepLayouts out;
  for (graph::ValueId v : roles.batch_inputs) out.given[v] = batch_layout;
  // A parameter of rank 0 (none today) could not be sharded: it stays replicated.
  auto layout_of_param = [&](graph::ValueId p) { return g.value(p).info.shape.rank() > 0 ? param_layout : replicated; };
  for (graph::ValueId p : roles.parameters) out.given[p] = layout_of_param(p);
  for (const auto& [state, p] : roles.states) out.given[state] = layout_of_param(p);
  for (graph::ValueId v : roles.replicated_outputs) out.deliver[v] = replicated;
  for (const auto& [updated, buffer] : roles.updates) out.deliver[updated] = out.given.at(buffer);
  return out;
}

}  // namespace meshtrain::parallel
