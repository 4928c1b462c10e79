#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <thread>

#include "checkpoint/safetensors.h"
#include "comm/mpi_backend.h"
#include "compile/compile.h"
#include "core/copy.h"
#include "core/error.h"
#include "core/file_io.h"
#include "estimate/kernel_benchmark.h"
#include "kernels/cpu/op_kernels.h"
#include "kernels/cuda/cuda.h"
#include "sched/trace.h"
#include "train/rank_agreement.h"
#include "train/signals.h"

namespace meshtrain::train {

namespace {
// validation.path's batches, of the training batch's shape; its errors name the key.
std::unique_ptr<TokenDataset> validation_loader(const config::TrainConfig& c) {
  try {
    return std::make_unique<TokenDataset>(c.validation.path, c.data.batch_size, c.data.seq_len, c.training.seed,
                                          "validation.path");
  } catch (const InvalidArgument& e) {  // a file's own errors say "data file": name the key
    const std::string what = e.what();
    throw InvalidArgument(what.starts_with("validation.path") ? what : "validation.path: " + what);
  }
}
}  // namespace

Trainer::Trainer(config::TrainConfig config, comm::ProcessGroupPtr world)
    : config_(std::move(config)), world_(world && world->size() > 1 ? std::move(world) : nullptr) {
  // The data read and checked on every rank, an error said once (every rank reads the same files).
  fail_together(world_.get(), [&] {
    loader_.emplace(config_.data.path, config_.data.batch_size, config_.data.seq_len, config_.training.seed);
    if (!config_.validation.path.empty()) val_loader_ = validation_loader(config_);
  });
  data_digest_ = loader_->digest();
  if (val_loader_) val_start_ = val_loader_->cursor();
  FileDigests digests{{"the contents of data.path", data_digest_}};
  // Every rank gives as many lines (a rank without validation.path gives "" for its contents).
  digests.emplace_back("the contents of validation.path", val_loader_ ? val_loader_->digest() : "");
  if (world_) check_ranks_agree(config_, digests, *world_);  // before any collective but fail_together's
  fail_together(world_.get(), [&] {
    loader_->check_vocabulary(config_.model.vocab_size);  // naming the shard
    try {
      if (val_loader_) val_loader_->check_vocabulary(config_.model.vocab_size);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("validation.path: {}", e.what()));
    }
  });
  // What the trainer holds is allocated fresh: a block cached from earlier
  // work (another trainer in this process) may be up to twice the request.
  default_allocator().release_cache();
  const sched::HardwareProfile hardware = compile::scheduling_hardware(config_);
  if (world_) {  // parallel.cp_attention auto decided once, for everything built from the config
    compile::CpAttentionChoice choice = compile::choose_cp_attention(config_, num_ranks(), hardware);
    config_ = std::move(choice.config);
    cp_attention_why_ = std::move(choice.why);
  }
  if (config_.schedule.estimate == config::EstimateMode::benchmark) {
    compile::check_benchmark_hardware(hardware);
    benchmark_ = std::make_unique<estimate::BenchmarkMode>(config_, world_);
  }
  const std::optional<checkpoint::CheckpointInfo> resume_from = checkpoint_to_resume();
  std::map<std::string, Tensor> initial;
  fail_together(world_.get(), [&] { initial = initial_parameters(!resume_from); });  // init_from's errors said once
  // Benchmark mode on several ranks: the passes cost the lowered step with
  // kernel times the ranks measure side by side and agree on.
  compile::CompileOptions options;
  if (benchmark_ && world_) options.measure = [this](const graph::Graph& g) { return benchmark_->measure(g); };
  compile::CompiledRank compiled = compile::compile_rank(config_, num_ranks(), rank(), hardware, options);
  if (compiled.pipeline) {
    MT_CHECK(config_.training.device == Device::cpu,
             "training.device {} with parallel.pp {}: pipelines run on the CPU only, for now",
             device_name(config_.training.device), config_.parallel.pp);
    MT_CHECK(world_, "parallel.pp {} needs {} ranks or a multiple (mpirun -n {}); this run has one",
             config_.parallel.pp, config_.parallel.pp, config_.parallel.pp);
    runner_ = std::make_unique<PipelineRunner>(config_, world_, std::move(*compiled.pipeline), initial);
    initial.clear();
    default_allocator().release_cache();
  } else {
    runner_ = std::make_unique<FlatStepRunner>(config_, world_, std::move(compiled.flat), std::move(initial), hardware,
                                               benchmark_.get());
  }
  if (resume_from) resume(*resume_from);
  // checkpoint.async copies the state into buffers of its own: made (and
  // their pages touched) here, so that no save pays for that in the loop.
  if (config_.checkpoint.async && !config_.checkpoint.folder.empty())
    for (const checkpoint::HeldTensor& t : runner_->held_tensors())
      snapshot_[t.name] = Tensor::zeros(t.local.shape(), t.local.dtype());
}

