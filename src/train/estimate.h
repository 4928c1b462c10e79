// A training config's step estimated for an N-rank job on a hardware
// profile, without allocating a tensor or talking to another rank: the step
// is built, laid out on N ranks and lowered for one of them exactly as
// `meshtrain train` would (the lowered graph records every collective the
// rank would run), scheduled, and its runtime and memory estimated
// (sched/estimate.h, sched/memory_estimate.h).
#pragma once

#include "sched/estimate.h"
#include "sched/memory_estimate.h"
#include "train/config.h"

namespace meshtrain::train {

struct TrainingEstimate {
  int world_size = 1, rank = 0;
  std::string mesh;  // "" on one rank
  size_t nodes = 0, collectives = 0;
  double collective_bytes = 0;  // moved by this rank per step
  sched::StepEstimate time;
  sched::MemoryEstimate memory;
  double tokens_per_step = 0;              // the global batch's
  double tokens_per_s_per_device = 0;
  double flops_per_token = 0;              // torchtitan's formula (see below)
  double mfu = 0;                          // flops_per_token x tokens/s per device / the device's peak
  double peak_gflops = 0;                  // that peak (of the compute dtype, the rank's share)
  std::string trace;                       // the estimated timeline as a Chrome trace, when asked for
};

// Model FLOPs per token as torchtitan counts them for MFU:
// 6 x (parameters - the token embedding's) + 12 x layers x heads x head_dim x seq_len.
double torchtitan_flops_per_token(const models::LlamaConfig& model, int64_t seq_len);

// `rank`'s step of the config on `world_size` ranks on `hardware`;
// `with_trace`: also its timeline as a Chrome trace document.
TrainingEstimate estimate_training(const TrainConfig& config, int world_size, int rank,
                                   const sched::HardwareProfile& hardware, bool with_trace = false);

}  // namespace meshtrain::train
