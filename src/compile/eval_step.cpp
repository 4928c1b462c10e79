#include "compile/eval_step.h"

#include "compile/train_step.h"
#include "core/error.h"
#include "parallel/plan.h"
#include "sched/schedule.h"

namespace meshtrain::compile {

std::unique_ptr<EvalStep> compile_eval(const config::TrainConfig& config, int world_size, int rank) {
  MT_ASSERT(config.parallel.pp == 1, "a pipeline evaluates with its stages' forward programs, not one graph");
  auto eval = std::make_unique<EvalStep>();
  eval->model =
      build_forward(eval->global, config.model, config.data.batch_size, config.data.seq_len, step_options(config));
  eval->global.add_output(eval->model.loss);
  if (world_size > 1) {
    const sharding::DeviceMesh mesh = check_parallel_config(config, world_size);
    sharding::Planner planner(mesh, sharding::CostModel::for_mesh(mesh));
    const bool split_activations = parallel::splits_activations(mesh);
    // The layouts the training step gives the same parameters and batch.
    const parallel::StepLayouts layouts = parallel::step_layouts(
        mesh, eval->global, forward_roles(eval->model, split_activations, config.parallel.expert_tp > 1),
        config.parallel);
    eval->layout = lay_out_graph(
        eval->global, planner, rank, layouts.given, layouts.deliver,
        {.reshard_after_forward = config.parallel.reshard_after_forward, .ragged_rows = ragged_rows(eval->model, {})});
    eval->values = eval->layout->lowered.values;
  } else {
    eval->values = identity_values(eval->global);
  }
  eval->schedule = sched::make_schedule(eval->running(), eval->running().outputs(), {});
  return eval;
}

}  // namespace meshtrain::compile
