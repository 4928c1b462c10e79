// The trainer: builds the training-step graph for a config, initialises or
// loads the weights, and runs steps with metrics, progress and checkpoints.
#pragma once

#include <cstdio>
#include <map>
#include <memory>

#include "runtime/executor.h"
#include "train/config.h"
#include "train/data.h"

namespace meshtrain::train {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0, lr = 0, grad_norm = 0, step_ms = 0, tokens_per_s = 0;
  size_t peak_bytes = 0;
};

class Trainer {
 public:
  explicit Trainer(TrainConfig config);
  StepMetrics step();  // one optimizer step on the next batch
  struct Summary {
    StepMetrics first, last;
  };
  // All configured steps: metrics to config.metrics.file, progress to
  // `progress` (a live line on a terminal), checkpoints at the interval and
  // at the end.
  Summary run(std::FILE* progress);
  // Parameters by Hugging Face name (the live buffers).
  const std::map<std::string, Tensor>& parameters() const { return params_; }
  void save(const std::string& path) const;
  const TrainConfig& config() const { return config_; }
  size_t parameter_count() const;
  double flops_per_step() const;
  // Time every op of the steps after the first (the first warms caches); see profile().
  void set_profiling(bool on) { profiling_ = on; }
  std::vector<runtime::Executor::OpTime> profile() const;  // every part's, slowest op first

 private:
  void init_parameters();

  // A piece of the model with its own step graph and executor, run in order
  // each step. Today there is one part, the whole model; pipeline stages
  // will each be one.
  struct ModelPart {
    graph::Graph graph;
    TrainStepGraph step_graph;
    std::unique_ptr<runtime::Executor> executor;
  };
  ModelPart& loss_part() { return *parts_.back(); }  // the part that computes the loss

  TrainConfig config_;
  std::vector<std::unique_ptr<ModelPart>> parts_;  // stable addresses: executors hold their graph
  TokenLoader loader_;
  std::map<std::string, Tensor> params_;
  Tensor tokens_, targets_, lr_, step_;
  int64_t steps_done_ = 0;
  bool profiling_ = false;
};

}  // namespace meshtrain::train
