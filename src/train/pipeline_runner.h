// One rank's part of a pipeline-parallel training step: its stages'
// programs (compile/pipeline_stage.h) run in the order its schedule
// (parallel/pipeline_schedule.h, lowered with its sends and receives) says,
// activations and their gradients sent and received between ranks without
// blocking one another, each stage's gradients summed over the
// microbatches, the gradient norm taken over every stage, and clipping and
// AdamW applied to this rank's parameters — the single-rank step's numbers.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "compile/compile.h"
#include "config/config.h"
#include "parallel/pipeline_schedule.h"
#include "runtime/executor.h"
#include "sched/trace.h"
#include "sharding/device_mesh.h"
#include "sharding/planner.h"
#include "train/step_runner.h"

namespace meshtrain::train {

class PipelineRunner : public StepRunner {
 public:
  // `world`: every rank of the job, on the mesh of `compiled.place` (a
  // collective: every rank constructs its runner); `compiled`: this rank's
  // stages as compile_rank built them; `whole`: every parameter of the model
  // by Hugging Face name (this rank keeps its part of its stages').
  PipelineRunner(const config::TrainConfig& config, comm::ProcessGroupPtr world, compile::PipelineRank compiled,
                 const std::map<std::string, Tensor>& whole);
  ~PipelineRunner() override;

  // The global batch, of which each rank takes its rows: row i belongs to microbatch i mod
  // (pp_microbatches x grad_accum_steps), as in single-rank gradient
  // accumulation, and the schedule runs once per grad_accum_steps chunk of
  // pp_microbatches microbatches.
  Tensor& batch_tokens() override { return global_tokens_; }
  Tensor& batch_targets() override { return global_targets_; }
  // On a stage mesh, this rank's data-parallel rows of every microbatch (the
  // data fills only those; the batch's valid-target count is summed over the
  // data-parallel ranks). Without data parallelism, every row.
  std::vector<RowRange> rows_read() const override;
  Result step(double lr, int64_t update) override;
  // Every microbatch's forward through the rank's stages, in microbatch then
  // stage order on every rank, activations sent on as the step sends them;
  // nothing kept for a backward.
  double evaluate() override;

  const std::map<std::string, Tensor>& parameters() const override { return params_; }
  const std::map<std::string, Tensor>& exp_avg() const override { return exp_avg_; }
  const std::map<std::string, Tensor>& exp_avg_sq() const override { return exp_avg_sq_; }
  // This rank's part of its stages' tensors, on the mesh (pp, dp_replicate, dp_shard, tp).
  std::vector<checkpoint::HeldTensor> held_tensors() const override;
  checkpoint::CheckpointRank checkpoint_rank() const override;
  // Each parameter gathered whole on its stage's ranks, then sent by the
  // first of them to every rank.
  std::map<std::string, Tensor> whole_parameters() override;
  const sharding::DeviceMesh* mesh() const override { return &place_.mesh; }
  std::string layout_summary() const override;
  void report(RankReport& r) const override;
  double estimated_step_us() const override { return 0; }
  const std::string& no_estimate_because() const override { return no_estimate_because_; }
  std::string trace_events(int rank) const override;

  const parallel::PpSchedule& schedule() const { return place_.schedule; }
  int pipeline_rank() const { return group_->rank(); }
  // Parameter `name` whole on every rank of the stage holding it (a
  // collective over that stage's ranks; only they may call it).
  Tensor gather_parameter(const std::string& name);
  // The first rank of the world in the stage holding parameter `name`.
  int first_rank_holding(const std::string& name) const;
  // How this rank's parameter `name` (and its moments) lies on the mesh
  // (pp, dp_replicate, dp_shard, tp): Replicate over pp (only its stage's
  // ranks hold it: checkpoint's pipeline_rank), as its stage lays it out on the rest.
  sharding::Layout mesh_layout(const std::string& name) const;
  std::vector<int> stages() const;  // this rank's, in order
  // This rank's programs as text, stage by stage, and its actions.
  std::string text() const override;
  double flops_per_step() const override;
  double p2p_bytes_per_step() const;  // sent by this rank
  int64_t p2p_per_step() const;       // sends and receives this rank posts
  // The last step as it ran on this rank: its wall time from the first
  // action to the last send done, the part of it spent computing (the
  // programs' kernels and their outputs' copies; the rest is the bubble:
  // waiting for a neighbour), and at their peak the bytes of activations
  // held between programs (received, kept for a backward, or waiting to be
  // sent) and the (stage, microbatch) pairs holding them.
  struct StepStats {
    double step_us = 0, busy_us = 0;
    double held_bytes_peak = 0;
    int held_pairs_peak = 0;
    double bubble() const { return step_us > 0 ? 1 - busy_us / step_us : 0; }
  };
  const StepStats& last_step() const { return stats_; }
  // While on, each step records its actions' spans from the step's start:
  // compute actions on the compute track; the waits for receives, FSDP's
  // gathers and reductions, and the step-end all_reduce and update on the
  // communication track.
  void set_tracing(bool on) override { tracing_ = on; }
  const std::vector<sched::NamedSpan>& trace() const { return trace_; }
  void set_profiling(bool on) override;
  std::vector<runtime::Executor::OpTime> profile() const override;

