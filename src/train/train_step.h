// One training step as one graph: forward, backward, global gradient-norm
// clipping and the AdamW update of every parameter, with the updated
// parameters and moments written back into their buffers after each run.
#pragma once

#include <map>
#include <string>

#include "graph/graph.h"
#include "models/llama.h"
#include "parallel/plan.h"

namespace meshtrain::train {

struct OptimizerConfig {
  double lr = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  DType state_dtype = DType::f32;  // the moments' storage: f32, or bf16 (f32 math either way)
};

struct TrainStepGraph {
  models::LlamaGraph model;
  graph::ValueId lr;         // f64 scalar input, set each step (schedule)
  graph::ValueId step;       // i64 scalar input, 1-based (bias correction)
  graph::ValueId grad_norm;  // global L2 norm of the gradients, before clipping
  std::map<std::string, graph::ValueId> exp_avg, exp_avg_sq;  // optimizer state inputs by parameter name
  // Updated value -> its buffer. The graph's outputs are the loss, grad_norm
  // and every updated value.
  std::vector<std::pair<graph::ValueId, graph::ValueId>> write_backs;
  std::map<graph::ValueId, graph::ValueId> gradient_of;  // forward value -> its gradient
};

// Parameters, gradients and optimizer state are f32; compute_dtype bf16 runs
// the forward and backward passes in bf16 (f32 master weights).
// max_grad_norm: clip the global gradient norm to it before the update, as
// torch.nn.utils.clip_grad_norm_ (<= 0: no clipping).
// split_loss: see models::build_llama.
TrainStepGraph build_train_step(graph::Graph& g, const models::LlamaConfig& model, int64_t batch, int64_t seq_len,
                                const OptimizerConfig& opt, double max_grad_norm, DType dtype = DType::f32,
                                std::optional<DType> compute_dtype = std::nullopt, bool split_loss = false);

// What each value of the step is to a parallel plan: parameters (split over
// tp as Megatron's Llama plan says when `tensor_parallel`), their optimizer
// states, the batch, the residual stream, block inputs and logits (when
// `tensor_parallel`), the replicated outputs and the write-backs.
parallel::StepRoles step_roles(const TrainStepGraph& step, bool tensor_parallel);

}  // namespace meshtrain::train
