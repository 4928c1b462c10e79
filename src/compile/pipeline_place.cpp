#include "compile/pipeline_place.h"

#include <fmt/ranges.h>

#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/file_io.h"

namespace meshtrain::compile {

namespace {

// What a generated schedule depends on: the same key gives the same lists.
struct GeneratedScheduleKey {
  parallel::PpScheduleKind kind;
  int ranks, microbatches, stages_per_rank, max_active_stages;
  bool fsdp_actions;
  bool operator==(const GeneratedScheduleKey&) const = default;
};

// Generating, lowering and checking a deep schedule (pp 64 x 64
// microbatches) takes milliseconds; autoplan asks for the same few many
// times, so they are kept, a bounded number of them, for the process.
std::shared_ptr<const parallel::PpSchedule> generated_schedule(const GeneratedScheduleKey& key) {
  static std::mutex mu;
  static std::vector<std::pair<GeneratedScheduleKey, std::shared_ptr<const parallel::PpSchedule>>> kept;
  constexpr size_t kKept = 64;
  {
    std::lock_guard lock(mu);
    for (const auto& [k, schedule] : kept)
      if (k == key) return schedule;
  }
  parallel::PpSchedule compute = parallel::make_pp_schedule(key.kind, key.ranks, key.microbatches, key.stages_per_rank);
  parallel::validate_pp_schedule(compute);
  parallel::PpSchedule lowered = parallel::add_pp_communication(compute);
  auto schedule = std::make_shared<const parallel::PpSchedule>(
      key.fsdp_actions ? parallel::add_pp_fsdp_actions(lowered, key.max_active_stages) : std::move(lowered));
  std::lock_guard lock(mu);
  if (kept.size() >= kKept) kept.erase(kept.begin());
  kept.emplace_back(key, schedule);
  return schedule;
}

parallel::PpSchedule schedule_from_csv(const parallel::ParallelConfig& p, int ranks) {
  parallel::PpSchedule compute = parallel::pp_schedule_from_csv(
      read_small_file(p.pp_schedule_csv, parallel::kMaxScheduleCsvBytes, "parallel.pp_schedule_csv"), ranks);
  MT_CHECK(p.pp_microbatches == 0 || p.pp_microbatches == compute.microbatches,
           "pp_microbatches {} with pp_schedule_csv {}, whose actions run {} microbatches (leave pp_microbatches "
           "at 0 to take the file's)",
           p.pp_microbatches, p.pp_schedule_csv, compute.microbatches);
  MT_CHECK(p.pp_stages_per_rank == 0 || p.pp_stages_per_rank == compute.stages_per_rank,
           "pp_stages_per_rank {} with pp_schedule_csv {}, whose ranks hold {} stages each (leave "
           "pp_stages_per_rank at 0 to take the file's)",
           p.pp_stages_per_rank, p.pp_schedule_csv, compute.stages_per_rank);
  return compute;
}

}  // namespace

parallel::PpSchedule pipeline_schedule(const config::TrainConfig& config, int ranks, bool fsdp_actions) {
  const parallel::ParallelConfig& p = config.parallel;
  MT_CHECK(!config.model.tie_embeddings,
           "model.tie_embeddings with parallel.pp {}: the embedding (first stage) and the head (last stage) would "
           "share one weight across ranks, which the pipeline does not support; untie them or set parallel.pp = 1",
           p.pp);
  const int64_t accum = config.training.grad_accum_steps;
  MT_CHECK(accum >= 1 && accum <= 65536, "training.grad_accum_steps {} must be between 1 and 65536", accum);
  parallel::PpSchedule schedule;
  try {  // the schedule's keys are those of [parallel]
    MT_CHECK(p.pp_max_active_stages <= 64, "pp_max_active_stages {} must be at most 64", p.pp_max_active_stages);
    if (p.pp_schedule_csv.empty()) {
      const int64_t per_rank = p.stages_per_rank(), micro = p.microbatches();
      MT_CHECK(per_rank <= 64 && micro <= 65536,
               "pp_stages_per_rank {} and pp_microbatches {} must be at most 64 and 65536", per_rank, micro);
      schedule = *generated_schedule({p.pp_schedule, ranks, static_cast<int>(micro), static_cast<int>(per_rank),
                                      static_cast<int>(p.pp_max_active_stages), fsdp_actions});
    } else {
      const parallel::PpSchedule compute = schedule_from_csv(p, ranks);
      parallel::validate_pp_schedule(compute);
      const parallel::PpSchedule lowered = parallel::add_pp_communication(compute);
      schedule =
          fsdp_actions ? parallel::add_pp_fsdp_actions(lowered, static_cast<int>(p.pp_max_active_stages)) : lowered;
    }
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("[parallel] {}", e.what()));
  }
  MT_CHECK(config.data.batch_size % (schedule.microbatches * accum) == 0,
           "data.batch_size {} must divide by parallel.pp_microbatches {}{}: each microbatch takes an equal share of "
           "the batch's sequences",
           config.data.batch_size, schedule.microbatches,
           accum > 1 ? fmt::format(" x training.grad_accum_steps {}", accum) : std::string());
  return schedule;
}

