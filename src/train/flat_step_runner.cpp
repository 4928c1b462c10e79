#include "train/flat_step_runner.h"

#include <algorithm>
#include <span>

#include "core/allocator.h"
#include "core/copy.h"
#include "core/error.h"
#include "sched/estimate.h"
#include "sched/memory_estimate.h"
#include "sched/trace.h"
#include "sharding/local_chunk.h"
#include "sharding/redistribute.h"
#include "spmd/lower.h"

namespace meshtrain::train {

FlatStepRunner::FlatStepRunner(const config::TrainConfig& config, comm::ProcessGroupPtr world,
                               std::unique_ptr<compile::FlatStep> step, std::map<std::string, Tensor> initial,
                               const sched::HardwareProfile& hardware, estimate::BenchmarkMode* benchmark)
    : config_(config), world_(std::move(world)), step_(std::move(step)) {
  MT_ASSERT(step_ != nullptr && (world_ == nullptr) == !step_->layout,
            "a flat step runner needs a step laid out exactly when it has several ranks");
  on_gpu_ = config_.training.device == Device::cuda;
  MT_CHECK(!on_gpu_ || !world_, "training.device cuda runs on one rank for now; this job has {} (mpirun -n 1)",
           world_ ? world_->size() : 1);
  if (on_gpu_) stream_ = std::make_unique<kernels::cuda::Stream>();
  lr_ = Tensor::empty({}, DType::f64);
  update_ = Tensor::empty({}, DType::i64);
  const compile::TrainStepGraph& sg = step_->step;
  const auto run_value = [&](graph::ValueId global) { return step_->values.at(global); };
  const int ranks = world_ ? world_->size() : 1;
  if (world_) {
    groups_ = std::make_unique<sharding::MeshGroups>(step_->layout->mesh(), world_);
    const Shape batch{config_.data.batch_size, config_.data.seq_len};
    global_tokens_ = Tensor::empty(batch, DType::i64);
    global_targets_ = Tensor::empty(batch, DType::i64);
    // This rank's shard of every parameter, cut from the same global initial
    // weights, all before any is freed, from an empty cache: a shard served
    // from a freed block up to twice its size would hold memory no step uses.
    default_allocator().release_cache();
    for (const auto& [name, v] : sg.model.params)
      params_[name] = sharding::local_piece(initial.at(name), layout_of(v), groups_->mesh(), groups_->coordinate());
    initial.clear();
    default_allocator().release_cache();
  } else {
    params_ = std::move(initial);
  }
  const graph::Graph& run_graph = step_->running();
  tokens_ = Tensor::empty(run_graph.value(run_value(sg.model.tokens)).info.shape, DType::i64);
  targets_ = Tensor::empty(run_graph.value(run_value(sg.model.targets)).info.shape, DType::i64);
  if (config_.schedule.memory_budget_mb > 0)
    check_memory_budget(sched::estimate_memory(run_graph, step_->schedule).allocated_bytes +
                        compile::batch_buffer_bytes(config_, ranks));
  auto& ex = *(executor_ = std::make_unique<runtime::Executor>(run_graph, step_->schedule, groups_.get(),
                                                               config_.training.device));
  const sched::KernelTimes* measured = benchmark ? benchmark->measure(run_graph) : nullptr;
  if (on_gpu_ && config_.schedule.hardware == "auto") {
    no_estimate_because_ =
        "the default profile (auto) is this project's CPU VM and the step runs on the GPU: "
        "--schedule.hardware h100-sxm, h200 or a profile file estimates it";
  } else {
    try {  // a report, not a need: a profile without figures for this job leaves it out
      estimated_step_us_ = sched::estimate_step(run_graph, ex.schedule(), {hardware, ranks, measured}).step_us;
    } catch (const std::exception& e) {
      no_estimate_because_ = e.what();
    }
  }
  if (benchmark) benchmark->save_cache();
  default_allocator().release_cache();  // of the measurements
  for (const auto& [name, v] : sg.model.params) {
    const Tensor& p = params_.at(name);
    bind(run_value(v), p, state_twins_);
    const DType state = config_.optimizer.state_dtype;
    bind(run_value(sg.exp_avg.at(name)), exp_avg_[name] = Tensor::zeros(p.shape(), state), state_twins_);
    bind(run_value(sg.exp_avg_sq.at(name)), exp_avg_sq_[name] = Tensor::zeros(p.shape(), state), state_twins_);
  }
  bind(run_value(sg.model.tokens), tokens_, input_twins_);
  bind(run_value(sg.model.targets), targets_, input_twins_);
  bind(run_value(sg.lr), lr_, input_twins_);
  bind(run_value(sg.step), update_, input_twins_);
  // The loss and the gradient norm as the graph that runs delivers them.
  const auto delivered = compile::delivered_outputs(step_->global, run_graph);
  loss_value_ = delivered.at(sg.model.loss);
  grad_norm_value_ = delivered.at(sg.grad_norm);
  for (const graph::ValueId load : sg.model.expert_load) expert_load_values_.push_back(delivered.at(load));
  if (sg.model.aux_loss.valid()) aux_loss_value_ = delivered.at(sg.model.aux_loss);
}

void FlatStepRunner::bind(graph::ValueId run_value, const Tensor& host, std::vector<Twin>& twins) {
  if (!on_gpu_) return executor_->bind(run_value, host);
  Tensor device = kernels::cuda::to_device(host);
  executor_->bind(run_value, device);
  twins.push_back({host, std::move(device)});
}

void FlatStepRunner::download_state() const {
  if (!on_gpu_) return;
  for (const Twin& t : state_twins_) {
    Tensor host = t.host;  // shares the storage of the map's tensor
    kernels::cuda::copy(host, t.device, *stream_);
  }
  stream_->synchronize();
}

void FlatStepRunner::state_loaded() {
  if (!on_gpu_) return;
  for (Twin& t : state_twins_) kernels::cuda::copy(t.device, t.host, *stream_);
  stream_->synchronize();
}

void FlatStepRunner::check_memory_budget(double needed_bytes) const {
  const double budget = compile::memory_budget_bytes(config_);
  if (!world_) {
    MT_CHECK(needed_bytes <= budget, "{}", compile::over_budget_message(config_, needed_bytes, 0));
    return;
  }
  // Every rank learns every rank's need, so that all of them stop together.
  Tensor needs = Tensor::zeros({world_->size()}, DType::f64);
  needs.data<double>()[static_cast<size_t>(world_->rank())] = needed_bytes;
  world_->all_reduce(needs)->wait();
  const std::span<double> need = needs.data<double>();
  const auto most = static_cast<size_t>(std::max_element(need.begin(), need.end()) - need.begin());
  if (need[most] <= budget) return;
  // Rank 0 reports it and takes the job down; the others wait to be stopped.
  if (world_->rank() != 0) world_->barrier()->wait();
  throw InvalidArgument(compile::over_budget_message(config_, need[most], static_cast<int>(most)));
}

std::vector<RowRange> FlatStepRunner::rows_read() const {
  if (!world_) return {};
  const auto chunk = sharding::local_chunk(global_tokens_.shape(), layout_of(step_->step.model.tokens), groups_->mesh(),
                                           groups_->coordinate());
  return {{chunk.offset[0], chunk.offset[0] + chunk.shape[0]}};
}

void FlatStepRunner::take_rows() {
  if (!world_) return;
  // This rank's rows of the global batch (the batch is Shard(0), so they are contiguous).
  const auto chunk = sharding::local_chunk(global_tokens_.shape(), layout_of(step_->step.model.tokens), groups_->mesh(),
                                           groups_->coordinate());
  const size_t row_bytes = static_cast<size_t>(global_tokens_.shape()[1]) * sizeof(int64_t);
  copy_bytes(tokens_.raw(), static_cast<const std::byte*>(global_tokens_.raw()) + chunk.offset[0] * row_bytes,
             tokens_.nbytes());
  copy_bytes(targets_.raw(), static_cast<const std::byte*>(global_targets_.raw()) + chunk.offset[0] * row_bytes,
             targets_.nbytes());
}

const Tensor& FlatStepRunner::bound(const Tensor& host) const {
  for (const auto* twins : {&state_twins_, &input_twins_})
    for (const Twin& t : *twins)
      if (t.host.raw() == host.raw()) return t.device;
  MT_ASSERT(!on_gpu_, "a host tensor with no device twin on the GPU");
  return host;
}

StepRunner::Result FlatStepRunner::step(double lr, int64_t update) {
  take_rows();
  lr_.data<double>()[0] = lr;
  update_.data<int64_t>()[0] = update;
  if (on_gpu_) {
    for (Twin& t : input_twins_) kernels::cuda::copy(t.device, t.host, *stream_);
    stream_->synchronize();
    executor_->run();
    return {kernels::cuda::to_host(executor_->fetch(loss_value_)).get(0),
            kernels::cuda::to_host(executor_->fetch(grad_norm_value_)).get(0)};
  }
  executor_->run();
  Result result{executor_->fetch(loss_value_).get(0), executor_->fetch(grad_norm_value_).get(0)};
  for (const graph::ValueId v : expert_load_values_) {
    const Tensor& load = executor_->fetch(v);
    std::vector<double>& layer = result.expert_load.emplace_back();
    for (int64_t e = 0; e < load.numel(); ++e) layer.push_back(load.get(e));
  }
  if (aux_loss_value_.valid()) result.aux_loss = executor_->fetch(aux_loss_value_).get(0);
  return result;
}

double FlatStepRunner::evaluate() {
  if (!eval_) eval_ = compile::compile_eval(config_, world_ ? world_->size() : 1, world_ ? world_->rank() : 0);
  const graph::Graph& g = eval_->running();
  runtime::Executor ex(g, eval_->schedule, groups_.get(), config_.training.device);
  const auto run_value = [&](graph::ValueId global) { return eval_->values.at(global); };
  // The training step's own tensors: its parameters (shards) and its rows of the batch.
  for (const auto& [name, v] : eval_->model.params) ex.bind(run_value(v), bound(params_.at(name)));
  ex.bind(run_value(eval_->model.tokens), bound(tokens_));
  ex.bind(run_value(eval_->model.targets), bound(targets_));
  take_rows();
  if (on_gpu_) {
    for (Twin& t : input_twins_) kernels::cuda::copy(t.device, t.host, *stream_);
    stream_->synchronize();
  }
  ex.run();
  const Tensor loss = ex.fetch(compile::delivered_outputs(eval_->global, g).at(eval_->model.loss));
  return on_gpu_ ? kernels::cuda::to_host(loss).get(0) : loss.get(0);
}

std::vector<checkpoint::HeldTensor> FlatStepRunner::held_tensors() const {
  download_state();
  const compile::TrainStepGraph& sg = step_->step;
  std::vector<checkpoint::HeldTensor> held;
  const auto layout = [&](graph::ValueId v) { return world_ ? layout_of(v) : sharding::Layout{}; };
  for (const auto& [name, v] : sg.model.params) {
    const Shape& shape = step_->global.value(v).info.shape;
    held.push_back({name, shape, layout(v), params_.at(name)});
    held.push_back({"optimizer.exp_avg." + name, shape, layout(sg.exp_avg.at(name)), exp_avg_.at(name)});
    held.push_back({"optimizer.exp_avg_sq." + name, shape, layout(sg.exp_avg_sq.at(name)), exp_avg_sq_.at(name)});
  }
  return held;
}

checkpoint::CheckpointRank FlatStepRunner::checkpoint_rank() const {
  if (!world_) return {};
  return {&groups_->mesh(), groups_->coordinate(), world_.get()};
}

std::map<std::string, Tensor> FlatStepRunner::whole_parameters() {
  if (!world_) {
    download_state();
    return params_;
  }
  // Every parameter gathered whole (a collective: every rank takes part).
  const sharding::Layout replicated =
      sharding::Layout::from_placements(std::vector<sharding::Placement>(static_cast<size_t>(groups_->mesh().ndim())));
  std::map<std::string, Tensor> whole;
  for (const auto& [name, v] : step_->step.model.params)
    whole[name] = sharding::redistribute(params_.at(name), step_->global.value(v).info.shape, layout_of(v), replicated,
                                         *groups_, *step_->layout->planner);
  return whole;
}

std::string FlatStepRunner::text() const {
  return world_ ? spmd::to_text(step_->global, step_->layout->lowered, step_->layout->sharding)
                : graph::to_text(step_->global);
}

std::string FlatStepRunner::layout_summary() const {
  if (!world_) return "";
  std::string out = fmt::format("mesh {}: ", groups_->mesh().describe());
  std::map<std::string, int> count;
  for (const auto& [name, v] : step_->step.model.params) ++count[layout_of(v).to_string()];
  for (const auto& [layout, n] : count) out += fmt::format("{} parameters {}; ", n, layout);
  out += fmt::format("batch {}", layout_of(step_->step.model.tokens).to_string());
  return out;
}

void FlatStepRunner::report(RankReport& r) const {
  if (groups_) r.coordinate = groups_->coordinate();
  const graph::Graph& g = step_->running();
  auto bytes = [&](graph::ValueId v) {
    return static_cast<double>(g.value(v).info.shape.numel() * dtype_size(g.value(v).info.dtype));
  };
  for (graph::NodeId n : g.order()) {
    const graph::Node& node = g.node(n);
    if (node.op->name == "adamw") {  // param, grad, m, v, lr, step: each as this rank holds it
      r.parameter_bytes += bytes(node.inputs[0]);
      r.gradient_bytes += bytes(node.inputs[1]);
      r.optimizer_state_bytes += bytes(node.inputs[2]) + bytes(node.inputs[3]);
    }
    if (node.op->is_collective) {
      r.collectives_per_step += 1;
      r.collective_bytes_per_step += node.attrs.get(graph::attr::comm_bytes);
    }
  }
}

std::string FlatStepRunner::trace_events(int rank) const {
  return sched::chrome_trace_events(step_->running(), executor_->trace(), rank);
}

}  // namespace meshtrain::train
