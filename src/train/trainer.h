// The trainer: gets its rank's step from the step compiler (compile/),
// initialises or loads the weights, and runs steps with metrics, progress and
// checkpoints. Given a world of several ranks (mpirun), every rank computes
// the single-rank step's numbers on its shards.
#pragma once

#include <atomic>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "comm/process_group.h"
#include "compile/compile.h"
#include "config/config.h"
#include "estimate/kernel_benchmark.h"
#include "runtime/executor.h"
#include "train/data.h"
#include "train/flat_step_runner.h"
#include "train/pipeline_runner.h"
#include "train/step_runner.h"

namespace meshtrain::train {

struct StepMetrics {
  int64_t step = 0;
  int64_t skipped_steps = 0;  // so far: steps whose non-finite gradient norm left the weights as they were
  double loss = 0, lr = 0, grad_norm = 0, step_ms = 0, tokens_per_s = 0;  // tokens/s: the whole job's
  size_t peak_bytes = 0;       // this rank's, since it started (training.device cuda: GPU memory)
  size_t step_peak_bytes = 0;  // this rank's during this step: what its step allocates (sched::estimate_memory's peak)
  size_t peak_bytes_max = 0;   // the largest rank's (gathered at logged steps; else this rank's)
  size_t step_peak_bytes_max = 0;  // the largest rank's step_peak_bytes (gathered likewise)
  std::optional<double> val_loss;  // after a step with a validation: the split's mean loss (Trainer::validate)
  // A mixture of experts' (flat steps): each MoE layer's load, and the
  // load-balancing loss (unweighted; the loss holds it times its coefficient).
  struct ExpertLoad {
    int64_t layer = 0;
    double max = 0, mean = 0;  // token slots an expert took: the most, and the mean over experts
    double dropped = 0;        // slots over capacity
  };
  std::vector<ExpertLoad> expert_load;
  std::optional<double> aux_loss;
};

// Throws when writing `output` (the path of config key or option `what`)
// would replace one of the run's inputs: data.path, checkpoint.init_from,
// the --config file, a hardware profile or pipeline CSV file, or a file of a
// checkpoint in checkpoint.folder.
void check_output_path(const config::TrainConfig& config, const std::string& output, const std::string& what);

// A step whose loss or gradient norm is NaN or infinite: a step with a
// non-finite gradient norm applied no update (AdamW skips it in the graph);
// training.skip_nonfinite lets run() go on past such a step.
class NonFiniteStep : public Error {
 public:
  NonFiniteStep(const std::string& what, const StepMetrics& step, bool applied)
      : Error(what), metrics(step), update_applied(applied) {}
  StepMetrics metrics;  // the step's, loss and norm as they came out
  bool update_applied;  // false: the weights and moments are the previous step's
};

class Trainer {
 public:
  // `world`: the ranks to train on; null (or one rank) trains on this process alone.
  explicit Trainer(config::TrainConfig config, comm::ProcessGroupPtr world = nullptr);
  // One optimizer step on the next batch; throws NonFiniteStep when its
  // loss or gradient norm is not finite (with a non-finite norm the weights
  // and moments are left as they were).
  StepMetrics step();
  // The validation split's mean loss over validation.steps batches from its
  // start, under the weights as they stand: forward only on the training
  // layout, no update (a collective). Needs validation.path.
  double validate();
  struct Summary {
    StepMetrics first, last;
    double median_step_ms = 0;       // of the steps after the first (the first warms up), or the only one
    int64_t steps_run = 0;           // by this call: fewer than training.steps after a resume or a stop
    double checkpoint_stall_ms = 0;  // the loop stopped for checkpoints: the saves, or with async their copies
    int stopped_by_signal =
        0;  // SIGTERM, SIGINT or SIGUSR1: the run stopped after step last.step (0: it ran every step)
  };
  // All configured steps: metrics to config.metrics.file, progress to
  // `progress` (a live line on a terminal), checkpoints at the interval and
  // at the end, or fewer steps and a checkpoint after the last one run when
  // a signal asked to stop (stop_at_step_end_on_signals). On several ranks every rank runs it; rank 0 prints and
  // writes, and the logged steps gather every rank's peak memory.
  Summary run(std::FILE* progress);
  // Parameters by Hugging Face name (the live buffers: this rank's shards
  // when the step is laid out on several ranks).
  const std::map<std::string, Tensor>& parameters() const { return runner_->parameters(); }
  // Whole parameters to a Hugging Face safetensors file. On several ranks
  // every rank must call it (the shards are gathered); rank 0 writes.
  void save(const std::string& path);
  // The state after `step` (this rank's shards of the parameters and AdamW
  // moments, the step, the data cursor) as a checkpoint folder in
  // checkpoint.folder (checkpoint/checkpoint.h); every rank calls it. Returns its
  // path. With checkpoint.async the state is copied and written on a thread
  // while training goes on: the folder is complete once finish_save() has
  // returned it (run() calls it when every rank's writer is done, before the
  // next save and at the end).
  std::string save_checkpoint(int64_t step);
  // Waits for the save on its thread, if any, and completes it (a
  // collective); returns its path, or "" when none was pending.
  std::string finish_save();
  // Whether this rank's save thread, if any, has written its file.
  bool save_written() const { return pending_save_ == nullptr || save_written_; }
  bool save_pending() const { return pending_save_ != nullptr; }
  ~Trainer();
  // The checkpoint this trainer resumed from ("" when it started afresh) and its step.
  const std::string& resumed_from() const { return resumed_from_; }
  // parallel.pp > 1: the pipeline runner; else null.
  const PipelineRunner* pipeline() const { return dynamic_cast<const PipelineRunner*>(runner_.get()); }
  int64_t steps_done() const { return steps_done_; }
  int rank() const { return world_ ? world_->rank() : 0; }
  int num_ranks() const { return world_ ? world_->size() : 1; }
  const sharding::DeviceMesh& mesh() const { return *runner_->mesh(); }  // several ranks only
  // The mesh and each parameter's layout on it ("" on one rank).
  std::string layout_summary() const {
    return cp_attention_why_.empty() ? runner_->layout_summary() : runner_->layout_summary() + "; " + cp_attention_why_;
  }
  // Every rank's report, in rank order (a collective on several ranks:
  // every rank must call it; all get the list).
  std::vector<RankReport> rank_reports();
  // Returns when every rank has called it (at once on one rank).
  void wait_for_all_ranks();
  // The step graph this rank runs as text: its lowered graph on several
  // ranks (spmd::to_text), the global one on one.
  std::string lowered_text() const { return runner_->text(); }
  const config::TrainConfig& config() const { return config_; }
  // The step that runs, costed by sched::estimate_step on config.schedule.hardware
  // (with this machine's kernel times in benchmark mode), in ms: what `meshtrain estimate` says of it.
  // 0 when the profile cannot cost it (no_estimate_because() says why).
  double estimated_step_ms() const { return runner_->estimated_step_us() * 1e-3; }
  const std::string& no_estimate_because() const { return runner_->no_estimate_because(); }
  size_t parameter_count() const;
  double flops_per_step() const { return runner_->flops_per_step(); }
  // Time every op of the steps after the first (the first warms caches); see profile().
  void set_profiling(bool on) { profiling_ = on; }
  // Record the timeline of the last step (see trace()).
  void set_tracing(bool on) { tracing_ = on; }
  // The last step's timeline as a Chrome trace document (Perfetto,
  // chrome://tracing), every rank's, each from its own start of the step.
  // Under mpirun every rank calls it (it gathers); set_tracing(true) first.
  std::string trace();
  std::vector<runtime::Executor::OpTime> profile() const;  // slowest op first