void check_output_path(const config::TrainConfig& config, const std::string& output, const std::string& what) {
  std::vector<InputPath> inputs{{config.data.path, "data.path"},
                                {config.validation.path, "validation.path"},
                                {config.checkpoint.init_from, "checkpoint.init_from"},
                                {config.file, "the --config file"},
                                {config.schedule.hardware, "schedule.hardware"},
                                {config.parallel.pp_schedule_csv, "parallel.pp_schedule_csv"}};
  for (const std::string& shard : glob_matches(config.data.path)) inputs.push_back({shard, "a shard of data.path"});
  for (const std::string& shard : glob_matches(config.validation.path))
    inputs.push_back({shard, "a shard of validation.path"});
  for (const std::string& step : checkpoint::checkpoint_step_folders(config.checkpoint.folder))
    inputs.push_back({step, "a checkpoint in checkpoint.folder"});
  check_not_an_input(output, what, inputs);
}

RankReport Trainer::own_report() const {
  RankReport r;
  r.rank = rank();
  r.peak_bytes = static_cast<double>(std::max(peak_before_step_, step_memory().stats().peak_bytes));
  r.step_peak_bytes = static_cast<double>(last_step_peak_);
  runner_->report(r);
  return r;
}

std::vector<RankReport> Trainer::rank_reports() {
  const RankReport own = own_report();
  if (!world_) return {own};
  // Every rank's numbers, gathered: [rank][field].
  const std::vector<double> fields{
      own.parameter_bytes,           own.gradient_bytes,       own.optimizer_state_bytes, own.collectives_per_step,
      own.collective_bytes_per_step, own.peak_bytes,           own.step_peak_bytes,       own.pipeline_bubble,
      own.activation_peak_bytes,     own.activation_peak_pairs};
  const auto per_rank = static_cast<int64_t>(fields.size());
  Tensor mine = Tensor::empty({per_rank}, DType::f64), all = Tensor::empty({world_->size() * per_rank}, DType::f64);
  std::copy(fields.begin(), fields.end(), mine.data<double>().begin());
  world_->all_gather(mine, all)->wait();
  std::vector<RankReport> reports;
  for (int r = 0; r < world_->size(); ++r) {
    const double* f = all.data<double>().data() + r * per_rank;
    reports.push_back({r, mesh().coordinate(r), f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9]});
  }
  return reports;
}

void Trainer::wait_for_all_ranks() {
  if (world_) world_->barrier()->wait();
}

std::map<std::string, Tensor> Trainer::initial_parameters(bool from_init_file) const {
  const auto specs = models::llama_parameters(config_.model);
  if (config_.checkpoint.init_from.empty() || !from_init_file)
    return models::initial_parameters(specs, static_cast<uint64_t>(config_.training.seed));
  std::map<std::string, Tensor> params;
  const std::string& path = config_.checkpoint.init_from;
  std::map<std::string, Tensor> loaded;
  try {
    loaded = models::from_hf_tensors(checkpoint::load_safetensors(path), specs);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("checkpoint.init_from {}: {}", path, e.what()));
  }
  for (const auto& [name, spec] : specs) {
    auto it = loaded.find(name);
    MT_CHECK(it != loaded.end(), "checkpoint.init_from {}: tensor '{}' is missing{}", path, name,
             models::missing_tensor_hint(name, loaded));
    MT_CHECK(it->second.shape() == spec.shape,
             "checkpoint.init_from {}: tensor '{}' has shape {}, the model expects {}", path, name,
             it->second.shape().to_string(), spec.shape.to_string());
    params[name] = it->second.dtype() == DType::f32 ? it->second : it->second.to(DType::f32);
    const std::span<const float> values = std::as_const(params[name]).data<float>();
    const auto bad = std::find_if(values.begin(), values.end(), [](float x) { return !std::isfinite(x); });
    MT_CHECK(bad == values.end(),
             "checkpoint.init_from {}: tensor '{}' holds {} at element {}: the checkpoint is "
             "damaged or was saved from a diverged run; start from an earlier one",
             path, name, *bad, bad - values.begin());
  }
  return params;
}

