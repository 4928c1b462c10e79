#include "autoplan/plan_space.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "compile/pipeline_place.h"
#include "compile/pipeline_stage.h"
#include "compile/step.h"
#include "core/error.h"
#include "models/llama.h"
#include "parallel/plan.h"
#include "sched/estimate.h"

namespace meshtrain::autoplan {

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// A value as config_values writes it (TOML) in the form --section.key takes.
std::string command_line_text(const std::string& toml) {
  if (toml.size() >= 2 && toml.front() == '"' && toml.back() == '"') return toml.substr(1, toml.size() - 2);
  if (toml.size() >= 2 && toml.front() == '[' && toml.back() == ']') {
    std::string out;
    for (const char ch : toml.substr(1, toml.size() - 2))
      if (ch != ' ') out += ch;
    return out;
  }
  return toml;
}

// The pipeline's stages per rank a schedule runs with (its default, as the config reads it).
int64_t stages_per_rank(parallel::PpScheduleKind kind) {
  parallel::ParallelConfig config;
  config.pp_schedule = kind;
  return config.stages_per_rank();
}

// The layouts of one degree product: with a pipeline, one per schedule and
// microbatch count; each checked as a run would check it.
void add_layouts(const config::TrainConfig& base, int world_size, Plan plan, std::vector<Plan>& layouts,
                 std::vector<RejectedPlan>& rejected) {
  std::vector<Plan> candidates;
  if (plan.pp == 1) {
    candidates.push_back(plan);
  } else {
    const int64_t dp = plan.dp_replicate * plan.dp_shard;
    const int64_t local = base.data.batch_size % dp == 0 ? base.data.batch_size / dp : 1;
    for (const auto kind : {parallel::PpScheduleKind::gpipe, parallel::PpScheduleKind::one_f_one_b,
                            parallel::PpScheduleKind::interleaved_1f1b, parallel::PpScheduleKind::zero_bubble,
                            parallel::PpScheduleKind::zbv})
      // The stages' count of microbatches, twice and four times it (fewer
      // never fill the pipeline; more shrink the GEMMs for a bubble already small).
      for (int64_t micro = plan.pp * stages_per_rank(kind);
           micro <= std::min(local, 4 * plan.pp * stages_per_rank(kind)); micro *= 2) {
        if (local % micro != 0) continue;
        Plan p = plan;
        p.pp_schedule = kind;
        p.pp_microbatches = micro;
        p.pp_stages_per_rank = stages_per_rank(kind);
        candidates.push_back(p);
      }
    if (candidates.empty())
      rejected.push_back(
          {plan, base.data.batch_size % dp != 0
                     ? fmt::format("data.batch_size {} does not divide over the {} data-parallel ranks",
                                   base.data.batch_size, dp)
                     : fmt::format("data.batch_size {} gives each of the {} data-parallel ranks {} sequences: no "
                                   "count of microbatches a pipeline of {} stages takes (pp x stages per rank, "
                                   "times 1, 2 or 4) divides them",
                                   base.data.batch_size, dp, local, plan.pp)});
  }
  for (const Plan& p : candidates) {
    try {
      compile::check_parallel_config(apply_plan(base, p, world_size), world_size);
      layouts.push_back(p);
    } catch (const InvalidArgument& e) {
      rejected.push_back({p, e.what()});
    }
  }
}

}  // namespace

