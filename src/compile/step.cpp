#include "compile/step.h"

#include <cmath>
#include <optional>

#include "compile/pipeline_place.h"
#include "core/allocator.h"
#include "core/error.h"
#include "parallel/plan.h"
#include "sched/estimate.h"
#include "sched/pass.h"
#include "sched/schedule.h"

namespace meshtrain::compile {

std::map<graph::ValueId, graph::ValueId> delivered_outputs(const graph::Graph& global, const graph::Graph& running) {
  std::map<graph::ValueId, graph::ValueId> delivered;
  for (size_t k = 0; k < global.outputs().size(); ++k) delivered[global.outputs()[k]] = running.outputs()[k];
  return delivered;
}

graph::Schedule schedule_step(const graph::Graph& global, const TrainStepGraph& step, const graph::Graph& running,
                              const std::map<graph::ValueId, graph::ValueId>& values) {
  const auto delivered = delivered_outputs(global, running);
  std::vector<graph::Update> updates;  // parameters and moments, updated in place where the plan can
  for (const auto& [from, to] : step.write_backs) updates.push_back({delivered.at(from), values.at(to)});
  return sched::make_schedule(running, running.outputs(), std::move(updates));
}

void check_benchmark_hardware(const sched::HardwareProfile& hardware) {
  MT_CHECK(hardware.shared_host,
           "schedule.estimate = \"benchmark\" times the kernels on this machine's CPUs, so schedule.hardware (or "
           "--hardware) must be a profile of this machine (shared_host: cpu-2core, or one bench/calibrate.sh made); "
           "'{}' is not. Use schedule.estimate = \"roofline\" for other hardware",
           hardware.name);
}

namespace {
// The [parallel] checks of a pipeline-parallel run (parallel.pp > 1): the
// ranks are the pipeline's, and what the pipeline does not do yet is refused.
void check_tp_divides(const config::TrainConfig& config) {
  const int64_t tp = config.parallel.tp;
  const models::LlamaConfig& m = config.model;
  for (const auto& [key, n] : {std::pair{"model.n_heads", m.n_heads}, std::pair{"model.n_kv_heads", m.n_kv_heads},
                               std::pair{"model.vocab_size", m.vocab_size}})
    MT_CHECK(n % tp == 0, "{} {} must divide by parallel.tp {} (tensor parallelism splits it evenly)", key, n, tp);
}

sharding::DeviceMesh check_pipeline_config(const config::TrainConfig& config, int world_size) {
  const parallel::ParallelConfig& p = config.parallel;
  MT_CHECK(world_size % p.pp == 0,
           "parallel.pp {} must divide the job's {} ranks: each pipeline stage runs on ranks / pp of them (mpirun -n "
           "a multiple of {})",
           p.pp, world_size, p.pp);
  const sharding::DeviceMesh mesh = pipeline_mesh(config, world_size);
  const int64_t dp = parallel::data_parallel_degree(mesh);
  // The schedule's own checks first, naming the key; its microbatches and stages (read from
  // parallel.pp_schedule_csv, or the keys') are what the rest checks.
  const parallel::PpSchedule schedule = pipeline_schedule(config, static_cast<int>(p.pp));
  const int64_t micro = schedule.microbatches, accum = config.training.grad_accum_steps;
  // The schedule's checks saw that micro x accum divides the batch.
  MT_CHECK((config.data.batch_size / (micro * accum)) % dp == 0,
           "data.batch_size {} must divide by parallel.pp_microbatches {}{} x the data-parallel degree {} "
           "(parallel.dp_replicate x parallel.dp_shard): each microbatch's sequences are split over data parallel",
           config.data.batch_size, micro, accum > 1 ? fmt::format(" x training.grad_accum_steps {}", accum) : "", dp);
  check_tp_divides(config);
  MT_CHECK(config.schedule.estimate == config::EstimateMode::roofline && config.schedule.memory_budget_mb == 0,
           "schedule.estimate = \"benchmark\" and schedule.memory_budget_mb with parallel.pp {}: the scheduling "
           "passes do not cost pipeline stages yet; leave them at their defaults",
           p.pp);
  pipeline_spans(config.model, schedule.stages(), p.pp_layers_per_stage);
  return mesh;
}
}  // namespace

sharding::DeviceMesh check_parallel_config(const config::TrainConfig& config, int world_size) {
  if (config.parallel.pp > 1) return check_pipeline_config(config, world_size);
  const sharding::DeviceMesh mesh = parallel::make_mesh(config.parallel, world_size);
  const int64_t dp = parallel::data_parallel_degree(mesh);
  MT_CHECK(config.data.batch_size % dp == 0,
           "data.batch_size {} (the global batch, in sequences) must divide by the data-parallel degree {} "
           "(parallel.dp_replicate x parallel.dp_shard)",
           config.data.batch_size, dp);
  const int64_t micro = config.training.grad_accum_steps;
  MT_CHECK(config.data.batch_size % (dp * micro) == 0,
           "data.batch_size {} must divide by the data-parallel degree {} x training.grad_accum_steps {}: each "
           "data-parallel rank splits its {} sequences into {} microbatches",
           config.data.batch_size, dp, micro, config.data.batch_size / dp, micro);
  check_tp_divides(config);
  return mesh;
}

StepOptions step_options(const config::TrainConfig& config) {
  StepOptions options;
  options.max_grad_norm = config.training.max_grad_norm;
  options.compute_dtype = config.training.dtype;
  options.split_loss = config.parallel.loss_parallel;
  options.micro_batches = config.training.grad_accum_steps;
  return options;
}

TrainStepGraph build_step(const config::TrainConfig& config, graph::Graph& g) {
  TrainStepGraph step = build_train_step(g, config.model, config.data.batch_size, config.data.seq_len, config.optimizer,
                                         step_options(config));
  sched::step_pipeline(config.activation_checkpoint.mode, config.activation_checkpoint.selective_matmuls).run(g);
  return step;
}

sched::HardwareProfile scheduling_hardware(const config::TrainConfig& config) {
  return sched::load_hardware(config.hardware_profile(), "schedule.hardware");
}

double batch_buffer_bytes(const config::TrainConfig& config, int world_size) {
  if (world_size <= 1) return 0;
  const auto bytes = static_cast<size_t>(config.data.batch_size * config.data.seq_len) * sizeof(int64_t);
  return 2.0 * static_cast<double>(CachingAllocator::block_size(bytes));
}

double memory_budget_bytes(const config::TrainConfig& config) {
  return static_cast<double>(config.schedule.memory_budget_mb) * (1 << 20);
}

std::string over_budget_message(const config::TrainConfig& config, double needed_bytes, int rank) {
  // Where the step buckets (several ranks, one stage), copying bucket members may lower the peak.
  const parallel::ParallelConfig& p = config.parallel;
  const bool views = config.schedule.bucket_views && config.schedule.bucket_mode != sched::BucketMode::none &&
                     p.pp == 1 && p.dp_replicate * p.dp_shard * p.tp > 1;
  return fmt::format(
      "schedule.memory_budget_mb {} is too small: rank {}'s step allocates {:.1f} MiB with no collective started "
      "early; the smallest budget that fits is {} MiB (or lower the step's memory: fewer sequences per rank, more "
      "dp_shard or tp{})",
      config.schedule.memory_budget_mb, rank, needed_bytes / (1 << 20),
      static_cast<int64_t>(std::ceil(needed_bytes / (1 << 20))),
      views ? ", or try schedule.bucket_views = false: buckets then copy their members, which lowers some steps' "
              "peak and raises others'"
            : "");
}

void run_lowered_step_passes(const config::TrainConfig& config, const sched::RankDevice& device,
                             const sharding::DeviceMesh& mesh, int rank, const ScheduleOf& schedule_of,
                             graph::Graph& lowered) {
  std::optional<sched::PrefetchOptions> prefetch;
  // Where the cores that compute also move a collective's bytes, starting it early hides nothing.
  if (config.schedule.reorder && !device.hardware.shared_host) {
    // Which bucket members the memory plan lays out in their bucket does
    // not depend on the order, so one plan of the bucketed step serves.
    auto plan = std::make_shared<std::optional<graph::MemoryPlan>>();
    prefetch = sched::PrefetchOptions{
        .node_us =
            [&lowered, &schedule_of, device, plan](graph::NodeId n) {
              if (!*plan) *plan = schedule_of(lowered).memory;
              return sched::planned_node_us(lowered, n, device, **plan);
            },
        .schedule_of = schedule_of,
        .memory_budget_bytes = memory_budget_bytes(config),
    };
  }
  sched::BucketOptions buckets{.mode = config.schedule.bucket_mode,
                               .cap_bytes = config.schedule.bucket_cap_mb * (1 << 20),
                               .mesh_ndim = mesh.ndim(),
                               .member_views = config.schedule.bucket_views};
  if (buckets.mode == sched::BucketMode::automatic)
    buckets.step_us = [&schedule_of, device](const graph::Graph& r) {
      return sched::estimate_step(r, schedule_of(r), device).step_us;
    };
  std::optional<sched::AsyncTpOptions> async_tp;
  if (config.parallel.async_tp && mesh.size(mesh.dim_index("tp")) > 1)
    async_tp = sched::AsyncTpOptions{mesh.ndim(), mesh.dim_index("tp"), rank};
  sched::lowered_step_pipeline(std::move(buckets), std::move(prefetch), async_tp).run(lowered);
}

std::map<graph::ValueId, graph::ValueId> identity_values(const graph::Graph& g) {
  std::map<graph::ValueId, graph::ValueId> values;
  for (int i = 0; i < g.num_values(); ++i) values[graph::ValueId(i)] = graph::ValueId(i);
  return values;
}

LaidOut lay_out_graph(const graph::Graph& g, sharding::Planner& planner, int rank,
                      const std::map<graph::ValueId, sharding::Layout>& given,
                      const std::map<graph::ValueId, sharding::Layout>& deliver, const spmd::LowerOptions& options,
                      const spmd::PropagationOptions& propagation) {
  LaidOut out;
  out.sharding = spmd::propagate(g, planner, given, deliver, propagation);
  out.lowered = spmd::lower(g, out.sharding, planner, rank, options);
  return out;
}

StepLayout lay_out_step(const config::TrainConfig& config, const graph::Graph& g, const TrainStepGraph& step,
                        int world_size, int rank, const sched::HardwareProfile& hardware,
                        const MeasureKernels& measured_kernels) {
  MT_CHECK(config.parallel.pp == 1,
           "parallel.pp {}: a pipeline is not laid out as one step graph; each stage is laid out on its own ranks "
           "(compile/pipeline_stage.h)",
           config.parallel.pp);
  const sharding::DeviceMesh mesh = check_parallel_config(config, world_size);
  StepLayout out;
  out.planner = sharding::shared_planner(mesh);
  const bool split_activations = parallel::splits_activations(mesh);
  const parallel::StepLayouts layouts = parallel::step_layouts(
      mesh, g,
      step_roles(step, split_activations, config.training.reduce_dtype != DType::f32, config.parallel.expert_tp > 1),
      config.parallel);
  LaidOut laid_out = lay_out_graph(g, *out.planner, rank, layouts.given, layouts.deliver,
                                   {.reshard_after_forward = config.parallel.reshard_after_forward,
                                    .ragged_rows = ragged_rows(step.model, step.gradient_of)},
                                   {.choices = spmd::shared_choices(out.planner)});
  out.sharding = std::move(laid_out.sharding);
  out.lowered = std::move(laid_out.lowered);
  const sched::RankDevice device{hardware, world_size,
                                 measured_kernels ? measured_kernels(out.lowered.graph) : nullptr};
  run_lowered_step_passes(
      config, device, mesh, rank, [&](const graph::Graph& r) { return schedule_step(g, step, r, out.lowered.values); },
      out.lowered.graph);
  return out;
}

}  // namespace meshtrain::compile