namespace {
// The keys a checkpoint must have been saved with to resume this run: the
// model and the moments' dtype (the shapes alone miss norm_eps and rope_theta).
nlohmann::json checkpoint_config(const config::TrainConfig& c, const std::string& data_digest) {
  const models::LlamaConfig& m = c.model;
  nlohmann::json keys = {{"the contents of data.path", data_digest},  // the data cursor points into these shards
                         {"model.dim", m.dim},
                         {"model.n_layers", m.n_layers},
                         {"model.n_heads", m.n_heads},
                         {"model.n_kv_heads", m.n_kv_heads},
                         {"model.ffn_dim", m.ffn_dim},
                         {"model.vocab_size", m.vocab_size},
                         {"model.norm_eps", m.norm_eps},
                         {"model.rope_theta", m.rope_theta},
                         {"model.tie_embeddings", m.tie_embeddings},
                         {"model.n_experts", m.n_experts},
                         {"optimizer.state_dtype", std::string(dtype_name(c.optimizer.state_dtype))}};
  if (m.n_experts == 0) return keys;
  keys["model.n_experts_per_token"] = m.n_experts_per_token;
  keys["model.moe_ffn_dim"] = m.expert_ffn_dim();
  keys["model.first_dense_layers"] = m.first_dense_layers;
  keys["model.n_shared_experts"] = m.n_shared_experts;
  return keys;
}

// A key a checkpoint saved before the key existed holds its then only value
// (checkpoints from before mixtures of experts are dense).
nlohmann::json saved_value(const nlohmann::json& saved, const std::string& key) {
  if (saved.contains(key)) return saved.at(key);
  if (key == "model.n_experts") return 0;
  return nullptr;
}

// What a checkpoint records of the run beside what a resume needs: the LR
// schedule is a function of the step and these keys, every data-parallel
// rank's rows follow from the one global cursor, and no random number is
// drawn after the seeded initialisation (no dropout; the order of shards is
// a function of the seed and the epoch).
nlohmann::json run_record(const config::TrainConfig& c, int64_t step) {
  const char* decay = c.lr_scheduler.decay == config::LrDecay::none     ? "none"
                      : c.lr_scheduler.decay == config::LrDecay::linear ? "linear"
                                                                        : "cosine";
  return {{"lr_schedule",
           {{"lr", c.optimizer.lr},
            {"warmup_steps", c.lr_scheduler.warmup_steps},
            {"decay", decay},
            {"min_lr_ratio", c.lr_scheduler.min_lr_ratio},
            {"steps", c.training.steps},
            {"lr_of_this_step", step > 0 ? c.lr_at(step) : 0.0}}},
          {"random", {{"seed", c.training.seed}, {"draws_after_initialisation", 0}}},
          {"data",
           {{"path", c.data.path},
            {"batch_size", c.data.batch_size},
            {"seq_len", c.data.seq_len},
            {"cursor_is",
             "global: every data-parallel rank reads its rows of the global batch there; epoch e's order of shards is "
             "drawn from (training.seed, e)"}}}};
}

// The data cursor a checkpoint saved.
DataCursor cursor_of(const checkpoint::CheckpointState& s) {
  return {s.data_epoch, s.data_shard_index, s.data_shard, s.data_cursor};
}
}  // namespace

std::optional<checkpoint::CheckpointInfo> Trainer::checkpoint_to_resume() const {
  const auto& ck = config_.checkpoint;
  MT_CHECK(ck.load_step == 0 || !ck.folder.empty(),
           "checkpoint.load_step {} needs checkpoint.folder, the folder that holds step {}", ck.load_step,
           ck.load_step);
  if (ck.folder.empty()) return std::nullopt;
  if (ck.load_step > 0) {
    const std::string path =
        (std::filesystem::path(ck.folder) / checkpoint::checkpoint_folder_name(ck.load_step)).string();
    if (!std::filesystem::is_directory(path)) {
      const auto newest = checkpoint::latest_checkpoint(ck.folder);
      throw InvalidArgument(fmt::format(
          "checkpoint.load_step {}: there is no checkpoint {} ({}); set 0 for the newest", ck.load_step, path,
          newest ? "the newest complete one is " + *newest : "there is no complete one in " + ck.folder));
    }
    return checkpoint::read_checkpoint_info(path);
  }
  const auto newest = checkpoint::latest_checkpoint(ck.folder);
  if (!newest) return std::nullopt;
  return checkpoint::read_checkpoint_info(*newest);
}

