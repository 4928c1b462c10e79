#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "core/error.h"
#include "sched/pass.h"
#include "sched/schedule.h"
#include "train/safetensors.h"

namespace meshtrain::train {

Trainer::Trainer(TrainConfig config)
    : config_(std::move(config)), loader_(config_.data.path, config_.data.batch_size, config_.data.seq_len) {
  MT_CHECK(loader_.max_token() < config_.model.vocab_size,
           "data file {} holds token {} but model.vocab_size is {}", config_.data.path, loader_.max_token(),
           config_.model.vocab_size);
  const int64_t B = config_.data.batch_size, T = config_.data.seq_len;
  init_parameters();
  tokens_ = Tensor::empty({B, T}, DType::i64);
  targets_ = Tensor::empty({B, T}, DType::i64);
  lr_ = Tensor::empty({}, DType::f64);
  step_ = Tensor::empty({}, DType::i64);
  auto& part = *parts_.emplace_back(std::make_unique<ModelPart>());
  const TrainStepGraph& sg = part.step_graph =
      build_train_step(part.graph, config_.model, B, T, config_.optimizer, config_.training.max_grad_norm,
                       DType::f32, config_.training.dtype);
  sched::step_pipeline().run(part.graph);
  auto& ex = *(part.executor =
                   std::make_unique<runtime::Executor>(part.graph, sched::make_schedule(part.graph, part.graph.outputs())));
  for (const auto& [from, to] : sg.write_backs) ex.write_back(from, to);
  for (const auto& [name, v] : sg.model.params) {
    ex.bind(v, params_.at(name));
    const DType state = config_.optimizer.state_dtype;
    ex.bind(sg.exp_avg.at(name), Tensor::zeros(params_.at(name).shape(), state));
    ex.bind(sg.exp_avg_sq.at(name), Tensor::zeros(params_.at(name).shape(), state));
  }
  ex.bind(sg.model.tokens, tokens_);
  ex.bind(sg.model.targets, targets_);
  ex.bind(sg.lr, lr_);
  ex.bind(sg.step, step_);
}

void Trainer::init_parameters() {
  const auto specs = models::llama_parameters(config_.model);
  if (config_.checkpoint.init_from.empty()) {
    params_ = models::initial_parameters(specs, static_cast<uint64_t>(config_.training.seed));
    return;
  }
  const std::string& path = config_.checkpoint.init_from;
  auto loaded = load_safetensors(path);
  for (const auto& [name, spec] : specs) {
    auto it = loaded.find(name);
    MT_CHECK(it != loaded.end(), "checkpoint.init_from {}: tensor '{}' is missing", path, name);
    MT_CHECK(it->second.shape() == spec.shape, "checkpoint.init_from {}: tensor '{}' has shape {}, the model expects {}",
             path, name, it->second.shape().to_string(), spec.shape.to_string());
    params_[name] = it->second.dtype() == DType::f32 ? it->second : it->second.to(DType::f32);
  }
}

size_t Trainer::parameter_count() const {
  size_t n = 0;
  for (const auto& [name, t] : params_) n += static_cast<size_t>(t.numel());
  return n;
}

StepMetrics Trainer::step() {
  const auto t0 = std::chrono::steady_clock::now();
  StepMetrics m;
  m.step = ++steps_done_;
  m.lr = config_.lr_at(m.step);
  loader_.next(tokens_, targets_);
  lr_.data<double>()[0] = m.lr;
  step_.data<int64_t>()[0] = m.step;
  for (auto& part : parts_) {
    part->executor->set_profiling(profiling_ && m.step > 1);
    part->executor->run();
  }
  const ModelPart& last = loss_part();
  m.loss = last.executor->fetch(last.step_graph.model.loss).get(0);
  m.grad_norm = last.executor->fetch(last.step_graph.grad_norm).get(0);
  m.step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  m.tokens_per_s = static_cast<double>(config_.data.batch_size * config_.data.seq_len) / (m.step_ms / 1000.0);
  m.peak_bytes = default_allocator().stats().peak_bytes;
  MT_CHECK(std::isfinite(m.loss), "step {}: the loss is {} (diverged); lower optimizer.lr or check the data", m.step, m.loss);
  return m;
}

double Trainer::flops_per_step() const {
  double total = 0;
  for (const auto& part : parts_) total += part->executor->flops();
  return total;
}

std::vector<runtime::Executor::OpTime> Trainer::profile() const {
  std::vector<runtime::Executor::OpTime> all;
  for (const auto& part : parts_)
    for (const auto& t : part->executor->profile()) all.push_back(t);
  std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.seconds > b.seconds; });
  return all;
}

void Trainer::save(const std::string& path) const { save_safetensors(path, params_); }

Trainer::Summary Trainer::run(std::FILE* progress) {
  std::ofstream metrics;
  if (!config_.metrics.file.empty()) {
    const auto dir = std::filesystem::path(config_.metrics.file).parent_path();
    if (!dir.empty()) std::filesystem::create_directories(dir);
    metrics.open(config_.metrics.file);
    MT_CHECK(metrics.good(), "cannot write metrics file '{}'", config_.metrics.file);
  }
  if (!config_.checkpoint.folder.empty()) std::filesystem::create_directories(config_.checkpoint.folder);
  const bool live = progress && isatty(fileno(progress));
  auto checkpoint = [&](int64_t s) {
    const std::string path = fmt::format("{}/step_{:06d}.safetensors", config_.checkpoint.folder, s);
    save(path);
    if (progress) fmt::print(progress, "{}saved {}\n", live ? "\n" : "", path);
  };
  Summary summary;
  StepMetrics& last = summary.last;
  for (int64_t s = 1; s <= config_.training.steps; ++s) {
    last = step();
    if (s == 1) summary.first = last;
    const bool log = s % config_.metrics.log_every == 0 || s == config_.training.steps;
    if (log && metrics.is_open()) {
      metrics << nlohmann::ordered_json{{"step", last.step},        {"loss", last.loss},
                                        {"lr", last.lr},            {"grad_norm", last.grad_norm},
                                        {"step_ms", last.step_ms},  {"tokens_per_s", last.tokens_per_s},
                                        {"peak_bytes", last.peak_bytes},
                                        {"gflops_per_s", flops_per_step() / last.step_ms * 1e-6}}
                     .dump()
              << '\n';
      metrics.flush();
    }
    if (progress && (live || log)) {
      fmt::print(progress, "{}step {:>5}/{}  loss {:.4f}  lr {:.2e}  grad_norm {:.3f}  {:.0f} ms  {:.0f} tok/s{}",
                 live ? "\r" : "", s, config_.training.steps, last.loss, last.lr, last.grad_norm, last.step_ms,
                 last.tokens_per_s, live ? "" : "\n");
      std::fflush(progress);
    }
    if (!config_.checkpoint.folder.empty() && config_.checkpoint.interval > 0 && s % config_.checkpoint.interval == 0 &&
        s != config_.training.steps)
      checkpoint(s);
  }
  if (progress && live) fmt::print(progress, "\n");
  if (!config_.checkpoint.folder.empty()) checkpoint(config_.training.steps);
  return summary;
}

}  // namespace meshtrain::train
