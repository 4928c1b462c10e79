#include "parallel/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <string>

#include "core/error.h"

namespace meshtrain::parallel {

sharding::DeviceMesh make_mesh(const ParallelConfig& c, int world_size) {
  MT_CHECK(c.dp_replicate >= 1, "parallel.dp_replicate must be >= 1, got {}", c.dp_replicate);
  MT_CHECK(c.tp >= 1, "parallel.tp must be >= 1, got {}", c.tp);
  MT_CHECK(c.cp >= 1, "parallel.cp must be >= 1, got {}", c.cp);
  MT_CHECK(c.dp_shard >= 1 || c.dp_shard == -1, "parallel.dp_shard must be >= 1 or -1 (the ranks left over), got {}",
           c.dp_shard);
  MT_CHECK(!c.sequence_parallel || c.tp > 1, "parallel.sequence_parallel needs parallel.tp > 1");
  MT_CHECK(!c.loss_parallel || c.tp > 1, "parallel.loss_parallel needs parallel.tp > 1");
  MT_CHECK(!c.async_tp || (c.tp > 1 && c.sequence_parallel),
           "parallel.async_tp needs parallel.tp > 1 and parallel.sequence_parallel = true (it overlaps sequence "
           "parallelism's all_gathers and reduce_scatters with their GEMMs; tp {}, sequence_parallel {})",
           c.tp, c.sequence_parallel);
  MT_CHECK(!c.async_tp || c.cp == 1,
           "parallel.async_tp does not compose with parallel.cp {} yet: the sequence is split over cp as well, so "
           "its chunks are not tp's alone; set one of them",
           c.cp);
  // Products checked, so that degrees whose product overflows (2^62 + 1 each) are never taken for a fit.
  int64_t others = 0, with_cp = 0;
  const bool others_overflow =
      __builtin_mul_overflow(c.dp_replicate, c.tp, &with_cp) || __builtin_mul_overflow(with_cp, c.cp, &others);
  const std::string cp_term = c.cp > 1 ? fmt::format(" x parallel.cp ({})", c.cp) : "";
  int64_t dp_shard = c.dp_shard;
  if (dp_shard == -1) {
    MT_CHECK(!others_overflow && world_size % others == 0,
             "{} ranks do not divide by parallel.dp_replicate ({}){} x parallel.tp ({})", world_size, c.dp_replicate,
             cp_term, c.tp);
    dp_shard = world_size / others;
  }
  int64_t product = 0;
  const bool overflow = others_overflow || __builtin_mul_overflow(others, dp_shard, &product);
  MT_CHECK(!overflow && product == world_size,
           "parallel.dp_replicate ({}) x parallel.dp_shard ({}){} x parallel.tp ({}) = {}, but the job has {} ranks",
           c.dp_replicate, dp_shard, cp_term, c.tp, overflow ? std::string("more than 2^63") : std::to_string(product),
           world_size);
  // Expert parallelism takes its ranks from dp_shard; where ep does not
  // divide dp_shard, from dp_shard x cp: every cp rank and ep / cp of the
  // dp_shard ranks (torchtitan's dp_shard_in_ep), as ep % cp == 0 allows.
  const bool ep_over_cp = c.ep > 1 && c.cp > 1 && dp_shard % c.ep != 0;
  MT_CHECK(c.ep >= 1 && (dp_shard % c.ep == 0 || (ep_over_cp && c.ep % c.cp == 0 && dp_shard % (c.ep / c.cp) == 0)),
           "parallel.ep {} must divide parallel.dp_shard {}{} (expert parallelism takes its ranks from dp_shard{})",
           c.ep, dp_shard, c.cp > 1 ? fmt::format(", or be parallel.cp {} times a divisor of it", c.cp) : "",
           c.cp > 1 ? ", or from all of cp and part of dp_shard" : "");
  MT_CHECK(c.expert_tp == 1 || c.expert_tp == c.tp, "parallel.expert_tp {} must be 1 or parallel.tp {}", c.expert_tp,
           c.tp);
  if (ep_over_cp)
    return sharding::DeviceMesh({static_cast<int>(c.dp_replicate), static_cast<int>(dp_shard / (c.ep / c.cp)),
                                 static_cast<int>(c.ep / c.cp), static_cast<int>(c.cp), static_cast<int>(c.tp)},
                                {"dp_replicate", "dp_shard", "dp_shard_in_ep", "cp", "tp"});
  if (c.cp > 1 && c.ep > 1)
    return sharding::DeviceMesh({static_cast<int>(c.dp_replicate), static_cast<int>(dp_shard / c.ep),
                                 static_cast<int>(c.ep), static_cast<int>(c.cp), static_cast<int>(c.tp)},
                                {"dp_replicate", "dp_shard", "ep", "cp", "tp"});
  if (c.cp > 1)
    return sharding::DeviceMesh(
        {static_cast<int>(c.dp_replicate), static_cast<int>(dp_shard), static_cast<int>(c.cp), static_cast<int>(c.tp)},
        {"dp_replicate", "dp_shard", "cp", "tp"});
  if (c.ep == 1)
    return sharding::DeviceMesh({static_cast<int>(c.dp_replicate), static_cast<int>(dp_shard), static_cast<int>(c.tp)},
                                {"dp_replicate", "dp_shard", "tp"});
  return sharding::DeviceMesh({static_cast<int>(c.dp_replicate), static_cast<int>(dp_shard / c.ep),
                               static_cast<int>(c.ep), static_cast<int>(c.tp)},
                              {"dp_replicate", "dp_shard", "ep", "tp"});
}

namespace {
// The index of the mesh dim of this name, or -1 where the mesh has none.
int optional_dim(const sharding::DeviceMesh& mesh, const char* name) {
  const auto& names = mesh.names();
  return std::find(names.begin(), names.end(), name) != names.end() ? mesh.dim_index(name) : -1;
}
// The dim of expert parallelism's dp_shard ranks: "ep", or "dp_shard_in_ep"
// where ep takes every cp rank too; -1 without expert parallelism.
int ep_dim_of(const sharding::DeviceMesh& mesh) {
  const int ep = optional_dim(mesh, "ep");
  return ep >= 0 ? ep : optional_dim(mesh, "dp_shard_in_ep");
}
int cp_dim_of(const sharding::DeviceMesh& mesh) { return optional_dim(mesh, "cp"); }
}  // namespace

std::vector<int> data_parallel_dims(const sharding::DeviceMesh& mesh) {
  std::vector<int> dims{mesh.dim_index("dp_replicate"), mesh.dim_index("dp_shard")};
  if (const int ep = ep_dim_of(mesh); ep >= 0) dims.push_back(ep);
  return dims;
}

std::vector<int> expert_dims(const sharding::DeviceMesh& mesh) {
  const int ep = ep_dim_of(mesh);
  if (ep < 0) return {};
  if (optional_dim(mesh, "dp_shard_in_ep") == ep) return {ep, cp_dim_of(mesh)};
  return {ep};
}

int64_t data_parallel_degree(const sharding::DeviceMesh& mesh) {
  int64_t n = 1;
  for (int d : data_parallel_dims(mesh)) n *= mesh.size(d);
  return n;
}

bool splits_activations(const sharding::DeviceMesh& mesh) {
  const int cp = cp_dim_of(mesh);
  return mesh.size(mesh.dim_index("tp")) > 1 || (cp >= 0 && mesh.size(cp) > 1);
}

sharding::Layout pending_over_data_parallel(const sharding::DeviceMesh& mesh, const sharding::Layout& kept,
                                            bool experts) {
  std::vector<sharding::Placement> placements = kept.placements;
  const std::vector<int> by_expert = experts ? expert_dims(mesh) : std::vector<int>{};
  std::vector<int> dims = data_parallel_dims(mesh);
  if (const int cp = cp_dim_of(mesh); cp >= 0) dims.push_back(cp);  // each cp rank's part of the sequence
  for (int d : dims)
    if (mesh.size(d) > 1 && std::find(by_expert.begin(), by_expert.end(), d) == by_expert.end())
      placements[static_cast<size_t>(d)] = sharding::Placement::partial();
  return sharding::Layout::from_placements(std::move(placements));
}

StepLayouts step_layouts(const sharding::DeviceMesh& mesh, const graph::Graph& g, const StepRoles& roles,
                         const ParallelConfig& config) {
  using sharding::Layout;
  using sharding::Placement;
  const auto replicate = static_cast<size_t>(mesh.dim_index("dp_replicate")),
             shard = static_cast<size_t>(mesh.dim_index("dp_shard")), tp = static_cast<size_t>(mesh.dim_index("tp"));
  const int ep_dim = ep_dim_of(mesh), cp_dim = cp_dim_of(mesh);
  const auto ep = static_cast<size_t>(ep_dim), cp = static_cast<size_t>(cp_dim);
  const bool ep_over_cp = expert_dims(mesh).size() == 2;  // the experts split over dp_shard_in_ep x cp
  const auto ndim = static_cast<size_t>(mesh.ndim());
  // A mesh dim of one rank splits nothing: its placement is Replicate, so
  // layouts read as what they do.
  auto split = [&](size_t mesh_dim, int tensor_dim) {
    return mesh.size(static_cast<int>(mesh_dim)) > 1 ? Placement::shard(tensor_dim) : Placement::replicate();
  };
  std::vector<Placement> batch(ndim);
  batch[replicate] = split(replicate, 0);
  batch[shard] = split(shard, 0);
  if (ep_dim >= 0) batch[ep] = split(ep, 0);
  const Layout batch_layout = Layout::from_placements(batch);
  const Layout replicated = Layout::from_placements(std::vector<Placement>(ndim));
  const std::set<graph::ValueId> experts(roles.experts.begin(), roles.experts.end());
  auto layout_of_param = [&](graph::ValueId p) {
    if (g.value(p).info.shape.rank() == 0) return replicated;  // nothing to shard
    std::vector<Placement> placements(ndim);
    const bool expert = experts.count(p) > 0;
    // Dense: FSDP over dp_shard (and ep: all of dp_shard). Experts under
    // ep: split by expert over ep, FSDP over the rest of dp_shard by dim 1
    // (each ep rank may hold a single expert); without ep, as dense.
    placements[shard] = split(shard, expert && ep_dim >= 0 ? 1 : 0);
    if (ep_dim >= 0) placements[ep] = split(ep, 0);
    // FSDP over dp_shard x cp; experts over ep x cp by expert where ep takes the cp ranks.
    if (cp_dim >= 0) placements[cp] = split(cp, expert && ep_dim >= 0 && !ep_over_cp ? 1 : 0);
    const auto tp_dim = roles.tp_dims.find(p);
    if (tp_dim != roles.tp_dims.end()) placements[tp] = split(tp, tp_dim->second);
    Layout l = Layout::from_placements(std::move(placements));
    // Where tp and data parallel split one dim, tp splits it first, then
    // FSDP each part (so gathering over dp_shard gives that part whole, as
    // torchtitan's strided shards do).
    if (tp_dim != roles.tp_dims.end() && l.placements[tp].is_sharding() &&
        l.shard_sequence(tp_dim->second).size() >= 2) {
      int next = 0;
      l.order[tp] = next++;
      for (const size_t d : {shard, ep, cp})
        if (d == shard || (d == ep && ep_dim >= 0) || (d == cp && cp_dim >= 0))
          if (l.placements[d].is_sharding() && l.placements[d].dim == tp_dim->second) l.order[d] = next++;
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
  // Activations [batch, seq, ...]: the batch's rows, and with context
  // parallelism split on the sequence over cp (the tokens themselves whole
  // there: each cp rank picks its part, graph/sequence_order.h).
  std::vector<Placement> activations = batch;
  if (cp_dim >= 0) activations[cp] = split(cp, 1);
  const Layout block_input_layout = Layout::from_placements(activations);
  std::vector<Placement> residual = activations;
  if (config.sequence_parallel) residual[tp] = split(tp, 1);
  const Layout residual_layout = Layout::from_placements(residual);
  for (graph::ValueId v : roles.residual_stream) pin(v, residual_layout, residual_layout);
  for (graph::ValueId v : roles.block_inputs) pin(v, block_input_layout, residual_layout);
  if (cp_dim >= 0) {  // the keys whole on each cp rank (their heads split over tp)
    std::vector<Placement> whole = batch;
    whole[tp] = split(tp, 2);
    std::vector<Placement> partial = whole;
    partial[cp] = mesh.size(cp_dim) > 1 ? Placement::partial() : Placement::replicate();
    for (graph::ValueId v : roles.attention_keys)
      pin(v, Layout::from_placements(whole), Layout::from_placements(partial));
  }
  if (config.loss_parallel)
    for (graph::ValueId v : roles.logits) {  // [rows, vocab], or [batch, seq, vocab] under cp
      std::vector<Placement> vocab_split = activations;
      vocab_split[tp] = split(tp, static_cast<int>(g.value(v).info.shape.rank()) - 1);
      pin(v, Layout::from_placements(vocab_split), Layout::from_placements(vocab_split));
    }
  if (ep_dim >= 0) {  // dispatched rows [blocks, batch, ...]: by block over ep, the batch one dim in
    std::vector<Placement> by_block(ndim);
    by_block[replicate] = split(replicate, 1);
    by_block[shard] = split(shard, 1);
    by_block[ep] = split(ep, 0);
    // [blocks, batch, cp parts, ...]: each cp rank's part of the sequence, or, where ep takes the cp ranks, its
    // blocks (after dp_shard_in_ep's: the blocks of ep x cp).
    if (cp_dim >= 0) by_block[cp] = ep_over_cp ? Placement::shard(0) : split(cp, 2);
    const Layout l = Layout::from_placements(by_block);
    for (graph::ValueId v : roles.dispatched) pin(v, l, l);
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
  for (const auto& [copy, p] : roles.copies) {
    const Layout& param = out.given.at(p);
    out.given[copy] = param;
    if (const auto it = roles.gradient_of.find(copy); it != roles.gradient_of.end())
      out.given[it->second] =
          roles.reduce_copies_in_compute_dtype ? param : pending_over_data_parallel(mesh, param, experts.count(p) > 0);
  }
  for (const auto& [updated, buffer] : roles.updates) out.deliver[updated] = out.given.at(buffer);
  return out;
}

bool llama_is_experts(std::string_view name) {
  return name.find("block_sparse_moe.experts.") != std::string_view::npos;
}

std::optional<int> llama_tp_dim(std::string_view name, bool expert_tp) {
  auto has = [&](std::string_view part) { return name.find(part) != std::string_view::npos; };
  if (llama_is_experts(name)) {
    if (!expert_tp) return std::nullopt;
    return has("experts.w2") ? 2 : 1;
  }
  for (std::string_view by_output : {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head",
                                     "shared_experts.w1", "shared_experts.w3"})
    if (has(by_output)) return 0;
  for (std::string_view by_input : {"o_proj", "down_proj", "shared_experts.w2"})
    if (has(by_input)) return 1;
  return std::nullopt;
}

}  // namespace meshtrain::parallel