 private:
  struct Program {
    const graph::ExtractedGraph* part = nullptr;
    std::unique_ptr<runtime::Executor> executor;  // none when the part has no nodes
  };
  struct Stage {
    compile::PipelineStage programs;
    Program forward, backward, backward_input, backward_weight, unshard;
    std::map<graph::ValueId, Tensor> step_held;      // the unshard program's outputs, from UNSHARD to RESHARD
    bool unsharded = false;                          // between its UNSHARD and RESHARD
    std::vector<graph::ValueId> kept_after_forward;  // what its backward programs read, computed or given in forward
    std::vector<graph::ValueId> kept_after_input;    // what backward_weight reads
    std::vector<Tensor> gradient_sums;               // by parameter, over the step's microbatches, in its layout
    // On a stage mesh: the sums as the programs leave them (pending over data
    // parallel), reduced into gradient_sums after the step's last backward.
    std::vector<Tensor> pending_sums;
    int backwards_done = 0;  // this step: microbatches whose weight gradients are in
    // This step's expert load (PipelineStage::expert_load) summed over its
    // microbatches, by MoE layer of the stage.
    std::vector<std::vector<double>> expert_load;
  };
  Stage& local_stage(int stage);
  // Runs `program` of stage `st` for microbatch `mb` on the values held for
  // them; keeps its outputs there and drops what no later program reads.
  void run(Stage& st, Program& program, int mb, const std::vector<graph::ValueId>& keep);
  void add_gradients(Stage& st, int mb);
  void add_expert_load(Stage& st, int mb);  // the microbatch's, taken from what its forward left
  // Every MoE layer's expert load this step, summed over the pipeline (each
  // stage's layers from its ranks).
  std::vector<std::vector<double>> step_expert_load();
  void count_targets();                   // count_ <- the global batch's valid targets
  void take_microbatches(int64_t chunk);  // tokens_, targets_ <- the chunk's microbatches' rows
  void act(const parallel::PpAction& action);
  // The tag of the `slot`th value (PipelineStage::to_next, to_previous) sent by `from_stage`.
  int peer_tag(int from_stage, bool forward, size_t slot) const;

  config::TrainConfig config_;
  comm::ProcessGroupPtr world_;  // every rank of the job
  comm::ProcessGroupPtr group_;  // the pipeline: the ranks at this rank's coordinate in every stage
  compile::PipelinePlace place_;
  // Composed with data or tensor parallelism: the groups and planner of the
  // stage's mesh over the ranks of this rank's stage.
  std::unique_ptr<sharding::MeshGroups> stage_groups_;
  std::shared_ptr<sharding::Planner> stage_planner_;
  std::map<int, std::unique_ptr<Stage>> stages_;  // this rank's, by stage index
  // In this rank's actions: the last compute action, and the stages that stay gathered from one run of the
  // schedule to the next (parallel::pp_stages_kept_between_runs).
  size_t last_compute_ = 0;
  std::set<int> kept_between_runs_;
  std::map<std::string, Tensor> params_, exp_avg_, exp_avg_sq_;
  // Per step: each microbatch's tokens and targets, the batch's valid-target
  // count, the values each (stage, microbatch) holds between its programs,
  // the receives in flight and the sends not yet known to be done.
  std::vector<Tensor> tokens_, targets_;
  Tensor count_;
  std::map<std::pair<int, int>, std::map<graph::ValueId, Tensor>> held_;
  void reduce_gradients(Stage& st);
  struct InFlight {
    Tensor tensor;
    comm::WorkPtr work;
  };
  // By receiving (stage, microbatch): its values from the previous (next) stage, in order.
  std::map<std::pair<int, int>, std::vector<InFlight>> receives_f_, receives_b_;
  std::vector<InFlight> sends_;
  float loss_sum_ = 0;
  double aux_loss_sum_ = 0;  // the last stage's microbatches' load-balancing losses
  StepStats stats_;
  bool tracing_ = false;
  std::vector<sched::NamedSpan> trace_;
  std::chrono::steady_clock::time_point step_start_;
  double waited_until_us_ = 0;  // tracing: when the running action's last receive arrived
  double since_start_us() const;
  void note_held();  // updates the peaks of stats_
  // The batch's valid-target count, the sum of squares of this rank's
  // gradients, and the update, each a small graph of its own.
  compile::PipelineUpdate update_;  // the count, sum-of-squares and update graphs, as compiled
  std::unique_ptr<runtime::Executor> count_run_, squares_run_, update_run_;
  Tensor lr_, adam_step_, squares_;
  Tensor global_tokens_, global_targets_;  // the batch every rank takes its microbatches' rows of
  std::string no_estimate_because_ = "a pipeline's step is estimated by `meshtrain estimate`, not yet beside a run";
};

}  // namespace meshtrain::train