 private:
  // Every parameter whole: checkpoint.init_from's, or (also when
  // `from_init_file` is false: a checkpoint will replace them) the seeded values.
  std::map<std::string, Tensor> initial_parameters(bool from_init_file) const;
  // The checkpoint to resume from: checkpoint.load_step's, or the newest
  // complete one in checkpoint.folder; none to start afresh.
  std::optional<checkpoint::CheckpointInfo> checkpoint_to_resume() const;
  void resume(const checkpoint::CheckpointInfo& checkpoint);
  void roll_back_past(const checkpoint::CheckpointInfo& checkpoint);
  RankReport own_report() const;

  config::TrainConfig config_;
  comm::ProcessGroupPtr world_;
  std::unique_ptr<estimate::BenchmarkMode> benchmark_;  // schedule.estimate = benchmark
  std::unique_ptr<StepRunner> runner_;                  // a flat step's, or a pipeline rank's
  std::optional<TokenDataset> loader_;                  // data.path's shards (made in the constructor)
  std::unique_ptr<TokenDataset> val_loader_;            // validation.path's batches (none without it)
  DataCursor val_start_;                                // where each validation starts: the split's first batch
  std::string resumed_from_;
  // The line of steps this run is on (checkpoint::CheckpointState::trajectory):
  // new, or the resumed checkpoint's when it was the newest. A rollback sets
  // the later steps aside, as `rollback_note_` says.
  std::string trajectory_ = checkpoint::new_trajectory_id();
  std::string rollback_note_;
  std::unique_ptr<checkpoint::PendingCheckpoint> pending_save_;  // checkpoint.async: written by save_writer_
  std::map<std::string, Tensor> snapshot_;                       // checkpoint.async: the state as of the pending save
  std::thread save_writer_;
  std::atomic<bool> save_written_{false};
  DataCursor cursor_before_step_;  // the data cursor where the last step's batch began
  // Where the step's memory is: the GPU's for training.device cuda (what
  // the peak-memory metrics count), else the host's.
  CachingAllocator& step_memory() const;
  std::string data_digest_;  // TokenDataset::digest of data.path (checkpoints and the ranks' agreement)
  int64_t steps_done_ = 0;
  int64_t updates_applied_ = 0;  // steps done less those skipped for a non-finite gradient norm
  bool profiling_ = false;
  bool tracing_ = false;
  size_t peak_before_step_ = 0;   // the allocator's peak before the current step reset it
  size_t last_step_peak_ = 0;     // the last step's peak
  std::string cp_attention_why_;  // parallel.cp_attention auto: what it chose and why (compile::choose_cp_attention)
};

}  // namespace meshtrain::train