// Resuming an older step than the folder's newest rolls back: the later
// steps (rank 0 moves them, the other ranks wait in fail_together) are set
// aside, never resumed or deleted, and the steps saved from here on are a
// new trajectory's.
void Trainer::roll_back_past(const checkpoint::CheckpointInfo& checkpoint) {
  const std::string aside = "abandoned_" + trajectory_;
  if (rank() != 0) return;
  const std::vector<int64_t> moved =
      checkpoint::set_aside_steps_after(config_.checkpoint.folder, checkpoint.state.step, aside);
  if (moved.empty()) {
    trajectory_ = checkpoint.state.trajectory.empty() ? trajectory_ : checkpoint.state.trajectory;
    return;
  }
  rollback_note_ =
      fmt::format("rolled back to step {}: the later step{} {} moved to {}/{}, where no run resumes or deletes {}\n",
                  checkpoint.state.step, moved.size() > 1 ? "s" : "", fmt::join(moved, ", "), config_.checkpoint.folder,
                  aside, moved.size() > 1 ? "them" : "it");
}

void Trainer::resume(const checkpoint::CheckpointInfo& checkpoint) {
  std::string failure;
  try {
    const nlohmann::json mine = checkpoint_config(config_, data_digest_);
    for (const auto& [key, value] : mine.items()) {
      const nlohmann::json saved = saved_value(checkpoint.state.config, key);
      MT_CHECK(
          saved == value,
          "checkpoint {} was saved with {} = {}, this run has {}: resume with the same data file, [model] keys "
          "and optimizer.state_dtype, or train in another checkpoint.folder (meshtrain export makes a Hugging Face "
          "file of it for checkpoint.init_from)",
          checkpoint.path, key, saved.is_null() ? "nothing" : saved.dump(), value.dump());
    }
    loader_->set_cursor(cursor_of(checkpoint.state));
    roll_back_past(checkpoint);
  } catch (const std::exception& e) {
    failure = fmt::format("resuming from {}: {}", checkpoint.path, e.what());
  }
  checkpoint::fail_together(failure, world_.get());
  std::vector<checkpoint::HeldTensor> held = runner_->held_tensors();
  checkpoint::load_checkpoint(checkpoint, held, runner_->checkpoint_rank());
  runner_->state_loaded();
  steps_done_ = checkpoint.state.step;
  updates_applied_ = checkpoint.state.updates_applied;
  cursor_before_step_ = cursor_of(checkpoint.state);
  resumed_from_ = checkpoint.path;
}

std::string Trainer::save_checkpoint(int64_t step) {
  MT_CHECK(step == steps_done_ || step == steps_done_ - 1,
           "Trainer::save_checkpoint: step {} is neither the last "
           "step done ({}) nor the one before",
           step, steps_done_);
  finish_save();  // one save at a time, in step order
  const DataCursor cursor = step == steps_done_ ? loader_->cursor() : cursor_before_step_;
  checkpoint::CheckpointState state;
  state.step = step;
  state.updates_applied = updates_applied_;
  state.data_cursor = cursor.offset;
  state.data_epoch = cursor.epoch;
  state.data_shard_index = cursor.shard_index;
  state.data_shard = cursor.shard;
  state.config = checkpoint_config(config_, data_digest_);
  state.trajectory = trajectory_;
  state.run = run_record(config_, step);
  std::vector<checkpoint::HeldTensor> held = runner_->held_tensors();
  if (!config_.checkpoint.async) {
    const std::string path =
        checkpoint::save_checkpoint(config_.checkpoint.folder, state, held, runner_->checkpoint_rank());
    if (rank() == 0)
      checkpoint::keep_latest_checkpoints(
          config_.checkpoint.folder, static_cast<int>(std::min<int64_t>(config_.checkpoint.keep_latest_k, 1 << 30)));
    return path;
  }
  // The stall: a copy of this rank's state into the snapshot buffers (free:
  // the save before is finished); the thread writes them.
  for (checkpoint::HeldTensor& t : held) {
    Tensor& copy = snapshot_[t.name];
    if (!copy.defined() || copy.shape() != t.local.shape() || copy.dtype() != t.local.dtype())
      copy = Tensor::empty(t.local.shape(), t.local.dtype());
    copy_bytes(copy.raw(), t.local.raw(), t.local.nbytes());
    t.local = copy;
  }
  pending_save_ = std::make_unique<checkpoint::PendingCheckpoint>(
      checkpoint::begin_checkpoint(config_.checkpoint.folder, state, held, runner_->checkpoint_rank()));
  save_written_ = false;
  save_writer_ = std::thread([this] {
    checkpoint::write_checkpoint_file(*pending_save_);
    save_written_ = true;
  });
  return pending_save_->final_path;
}

