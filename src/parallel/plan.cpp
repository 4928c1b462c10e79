#include "parallel/plan.h"

#include <string>

#include "core/error.h"

namespace meshtrain::parallel {

sharding::DeviceMesh make_mesh(const ParallelConfig& c, int world_size) {
  MT_CHECK(c.dp_replicate >= 1, "parallel.dp_replicate must be >= 1, got {}", c.dp_replicate);
  MT_CHECK(c.tp >= 1, "parallel.tp must be >= 1, got {}", c.tp);
  MT_CHECK(c.dp_shard >= 1 || c.dp_shard == -1, "parallel.dp_shard must be >= 1 or -1 (the ranks left over), got {}",
           c.dp_shard);
  MT_CHECK(!c.sequence_parallel || c.tp > 1, "parallel.sequence_parallel needs parallel.tp > 1");
  MT_CHECK(!c.loss_parallel || c.tp > 1, "parallel.loss_parallel needs parallel.tp > 1");
  // Products checked, so that degrees whose product overflows (2^62 + 1 each) are never taken for a fit.
  int64_t others = 0;
  const bool others_overflow = __builtin_mul_overflow(c.dp_replicate, c.tp, &others);
  int64_t dp_shard = c.dp_shard;
  if (dp_shard == -1) {
    MT_CHECK(!others_overflow && world_size % others == 0,
             "{} ranks do not divide by parallel.dp_replicate ({}) x parallel.tp ({})", world_size, c.dp_replicate,
             c.tp);
    dp_shard = world_size / others;
  }
  int64_t product = 0;
  const bool overflow = others_overflow || __builtin_mul_overflow(others, dp_shard, &product);
  MT_CHECK(!overflow && product == world_size,
           "parallel.dp_replicate ({}) x parallel.dp_shard ({}) x parallel.tp ({}) = {}, but the job has {} ranks",
           c.dp_replicate, dp_shard, c.tp, overflow ? std::string("more than 2^63") : std::to_string(product),
           world_size);
  return sharding::DeviceMesh({static_cast<int>(c.dp_replicate), static_cast<int>(dp_shard), static_cast<int>(c.tp)},
                              {"dp_replicate", "dp_shard", "tp"});
}

StepLayouts step_layouts(const sharding::DeviceMesh& mesh, const graph::Graph& g, const StepRoles& roles,
                         const ParallelConfig& config) {
  using sharding::Layout;
  using sharding::Placement;
  const auto replicate = static_cast<size_t>(mesh.dim_index("dp_replicate")),
             shard = static_cast<size_t>(mesh.dim_index("dp_shard")), tp = static_cast<size_t>(mesh.dim_index("tp"));
  const auto ndim = static_cast<size_t>(mesh.ndim());
  // A mesh dim of one rank splits nothing: its placement is Replicate, so
  // layouts read as what they do.
  auto split = [&](size_t mesh_dim, int tensor_dim) {
    return mesh.size(static_cast<int>(mesh_dim)) > 1 ? Placement::shard(tensor_dim) : Placement::replicate();
  };
  std::vector<Placement> batch(ndim);
  batch[replicate] = split(replicate, 0);
  batch[shard] = split(shard, 0);
  const Layout batch_layout = Layout::from_placements(batch);
  const Layout replicated = Layout::from_placements(std::vector<Placement>(ndim));
  auto layout_of_param = [&](graph::ValueId p) {
    if (g.value(p).info.shape.rank() == 0) return replicated;  // nothing to shard
    std::vector<Placement> placements(ndim);
    placements[shard] = split(shard, 0);
    const auto tp_dim = roles.tp_dims.find(p);
    if (tp_dim != roles.tp_dims.end()) placements[tp] = split(tp, tp_dim->second);
    Layout l = Layout::from_placements(std::move(placements));
    if (l.shard_sequence(0).size() == 2) {
      l.order[tp] = 0;  // tp splits dim 0 first, then dp_shard each part
      l.order[shard] = 1;
    }
    return l;
  };
  StepLayouts out;
  for (graph::ValueId v : roles.batch_inputs) out.given[v] = batch_layout;
  // A pinned activation, and its gradient in the backward.
  auto pin = [&](graph::ValueId v, const Layout& l, const Layout& gradient) {
    out.given[v] = l;
    if (const auto it = roles.gradient_of.find(v); it != roles.gradient_of.end()) out.given[it->second] = gradient;
  };
  std::vector<Placement> residual = batch;
  if (config.sequence_parallel) residual[tp] = split(tp, 1);
  const Layout residual_layout = Layout::from_placements(residual);
  for (graph::ValueId v : roles.residual_stream) pin(v, residual_layout, residual_layout);
  for (graph::ValueId v : roles.block_inputs) pin(v, batch_layout, residual_layout);
  if (config.loss_parallel) {
    std::vector<Placement> vocab_split = batch;  // rows: the batch's
    vocab_split[tp] = split(tp, 1);
    for (graph::ValueId v : roles.logits)
      pin(v, Layout::from_placements(vocab_split), Layout::from_placements(vocab_split));
  }
  for (graph::ValueId p : roles.parameters) out.given[p] = layout_of_param(p);
  for (const auto& [state, p] : roles.states) out.given[state] = layout_of_param(p);
  for (graph::ValueId v : roles.replicated_outputs) out.deliver[v] = replicated;
  // FSDP's gradients: each parameter's reduced once, into its parameter's
  // layout (reduce_scatter over dp_shard, all_reduce over dp_replicate),
  // where the norm, the clipping and AdamW then read it. The clipped
  // gradient AdamW reads stays there too (computed on the same shard,
  // never gathered for the update).
  for (graph::ValueId p : roles.parameters) {
    if (const auto it = roles.gradient_of.find(p); it != roles.gradient_of.end())
      out.given[it->second] = out.given.at(p);
    if (const auto it = roles.applied_gradient_of.find(p); it != roles.applied_gradient_of.end())
      out.given[it->second] = out.given.at(p);
  }
  // A parameter's compute-dtype copy lies like the parameter (cast on the
  // shard, gathered in bf16). Its gradient is reduced in that dtype when
  // asked; otherwise it stays a pending sum over data parallel until it is
  // widened, and the parameter's gradient is reduced in the parameter's
  // dtype (propagation would reduce the narrower one).
  auto pending_over_dp = [&](const Layout& l) {
    std::vector<Placement> placements = l.placements;
    for (size_t d : {replicate, shard})
      if (mesh.size(static_cast<int>(d)) > 1) placements[d] = Placement::partial();
    return Layout::from_placements(std::move(placements));
  };
  for (const auto& [copy, p] : roles.copies) {
    const Layout& param = out.given.at(p);
    out.given[copy] = param;
    if (const auto it = roles.gradient_of.find(copy); it != roles.gradient_of.end())
      out.given[it->second] = roles.reduce_copies_in_compute_dtype ? param : pending_over_dp(param);
  }
  for (const auto& [updated, buffer] : roles.updates) out.deliver[updated] = out.given.at(buffer);
  return out;
}

std::optional<int> llama_tp_dim(std::string_view name) {
  auto has = [&](std::string_view part) { return name.find(part) != std::string_view::npos; };
  for (std::string_view by_output : {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head",
                                     "shared_experts.w1", "shared_experts.w3"})
    if (has(by_output)) return 0;
  for (std::string_view by_input : {"o_proj", "down_proj", "shared_experts.w2"})
    if (has(by_input)) return 1;
  return std::nullopt;
}

}  // namespace meshtrain::parallel