bool pipeline_stages_alike(const config::TrainConfig& config, const PipelinePlace& place,
                           const sched::HardwareProfile& hardware, int a, int b) {
  const models::LlamaConfig& m = config.model;
  const int per_host = std::max(1, hardware.devices_per_host);
  if (!m.fp8.skip.empty() || (place.stage_size % per_host != 0 && per_host % place.stage_size != 0)) return false;
  const models::LlamaSpan &x = place.spans.at(static_cast<size_t>(a)), &y = place.spans.at(static_cast<size_t>(b));
  const auto end = [&](const models::LlamaSpan& s) { return s.end_layer < 0 ? m.n_layers : s.end_layer; };
  if (x.embedding != y.embedding || x.head != y.head || end(x) - x.first_layer != end(y) - y.first_layer ||
      models::span_takes_router_stats(m, x) != models::span_takes_router_stats(m, y) ||
      models::span_gives_router_stats(m, x) != models::span_gives_router_stats(m, y))
    return false;
  for (int64_t i = 0; i < end(x) - x.first_layer; ++i)
    if (m.is_moe_layer(x.first_layer + i) != m.is_moe_layer(y.first_layer + i)) return false;
  return true;
}

bool splits_backward(const parallel::PpSchedule& schedule) {
  for (const auto& actions : schedule.actions)
    for (const parallel::PpAction& a : actions)
      if (a.type == parallel::PpActionType::backward_input) return true;
  return false;
}

sharding::DeviceMesh pipeline_mesh(const config::TrainConfig& config, int world_size) {
  const int64_t pp = config.parallel.pp;
  MT_CHECK(pp >= 1 && world_size % pp == 0,
           "parallel.pp {} must divide the job's {} ranks (each stage runs on ranks / pp of them)", pp, world_size);
  const sharding::DeviceMesh stage = parallel::make_mesh(config.parallel, static_cast<int>(world_size / pp));
  std::vector<int> shape{static_cast<int>(pp)};
  std::vector<std::string> names{"pp"};
  shape.insert(shape.end(), stage.shape().begin(), stage.shape().end());
  names.insert(names.end(), stage.names().begin(), stage.names().end());
  return sharding::DeviceMesh(std::move(shape), std::move(names));
}

std::vector<int> PipelinePlace::stages() const {
  std::vector<int> out;
  for (int s = 0; s < schedule.stages(); ++s)
    if (schedule.rank_of_stage[static_cast<size_t>(s)] == pp_rank) out.push_back(s);
  return out;
}

PipelinePlace pipeline_place(const config::TrainConfig& config, int world_size, int rank, bool fsdp_actions) {
  PipelinePlace place{.mesh = pipeline_mesh(config, world_size)};
  MT_CHECK(rank >= 0 && rank < world_size, "pipeline: rank {} is outside the job's {} ranks", rank, world_size);
  const sharding::DeviceMesh& mesh = place.mesh;
  place.rank = rank;
  place.stage_size = world_size / mesh.size(0);
  place.stage_rank = rank % place.stage_size;
  place.pp_rank = rank / place.stage_size;
  if (place.stage_size > 1)  // the pipeline's mesh without pp
    place.stage_mesh.emplace(std::vector<int>(mesh.shape().begin() + 1, mesh.shape().end()),
                             std::vector<std::string>(mesh.names().begin() + 1, mesh.names().end()));
  place.schedule = pipeline_schedule(config, mesh.size(0), fsdp_actions);
  place.spans = pipeline_spans(config.model, place.schedule.stages(), config.parallel.pp_layers_per_stage);
  place.accumulation = config.training.grad_accum_steps;
  place.microbatch_rows = config.data.batch_size / (place.schedule.microbatches * place.accumulation);
  place.splits_backward = splits_backward(place.schedule);
  return place;
}

std::string pipeline_programs_text(const PipelinePlace& place, const std::vector<const PipelineStage*>& stages) {
  std::string out = fmt::format("# rank {} of mesh {}: pipeline rank {} of {}, {}\n", place.rank, place.mesh.describe(),
                                place.pp_rank, place.mesh.size(0), parallel::pp_schedule_name(place.schedule.kind));
  std::vector<std::string> actions;
  for (const parallel::PpAction& a : place.schedule.actions.at(static_cast<size_t>(place.pp_rank)))
    actions.push_back(parallel::to_string(a));
  out += fmt::format("# actions: {}\n", fmt::join(actions, " "));
  for (const PipelineStage* st : stages) {
    std::vector<std::pair<const char*, const graph::ExtractedGraph*>> programs{{"unshard", &st->unshard},
                                                                               {"forward", &st->forward}};
    if (place.splits_backward) {
      programs.emplace_back("backward_input", &st->backward_input);
      programs.emplace_back("backward_weight", &st->backward_weight);
    } else {
      programs.emplace_back("backward", &st->backward);
    }
    for (const auto& [name, program] : programs)
      if (program->graph.num_nodes() > 0)
        out += fmt::format("# stage {} {}\n{}", st->index, name, graph::to_text(program->graph));
  }
  return out;
}

}  // namespace meshtrain::compile