std::string Trainer::finish_save() {
  if (!pending_save_) return "";
  if (save_writer_.joinable()) save_writer_.join();
  std::unique_ptr<checkpoint::PendingCheckpoint> save = std::move(pending_save_);
  const std::string path = checkpoint::complete_checkpoint(*save);
  if (rank() == 0)
    checkpoint::keep_latest_checkpoints(config_.checkpoint.folder,
                                        static_cast<int>(std::min<int64_t>(config_.checkpoint.keep_latest_k, 1 << 30)));
  return path;
}

Trainer::~Trainer() {
  // A save still being written is left as its .tmp folder, never loaded.
  if (save_writer_.joinable()) save_writer_.join();
}

size_t Trainer::parameter_count() const {
  size_t n = 0;  // the whole model's, whatever this rank holds
  for (const auto& [name, spec] : models::llama_parameters(config_.model)) n += static_cast<size_t>(spec.shape.numel());
  return n;
}

CachingAllocator& Trainer::step_memory() const {
  return config_.training.device == Device::cuda ? kernels::cuda::device_allocator() : default_allocator();
}

double Trainer::validate() {
  MT_CHECK(val_loader_, "validate: validation.path is not set");
  val_loader_->set_cursor(val_start_);  // the same batches each time
  double sum = 0;
  for (int64_t i = 0; i < config_.validation.steps; ++i) {
    val_loader_->next(runner_->batch_tokens(), runner_->batch_targets(), runner_->rows_read());
    sum += runner_->evaluate();
  }
  return sum / static_cast<double>(config_.validation.steps);
}

StepMetrics Trainer::step() {
  const auto t0 = std::chrono::steady_clock::now();
  StepMetrics m;
  m.step = ++steps_done_;
  // The step's own peak from here; the peak so far is kept beside it.
  peak_before_step_ = std::max(peak_before_step_, step_memory().stats().peak_bytes);
  step_memory().reset_peak();
  m.lr = config_.lr_at(m.step);
  cursor_before_step_ = loader_->cursor();
  loader_->next(runner_->batch_tokens(), runner_->batch_targets(), runner_->rows_read());
  runner_->set_profiling(profiling_ && m.step > 1);
  runner_->set_tracing(tracing_ && m.step == config_.training.steps);
  // AdamW's step count (its bias correction): the updates it has applied, this one included.
  const StepRunner::Result result = runner_->step(m.lr, updates_applied_ + 1);
  m.loss = result.loss;
  m.grad_norm = result.grad_norm;
  m.aux_loss = result.aux_loss;
  for (size_t l = 0; l < result.expert_load.size(); ++l) {
    const std::vector<double>& load = result.expert_load[l];  // per expert, then the dropped
    const double most = *std::max_element(load.begin(), load.end() - 1);
    const double total = std::accumulate(load.begin(), load.end() - 1, 0.0);
    m.expert_load.push_back({config_.model.first_dense_layers + static_cast<int64_t>(l), most,
                             total / static_cast<double>(load.size() - 1), load.back()});
  }
  m.step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  m.tokens_per_s = static_cast<double>(config_.data.batch_size * config_.data.seq_len) / (m.step_ms / 1000.0);
  m.step_peak_bytes = m.step_peak_bytes_max = last_step_peak_ = step_memory().stats().peak_bytes;
  m.peak_bytes = m.peak_bytes_max = std::max(peak_before_step_, m.step_peak_bytes);
  m.skipped_steps = m.step - 1 - updates_applied_;
  // An FP8 operand with a NaN or infinity (its GEMM gave NaNs): named, as where the step went wrong first.
  const std::string fp8_operand = kernels::cpu::take_fp8_nonfinite_operand();
  const std::string fp8_note =
      fp8_operand.empty() ? std::string()
                          : fmt::format(
                                "; FP8: {} held NaN or infinite values first (training.fp8_skip leaves a layer "
                                "out of FP8)",
                                fp8_operand);
  if (!std::isfinite(m.grad_norm)) {
    m.skipped_steps += 1;
    throw NonFiniteStep(
        fmt::format(
            "step {}: the gradient norm is {} (loss {}): the update was not applied, so the weights and optimizer state "
            "are those of the step before; lower optimizer.lr (now {:g} at this step) or training.max_grad_norm, check "
            "the data, or set training.skip_nonfinite = true to go on past such steps{}",
            m.step, m.grad_norm, m.loss, m.lr, fp8_note),
        m, false);
  }
  ++updates_applied_;
  if (!std::isfinite(m.loss))
    throw NonFiniteStep(fmt::format("step {}: the loss is {} with a finite gradient norm {} (the update was applied); "
                                    "lower optimizer.lr or check the data{}",
                                    m.step, m.loss, m.grad_norm, fp8_note),
                        m, true);
  return m;
}