config::TrainConfig apply_plan(const config::TrainConfig& base, const Plan& plan, int world_size) {
  config::TrainConfig c = base;
  parallel::ParallelConfig& p = c.parallel;
  const parallel::ParallelConfig defaults;
  p.dp_replicate = plan.dp_replicate;
  p.dp_shard = plan.dp_shard;
  p.tp = plan.tp;
  p.cp = plan.cp;
  p.ep = plan.ep;
  p.expert_tp = plan.expert_tp;
  p.sequence_parallel = plan.sequence_parallel;
  p.loss_parallel = plan.loss_parallel;
  p.async_tp = plan.async_tp;
  p.reshard_after_forward = plan.reshard_after_forward;
  p.pp = plan.pp;
  p.pp_schedule = plan.pp > 1 ? plan.pp_schedule : defaults.pp_schedule;
  p.pp_microbatches = plan.pp > 1 ? plan.pp_microbatches : 0;
  p.pp_stages_per_rank = plan.pp > 1 ? plan.pp_stages_per_rank : 0;
  p.pp_schedule_csv.clear();  // the plan's schedule, not the user's file
  p.pp_layers_per_stage.clear();
  if (plan.pp == 1) p.pp_max_active_stages = 0;
  p.pp_keep_backward_layouts = plan.pp > 1 && plan.pp_keep_backward_layouts;
  c.training.grad_accum_steps = plan.grad_accum_steps;
  c.activation_checkpoint.mode = plan.checkpoint;
  c.activation_checkpoint.selective_matmuls = plan.selective_matmuls;
  c.schedule.bucket_mode = plan.bucket_mode;
  c.model.fp8.enabled = plan.fp8;
  c.training.reduce_dtype = plan.reduce_dtype;
  if (plan.cp > 1) p.cp_attention = plan.cp_attention;
  MT_CHECK(plan.dp_replicate * plan.dp_shard * plan.tp * plan.cp * plan.pp == world_size,
           "a plan's degrees {} x {} x {} x {} x {} must multiply to the {} ranks", plan.dp_replicate, plan.dp_shard,
           plan.tp, plan.cp, plan.pp, world_size);
  config::check_config(c);
  return c;
}

std::vector<std::pair<std::string, std::string>> plan_overrides(const config::TrainConfig& base,
                                                                const config::TrainConfig& planned) {
  const auto before = config::config_values(base), after = config::config_values(planned);
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t i = 0; i < after.size(); ++i)
    if (after[i].second != before[i].second) out.emplace_back(after[i].first, command_line_text(after[i].second));
  return out;
}

std::string overrides_text(const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::string out;
  for (const auto& [key, value] : overrides)
    out += fmt::format("{}--{} {}", out.empty() ? "" : " ", key, value.empty() ? "\"\"" : value);
  return out;
}

std::vector<Plan> enumerate_layouts(const config::TrainConfig& base, int world_size, const SpaceOptions& options,
                                    std::vector<RejectedPlan>& rejected) {
  const models::LlamaConfig& m = base.model;
  std::vector<Plan> layouts;
  for (const int64_t tp : divisors(world_size))
    for (const int64_t cp : divisors(world_size / tp))
      for (const int64_t pp : divisors(world_size / (tp * cp)))
        for (const int64_t dp_replicate : divisors(world_size / (tp * cp * pp))) {
          Plan plan;
          plan.tp = tp;
          plan.cp = cp;
          plan.pp = pp;
          plan.dp_replicate = dp_replicate;
          plan.dp_shard = world_size / (tp * cp * pp * dp_replicate);
          plan.sequence_parallel = plan.loss_parallel = tp > 1;
          plan.bucket_mode = base.schedule.bucket_mode;
          plan.fp8 = base.model.fp8.enabled;
          plan.reduce_dtype = base.training.reduce_dtype;
          using CpAttention = parallel::ParallelConfig::CpAttention;
          plan.cp_attention = base.parallel.cp_attention == CpAttention::by_estimate ? CpAttention::allgather
                                                                                     : base.parallel.cp_attention;
          std::vector<int64_t> eps{1};
          if (m.n_experts > 0) {
            eps.clear();
            for (const int64_t ep : divisors(m.n_experts))
              if (plan.dp_shard % ep == 0 || (cp > 1 && ep % cp == 0 && plan.dp_shard % (ep / cp) == 0))
                eps.push_back(ep);
          }
          for (const int64_t ep : eps)
            for (const int64_t expert_tp :
                 m.n_experts > 0 && tp > 1 ? std::vector<int64_t>{1, tp} : std::vector<int64_t>{1})
              for (const bool fp8 : options.vary_fp8 ? std::vector<bool>{false, true} : std::vector<bool>{plan.fp8}) {
                Plan p = plan;
                p.ep = ep;
                p.expert_tp = expert_tp;
                p.fp8 = fp8;
                add_layouts(base, world_size, p, layouts, rejected);
              }
        }
  return layouts;
}

