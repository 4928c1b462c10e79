// What runs one rank's training step for the Trainer: a flat step's executor
// (FlatStepRunner) or a pipeline rank's runner (PipelineRunner), behind one
// interface, so that the trainer's loop has no flat/pipeline branch.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/tensor.h"
#include "runtime/executor.h"
#include "sharding/device_mesh.h"
#include "train/data.h"

namespace meshtrain::train {

// What one rank holds and does each step: its mesh coordinate, the bytes of
// its parameters, gradients (as the optimizer takes them) and optimizer
// states, the collectives its step graph runs and the bytes they move, and
// its peak memory so far and in its last step.
struct RankReport {
  int rank = 0;
  std::vector<int> coordinate;
  double parameter_bytes = 0, gradient_bytes = 0, optimizer_state_bytes = 0;
  double collectives_per_step = 0, collective_bytes_per_step = 0;
  double peak_bytes = 0;
  double step_peak_bytes = 0;
  // Pipeline parallel, the last step: the rank's measured bubble (the share
  // of the step it did not compute), and its activations held between
  // programs at their peak: bytes, and (stage, microbatch) pairs.
  double pipeline_bubble = 0, activation_peak_bytes = 0, activation_peak_pairs = 0;
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;

  // Where the trainer puts each step's global batch, [batch, seq] tokens and
  // targets (of which the data fills the rows_read()); the runner takes its rows.
  virtual Tensor& batch_tokens() = 0;
  virtual Tensor& batch_targets() = 0;
  // The rows of the global batch this rank's step reads: the data fills only
  // those (each data-parallel rank reads only the tokens it trains on).
  // Empty: every row (one rank, or a pipeline's ranks).
  virtual std::vector<RowRange> rows_read() const { return {}; }
  struct Result {
    double loss = 0;       // the batch's mean loss (every rank gets it)
    double grad_norm = 0;  // over every gradient, before clipping
    // A mixture of experts': each MoE layer's token slots
    // per expert then the dropped ones (models::LlamaGraph::expert_load),
    // and the load-balancing loss, unweighted.
    std::vector<std::vector<double>> expert_load;
    std::optional<double> aux_loss;
  };
  // One optimizer step on the batch at learning rate `lr`; `update` is
  // AdamW's 1-based count (its bias correction).
  virtual Result step(double lr, int64_t update) = 0;
  // The batch's mean loss under the parameters as they stand: the forward
  // only, laid out as the step is, with no gradient, update or optimizer
  // state touched (validation). A collective: every rank calls it.
  virtual double evaluate() = 0;

  // This rank's parameters and AdamW moments by Hugging Face name: the live
  // tensors the step updates (its shards on several ranks).
  virtual const std::map<std::string, Tensor>& parameters() const = 0;
  virtual const std::map<std::string, Tensor>& exp_avg() const = 0;
  virtual const std::map<std::string, Tensor>& exp_avg_sq() const = 0;
  // What a checkpoint saves of this rank (parameters and moments, each with
  // its global shape and layout) and where the rank stands on the mesh.
  // On a GPU they are host copies of the state, taken when asked for; after
  // writing into them (a resume) call state_loaded() to take them back.
  virtual std::vector<checkpoint::HeldTensor> held_tensors() const = 0;
  virtual void state_loaded() {}
  virtual checkpoint::CheckpointRank checkpoint_rank() const = 0;
  // Every parameter whole: a collective (every rank calls it); rank 0 gets
  // them all, the others whatever they gathered.
  virtual std::map<std::string, Tensor> whole_parameters() = 0;

  virtual const sharding::DeviceMesh* mesh() const = 0;  // null on one rank
  // The step graph or programs this rank runs, as text (--dump-graph).
  virtual std::string text() const = 0;
  // The mesh and how the model lies on it ("" on one rank).
  virtual std::string layout_summary() const = 0;
  // Fills what the runner knows of this rank's report: coordinate, bytes
  // held, collectives and, for a pipeline, the last step's bubble.
  virtual void report(RankReport& r) const = 0;
  virtual double flops_per_step() const = 0;
  // The step sched::estimate_step costs on config.schedule.hardware, in us
  // (0 when it cannot: no_estimate_because() says why).
  virtual double estimated_step_us() const = 0;
  virtual const std::string& no_estimate_because() const = 0;

  virtual void set_profiling(bool on) = 0;  // time every op of the next steps
  virtual void set_tracing(bool on) = 0;    // record the next step's timeline
  // The last traced step's events (Chrome trace), as rank `rank`'s.
  virtual std::string trace_events(int rank) const = 0;
  virtual std::vector<runtime::Executor::OpTime> profile() const = 0;
};

}  // namespace meshtrain::train