std::string Trainer::trace() {
  const std::string mine = runner_->trace_events(rank());
  if (!world_) return sched::chrome_trace({mine});
  const std::vector<std::string> events = comm::all_gather_text(*world_, mine);
  return sched::chrome_trace(events);
}

std::vector<runtime::Executor::OpTime> Trainer::profile() const {
  std::vector<runtime::Executor::OpTime> all = runner_->profile();
  std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.seconds > b.seconds; });
  return all;
}

void Trainer::save(const std::string& path) {
  // Gathered whole (a collective on several ranks: every rank takes part); rank 0 writes.
  std::map<std::string, Tensor> whole = runner_->whole_parameters();
  if (rank() == 0) checkpoint::save_safetensors(path, models::hf_tensors(std::move(whole)));
}

namespace {
// A mixture of experts' load in a metrics line: the load-balancing loss and,
// per MoE layer, the most and the mean token slots of an expert and the dropped.
void add_expert_load(nlohmann::ordered_json& line, const StepMetrics& m) {
  if (m.aux_loss) line["aux_loss"] = *m.aux_loss;
  if (m.expert_load.empty()) return;
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const StepMetrics::ExpertLoad& l : m.expert_load)
    layers.push_back({{"layer", l.layer},
                      {"tokens_per_expert_max", l.max},
                      {"tokens_per_expert_mean", l.mean},
                      {"dropped", l.dropped}});
  line["moe"] = layers;
}
// "  experts max/mean 1.42 (layer 3)" for the most unbalanced MoE layer, and the slots dropped in all.
std::string expert_load_summary(const StepMetrics& m) {
  if (m.expert_load.empty()) return "";
  const auto worst = std::max_element(m.expert_load.begin(), m.expert_load.end(),
                                      [](const auto& a, const auto& b) { return a.max * b.mean < b.max * a.mean; });
  double dropped = 0;
  for (const StepMetrics::ExpertLoad& l : m.expert_load) dropped += l.dropped;
  return fmt::format("  experts max/mean {:.2f} (layer {}){}", worst->mean > 0 ? worst->max / worst->mean : 0.0,
                     worst->layer, dropped > 0 ? fmt::format(", {:.0f} dropped", dropped) : "");
}

template <typename... Args>
void say(std::FILE* out, fmt::format_string<Args...> format, Args&&... args) {
  if (out != nullptr) write_progress(out, fmt::format(format, std::forward<Args>(args)...));
}
}  // namespace