std::vector<Plan> memory_ladder(const config::TrainConfig& base, const Plan& plan) {
  std::vector<Plan> ladder;
  Plan p = plan;
  p.checkpoint = sched::ActivationCheckpoint::selective;
  p.selective_matmuls = sched::SelectiveMatmuls::all;
  ladder.push_back(p);
  p.selective_matmuls = sched::SelectiveMatmuls::every_other;
  ladder.push_back(p);
  p.checkpoint = sched::ActivationCheckpoint::full;
  p.selective_matmuls = sched::SelectiveMatmuls::all;
  ladder.push_back(p);
  if (plan.pp == 1) {
    const int64_t local = base.data.batch_size / (plan.dp_replicate * plan.dp_shard);
    for (int64_t accum = 2; accum <= local; accum *= 2)
      if (local % accum == 0) {
        p.grad_accum_steps = accum;
        ladder.push_back(p);
      }
  }
  return ladder;
}

std::vector<Plan> communication_variants(const config::TrainConfig& base, const Plan& plan,
                                         const SpaceOptions& options) {
  std::vector<Plan> out;
  auto add = [&](auto change) {
    Plan p = plan;
    change(p);
    out.push_back(p);
  };
  if (plan.reshard_after_forward && plan.dp_shard * plan.cp > 1) add([](Plan& p) { p.reshard_after_forward = false; });
  if (plan.pp > 1 && !plan.pp_keep_backward_layouts && plan.dp_shard * plan.cp > 1)
    add([](Plan& p) { p.pp_keep_backward_layouts = true; });
  if (plan.bucket_mode != sched::BucketMode::automatic)
    add([](Plan& p) { p.bucket_mode = sched::BucketMode::automatic; });
  if (plan.tp > 1) {
    if (plan.sequence_parallel && !plan.async_tp) add([](Plan& p) { p.sequence_parallel = false; });
    if (plan.loss_parallel) add([](Plan& p) { p.loss_parallel = false; });
    if (plan.sequence_parallel && !plan.async_tp && plan.cp == 1) add([](Plan& p) { p.async_tp = true; });
  }
  using CpAttention = parallel::ParallelConfig::CpAttention;
  if (plan.cp > 1 && base.parallel.cp_attention == CpAttention::by_estimate && plan.cp_attention != CpAttention::ring)
    add([](Plan& p) { p.cp_attention = CpAttention::ring; });
  if (options.vary_reduce_dtype && base.training.dtype == DType::bf16 && plan.reduce_dtype == DType::f32 &&
      plan.dp_replicate * plan.dp_shard * plan.cp > 1)
    add([](Plan& p) { p.reduce_dtype = DType::bf16; });
  return out;
}

double GlobalCompute::total_us() const {
  double us = embedding_us + head_us + other_us;
  for (const double l : layer_us) us += l;
  return us;
}

namespace {
// All of the model's parameters, and the fewest of a pipeline unit (a
// layer, the embedding or the head).
void count_parameters(const models::LlamaConfig& m, GlobalCompute& out) {
  double embedding = 0, head = 0;
  std::map<int64_t, double> per_layer;
  for (const auto& [name, spec] : models::llama_parameters(m)) {
    const double n = static_cast<double>(spec.shape.numel());
    out.parameters += n;
    if (const auto layer = models::parameter_layer(name))
      per_layer[*layer] += n;
    else
      (name == "model.embed_tokens.weight" ? embedding : head) += n;
  }
  out.fewest_parameters_of_a_unit = std::min(embedding, head);
  for (const auto& [layer, n] : per_layer)
    out.fewest_parameters_of_a_unit = std::min(out.fewest_parameters_of_a_unit, n);
}
}  // namespace

