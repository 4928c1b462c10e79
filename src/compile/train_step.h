// One training step as one graph: forward, backward, global gradient-norm
// clipping and the AdamW update of every parameter, with the updated
// parameters and moments written back into their buffers after each run.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "config/config.h"
#include "graph/graph.h"
#include "models/llama.h"
#include "parallel/plan.h"

namespace meshtrain::compile {

struct TrainStepGraph {
  models::LlamaGraph model;
  graph::ValueId lr;                                          // f64 scalar input, set each step (schedule)
  graph::ValueId step;                                        // i64 scalar input, 1-based (bias correction)
  graph::ValueId grad_norm;                                   // global L2 norm of the gradients, before clipping
  std::map<std::string, graph::ValueId> exp_avg, exp_avg_sq;  // optimizer state inputs by parameter name
  // Updated value -> its buffer. The graph's outputs are leading_outputs
  // then every updated value.
  std::vector<std::pair<graph::ValueId, graph::ValueId>> write_backs;
  std::map<graph::ValueId, graph::ValueId> gradient_of;          // forward value -> its gradient
  std::map<graph::ValueId, graph::ValueId> applied_gradient_of;  // parameter -> the (clipped) gradient AdamW reads
};

// How a step is built beyond the model and the optimizer.
struct StepOptions {
  // Global gradient-norm clipping to this norm before the update, as
  // torch.nn.utils.clip_grad_norm_ (<= 0: no clipping).
  double max_grad_norm = 1.0;
  DType dtype = DType::f32;  // parameters, gradients and optimizer state (the master dtype)
  // The forward and backward in another dtype (bf16: each use of a
  // parameter a bf16 copy, activations bf16, the loss f32).
  std::optional<DType> compute_dtype;
  bool split_loss = false;  // see models::build_llama
  // Gradient accumulation: the batch's rows in this many microbatches (row i
  // in microbatch i mod micro_batches, so each data-parallel rank's rows
  // split alike), each's forward and backward in turn, their gradients
  // summed; the loss is the batch's mean over all its valid targets.
  int64_t micro_batches = 1;
};

// The batch's forward and loss on every parameter of the model: build_llama,
// or with options.micro_batches > 1 each microbatch's forward in turn (row i
// in microbatch i mod micro_batches) on the same parameters, each loss a
// share of the batch's mean, summed. `after_each(k, m)` is called once
// microbatch k's forward `m` is built (the training step appends its
// backward there). The result's params, batch, loss and per-block values
// cover the whole batch.
using AfterMicrobatch = std::function<void(int64_t k, const models::LlamaGraph& m)>;
models::LlamaGraph build_forward(graph::Graph& g, const models::LlamaConfig& model, int64_t batch, int64_t seq_len,
                                 const StepOptions& options, const AfterMicrobatch& after_each = {});

TrainStepGraph build_train_step(graph::Graph& g, const models::LlamaConfig& model, int64_t batch, int64_t seq_len,
                                const config::OptimizerConfig& opt, const StepOptions& options = {});

// Clipping to options.max_grad_norm by `grad_norm` and AdamW for each of
// `params` (named `names`, gradients `grads`), appended to `g` in the
// optimizer phase: adds the moments, lr and step as inputs, `leading_outputs`
// then each update as outputs, and fills those members of `s` (exp_avg,
// exp_avg_sq, lr, step, applied_gradient_of, write_backs).
void append_optimizer(graph::Graph& g, const std::vector<std::string>& names, const std::vector<graph::ValueId>& params,
                      const std::vector<graph::ValueId>& grads, graph::ValueId grad_norm,
                      const config::OptimizerConfig& opt, double max_grad_norm,
                      const std::vector<graph::ValueId>& leading_outputs, TrainStepGraph& s);

// The step's first outputs, replicated on every rank: the loss, the
// gradient norm, each MoE layer's expert load and the load-balancing loss
// (where the model has them).
std::vector<graph::ValueId> leading_outputs(const TrainStepGraph& step);

// What each value of a forward (build_forward) is to a parallel plan: its
// parameters (split over tp as Megatron's Llama plan says when
// `split_activations`), the batch, the residual stream, block inputs and
// logits (when `split_activations`: under tensor or context parallelism,
// parallel::splits_activations), the compute-dtype copies and its loss,
// replicated.
// Expert parallelism: the values laid out by block of experts (dispatched
// rows and their experts); the dispatched rows, and their gradients, each
// with its experts (spmd::LowerOptions::ragged_rows).
std::vector<graph::ValueId> dispatched_values(const models::LlamaGraph& m);
std::map<graph::ValueId, graph::ValueId> ragged_rows(const models::LlamaGraph& m,
                                                     const std::map<graph::ValueId, graph::ValueId>& gradient_of);
parallel::StepRoles forward_roles(const models::LlamaGraph& m, bool split_activations, bool expert_tp = false);
// What each value of the step is to a parallel plan: forward_roles, and the
// parameters' optimizer states and gradients, the gradient norm (replicated)
// and the write-backs; with `reduce_in_compute_dtype`, the compute-dtype
// copies of parameters whose gradients are reduced before they are widened.
parallel::StepRoles step_roles(const TrainStepGraph& step, bool split_activations, bool reduce_in_compute_dtype = false,
                               bool expert_tp = false);

}  // namespace meshtrain::compile
