// Training configuration: a TOML file whose every key can be overridden on
// the command line as --section.key value. Unknown keys and bad values are
// errors that name the key.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "models/llama.h"
#include "parallel/plan.h"
#include "sched/passes/bucket_collectives.h"
#include "sched/passes/checkpoint_activations.h"

namespace meshtrain::config {

// AdamW's hyperparameters ([optimizer]); a TrainConfig's are the key
// table's defaults.
struct OptimizerConfig {
  double lr{};
  double beta1{};
  double beta2{};
  double eps{};
  double weight_decay{};
  DType state_dtype{};  // the moments' storage: f32, or bf16 (f32 math either way)
};

enum class LrDecay { none, linear, cosine };

// How the scheduling passes and estimates cost a compute node ([schedule] estimate).
enum class EstimateMode { roofline, benchmark };

struct TrainConfig {
  std::string file;  // the TOML file it was read from (not a key; "" when built in code)
  models::LlamaConfig model;
  struct {
    std::string path;
    int64_t seq_len{};
    int64_t batch_size{};
  } data;
  OptimizerConfig optimizer;  // optimizer.state_dtype: float32 or bfloat16
  struct {
    int64_t warmup_steps{};
    LrDecay decay{};
    double min_lr_ratio{};
  } lr_scheduler;
  struct {
    int64_t steps{};
    int64_t seed{};
    double max_grad_norm{};      // global gradient-norm clipping; 0: none
    DType dtype{};               // compute dtype: float32 or bfloat16 (master weights stay f32)
    Device device{};             // where the step runs: cpu, or cuda (one rank, for now)
    int64_t grad_accum_steps{};  // microbatches per step, their gradients summed
    DType reduce_dtype{};        // gradients reduced across ranks in: float32, or bfloat16 (with dtype bfloat16)
    // A step whose gradient norm is NaN or infinite (no update applied):
    // false stops the run naming it; true goes on, counting it in the metrics.
    bool skip_nonfinite{};
  } training;
  struct {
    std::string init_from;
    std::string folder;
    int64_t interval{};       // 0: only at the end (when folder is set)
    int64_t load_step{};      // the step to resume from; 0: the newest complete checkpoint in folder
    int64_t keep_latest_k{};  // checkpoints kept in folder; 0: all
    std::string export_file;  // whole weights as Hugging Face safetensors after the last step; "": none
    bool async{};             // copy the state and write it on a thread of its own while training goes on
  } checkpoint;
  struct {
    std::string file;
    int64_t log_every{};
  } metrics;
  struct {
    std::string path;  // the validation split's tokens (as data.path reads them); "": no validation
    int64_t every{};   // steps between validations (and one after the last step); 0: only after the last
    int64_t steps{};   // batches of data.batch_size x data.seq_len in each validation, from the split's start
  } validation;
  parallel::ParallelConfig parallel;  // used under mpirun
  struct {
    // A collective that has not finished after this long (a rank died or
    // hangs) stops the job: the error names it, every rank dumps its flight
    // recorder (MESHTRAIN_FR_DIR), and `meshtrain fr-analyze` names who never joined.
    double timeout_s{};
  } comm;
  struct {
    sched::ActivationCheckpoint mode{};           // none, full or selective
    sched::SelectiveMatmuls selective_matmuls{};  // selective: all or every_other kept
  } activation_checkpoint;
  struct {
    sched::BucketMode bucket_mode{};  // none, per_block, size_cap or auto
    double bucket_cap_mb{};           // size_cap: a bucket's bytes per rank
    bool bucket_views{};              // members as views of their bucket (false: copied in and out)
    bool reorder{};                   // start collectives early, so compute hides them (sched::prefetch_collectives)
    int64_t memory_budget_mb{};       // a rank's step may allocate at most this; 0: no budget
    std::string hardware{};           // the profile the passes cost the step on; auto: cpu-2core
    // How compute nodes are costed: the profile's roofline, or (benchmark)
    // each kernel timed on this machine and agreed across the ranks.
    EstimateMode estimate{};
    std::string kernel_cache;  // benchmark mode: a JSON file of kernel times read first and written back ("": none)
  } schedule;

  // Every key at its default, from the key table (config.cpp), the one
  // place a key's default is declared: the members' own initial values are
  // only the types' zeros (and models::LlamaConfig's and
  // parallel::ParallelConfig's library defaults, which the table's replace).
  TrainConfig();

  // Learning rate of 1-based step `step`: linear warmup, then the decay.
  double lr_at(int64_t step) const;
  // parallel.cp_attention, and the model's ring_attention that follows from it (with parallel.cp > 1).
  void set_cp_attention(parallel::ParallelConfig::CpAttention mode);
  // What schedule.hardware "auto" names: this project's development VM.
  static constexpr const char* kDefaultHardware = "cpu-2core";
  // The hardware profile schedule.hardware names: a built-in name or a file;
  // "auto" is kDefaultHardware.
  std::string hardware_profile() const { return schedule.hardware == "auto" ? kDefaultHardware : schedule.hardware; }
};

// Set one key from its text form ("model.dim", "512"); throws naming the key.
void apply_override(TrainConfig& config, const std::string& key, const std::string& value);
// Read `path` (TOML), then apply overrides ("section.key", "value") in order.
TrainConfig load_config(const std::string& path, const std::vector<std::pair<std::string, std::string>>& overrides);
// The checks of keys against each other that load_config makes once every
// key is read, and the settings that follow from them (the model's dispatch
// blocks, sequence chunks and ring attention); for a config changed in code.
void check_config(TrainConfig& config);
// Every key, "section.key".
std::vector<std::string> config_keys();
// Every key with the value `config` holds, as TOML writes it, in key order.
std::vector<std::pair<std::string, std::string>> config_values(const TrainConfig& config);
// The same as a TOML document: every key, by [section]; load_config reads it back.
std::string config_toml(const TrainConfig& config);
// Every key as --help shows it: its name ("section.key"), its default (as
// --section.key takes it) and what a value must be.
struct KeyDoc {
  std::string name, default_text, expects;
};
std::vector<KeyDoc> config_key_docs();
// docs/configuration.md: every key by section, a table row each (name,
// default, what its value must be), made from the same table as --help.
std::string config_reference_markdown();

}  // namespace meshtrain::config