const GlobalCompute& global_compute(const config::TrainConfig& planned, int world_size,
                                    const sched::HardwareProfile& hardware) {
  // What shapes the global graph: every key but those of the layout, the
  // schedule and the run's files (the model's sequence chunks, dispatch
  // blocks and ring attention follow cp, ep and cp_attention; loss parallel
  // splits the loss), and what costs it: the ranks and the profile.
  const config::TrainConfig& c = planned;
  std::string key = fmt::format("{} {} {} {} {}|", c.model.dispatch_blocks, c.model.seq_chunks, c.model.ring_attention,
                                c.parallel.loss_parallel, world_size);
  for (const auto& [name, value] : config::config_values(c))
    for (const char* section :
         {"model.", "data.seq_len", "data.batch_size", "optimizer.", "training.", "activation_checkpoint."})
      if (name.rfind(section, 0) == 0) key += name + "=" + value + ";";
  key += fmt::format("|{} {} {} {} {} {} {} {}", hardware.name, hardware.peak_gflops_f32, hardware.peak_gflops_bf16,
                     hardware.peak_gflops_fp8, hardware.memory_gbps, hardware.compute_efficiency,
                     hardware.memory_efficiency, hardware.shared_host);
  for (const auto& [op, e] : hardware.op_efficiency) key += fmt::format(" {}={}", op, e);
  for (const auto& [op, us] : hardware.op_call_us) key += fmt::format(" {}+{}us", op, us);
  static std::mutex mu;
  static std::map<std::string, GlobalCompute> known;  // entries never move
  {
    std::lock_guard lock(mu);
    if (const auto it = known.find(key); it != known.end()) return it->second;
  }
  graph::Graph g;
  compile::build_step(c, g);
  const sched::RankDevice device{hardware, world_size, nullptr};
  GlobalCompute out;
  out.layer_us.assign(static_cast<size_t>(c.model.n_layers), 0.0);
  const std::string layers = "layers.";
  for (const graph::NodeId n : g.order()) {
    const double us = sched::node_us(g, n, device);
    const std::string& scope = g.node(n).scope;
    if (scope.rfind(layers, 0) == 0) {
      const int64_t layer = std::stoll(scope.substr(layers.size()));
      out.layer_us[static_cast<size_t>(layer)] += us;
    } else if (scope.rfind("tok_embeddings", 0) == 0) {
      out.embedding_us += us;
    } else if (scope.rfind("norm", 0) == 0 || scope.rfind("output", 0) == 0 || scope.rfind("loss", 0) == 0) {
      out.head_us += us;
    } else {
      out.other_us += us;
    }
  }
  count_parameters(c.model, out);
  std::lock_guard lock(mu);
  return known.emplace(key, std::move(out)).first->second;
}

namespace {
// A pipeline's busiest rank's compute: its stages' units, their work split
// over the stage's ranks, and its share of the rest.
double busiest_pipeline_rank_us(const config::TrainConfig& planned, int world_size, const GlobalCompute& work) {
  const parallel::ParallelConfig& p = planned.parallel;
  const parallel::PpSchedule schedule = compile::pipeline_schedule(planned, static_cast<int>(p.pp));
  const auto spans = compile::pipeline_spans(planned.model, schedule.stages(), p.pp_layers_per_stage);
  std::vector<double> rank_us(static_cast<size_t>(p.pp), work.other_us / static_cast<double>(p.pp));
  for (size_t s = 0; s < spans.size(); ++s) {
    const models::LlamaSpan& span = spans[s];
    double us = (span.embedding ? work.embedding_us : 0) + (span.head ? work.head_us : 0);
    const int64_t end = span.end_layer < 0 ? planned.model.n_layers : span.end_layer;
    for (int64_t l = span.first_layer; l < end; ++l) us += work.layer_us[static_cast<size_t>(l)];
    rank_us[static_cast<size_t>(schedule.rank_of_stage[s])] += us;
  }
  const double per_stage_ranks = static_cast<double>(world_size) / static_cast<double>(p.pp);
  return *std::max_element(rank_us.begin(), rank_us.end()) / per_stage_ranks;
}
}  // namespace

