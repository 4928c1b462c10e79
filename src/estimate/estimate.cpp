#include "estimate/estimate.h"

#include <algorithm>
#include <array>
#include <map>
#include <numeric>
#include <set>

#include "compile/compile.h"
#include "core/error.h"
#include "estimate/kernel_benchmark.h"
#include "graph/op_registry.h"
#include "parallel/plan.h"
#include "runtime/cpu_threads.h"
#include "sched/schedule.h"
#include "sched/trace.h"
#include "sharding/local_chunk.h"

namespace meshtrain::estimate {

double torchtitan_flops_per_token(const models::LlamaConfig& model, int64_t seq_len) {
  double params = 0;  // active ones: of the routed experts, k of n_experts per token
  const double active_experts =
      model.n_experts > 0 ? static_cast<double>(model.n_experts_per_token) / static_cast<double>(model.n_experts) : 1.0;
  for (const auto& [name, spec] : models::llama_parameters(model))
    if (name != "model.embed_tokens.weight")
      params += static_cast<double>(spec.shape.numel()) *
                (name.find("block_sparse_moe.experts.") != std::string::npos ? active_experts : 1.0);
  return 6 * params + 12.0 * static_cast<double>(model.n_layers * model.n_heads * model.head_dim() * seq_len);
}

namespace {

// The values of the graph that runs holding parameter gradients: the
// images of the step's gradients of parameters (and of their compute-dtype
// copies), the partial sums that add up to them, and what collectives,
// waits, views and casts make of them.
std::set<graph::ValueId> gradient_values(const graph::Graph& global, const compile::TrainStepGraph& step,
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

double bytes_of(const graph::Graph& g, graph::ValueId v) {
  const graph::ValueInfo& info = g.value(v).info;
  return static_cast<double>(info.shape.numel()) * static_cast<double>(dtype_size(info.dtype));
}

void fill_rates(const config::TrainConfig& config, const sched::HardwareProfile& hardware, TrainingEstimate& e) {
  e.tokens_per_step = static_cast<double>(config.data.batch_size * config.data.seq_len);
  e.tokens_per_s_per_device = e.time.step_us > 0 ? e.tokens_per_step / e.world_size / (e.time.step_us * 1e-6) : 0;
  e.flops_per_token = torchtitan_flops_per_token(config.model, config.data.seq_len);
  const bool bf16 = config.training.dtype == DType::bf16 && hardware.peak_gflops_bf16 > 0;
  e.peak_gflops = (bf16 ? hardware.peak_gflops_bf16 : hardware.peak_gflops_f32) * hardware.rank_share(e.world_size);
  e.mfu = e.flops_per_token * e.tokens_per_s_per_device / (e.peak_gflops * 1e9);
}

// What one pipeline stage holds, at this rank's place in its stage mesh.
struct StageMemory {
  double parameters = 0, moments = 0;  // as the plan keeps them, all step
  double pending = 0;                  // the step's gradient sums, pending over data parallel
  double gathered = 0;                 // its unshard program's results (weights gathered, cast)
  double kept_between = 0;             // what one microbatch keeps from its forward to its backward
  double arena = 0;                    // its largest program's
};

StageMemory stage_memory(const config::TrainConfig& config, const compile::PipelineStage& st, bool split,
                         bool data_parallel) {
  StageMemory m;
  std::set<graph::ValueId> kept;
  for (const graph::ExtractedGraph* part :
       split ? std::vector{&st.backward_input, &st.backward_weight} : std::vector{&st.backward})
    for (const graph::ValueId v : part->reads)
      if (st.joint.value(v).kind != graph::ValueKind::parameter &&
          std::find(st.step_values.begin(), st.step_values.end(), v) == st.step_values.end() && kept.insert(v).second)
        m.kept_between += bytes_of(st.joint, v);
  for (const graph::ValueId v : st.step_values) m.gathered += bytes_of(st.joint, v);
  for (const graph::ExtractedGraph* part :
       {&st.forward, &st.backward, &st.backward_input, &st.backward_weight, &st.unshard})
    if (part->graph.num_nodes() > 0)
      m.arena = std::max(
          m.arena,
          sched::estimate_memory(part->graph, sched::make_schedule(part->graph, part->graph.outputs())).arena_bytes);
  const double state_bytes = static_cast<double>(dtype_size(config.optimizer.state_dtype));
  for (size_t i = 0; i < st.parameters.size(); ++i) {
    const double held = bytes_of(st.joint, st.parameters[i]);
    if (data_parallel) m.pending += bytes_of(st.joint, st.gradients[i]);
    m.parameters += held;
    m.moments += 2 * held / 4 * state_bytes;
  }
  return m;
}

// The most of rank r's stages gathered at once, by its UNSHARD and RESHARD actions.
int most_gathered(const parallel::PpSchedule& schedule, int r) {
  int now = 0, most = 0;
  for (const parallel::PpAction& a : schedule.actions[static_cast<size_t>(r)])
    if (a.type == parallel::PpActionType::unshard)
      most = std::max(most, ++now);
    else if (a.type == parallel::PpActionType::reshard)
      --now;
  return most;
}

struct RankMemory {
  sched::MemoryEstimate memory;
  double parameters = 0, moments = 0, activation_bytes_per_pair = 0;
};

// A pipeline rank's memory: its stages' tensors held through the step, the
// largest `gathered_at_once` of their gathered copies, the activations of
// the (stage, microbatch) pairs in flight at the peak, and the largest
// program's arena.
RankMemory rank_memory(const std::vector<const StageMemory*>& stages, int gathered_at_once, int peak_pairs) {
  RankMemory r;
  double pending = 0, arena = 0;
  std::vector<double> gathered;
  for (const StageMemory* m : stages) {
    r.parameters += m->parameters;
    r.moments += m->moments;
    pending += m->pending;
    arena = std::max(arena, m->arena);
    r.activation_bytes_per_pair = std::max(r.activation_bytes_per_pair, m->kept_between);
    gathered.push_back(m->gathered);
  }
  std::sort(gathered.rbegin(), gathered.rend());  // the largest at once, at most
  const double computed = std::accumulate(
      gathered.begin(), gathered.begin() + std::min<std::ptrdiff_t>(gathered_at_once, std::ssize(gathered)), 0.0);
  const double activations = r.activation_bytes_per_pair * peak_pairs;
  sched::MemoryEstimate& e = r.memory;
  e.at_peak[sched::MemoryKind::parameters] = r.parameters + computed;
  e.at_peak[sched::MemoryKind::gradients] = r.parameters + pending;
  e.at_peak[sched::MemoryKind::optimizer_states] = r.moments;
  e.at_peak[sched::MemoryKind::activations] = activations;
  e.at_peak[sched::MemoryKind::other] = arena;
  e.input_bytes = r.parameters * 2 + computed + pending + r.moments + activations;
  e.arena_bytes = arena;
  e.peak_bytes = e.allocated_bytes = e.input_bytes + arena;
  return r;
}

// The bytes the pipeline runner moves around one microbatch's programs of
// stage `st` (train::PipelineRunner): each output copied out of the
// program's arena (read and written), and after the backward (its weight
// half when split) every gradient added into the stage's sums (two reads,
// a write).
struct StageCopies {
  double forward = 0, backward_input = 0, backward_weight = 0;
};
StageCopies stage_copies(const compile::PipelineStage& st, bool split) {
  auto outputs = [&](const graph::ExtractedGraph& part) {
    double bytes = 0;
    for (const graph::ValueId v : part.outputs) bytes += 2 * bytes_of(st.joint, v);
    return bytes;
  };
  double gradients = 0;
  for (const graph::ValueId v : st.gradients) gradients += 3 * bytes_of(st.joint, v);
  if (split) return {outputs(st.forward), outputs(st.backward_input), outputs(st.backward_weight) + gradients};
  const double backward = outputs(st.backward) + gradients;  // split evenly, as the backward's time is
  return {outputs(st.forward), backward / 2, backward / 2};
}

// parallel.pp > 1: every stage's programs laid out and lowered for the
// rank at this rank's place in its stage (the stages' ranks are laid out
// alike), each costed on the profile; the schedule simulated with those
// costs; this rank's once-a-step work (gathering its parameters, reducing
// its gradients, the update) added after it.
TrainingEstimate estimate_pipeline(const config::TrainConfig& config, int world_size, int rank,
                                   const sched::HardwareProfile& hardware) {
  MT_CHECK(config.schedule.estimate == config::EstimateMode::roofline,
           "schedule.estimate = \"benchmark\" with parallel.pp {}: pipeline stages are costed by the roofline only",
           config.parallel.pp);
  const compile::CompiledRank compiled =
      compile::compile_rank(config, world_size, rank, hardware, {.every_stage = true});
  const compile::PipelinePlace& place = compiled.pipeline->place;
  const sharding::DeviceMesh& mesh = place.mesh;
  TrainingEstimate e;
  e.world_size = world_size;
  e.rank = rank;
  e.mesh = mesh.describe();
  const int stage_size = place.stage_size, stage_rank = place.stage_rank, pp_rank = place.pp_rank;
  const compile::StageMesh where = place.where();
  const parallel::PpSchedule& schedule = place.schedule;
  // A stage's programs run their collectives while the other stages compute.
  const sched::RankDevice device{hardware, world_size, nullptr, schedule.ranks > 1};
  const bool split = place.splits_backward;
  // The world rank at `pp` with this rank's place in its stage, and the
  // ranks of this rank's dp_shard and dp_replicate groups.
  auto world_rank = [&](int pp) { return pp * stage_size + stage_rank; };

  PipelineEstimate p;
  p.schedule = std::string(parallel::pp_schedule_name(schedule.kind));
  p.stages = schedule.stages();
  p.stages_per_rank = schedule.stages_per_rank;
  p.microbatches = schedule.microbatches;
  p.runs = static_cast<int>(place.accumulation);
  const auto per_step = static_cast<double>(schedule.microbatches * place.accumulation);  // microbatches a step
  // A memory-bound byte's time on this rank: the runner's copies and the update stream at the profile's bandwidth.
  const double per_byte_us =
      1.0 / (hardware.memory_gbps * 1e3 * hardware.memory_efficiency * hardware.rank_share(world_size));
  std::vector<parallel::PpCosts> costs;
  double in_program_comm = 0;
  // UNSHARD as the rank's list has them (with pp_max_active_stages a stage may be gathered again before its next
  // use): every gather costed, in every run of the schedule but for the stages kept gathered between runs.
  std::map<int, int64_t> gathers;
  for (const parallel::PpAction& a : schedule.actions[static_cast<size_t>(pp_rank)])
    if (a.type == parallel::PpActionType::unshard) ++gathers[a.stage];
  const std::set<int> kept_between_runs = parallel::pp_stages_kept_between_runs(schedule, pp_rank);
  auto gathers_of = [&](int stage) {
    return gathers[stage] * place.accumulation - (kept_between_runs.contains(stage) ? place.accumulation - 1 : 0);
  };
  std::map<const compile::PipelineStage*, std::array<sched::StepEstimate, 3>> stage_costs;  // forward, input, weight
  for (int s = 0; s < schedule.stages(); ++s) {
    const compile::PipelineStage& st = compiled.pipeline->stage(s);
    auto cost = [&](const graph::ExtractedGraph& part) -> sched::StepEstimate {
      if (part.graph.num_nodes() == 0) return {};
      return sched::estimate_step(part.graph, sched::make_schedule(part.graph, part.graph.outputs()), device);
    };
    // A stage built in another's place (compile::pipeline_stages_alike) costs as that one.
    auto [known, first] = stage_costs.try_emplace(&st);
    auto& [forward, input, weight] = known->second;
    if (first) {
      forward = cost(st.forward);
      if (split) {
        input = cost(st.backward_input);
        weight = cost(st.backward_weight);
      } else {  // the whole backward, its time split evenly between the halves the simulation adds back up
        weight = cost(st.backward);
        input.step_us = weight.step_us /= 2;
        input.communication_us = weight.communication_us /= 2;
      }
    }
    // The runner's work around each program: it copies the program's outputs out of its arena and adds a
    // backward's gradients into the stage's sums, memory-bound.
    const StageCopies copies = stage_copies(st, split);
    constexpr double kLeast = 1e-3;  // a half with nothing to do (the first stage's input gradient)
    parallel::PpCosts c{std::max(forward.step_us + copies.forward * per_byte_us, kLeast),
                        std::max(input.step_us + copies.backward_input * per_byte_us, kLeast),
                        std::max(weight.step_us + copies.backward_weight * per_byte_us, kLeast), 0};
    if (schedule.rank_of_stage[static_cast<size_t>(s)] == pp_rank)
      p.copy_us += per_step * (copies.forward + copies.backward_input + copies.backward_weight) * per_byte_us;
    double sent = 0;  // to the next stage: the residual stream (and the router statistics)
    for (const graph::ValueId v : st.to_next()) sent += bytes_of(st.joint, v);
    if (s + 1 < schedule.stages() &&
        schedule.rank_of_stage[static_cast<size_t>(s)] != schedule.rank_of_stage[static_cast<size_t>(s + 1)])
      c.p2p = hardware.collective_us(comm::OpType::all_gather, 2 * sent,
                                     {world_rank(schedule.rank_of_stage[static_cast<size_t>(s)]),
                                      world_rank(schedule.rank_of_stage[static_cast<size_t>(s + 1)])},
                                     world_size);
    costs.push_back(c);
    p.forward_us.push_back(c.forward);
    p.backward_input_us.push_back(c.backward_input);
    p.backward_weight_us.push_back(c.backward_weight);
    p.p2p_us.push_back(c.p2p);
    if (schedule.rank_of_stage[static_cast<size_t>(s)] != pp_rank) continue;
    // This rank's stage: its tensors, its once-a-step collectives, what it keeps between programs.
    in_program_comm += per_step * (forward.communication_us + input.communication_us + weight.communication_us);
    for (const graph::ExtractedGraph* part : split ? std::vector{&st.forward, &st.backward_input, &st.backward_weight}
                                                   : std::vector{&st.forward, &st.backward})
      for (const graph::NodeId n : part->graph.order()) {
        const graph::Node& node = part->graph.node(n);
        e.nodes += static_cast<size_t>(per_step);
        if (!node.op->starts_async) continue;
        e.collectives += static_cast<size_t>(per_step);
        e.collective_bytes += per_step * node.attrs.get(graph::attr::comm_bytes);
      }
    // UNSHARD: the unshard program (its gathers costed by the profile), as often as the rank gathers the stage.
    p.unshard_us += cost(st.unshard).step_us * static_cast<double>(gathers_of(s));
    for (size_t i = 0; i < st.parameter_names.size(); ++i) {
      const double held = bytes_of(st.joint, st.parameters[i]);  // this rank's part, as the plan keeps it
      if (where.mesh) {
        // REDUCE_GRAD: the step's sum, pending over data parallel (stage mesh dim d is the pipeline mesh's
        // d + 1), reduce-scattered over the dims that shard the parameter (dp_shard, ep but for experts, cp)
        // and all-reduced over those that replicate it (dp_replicate).
        const double sum = bytes_of(st.joint, st.gradients[i]);
        const sharding::Layout& reduced = st.gradient_layouts.at(st.parameter_names[i]);
        const sharding::Layout& held_as = st.parameter_layouts.at(st.parameter_names[i]);
        std::vector<int> shard_dims, replicate_dims;
        for (size_t d = 0; d < reduced.placements.size(); ++d)
          if (reduced.placements[d].is_partial())
            (held_as.placements[d].is_sharding() ? shard_dims : replicate_dims).push_back(static_cast<int>(d) + 1);
        if (!shard_dims.empty())
          p.reduce_grad_us +=
              hardware.collective_us(comm::OpType::reduce_scatter, sum, mesh.group_ranks(rank, shard_dims), world_size);
        if (!replicate_dims.empty())
          p.reduce_grad_us += hardware.collective_us(comm::OpType::all_reduce, held,
                                                     mesh.group_ranks(rank, replicate_dims), world_size);
      }
    }
  }
  // Ranks sharing a host's cores: while a stage waits in the bubble, the stages computing get its cores.
  std::vector<double> speed_when_busy;
  for (int k = 1; k <= schedule.ranks; ++k)
    speed_when_busy.push_back(hardware.busy_share(world_size, k * stage_size) / hardware.rank_share(world_size));
  const parallel::PpSimulation sim = parallel::simulate_pp_schedule(schedule, costs, speed_when_busy);
  p.makespan_us = sim.makespan;
  p.bubble_fraction = sim.bubble_fraction;
  p.rank_busy_us = sim.busy[static_cast<size_t>(pp_rank)];
  p.peak_activation_pairs = sim.peak_activations[static_cast<size_t>(pp_rank)];
  parallel::PpCosts mean{0, 0, 0, 0};
  for (const auto& c : costs) {
    mean.forward += c.forward / static_cast<double>(costs.size()) * schedule.stages_per_rank;
    mean.backward_input += c.backward_input / static_cast<double>(costs.size()) * schedule.stages_per_rank;
    mean.backward_weight += c.backward_weight / static_cast<double>(costs.size()) * schedule.stages_per_rank;
  }
  p.published_bubble = parallel::published_bubble_fraction(schedule, mean);
  // Memory, of every pipeline rank at this rank's place in its stage.
  std::map<const compile::PipelineStage*, StageMemory> measured;  // alike stages are one
  auto memory_of = [&](int r) {
    std::vector<const StageMemory*> held;
    for (int s = 0; s < schedule.stages(); ++s)
      if (schedule.rank_of_stage[static_cast<size_t>(s)] == r) {
        const compile::PipelineStage& st = compiled.pipeline->stage(s);
        auto [known, first] = measured.try_emplace(&st);
        if (first) known->second = stage_memory(config, st, split, where.mesh != nullptr);
        held.push_back(&known->second);
      }
    return rank_memory(held, most_gathered(schedule, r), sim.peak_activations[static_cast<size_t>(r)]);
  };
  const RankMemory mine = memory_of(pp_rank);
  p.activation_bytes_per_pair = mine.activation_bytes_per_pair;
  for (int r = 0; r < schedule.ranks; ++r) {
    const double peak = r == pp_rank ? mine.memory.peak_bytes : memory_of(r).memory.peak_bytes;
    if (peak > p.fullest_peak_bytes) p.fullest_peak_bytes = peak, p.fullest_rank = world_rank(r);
  }
  // The update: AdamW reads the parameter, its gradient and moments and
  // writes the parameter and moments; the norm reads the gradient again.
  const double update_bytes = mine.parameters * 6 + mine.moments * 2;
  p.update_us = update_bytes * per_byte_us;
  e.time.step_us = p.makespan_us * p.runs + p.unshard_us + p.reduce_grad_us + p.update_us;
  e.time.compute_us = p.rank_busy_us * p.runs + p.update_us;
  e.time.communication_us = p.unshard_us + p.reduce_grad_us + in_program_comm;
  // Each link a stage of this rank's ends carries two transfers a microbatch: the activation and its gradient.
  for (size_t s = 0; s + 1 < costs.size(); ++s)
    if (schedule.rank_of_stage[s] == pp_rank || schedule.rank_of_stage[s + 1] == pp_rank)
      e.time.communication_us += 2 * per_step * costs[s].p2p;
  e.time.exposed_us = e.time.step_us - e.time.compute_us;  // waits: the bubble and the once-a-step collectives
  e.memory = mine.memory;
  const double budget = compile::memory_budget_bytes(config);
  MT_CHECK(budget <= 0 || e.memory.peak_bytes <= budget, "{}",
           compile::over_budget_message(config, e.memory.peak_bytes, rank));
  e.pipeline = p;
  fill_rates(config, hardware, e);
  return e;
}

}  // namespace

TrainingEstimate estimate_training(const config::TrainConfig& requested, int world_size, int rank,
                                   const sched::HardwareProfile& hardware, bool with_trace) {
  MT_CHECK(world_size >= 1, "estimate: --ranks {} must be at least 1", world_size);
  MT_CHECK(rank >= 0 && rank < world_size, "estimate: --rank {} is outside the {} ranks", rank, world_size);
  const compile::CpAttentionChoice choice = compile::choose_cp_attention(requested, world_size, hardware);
  const config::TrainConfig& config = choice.config;
  if (config.parallel.pp > 1) {
    MT_CHECK(!with_trace,
             "estimate --trace with parallel.pp {}: the pipeline's timeline is not drawn yet; "
             "`meshtrain pp-schedule` prints the schedule's",
             config.parallel.pp);
    TrainingEstimate e = estimate_pipeline(config, world_size, rank, hardware);
    e.cp_attention = choice.why;
    return e;
  }
  TrainingEstimate e;
  e.cp_attention = choice.why;
  e.world_size = world_size;
  e.rank = rank;
  // Benchmark mode: the cache's kernel times, the rest timed here as a rank
  // of the job would run them (its threads, its share of the cores).
  sched::KernelTimes kernel_times;
  compile::MeasureKernels measure;
  if (config.schedule.estimate == config::EstimateMode::benchmark) {
    compile::check_benchmark_hardware(hardware);
    if (!config.schedule.kernel_cache.empty()) kernel_times = sched::load_kernel_times(config.schedule.kernel_cache);
    runtime::set_threads_per_rank(world_size);
    measure = [&kernel_times, slowdown = runtime::shared_core_slowdown(world_size)](const graph::Graph& g) {
      measure_kernels(g, kernel_times, {.slowdown = slowdown});
      return &kernel_times;
    };
  }
  const compile::CompiledRank compiled =
      compile::compile_rank(config, world_size, rank, hardware, {.measure = measure});
  const compile::FlatStep& flat = *compiled.flat;
  if (flat.layout) e.mesh = flat.layout->mesh().describe();
  const graph::Graph& global = flat.global;
  const compile::TrainStepGraph& step = flat.step;
  const graph::Graph& running = flat.running();
  const auto& values = flat.values;
  const graph::Schedule& schedule = flat.schedule;

  const sched::RankDevice device{hardware, world_size, measure ? measure(running) : nullptr};
  if (measure && !config.schedule.kernel_cache.empty())
    sched::save_kernel_times(kernel_times, config.schedule.kernel_cache);
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
  const double budget = compile::memory_budget_bytes(config);
  const double needed = e.memory.allocated_bytes + compile::batch_buffer_bytes(config, world_size);
  MT_CHECK(budget <= 0 || needed <= budget, "{}", compile::over_budget_message(config, needed, rank));
  for (graph::NodeId n : schedule.steps) {
    const graph::Node& node = running.node(n);
    ++e.nodes;
    if (node.op->starts_async) {
      ++e.collectives;
      e.collective_bytes += node.attrs.get(graph::attr::comm_bytes);
    }
  }
  fill_rates(config, hardware, e);
  return e;
}

}  // namespace meshtrain::estimate
