// Pipeline stages of a training step: the model cut at block boundaries
// into stages, and one stage's forward and backward of one microbatch cut
// into the programs a pipeline schedule runs one at a time — forward (F),
// backward (B), or B's two halves: the input gradient (I) a previous stage
// waits for, and the weight gradients (W) that can wait.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"
#include "graph/extract.h"
#include "graph/graph.h"
#include "models/llama.h"
#include "sched/estimate.h"
#include "sharding/device_mesh.h"
#include "sharding/layout.h"

namespace meshtrain::compile {

// The span of each of `stages` stages: model.n_layers + 2 units (the
// embedding and the head count as one each) split by `layers_per_stage`, or
// as evenly as they go (earlier stages one more) when it is empty. Throws
// naming parallel.pp_layers_per_stage (or parallel.pp and
// parallel.pp_stages_per_rank) when they cannot be split so.
std::vector<models::LlamaSpan> pipeline_spans(const models::LlamaConfig& model, int64_t stages,
                                              const std::vector<int64_t>& layers_per_stage);

// Where a stage's step is laid out when the pipeline is composed with data
// or tensor parallelism: the stage's mesh (dp_replicate, dp_shard, tp) and
// this rank's index in it.
struct StageMesh {
  const sharding::DeviceMesh* mesh = nullptr;
  int rank = 0;
};

struct PipelineStage {
  int index = 0;
  models::LlamaSpan span;
  // The stage's forward and backward of one microbatch (and the passes of
  // config's step pipeline: activation checkpointing); on a stage mesh, this
  // rank's lowered graph of it (every value below is its local value).
  graph::Graph joint;
  // On a stage mesh, by parameter: its layout as the plan keeps it (FSDP:
  // sharded over dp_shard), and its gradient as the programs leave it, a
  // pending sum over data parallel until the stage's last backward of the
  // step reduces the sum into the parameter's layout (REDUCE_GRAD).
  std::map<std::string, sharding::Layout> parameter_layouts, gradient_layouts;
  sharding::Layout batch_layout;  // on a stage mesh: the tokens' and targets' (rows split over data parallel)
  std::vector<std::string> parameter_names;           // Hugging Face names, in order
  std::vector<graph::ValueId> parameters, gradients;  // in `joint`, by parameter_names
  graph::ValueId input;                               // the tokens (first stage) or the residual stream received
  graph::ValueId targets, count;   // last stage: the microbatch's targets, the batch's valid-target count
  graph::ValueId output;           // the residual stream sent on, or (last stage) the microbatch's loss
  graph::ValueId output_gradient;  // not last: the gradient of `output` received back
  graph::ValueId input_gradient;   // not first: the gradient of `input` sent back
  // With a load-balancing loss, the router statistics of the MoE layers so
  // far (models::LlamaGraph::router_stats), whole on every rank of a stage
  // mesh: received from the previous stage (models::span_takes_router_stats)
  // and their gradient sent back; handed on to the next
  // (span_gives_router_stats) and their gradient received back. The last
  // stage forms the loss of them: `aux_loss`, the microbatch's, unweighted.
  graph::ValueId router_stats_in, router_stats_in_gradient;
  graph::ValueId router_stats_out, router_stats_out_gradient;
  graph::ValueId aux_loss;
  // What crosses between stages, in the order it is sent: to the next stage
  // (the residual stream, then the router statistics) and its gradients
  // from there; from the previous stage and its gradients sent back. Empty
  // on the last and on the first stage.
  std::vector<graph::ValueId> to_next() const { return sent_values(output, router_stats_out, !span.head); }
  std::vector<graph::ValueId> from_next() const {
    return sent_values(output_gradient, router_stats_out_gradient, !span.head);
  }
  std::vector<graph::ValueId> from_previous() const { return sent_values(input, router_stats_in, !span.embedding); }
  std::vector<graph::ValueId> to_previous() const {
    return sent_values(input_gradient, router_stats_in_gradient, !span.embedding);
  }
  // A mixture of experts': each of the stage's MoE layers' token slots per
  // expert then the dropped ones, of one microbatch (forward computes them;
  // models::LlamaGraph::expert_load), on a stage mesh summed over its ranks.
  std::vector<graph::ValueId> expert_load;
  // The programs, each reading the values of `joint` it lists in `reads`
  // and computing its outputs: forward (output, then what a backward reads);
  // backward (input_gradient when there is one, then the gradients);
  // backward_input (input_gradient when there is one, the gradients its
  // nodes compute, then what backward_weight reads of it); backward_weight
  // (the other gradients).
  graph::ExtractedGraph forward, backward, backward_input, backward_weight;
  // What forward computes from the parameters alone, once a step (UNSHARD):
  // the compute-dtype copies of the weights and, on a stage mesh, their
  // gathers over dp_shard. Its outputs, `step_values`, the other programs
  // read; they are held from the stage's UNSHARD to its RESHARD.
  graph::ExtractedGraph unshard;
  std::vector<graph::ValueId> step_values;

 private:
  static std::vector<graph::ValueId> sent_values(graph::ValueId stream, graph::ValueId router_stats, bool crosses) {
    if (!crosses) return {};
    if (!router_stats.valid()) return {stream};
    return {stream, router_stats};
  }
};

// Stage `index` of `spans` for microbatches of `rows` sequences of
// data.seq_len tokens, as `config` trains (compute dtype, loss, activation
// checkpointing).
// On `mesh`, the stage is laid out by the [parallel] plan (the residual
// stream it receives and sends lies like the one between blocks; the
// gradients are reduced into their parameters' layouts) and lowered for
// mesh.rank before it is cut. Given `device`, the lowered stage then goes
// through the lowered-step passes a flat step goes through (bucketing,
// waits sunk, reordering: run_lowered_step_passes), costed on it; null: the
// stage as lowered.
PipelineStage build_pipeline_stage(const config::TrainConfig& config, const std::vector<models::LlamaSpan>& spans,
                                   int index, int64_t rows, const StageMesh& mesh = {},
                                   const sched::RankDevice* device = nullptr);

}  // namespace meshtrain::compile
