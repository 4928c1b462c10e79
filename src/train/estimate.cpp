#include "train/estimate.h"

#include <set>

#include "core/error.h"
#include "graph/op_registry.h"
#include "sched/trace.h"
#include "train/kernel_benchmark.h"
#include "train/trainer.h"

namespace meshtrain::train {

double torchtitan_flops_per_token(const models::LlamaConfig& model, int64_t seq_len) {
  double params = 0;
  for (const auto& [name, spec] : models::llama_parameters(model))
    if (name != "model.embed_tokens.weight") params += static_cast<double>(spec.shape.numel());
  return 6 * params + 12.0 * static_cast<double>(model.n_layers * model.n_heads * model.head_dim() * seq_len);
}

namespace {

// The values of the graph that runs holding parameter gradients: the
// images of the step's gradients of parameters (and of their compute-dtype
// copies), the partial sums that add up to them, and what collectives,
// waits, views and casts make of them.
std::set<graph::ValueId> gradient_values(const graph::Graph& global, const TrainStepGraph& step,
                                         const graph::Graph& running,
                                         const std::map<graph::ValueId, graph::ValueId>& values) {
  std::set<graph::ValueId> global_grads;
  auto seed = [&](const std::map<graph::ValueId, graph::ValueId>& of, graph::ValueId v) {
    if (const auto it = of.find(v); it != of.end()) global_grads.insert(it->second);
  };
  for (const auto& [name, p] : step.model.params) {
    seed(step.gradient_of, p);
    seed(step.applied_gradient_of, p);
  }
  for (const auto& [copy, param] : step.model.param_copies) seed(step.gradient_of, copy);
  // The partial sums (microbatches, several uses) that add up to a gradient.
  for (bool grew = true; grew;) {
    grew = false;
    for (graph::NodeId n : global.order()) {
      const graph::Node& node = global.node(n);
      if (node.op->name != "add" || !global_grads.count(node.outputs[0])) continue;
      for (graph::ValueId in : node.inputs)
        if (global.value(in).producer.valid() && global_grads.insert(in).second) grew = true;
    }
  }
  std::set<graph::ValueId> out;
  for (graph::ValueId v : global_grads)
    if (const auto it = values.find(v); it != values.end()) out.insert(it->second);
  for (graph::NodeId n : running.order()) {
    const graph::Node& node = running.node(n);
    const bool carries = node.op->is_collective || node.op->is_view || node.op->name == "cast";
    if (carries && !node.inputs.empty() && out.count(node.inputs[0]))
      for (graph::ValueId o : node.outputs) out.insert(o);
  }
  return out;
}

}  // namespace

TrainingEstimate estimate_training(const TrainConfig& config, int world_size, int rank,
                                   const sched::HardwareProfile& hardware, bool with_trace) {
  MT_CHECK(world_size >= 1, "estimate: --ranks {} must be at least 1", world_size);
  MT_CHECK(rank >= 0 && rank < world_size, "estimate: --rank {} is outside the {} ranks", rank, world_size);
  TrainingEstimate e;
  e.world_size = world_size;
  e.rank = rank;
  graph::Graph global;
  const TrainStepGraph step = build_step(config, global);
  std::optional<StepLayout> layout;
  std::map<graph::ValueId, graph::ValueId> identity;
  // Benchmark mode: the cache's kernel times, the rest timed here as a rank
  // of the job would run them (its threads, its share of the cores).
  sched::KernelTimes kernel_times;
  MeasureKernels measure;
  if (config.schedule.estimate == EstimateMode::benchmark) {
    check_benchmark_hardware(hardware);
    if (!config.schedule.kernel_cache.empty()) kernel_times = sched::load_kernel_times(config.schedule.kernel_cache);
    set_threads_per_rank(world_size);
    measure = [&kernel_times, slowdown = shared_core_slowdown(world_size)](const graph::Graph& g) {
      measure_kernels(g, kernel_times, slowdown);
      return &kernel_times;
    };
  }
  if (world_size > 1) {
    layout = lay_out_step(config, global, step, world_size, rank, hardware, measure);
    e.mesh = layout->mesh().describe();
  } else {
    for (int i = 0; i < global.num_values(); ++i) identity[graph::ValueId(i)] = graph::ValueId(i);
  }
  const graph::Graph& running = layout ? layout->lowered.graph : global;
  const auto& values = layout ? layout->lowered.values : identity;
  const graph::Schedule schedule = schedule_step(global, step, running, values);

  const sched::RankDevice device{hardware, world_size, measure ? measure(running) : nullptr};
  if (measure && !config.schedule.kernel_cache.empty()) sched::save_kernel_times(kernel_times, config.schedule.kernel_cache);
  e.time = sched::estimate_step(running, schedule, device);
  if (with_trace) e.trace = sched::chrome_trace({sched::chrome_trace_events(running, e.time.timeline, rank)});
  std::set<graph::ValueId> states;
  for (const auto* of : {&step.exp_avg, &step.exp_avg_sq})
    for (const auto& [name, v] : *of) states.insert(values.at(v));
  const std::set<graph::ValueId> gradients = gradient_values(global, step, running, values);
  e.memory = sched::estimate_memory(running, schedule, [&](graph::ValueId v) -> std::optional<sched::MemoryKind> {
    if (states.count(v)) return sched::MemoryKind::optimizer_states;
    if (gradients.count(v)) return sched::MemoryKind::gradients;
    return std::nullopt;
  });
  const double budget = memory_budget_bytes(config);
  const double needed = e.memory.allocated_bytes + batch_buffer_bytes(config, world_size);
  MT_CHECK(budget <= 0 || needed <= budget, "{}", over_budget_message(config, needed, rank));
  for (graph::NodeId n : schedule.steps) {
    const graph::Node& node = running.node(n);
    ++e.nodes;
    if (node.op->starts_async) {
      ++e.collectives;
      e.collective_bytes += node.attrs.get(graph::attr::comm_bytes);
    }
  }
  e.tokens_per_step = static_cast<double>(config.data.batch_size * config.data.seq_len);
  e.tokens_per_s_per_device = e.time.step_us > 0 ? e.tokens_per_step / world_size / (e.time.step_us * 1e-6) : 0;
  e.flops_per_token = torchtitan_flops_per_token(config.model, config.data.seq_len);
  const bool bf16 = config.training.dtype == DType::bf16 && hardware.peak_gflops_bf16 > 0;
  e.peak_gflops = (bf16 ? hardware.peak_gflops_bf16 : hardware.peak_gflops_f32) * hardware.rank_share(world_size);
  e.mfu = e.flops_per_token * e.tokens_per_s_per_device / (e.peak_gflops * 1e9);
  return e;
}

}  // namespace meshtrain::train
