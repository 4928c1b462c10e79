#include "compile/pipeline_stage.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "compile/step.h"
#include "core/error.h"
#include "graph/autodiff.h"
#include "parallel/plan.h"
#include "sched/pass.h"
#include "sched/schedule.h"
#include "sharding/planner.h"
#include "spmd/lower.h"
#include "spmd/propagate.h"

namespace meshtrain::compile {

std::vector<models::LlamaSpan> pipeline_spans(const models::LlamaConfig& model, int64_t stages,
                                              const std::vector<int64_t>& layers_per_stage) {
  const int64_t units = model.n_layers + 2;
  std::vector<int64_t> counts = layers_per_stage;
  if (counts.empty()) {
    MT_CHECK(stages <= units,
             "the model's {} layers and its embedding and head make {} units, fewer than the {} pipeline stages "
             "(parallel.pp x parallel.pp_stages_per_rank): every stage needs at least one",
             model.n_layers, units, stages);
    for (int64_t s = 0; s < stages; ++s) counts.push_back(units / stages + (s < units % stages ? 1 : 0));
  }
  MT_CHECK(static_cast<int64_t>(counts.size()) == stages,
           "parallel.pp_layers_per_stage lists {} stages ([{}]) but the pipeline has {} (parallel.pp x "
           "parallel.pp_stages_per_rank)",
           counts.size(), fmt::join(counts, ", "), stages);
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  MT_CHECK(total == units,
           "parallel.pp_layers_per_stage [{}] adds up to {}, but the model has {} units to split: model.n_layers {} "
           "plus the embedding and the head, which count as one layer each",
           fmt::join(counts, ", "), total, units, model.n_layers);
  std::vector<models::LlamaSpan> spans;
  int64_t unit = 0;  // 0: the embedding; 1..n_layers: block unit-1; n_layers+1: the head
  for (int64_t s = 0; s < stages; ++s) {
    const int64_t end = unit + counts[static_cast<size_t>(s)];
    models::LlamaSpan span;
    span.embedding = unit == 0;
    span.first_layer = std::max<int64_t>(unit - 1, 0);
    span.end_layer = std::min(end - 1, model.n_layers);
    span.head = end == units;
    spans.push_back(span);
    unit = end;
  }
  return spans;
}

namespace {

// The values `part` reads that `producer_part` computes, in the order `part` reads them.
std::vector<graph::ValueId> computed_by(const graph::Graph& g, const std::vector<graph::NodeId>& producer_part,
                                        const graph::ExtractedGraph& part) {
  const std::set<graph::NodeId> producers(producer_part.begin(), producer_part.end());
  std::vector<graph::ValueId> out;
  for (const graph::ValueId v : part.reads)
    if (producers.contains(g.value(v).producer)) out.push_back(v);
  return out;
}

}  // namespace

namespace {

// The stage's joint graph laid out on the stage mesh by the [parallel] plan
// and lowered for this rank; the stage's values become their local values.
void lay_out_stage(const config::TrainConfig& config, const StageMesh& where, const sched::RankDevice* device,
                   const models::LlamaGraph& m, const std::map<graph::ValueId, graph::ValueId>& gradient_of,
                   PipelineStage& st) {
  const sharding::DeviceMesh& mesh = *where.mesh;
  const graph::Graph& g = st.joint;
  // The span's roles as a flat step's forward has them, but for what a
  // stage takes in and hands on: its own batch inputs and loss.
  parallel::StepRoles roles = forward_roles(m, parallel::splits_activations(mesh), config.parallel.expert_tp > 1);
  const std::set<graph::ValueId> experts(roles.experts.begin(), roles.experts.end());
  roles.batch_inputs.clear();
  roles.replicated_outputs.clear();
  if (st.span.embedding) roles.batch_inputs.push_back(st.input);
  if (st.span.head) {
    roles.batch_inputs.push_back(st.targets);
    roles.replicated_outputs.push_back(st.output);
  }
  roles.replicated_outputs.insert(roles.replicated_outputs.end(), st.expert_load.begin(), st.expert_load.end());
  if (st.aux_loss.valid()) roles.replicated_outputs.push_back(st.aux_loss);
  // What crosses stages, and its gradient, lies as the residual stream between blocks does.
  if (!st.span.embedding) roles.residual_stream.push_back(st.input);
  if (!st.span.head) roles.residual_stream.push_back(st.output);
  roles.gradient_of = gradient_of;
  roles.reduce_copies_in_compute_dtype = config.training.reduce_dtype != DType::f32;
  parallel::StepLayouts layouts = parallel::step_layouts(mesh, g, roles, config.parallel);
  // The programs leave each gradient a pending sum over data parallel (the
  // runner reduces the step's sum once, at the stage's REDUCE_GRAD); the
  // parameters lie as the plan keeps them, and what the lowering gathers of
  // them (once: reshard_after_forward is off) the stage's unshard program
  // computes once a step (UNSHARD).
  auto pending = [&](graph::ValueId p) {
    return parallel::pending_over_data_parallel(mesh, layouts.given.at(p), experts.count(p) > 0);
  };
  for (size_t i = 0; i < st.parameters.size(); ++i) {
    const graph::ValueId p = st.parameters[i];
    st.parameter_layouts[st.parameter_names[i]] = layouts.given.at(p);
    st.gradient_layouts[st.parameter_names[i]] = pending(p);
    if (const auto it = gradient_of.find(p); it != gradient_of.end()) layouts.given[it->second] = pending(p);
  }
  for (const auto& [copy, p] : m.param_copies)
    if (const auto it = gradient_of.find(copy); it != gradient_of.end()) layouts.given[it->second] = pending(p);
  const sharding::Layout replicated =
      sharding::Layout::from_placements(std::vector<sharding::Placement>(static_cast<size_t>(mesh.ndim())));
  if (st.count.valid()) layouts.given[st.count] = replicated;
  // The router statistics, and their gradients, whole on every rank (summed over the stage's).
  for (const graph::ValueId v : {st.router_stats_in, st.router_stats_out_gradient})
    if (v.valid()) layouts.given[v] = replicated;
  for (const graph::ValueId v : {st.router_stats_out, st.router_stats_in_gradient})
    if (v.valid()) layouts.deliver[v] = replicated;
  // Every output delivered where the plan puts it: the gradients in their parameters' layouts.
  for (const graph::ValueId v : g.outputs())
    if (const auto it = layouts.given.find(v); it != layouts.given.end()) layouts.deliver[v] = it->second;
  for (size_t i = 0; i < st.gradients.size(); ++i)
    layouts.deliver[st.gradients[i]] = st.gradient_layouts.at(st.parameter_names[i]);
  // Shared with every stage, and every compile, on a mesh of this shape.
  const std::shared_ptr<sharding::Planner> planner = sharding::shared_planner(mesh);
  // The weights' gathers (FSDP's, over dp_shard and cp) and casts run once
  // for all the microbatches (the unshard program, below).
  spmd::PropagationOptions once_a_run{
      .parameter_share = 1.0 / static_cast<double>(std::max<int64_t>(1, config.parallel.microbatches())),
      .share_in_backward = config.parallel.pp_keep_backward_layouts,
      .choices = spmd::shared_choices(planner)};
  for (int d = 0; d < mesh.ndim(); ++d)
    if (mesh.names()[static_cast<size_t>(d)] == "dp_shard" || mesh.names()[static_cast<size_t>(d)] == "cp")
      once_a_run.parameter_gather_dims.push_back(d);
  LaidOut laid_out =
      lay_out_graph(g, *planner, where.rank, layouts.given, layouts.deliver,
                    {.reshard_after_forward = false, .ragged_rows = ragged_rows(m, gradient_of)}, once_a_run);
  const spmd::Sharding& sharding = laid_out.sharding;
  spmd::LoweredGraph& lowered = laid_out.lowered;
  if (device)
    run_lowered_step_passes(
        config, *device, mesh, where.rank, [](const graph::Graph& r) { return sched::make_schedule(r, r.outputs()); },
        lowered.graph);
  st.batch_layout = sharding.values.at(st.span.embedding ? st.input : st.span.head ? st.targets : st.input);
  // Inputs by the lowering's map; what the stage computes as the lowered graph delivers it.
  std::map<graph::ValueId, graph::ValueId> local = lowered.values;
  for (size_t k = 0; k < g.outputs().size(); ++k) local[g.outputs()[k]] = lowered.graph.outputs()[k];
  auto to_local = [&](graph::ValueId& v) {
    if (v.valid()) v = local.at(v);
  };
  for (graph::ValueId* v :
       {&st.input, &st.targets, &st.count, &st.output, &st.output_gradient, &st.input_gradient, &st.router_stats_in,
        &st.router_stats_in_gradient, &st.router_stats_out, &st.router_stats_out_gradient, &st.aux_loss})
    to_local(*v);
  for (auto& v : st.parameters) to_local(v);
  for (auto& v : st.gradients) to_local(v);
  for (auto& v : st.expert_load) to_local(v);
  st.joint = std::move(lowered.graph);
}

}  // namespace

PipelineStage build_pipeline_stage(const config::TrainConfig& config, const std::vector<models::LlamaSpan>& spans,
                                   int index, int64_t rows, const StageMesh& where, const sched::RankDevice* device) {
  MT_CHECK(index >= 0 && index < static_cast<int>(spans.size()), "pipeline stage {} of {}", index, spans.size());
  PipelineStage st;
  st.index = index;
  st.span = spans[static_cast<size_t>(index)];
  graph::Graph& g = st.joint;
  const models::LlamaConfig& model = config.model;
  const DType compute = config.training.dtype;
  const int64_t seq = config.data.seq_len;
  std::map<std::string, graph::ValueId> params;
  for (const auto& [name, spec] : models::llama_parameters(model)) {
    if (!models::span_holds(model, st.span, name)) continue;
    params[name] = g.add_parameter(name, spec.shape, DType::f32);
    st.parameter_names.push_back(name);
    st.parameters.push_back(params[name]);
  }
  st.input = st.span.embedding ? g.add_input("tokens", {rows, seq}, DType::i64)
                               : g.add_input("input", {rows, seq, model.dim}, compute);
  if (st.span.head) {
    st.targets = g.add_input("targets", {rows, seq}, DType::i64);
    st.count = g.add_input("count", {}, DType::f64);
  }
  const graph::ValueInfo stats{{2, model.n_experts}, models::router_stats_dtype(compute)};
  if (models::span_takes_router_stats(model, st.span))
    st.router_stats_in = g.add_input("router_stats", stats.shape, stats.dtype);
  // Each microbatch's load-balancing loss is over its own tokens, and the step's is their mean.
  MT_CHECK(rows > 0 && config.data.batch_size % rows == 0,
           "pipeline stage {}: microbatches of {} rows do not divide data.batch_size {}", index, rows,
           config.data.batch_size);
  const double aux_weight = static_cast<double>(rows) / static_cast<double>(config.data.batch_size);
  const models::LlamaGraph m =
      models::llama_span_forward(g, model, st.span, params, st.input, st.targets, st.count, compute,
                                 config.parallel.loss_parallel, aux_weight, st.router_stats_in);
  st.output = st.span.head ? m.loss : m.output;
  st.aux_loss = st.span.head ? m.aux_loss : graph::ValueId{};
  st.expert_load = m.expert_load;
  if (!st.span.head) st.output_gradient = g.add_input("output_gradient", g.value(st.output).info.shape, compute);
  std::vector<graph::SeededOutput> seeded{{st.output, st.output_gradient}};  // the loss's: 1
  if (models::span_gives_router_stats(model, st.span)) {
    st.router_stats_out = m.router_stats;
    MT_ASSERT(st.router_stats_out.valid() && st.router_stats_out != st.router_stats_in,
              "pipeline stage {} hands on router statistics it does not add to", index);
    st.router_stats_out_gradient = g.add_input("router_stats_gradient", stats.shape, stats.dtype);
    seeded.push_back({st.router_stats_out, st.router_stats_out_gradient});
  }
  std::vector<graph::ValueId> wrt = st.parameters;
  if (!st.span.embedding) wrt.push_back(st.input);
  if (st.router_stats_in.valid()) wrt.push_back(st.router_stats_in);
  std::map<graph::ValueId, graph::ValueId> gradient_of;
  std::vector<graph::ValueId> grads = graph::append_backward(g, seeded, wrt, &gradient_of);
  if (st.router_stats_in.valid()) {
    st.router_stats_in_gradient = grads.back();
    grads.pop_back();
  }
  if (!st.span.embedding) {
    st.input_gradient = grads.back();
    grads.pop_back();
  }
  st.gradients = grads;
  for (size_t i = 0; i < grads.size(); ++i)
    MT_CHECK(grads[i].valid(), "pipeline stage {}: no gradient reaches parameter {}", index, st.parameter_names[i]);
  MT_ASSERT(st.router_stats_in_gradient.valid() == st.router_stats_in.valid(),
            "pipeline stage {}: no gradient reaches the router statistics it takes", index);
  // What the stage delivers, so that the step's passes keep what computes it.
  for (const graph::ValueId v : st.to_next()) g.add_output(v);
  if (st.span.head) g.add_output(st.output);
  if (st.aux_loss.valid()) g.add_output(st.aux_loss);
  for (const graph::ValueId v : st.to_previous()) g.add_output(v);
  for (const graph::ValueId grad : st.gradients) g.add_output(grad);
  for (const graph::ValueId load : st.expert_load) g.add_output(load);
  sched::step_pipeline(config.activation_checkpoint.mode, config.activation_checkpoint.selective_matmuls).run(g);
  if (where.mesh) lay_out_stage(config, where, device, m, gradient_of, st);

  // What the forward computes from the parameters alone (a weight's copy
  // in the compute dtype, gathered over dp_shard; with
  // pp_keep_backward_layouts, the other layouts of it the backward reads
  // too) is the unshard program's, run once a step: the other programs
  // read it.
  const graph::FromParameters once = graph::from_parameters(g, config.parallel.pp_keep_backward_layouts);
  const std::set<graph::NodeId> in_unshard(once.nodes.begin(), once.nodes.end());
  std::vector<graph::NodeId> forward, backward;
  for (const graph::NodeId n : g.order())
    if (!in_unshard.contains(n)) (g.node(n).phase == graph::Phase::forward ? forward : backward).push_back(n);
  std::vector<graph::NodeId> input_half;
  if (st.input_gradient.valid()) input_half = graph::nodes_needed_for(g, st.to_previous(), backward);
  const std::set<graph::NodeId> in_input_half(input_half.begin(), input_half.end());
  std::vector<graph::NodeId> weight_half;
  for (const graph::NodeId n : backward)
    if (!in_input_half.contains(n)) weight_half.push_back(n);
  for (const auto* part : {&forward, &backward})
    for (const graph::NodeId n : *part)
      for (const graph::ValueId v : g.node(n).inputs)
        if (once.values[static_cast<size_t>(v.index)] && g.value(v).kind != graph::ValueKind::parameter &&
            std::find(st.step_values.begin(), st.step_values.end(), v) == st.step_values.end())
          st.step_values.push_back(v);
  st.unshard = graph::extract_graph(g, once.nodes, st.step_values);

  std::vector<graph::ValueId> input_results = st.to_previous();
  std::vector<graph::ValueId> backward_results = input_results;
  backward_results.insert(backward_results.end(), st.gradients.begin(), st.gradients.end());
  st.backward = graph::extract_graph(g, backward, backward_results);
  // A node of the input half may compute a weight's gradient beside an
  // input's (rms_norm_backward): that gradient comes out of the input half.
  std::vector<graph::ValueId> weight_results;
  for (const graph::ValueId grad : st.gradients)
    (in_input_half.contains(g.value(grad).producer) ? input_results : weight_results).push_back(grad);
  st.backward_weight = graph::extract_graph(g, weight_half, weight_results);
  const std::vector<graph::ValueId> weight_reads = computed_by(g, input_half, st.backward_weight);
  input_results.insert(input_results.end(), weight_reads.begin(), weight_reads.end());
  st.backward_input = graph::extract_graph(g, input_half, input_results);
  std::vector<graph::ValueId> forward_results{st.output};
  if (st.router_stats_out.valid()) forward_results.push_back(st.router_stats_out);
  if (st.aux_loss.valid()) forward_results.push_back(st.aux_loss);
  forward_results.insert(forward_results.end(), st.expert_load.begin(), st.expert_load.end());
  for (const graph::ValueId v : computed_by(g, forward, st.backward))
    if (std::find(forward_results.begin(), forward_results.end(), v) == forward_results.end())
      forward_results.push_back(v);
  st.forward = graph::extract_graph(g, forward, forward_results);
  return st;
}

}  // namespace meshtrain::compile
