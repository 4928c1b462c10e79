#include "compile/pipeline_update.h"

#include "compile/step.h"
#include "compile/train_step.h"
#include "core/error.h"
#include "graph/builder.h"
#include "models/llama.h"
#include "sharding/planner.h"

namespace meshtrain::compile {

namespace {

graph::Graph count_graph(const config::TrainConfig& config, graph::ValueId& targets) {
  graph::Graph g;
  graph::Builder b(g);
  targets = g.add_input("targets", {config.data.batch_size * config.data.seq_len}, DType::i64);
  g.add_output(b.op("count_valid", {targets}, {graph::attr::ignore_index(-100)}));
  return g;
}

}  // namespace

PipelineUpdate build_pipeline_update(const config::TrainConfig& config, const PipelinePlace& place,
                                     const std::map<int, PipelineStage>& stages) {
  PipelineUpdate out;
  for (const int s : place.stages()) {
    const auto it = stages.find(s);
    MT_ASSERT(it != stages.end(), "pipeline rank {}'s stage {} was not built", place.pp_rank, s);
    const PipelineStage& p = it->second;
    for (const std::string& name : p.parameter_names) {
      out.names.push_back(name);
      out.layouts.push_back(place.stage_mesh ? p.parameter_layouts.at(name) : sharding::Layout{});
    }
  }
  out.count = count_graph(config, out.count_targets);
  const auto specs = models::llama_parameters(config.model);
  const std::vector<std::string>& names = out.names;

  graph::Graph update;
  graph::Builder b(update);
  std::vector<graph::ValueId> params, grads;
  for (const std::string& name : names) {
    const Shape& shape = specs.at(name).shape;
    params.push_back(update.add_parameter(name, shape, DType::f32));
    grads.push_back(update.add_input(name + ".grad", shape, DType::f32));
  }
  const graph::ValueId squares_in = update.add_input("sum_of_squares", {}, DType::f64);
  update.set_phase(graph::Phase::optimizer);
  graph::ValueId norm;
  {
    graph::ScopeGuard scope(update, "optimizer");
    norm = b.norm_from_sum_of_squares(squares_in, DType::f32);
  }
  TrainStepGraph roles;
  append_optimizer(update, names, params, grads, norm, config.optimizer, config.training.max_grad_norm, {norm}, roles);
  graph::Graph squares;
  graph::Builder squares_builder(squares);
  std::vector<graph::ValueId> square_grads;
  for (const std::string& name : names)
    square_grads.push_back(squares.add_input(name + ".grad", specs.at(name).shape, DType::f32));
  squares.add_output(squares_builder.sum_of_squares(square_grads));

  std::map<graph::ValueId, graph::ValueId> update_values, square_values;  // global -> in the graph that runs
  if (place.stage_mesh) {
    const sharding::DeviceMesh& mesh = *place.stage_mesh;
    sharding::Planner planner(mesh, sharding::CostModel::for_mesh(mesh));
    const sharding::Layout replicated =
        sharding::Layout::from_placements(std::vector<sharding::Placement>(static_cast<size_t>(mesh.ndim())));
    std::map<graph::ValueId, sharding::Layout> given, deliver;
    for (size_t i = 0; i < names.size(); ++i) {
      given[params[i]] = given[grads[i]] = out.layouts[i];
      given[roles.exp_avg.at(names[i])] = given[roles.exp_avg_sq.at(names[i])] = out.layouts[i];
    }
    for (const auto& [updated, buffer] : roles.write_backs) deliver[updated] = given.at(buffer);
    deliver[norm] = replicated;
    spmd::LoweredGraph lowered = lay_out_graph(update, planner, place.stage_rank, given, deliver).lowered;
    update_values = lowered.values;
    const auto delivered = delivered_outputs(update, lowered.graph);
    for (const auto& [from, to] : roles.write_backs)
      out.write_backs.push_back({delivered.at(from), update_values.at(to)});
    update_values[norm] = delivered.at(norm);
    out.update = std::move(lowered.graph);
    std::map<graph::ValueId, sharding::Layout> squares_given;
    for (size_t i = 0; i < names.size(); ++i) squares_given[square_grads[i]] = out.layouts[i];
    spmd::LoweredGraph squares_lowered =
        lay_out_graph(squares, planner, place.stage_rank, squares_given, {{squares.outputs()[0], replicated}}).lowered;
    square_values = squares_lowered.values;
    out.squares = std::move(squares_lowered.graph);
  } else {
    update_values = identity_values(update);
    square_values = identity_values(squares);
    for (const auto& [from, to] : roles.write_backs) out.write_backs.push_back({from, to});
    out.update = std::move(update);
    out.squares = std::move(squares);
  }
  for (size_t i = 0; i < names.size(); ++i) {
    out.parameters.push_back(update_values.at(params[i]));
    out.gradients.push_back(update_values.at(grads[i]));
    out.exp_avg.push_back(update_values.at(roles.exp_avg.at(names[i])));
    out.exp_avg_sq.push_back(update_values.at(roles.exp_avg_sq.at(names[i])));
    out.square_gradients.push_back(square_values.at(square_grads[i]));
  }
  out.sum_of_squares = update_values.at(squares_in);
  out.lr = update_values.at(roles.lr);
  out.step = update_values.at(roles.step);
  out.norm = update_values.at(norm);
  return out;
}

}  // namespace meshtrain::compile
