// The plans `meshtrain autoplan` chooses among: every way to lay a config's
// step out on N ranks (the [parallel] degrees, a pipeline's schedule and
// microbatches) with the options that trade memory for time (activation
// checkpointing, gradient accumulation) and those that change only the
// communication (resharding, bucketing, sequence and loss parallel, async TP),
// and the lower bounds that rule a plan out before it is costed.
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "sched/hardware.h"

namespace meshtrain::autoplan {

// Every key a plan sets; the rest are the user's config's.
struct Plan {
  int64_t dp_replicate = 1, dp_shard = 1, tp = 1, cp = 1, pp = 1, ep = 1, expert_tp = 1;
  bool sequence_parallel = false, loss_parallel = false, async_tp = false, reshard_after_forward = true;
  parallel::PpScheduleKind pp_schedule = parallel::PpScheduleKind::one_f_one_b;
  int64_t pp_microbatches = 0, pp_stages_per_rank = 0;  // pp > 1; 0 with pp 1
  bool pp_keep_backward_layouts = false;                // pp > 1
  int64_t grad_accum_steps = 1;
  sched::ActivationCheckpoint checkpoint = sched::ActivationCheckpoint::none;
  sched::SelectiveMatmuls selective_matmuls = sched::SelectiveMatmuls::all;
  sched::BucketMode bucket_mode = sched::BucketMode::per_block;
  bool fp8 = false;
  DType reduce_dtype = DType::f32;
  // With cp > 1; the config's auto is searched as allgather, then ring as
  // a communication option (what auto would choose between).
  parallel::ParallelConfig::CpAttention cp_attention = parallel::ParallelConfig::CpAttention::allgather;
};

// What the search may change besides the layout: the numerics-changing
// options only when the user allows them.
struct SpaceOptions {
  bool vary_fp8 = false;           // training.fp8 none or tensorwise (else the config's)
  bool vary_reduce_dtype = false;  // training.reduce_dtype float32 or bfloat16 (else the config's)
};

// The user's config with the plan's keys set and checked as load_config
// checks a file's (config::check_config); throws naming the key when the
// plan cannot run the config on `world_size` ranks.
config::TrainConfig apply_plan(const config::TrainConfig& base, const Plan& plan, int world_size);

// The --section.key overrides that turn `base` into `planned`: the keys
// whose values differ, in key order.
std::vector<std::pair<std::string, std::string>> plan_overrides(const config::TrainConfig& base,
                                                                const config::TrainConfig& planned);
// The same as one line: "--parallel.tp 2 --parallel.dp_shard 4" ("" when none).
std::string overrides_text(const std::vector<std::pair<std::string, std::string>>& overrides);

// A plan ruled out before it was costed, and why.
struct RejectedPlan {
  Plan plan;
  std::string reason;
};

// The layouts of `base` on `world_size` ranks: every [parallel] degree
// product and pipeline schedule, microbatch count and stages per rank the
// config allows, each with sequence and loss parallel on under tp and
// nothing recomputed; those the config cannot run go to `rejected` with the
// check's message. The starting point of each layout's search (search.h).
std::vector<Plan> enumerate_layouts(const config::TrainConfig& base, int world_size, const SpaceOptions& options,
                                    std::vector<RejectedPlan>& rejected);

// The plans that hold less memory than `plan` at the cost of recompute or
// smaller microbatches, from the least recompute to the most: selective
// (every matmul kept), selective every other matmul, full; then, without a
// pipeline, full with 2, 4, ... gradient-accumulation microbatches.
std::vector<Plan> memory_ladder(const config::TrainConfig& base, const Plan& plan);

// The plans one communication option away from `plan`: parameters kept
// from forward to backward (with a pipeline, also in the backward's
// layouts, gathered once a step), automatic bucketing, sequence or loss parallel
// off, async TP on, ring attention under cp (when the config says auto),
// gradients reduced in bf16 (when allowed).
std::vector<Plan> communication_variants(const config::TrainConfig& base, const Plan& plan,
                                         const SpaceOptions& options);

// Lower bounds of a plan's step on rank 0.
struct Bounds {
  // Its share of the whole step's compute: each node of the global step
  // graph (before any layout) by the estimate's roofline on one rank's
  // peaks, summed and divided by the ranks (the ranks' shards of a node do
  // at least its work between them); with a pipeline, the more of its
  // busiest rank's stages so divided, and the average times the bubble.
  double compute_us = 0;
  // Its FSDP traffic's floor: each parameter's tp part gathered and its
  // gradient reduced once, by the profile's floor for those bytes; a
  // pipeline's stages add it to their schedule (no experts: 0).
  double communication_us = 0;
  // Its step's bound: compute and that traffic overlapping, or with a
  // pipeline one after the other.
  double step_us = 0;
  // Its share of master weights and optimizer states, which it holds all
  // step, and with a pipeline under FSDP a stage's weights gathered.
  double memory_bytes = 0;
};
Bounds lower_bounds(const config::TrainConfig& planned, int world_size, const sched::HardwareProfile& hardware);
// The global step's compute on one rank's peaks, by pipeline unit (the
// embedding, each layer, the head with the final norm and the loss) and
// the rest (the optimizer), and the model's parameters, all of them and
// the fewest of a unit; plans whose global graphs are alike share it.
struct GlobalCompute {
  double embedding_us = 0, head_us = 0, other_us = 0;
  std::vector<double> layer_us;
  double parameters = 0, fewest_parameters_of_a_unit = 0;
  double total_us() const;
};
const GlobalCompute& global_compute(const config::TrainConfig& planned, int world_size,
                                    const sched::HardwareProfile& hardware);

}  // namespace meshtrain::autoplan
