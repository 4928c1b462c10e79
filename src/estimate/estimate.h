// A training config's step estimated for an N-rank job on a hardware
// profile, without allocating a tensor or talking to another rank: the step
// is built, laid out on N ranks and lowered for one of them exactly as
// `meshtrain train` would (the lowered graph records every collective the
// rank would run), scheduled, and its runtime and memory estimated
// (sched/estimate.h, sched/memory_estimate.h).
#pragma once

#include <optional>

#include "config/config.h"
#include "sched/estimate.h"
#include "sched/memory_estimate.h"

namespace meshtrain::estimate {

// A pipeline-parallel step (parallel.pp > 1): each stage's programs costed
// on its ranks' layout, the schedule simulated with those costs and the
// point-to-point time between stages, then the rank's once-a-step work.
struct PipelineEstimate {
  std::string schedule;
  int stages = 0, stages_per_rank = 0, microbatches = 0;
  int runs = 1;  // training.grad_accum_steps: the schedule runs this many times a step
  std::vector<double> forward_us, backward_input_us, backward_weight_us;  // per stage, one microbatch
  std::vector<double> p2p_us;    // per stage: over the link to the next stage's rank (output on, gradient back)
  double makespan_us = 0;        // the schedule simulated: its last action's end (one run)
  double bubble_fraction = 0;    // idle over all ranks x makespan
  double published_bubble = -1;  // the formula with the mean stage costs (-1: none published)
  double rank_busy_us = 0;       // this rank's compute in the schedule (one run)
  double copy_us = 0;            // a step's runner copying programs' outputs and adding gradients (in the busy time)
  double unshard_us = 0, reduce_grad_us = 0, update_us = 0;  // this rank's, once a step
  int peak_activation_pairs = 0;         // (stage, microbatch) pairs this rank holds at once, simulated
  double activation_bytes_per_pair = 0;  // the most one of its stages keeps from a forward to its backward
  // Of every pipeline rank at this rank's place in its stage: the largest
  // peak and that rank (stages differ: the first holds the embedding and
  // most activations, the last the head).
  double fullest_peak_bytes = 0;
  int fullest_rank = 0;
};

struct TrainingEstimate {
  int world_size = 1, rank = 0;
  std::string mesh;  // "" on one rank
  size_t nodes = 0, collectives = 0;
  double collective_bytes = 0;  // moved by this rank per step
  sched::StepEstimate time;
  sched::MemoryEstimate memory;
  double tokens_per_step = 0;  // the global batch's
  double tokens_per_s_per_device = 0;
  double flops_per_token = 0;                // torchtitan's formula (see below)
  double mfu = 0;                            // flops_per_token x tokens/s per device / the device's peak
  double peak_gflops = 0;                    // that peak (of the compute dtype, the rank's share)
  std::string trace;                         // the estimated timeline as a Chrome trace, when asked for
  std::optional<PipelineEstimate> pipeline;  // parallel.pp > 1
  std::string cp_attention;                  // parallel.cp_attention auto: what it chose and why; else ""
};

// Model FLOPs per token as torchtitan counts them for MFU:
// 6 x (parameters - the token embedding's) + 12 x layers x heads x head_dim x seq_len,
// a mixture of experts' routed experts counted k / n_experts (the active parameters).
double torchtitan_flops_per_token(const models::LlamaConfig& model, int64_t seq_len);

// `rank`'s step of the config on `world_size` ranks on `hardware`;
// `with_trace`: also its timeline as a Chrome trace document.
TrainingEstimate estimate_training(const config::TrainConfig& config, int world_size, int rank,
                                   const sched::HardwareProfile& hardware, bool with_trace = false);

}  // namespace meshtrain::estimate
