// A flat training step (parallel.pp = 1) run by one executor: the step the
// step compiler built, with this rank's shards of the parameters, its AdamW
// moments and its rows of each batch bound to it. With training.device
// cuda (one rank) the executor runs on the GPU: the state lives there, and
// the host tensors are its copies for checkpoints, refreshed when asked for.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "comm/process_group.h"
#include "compile/compile.h"
#include "compile/eval_step.h"
#include "config/config.h"
#include "estimate/kernel_benchmark.h"
#include "kernels/cuda/cuda.h"
#include "runtime/executor.h"
#include "sched/hardware.h"
#include "sharding/device_mesh.h"
#include "train/step_runner.h"

namespace meshtrain::train {

class FlatStepRunner : public StepRunner {
 public:
  // `world`: the job's ranks (null: one rank); `step`: this rank's step as
  // compile_rank built it; `initial`: every parameter whole (this rank keeps
  // its shards). The estimate beside the run costs the step on `hardware`,
  // with `benchmark`'s kernel times when given. On several ranks a
  // collective: a step over schedule.memory_budget_mb on any rank fails on
  // every rank (rank 0 says which and by how much).
  FlatStepRunner(const config::TrainConfig& config, comm::ProcessGroupPtr world,
                 std::unique_ptr<compile::FlatStep> step, std::map<std::string, Tensor> initial,
                 const sched::HardwareProfile& hardware, estimate::BenchmarkMode* benchmark);

  Tensor& batch_tokens() override { return world_ ? global_tokens_ : tokens_; }
  Tensor& batch_targets() override { return world_ ? global_targets_ : targets_; }
  // Several ranks: the contiguous rows of this rank's data-parallel index (the batch is Shard(0)).
  std::vector<RowRange> rows_read() const override;
  Result step(double lr, int64_t update) override;
  // Compiles the forward-only program on first use; its executor (and its
  // memory) lives only while it runs.
  double evaluate() override;

  const std::map<std::string, Tensor>& parameters() const override { return params_; }
  const std::map<std::string, Tensor>& exp_avg() const override { return exp_avg_; }
  const std::map<std::string, Tensor>& exp_avg_sq() const override { return exp_avg_sq_; }
  std::vector<checkpoint::HeldTensor> held_tensors() const override;
  void state_loaded() override;
  checkpoint::CheckpointRank checkpoint_rank() const override;
  std::map<std::string, Tensor> whole_parameters() override;

  const sharding::DeviceMesh* mesh() const override { return groups_ ? &groups_->mesh() : nullptr; }
  std::string text() const override;
  std::string layout_summary() const override;
  void report(RankReport& r) const override;
  double flops_per_step() const override { return executor_->flops(); }
  double estimated_step_us() const override { return estimated_step_us_; }
  const std::string& no_estimate_because() const override { return no_estimate_because_; }

  void set_profiling(bool on) override { executor_->set_profiling(on); }
  void set_tracing(bool on) override { executor_->set_tracing(on); }
  std::string trace_events(int rank) const override;
  std::vector<runtime::Executor::OpTime> profile() const override { return executor_->profile(); }

 private:
  // A value's layout on the mesh (several ranks).
  const sharding::Layout& layout_of(graph::ValueId global) const { return step_->layout->sharding.values.at(global); }
  // Fails on every rank where some rank's step would allocate more than
  // config.schedule.memory_budget_mb.
  void check_memory_budget(double needed_bytes) const;
  // A host tensor and the device copy bound in its place on the GPU.
  struct Twin {
    Tensor host, device;
  };
  // Binds a host tensor, or on the GPU its device twin (added to `twins`).
  void bind(graph::ValueId run_value, const Tensor& host, std::vector<Twin>& twins);
  void download_state() const;  // GPU: params_ and moments <- their twins
  // What an executor binds for host tensor `host`: itself, or on the GPU its device twin.
  const Tensor& bound(const Tensor& host) const;
  void take_rows();  // several ranks: tokens_ and targets_ <- this rank's rows of the global batch

  bool on_gpu_ = false;
  std::unique_ptr<kernels::cuda::Stream> stream_;  // GPU: the uploads and downloads
  std::vector<Twin> state_twins_;  // GPU: parameters and moments (downloaded for checkpoints, uploaded on resume)
  std::vector<Twin> input_twins_;  // GPU: tokens, targets, lr and update count (uploaded each step)

  config::TrainConfig config_;
  comm::ProcessGroupPtr world_;
  std::unique_ptr<compile::FlatStep> step_;
  std::unique_ptr<sharding::MeshGroups> groups_;                 // several ranks: the mesh's groups
  std::unique_ptr<runtime::Executor> executor_;                  // holds step_'s graph
  std::map<std::string, Tensor> params_, exp_avg_, exp_avg_sq_;  // as bound to the executor
  Tensor global_tokens_, global_targets_;           // several ranks: the whole batch, before this rank takes its rows
  Tensor tokens_, targets_, lr_, update_;           // bound to the executor
  graph::ValueId loss_value_, grad_norm_value_;     // in the graph that runs
  std::vector<graph::ValueId> expert_load_values_;  // a mixture of experts': each MoE layer's
  graph::ValueId aux_loss_value_;
  std::unique_ptr<compile::EvalStep> eval_;  // validation's forward-only program, once compiled
  double estimated_step_us_ = 0;
  std::string no_estimate_because_;
};

}  // namespace meshtrain::train