Trainer::Summary Trainer::run(std::FILE* progress) {
  std::ofstream metrics;
  if (rank() != 0) progress = nullptr;  // rank 0 prints and writes for the job
  // Where the results go is checked before any step: a folder that cannot
  // be written is found now, not at the first save after the training.
  if (!config_.metrics.file.empty() && rank() == 0) {
    check_output_path(config_, config_.metrics.file, "metrics.file");
    check_output_file(config_.metrics.file, "metrics.file");
    // A resumed run adds to the file (steps after the checkpoint that were
    // logged before the stop appear again, as they are run again).
    metrics.open(config_.metrics.file, resumed_from_.empty() ? std::ios::trunc : std::ios::app);
    MT_CHECK(metrics.good(), "cannot write metrics file '{}': {}", config_.metrics.file, std::strerror(errno));
  }
  if (!config_.checkpoint.folder.empty() && rank() == 0)
    check_writable_directory(config_.checkpoint.folder, "checkpoint.folder");
  if (!config_.checkpoint.export_file.empty() && rank() == 0) {
    check_output_path(config_, config_.checkpoint.export_file, "checkpoint.export");
    check_output_file(config_.checkpoint.export_file, "checkpoint.export");
  }
  // A live line (carriage returns) on a terminal; not under mpirun, whose
  // forwarded output runs such lines together.
  const bool live = progress && isatty(fileno(progress)) && num_ranks() == 1;
  Summary summary;
  StepMetrics& last = summary.last;
  std::vector<double> step_ms;  // after the first
  auto checkpoint = [&](int64_t s) {
    const auto t0 = std::chrono::steady_clock::now();
    if (const std::string done = finish_save(); !done.empty()) say(progress, "{}saved {}\n", live ? "\n" : "", done);
    const auto t1 = std::chrono::steady_clock::now();
    const std::string path = save_checkpoint(s);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
    const double waited = std::chrono::duration<double, std::milli>(t1 - t0).count();
    summary.checkpoint_stall_ms += ms + waited;
    if (save_pending())
      say(progress, "{}saving {} on a thread: the loop stopped {:.1f} ms to copy the state{}\n", live ? "\n" : "", path,
          ms, waited >= 0.05 ? fmt::format(" and {:.1f} ms for the save before", waited) : "");
    else
      say(progress, "{}saved {} ({:.1f} ms)\n", live ? "\n" : "", path, ms);
  };

  const int64_t start = steps_done_;  // 0, or the step resumed from (its state is saved already)
  if (!resumed_from_.empty())
    say(progress, "resumed from {}: step {} done, {} to go\n{}", resumed_from_, start,
        std::max<int64_t>(0, config_.training.steps - start), rollback_note_);
  for (int64_t s = start + 1; s <= config_.training.steps; ++s) {
    try {
      last = step();
    } catch (const NonFiniteStep& e) {
      // Every rank sees the same loss and norm, so all get here together.
      if (config_.training.skip_nonfinite && !e.update_applied) {  // counted, and on to the next step
        last = e.metrics;
        say(progress, "{}step {:>5}/{}  skipped: gradient norm {} (loss {}), no update; {} skipped so far\n",
            live ? "\n" : "", s, config_.training.steps, last.grad_norm, last.loss, last.skipped_steps);
      } else {
        // Keep the state as it is (the last good step's when the update was
        // not applied), unless that step's checkpoint is written already,
        // then report once.
        const int64_t kept = e.update_applied ? s : s - 1;
        const bool saved = kept == start || (kept == s - 1 && config_.checkpoint.interval > 0 &&
                                             kept % config_.checkpoint.interval == 0);
        if (!config_.checkpoint.folder.empty() && !saved) checkpoint(kept);
        if (const std::string done = finish_save(); !done.empty()) say(progress, "saved {}\n", done);
        if (world_ && rank() != 0) world_->barrier()->wait();  // rank 0 reports and takes the job down
        throw;
      }
    }
    ++summary.steps_run;
    const int64_t every = config_.validation.every;
    if (val_loader_ && ((every > 0 && s % every == 0) || s == config_.training.steps)) last.val_loss = validate();
    if (s == start + 1)
      summary.first = last;
    else
      step_ms.push_back(last.step_ms);
    const bool log = s % config_.metrics.log_every == 0 || s == config_.training.steps || last.val_loss;
    const int ranks = num_ranks();
    if (log && world_) {  // every rank takes part
      for (const RankReport& r : rank_reports()) {
        last.peak_bytes_max = std::max(last.peak_bytes_max, static_cast<size_t>(r.peak_bytes));
        last.step_peak_bytes_max = std::max(last.step_peak_bytes_max, static_cast<size_t>(r.step_peak_bytes));
      }
    }
    if (log && metrics.is_open()) {
      nlohmann::ordered_json line{{"step", last.step},
                                  {"loss", last.loss},
                                  {"lr", last.lr},
                                  {"grad_norm", last.grad_norm},
                                  {"step_ms", last.step_ms},
                                  {"tokens_per_s", last.tokens_per_s},
                                  {"peak_bytes", last.peak_bytes},
                                  {"step_peak_bytes", last.step_peak_bytes},
                                  {"gflops_per_s", flops_per_step() / last.step_ms * 1e-6},
                                  {"estimated_step_ms", estimated_step_ms()},
                                  {"skipped_steps", last.skipped_steps}};
      if (last.val_loss) line["val_loss"] = *last.val_loss;
      add_expert_load(line, last);
      if (world_) {
        line["ranks"] = ranks;
        line["tokens_per_s_per_rank"] = last.tokens_per_s / ranks;
        line["peak_bytes_max"] = last.peak_bytes_max;
        line["step_peak_bytes_max"] = last.step_peak_bytes_max;
      }
      metrics << line.dump() << '\n';
      metrics.flush();
      MT_CHECK(metrics.good(),
               "writing metrics file {} failed at step {} (the disk is full, or the file went away); "
               "the steps before it are in the file",
               config_.metrics.file, s);
    }
    if (progress && (live || log)) {
      const std::string per_rank =
          world_ ? fmt::format(" ({:.0f} per rank), peak {:.1f} MiB on the largest rank", last.tokens_per_s / ranks,
                               static_cast<double>(last.peak_bytes_max) / (1 << 20))
                 : "";
      const std::string val = last.val_loss ? fmt::format("  val_loss {:.4f}", *last.val_loss) : "";
      say(progress, "{}step {:>5}/{}  loss {:.4f}{}  lr {:.2e}  grad_norm {:.3f}  {:.0f} ms  {:.0f} tok/s{}{}{}",
          live ? "\r" : "", s, config_.training.steps, last.loss, val, last.lr, last.grad_norm, last.step_ms,
          last.tokens_per_s, expert_load_summary(last), log ? per_rank : "", live ? "" : "\n");
    }
    const bool interval_checkpoint =
        !config_.checkpoint.folder.empty() && config_.checkpoint.interval > 0 && s % config_.checkpoint.interval == 0;
    if (interval_checkpoint && s != config_.training.steps) checkpoint(s);
    // The ranks agree on two things they may see at different steps: a stop
    // asked by a signal (the largest signal number any rank got) and, with
    // a save on its threads, whether every rank's file is written.
    Tensor agreed = Tensor::empty({2}, DType::f64);
    agreed.data<double>()[0] = stop_signal_received();
    agreed.data<double>()[1] = save_written() ? 0 : 1;
    if (world_) world_->all_reduce(agreed, comm::ReduceOp::max)->wait();
    if (save_pending() && agreed.data<double>()[1] == 0) say(progress, "{}saved {}\n", live ? "\n" : "", finish_save());
    if (const int got = static_cast<int>(agreed.data<double>()[0]); got != 0 && s < config_.training.steps) {
      summary.stopped_by_signal = got;
      say(progress, "{}stopping after step {} of {}: {} asked to stop\n", live ? "\n" : "", s, config_.training.steps,
          signal_name(got));
      if (!config_.checkpoint.folder.empty() && !interval_checkpoint) checkpoint(s);
      break;
    }
  }
  std::sort(step_ms.begin(), step_ms.end());
  summary.median_step_ms = step_ms.empty() ? summary.first.step_ms : step_ms[(step_ms.size() - 1) / 2];
  if (live) say(progress, "\n");
  if (summary.stopped_by_signal == 0 && !config_.checkpoint.folder.empty() && summary.steps_run > 0)
    checkpoint(config_.training.steps);
  if (const std::string done = finish_save(); !done.empty()) say(progress, "saved {}\n", done);
  if (summary.stopped_by_signal != 0) return summary;
  if (!config_.checkpoint.export_file.empty()) {
    save(config_.checkpoint.export_file);
    say(progress, "exported the weights to {}\n", config_.checkpoint.export_file);
  }
  return summary;
}

}  // namespace meshtrain::train