namespace {
// The bytes of a parameter's element as FSDP gathers it.
size_t gathered_dtype_size(const config::TrainConfig& planned) {
  return planned.model.fp8.enabled && planned.model.fp8.all_gather ? 1 : dtype_size(planned.training.dtype);
}

// A plan's parameters on rank 0 before data parallel splits them, at
// least: all of them without a pipeline, else its stages' fewest units
// (a layer, the embedding or the head) times the fewest parameters of a
// unit (and so for one stage); each over tp at most.
struct RankParameters {
  double held = 0, stage = 0;
};
RankParameters rank_parameters(const config::TrainConfig& planned, const GlobalCompute& work) {
  const models::LlamaConfig& m = planned.model;
  const parallel::ParallelConfig& p = planned.parallel;
  const double total = work.parameters;
  const double tp = static_cast<double>(p.tp);
  if (p.pp == 1) return {total / tp, total / tp};
  const double unit = work.fewest_parameters_of_a_unit;
  const int64_t stages = p.pp * p.stages_per_rank();
  int64_t units = (m.n_layers + 2) / stages;  // each stage's at least (pipeline_spans)
  if (!p.pp_layers_per_stage.empty())
    units = *std::min_element(p.pp_layers_per_stage.begin(), p.pp_layers_per_stage.end());
  const auto of = [&](int64_t n) { return static_cast<double>(std::max<int64_t>(0, n)) * unit / tp; };
  return {of(p.stages_per_rank() * units), of(units)};
}

// FSDP's traffic on rank 0, at least: its parameters gathered over
// dp_shard x cp once a step (in the compute dtype, or FP8 where FP8
// gathers), their gradients reduce-scattered there and all-reduced over
// dp_replicate once (in the reduce dtype), each by the profile's floor for
// the bytes of all of them. Without a pipeline each runs on a stream of
// its own, so the step lasts at least the longest, less kCommunicationSlack
// for groups lowered in stages on streams of their own; a pipeline adds
// them to its schedule's time. 0 with experts (they shard another way).
constexpr double kCommunicationSlack = 0.8;
double data_parallel_traffic_us(const config::TrainConfig& planned, int world_size, double parameters,
                                const sched::HardwareProfile& hardware) {
  const models::LlamaConfig& m = planned.model;
  const parallel::ParallelConfig& p = planned.parallel;
  if (m.n_experts > 0) return 0;
  const sharding::DeviceMesh mesh = parallel::make_mesh(p, static_cast<int>(world_size / p.pp));
  std::vector<int> dims{mesh.dim_index("dp_shard")};
  if (p.cp > 1) dims.push_back(mesh.dim_index("cp"));
  const std::vector<int64_t> shards = mesh.group_ranks(0, dims);
  const std::vector<int64_t> replicas = mesh.group_ranks(0, {mesh.dim_index("dp_replicate")});
  const double gathered = parameters * static_cast<double>(gathered_dtype_size(planned));
  const double reduced = parameters * static_cast<double>(dtype_size(planned.training.reduce_dtype));
  const double gather = hardware.collective_floor_us(comm::OpType::all_gather, gathered, shards);
  const double scatter = hardware.collective_floor_us(comm::OpType::reduce_scatter, reduced, shards);
  const double all_reduce =
      hardware.collective_floor_us(comm::OpType::all_reduce, reduced / static_cast<double>(shards.size()), replicas);
  if (p.pp > 1) return gather + scatter + all_reduce;
  return kCommunicationSlack * std::max({gather, scatter, all_reduce});
}
}  // namespace

Bounds lower_bounds(const config::TrainConfig& planned, int world_size, const sched::HardwareProfile& hardware) {
  const parallel::ParallelConfig& p = planned.parallel;
  const GlobalCompute& work = global_compute(planned, world_size, hardware);
  Bounds b;
  b.compute_us = work.total_us() / world_size;
  if (p.pp > 1) {
    const double micro = static_cast<double>(p.microbatches()), v = static_cast<double>(p.stages_per_rank());
    const bool zero_bubble =
        p.pp_schedule == parallel::PpScheduleKind::zero_bubble || p.pp_schedule == parallel::PpScheduleKind::zbv;
    if (!zero_bubble) b.compute_us *= 1 + static_cast<double>(p.pp - 1) / (micro * v);
    b.compute_us = std::max(b.compute_us, busiest_pipeline_rank_us(planned, world_size, work));
  }
  // Master weights (f32) and the two moments, split at most over every
  // rank but the replicas; with a pipeline, also a stage's parameters
  // gathered whole while it runs.
  const RankParameters held = rank_parameters(planned, work);
  const double bytes_per_parameter = 4 + 2 * static_cast<double>(dtype_size(planned.optimizer.state_dtype));
  const auto fsdp = static_cast<double>(p.dp_shard * p.cp);
  b.memory_bytes = held.held * bytes_per_parameter / fsdp;
  if (p.pp > 1 && fsdp > 1) b.memory_bytes += held.stage * static_cast<double>(gathered_dtype_size(planned));
  b.communication_us = data_parallel_traffic_us(planned, world_size, held.held, hardware);
  b.step_us = p.pp > 1 ? b.compute_us + b.communication_us : std::max(b.compute_us, b.communication_us);
  return b;
}

}  // namespace meshtrain::autoplan
