#include "compile/compile.h"

#include <fmt/format.h>

#include <map>

#include "core/error.h"
#include "sched/estimate.h"

namespace meshtrain::compile {

namespace {

std::unique_ptr<FlatStep> compile_flat(const config::TrainConfig& config, int world_size, int rank,
                                       const sched::HardwareProfile& hardware, const MeasureKernels& measure) {
  auto flat = std::make_unique<FlatStep>();
  flat->step = build_step(config, flat->global);
  if (world_size > 1) {
    flat->layout = lay_out_step(config, flat->global, flat->step, world_size, rank, hardware, measure);
    flat->values = flat->layout->lowered.values;
  } else {
    flat->values = identity_values(flat->global);
  }
  flat->schedule = schedule_step(flat->global, flat->step, flat->running(), flat->values);
  return flat;
}

std::unique_ptr<PipelineRank> compile_pipeline(const config::TrainConfig& config, int world_size, int rank,
                                               const sched::HardwareProfile& hardware, bool every_stage) {
  check_parallel_config(config, world_size);
  auto out = std::make_unique<PipelineRank>(
      PipelineRank{.place = pipeline_place(config, world_size, rank, /*fsdp_actions=*/true), .stages = {}});
  const PipelinePlace& place = out->place;
  std::vector<int> stages = place.stages();
  if (every_stage) {
    stages.clear();
    for (int s = 0; s < place.schedule.stages(); ++s) stages.push_back(s);
  }
  const sched::RankDevice device{hardware, world_size, nullptr};
  const std::vector<int> own = place.stages();
  for (const int s : stages) {
    const bool others = std::find(own.begin(), own.end(), s) == own.end();
    const auto alike = std::find_if(out->stages.begin(), out->stages.end(), [&](const auto& built) {
      return pipeline_stages_alike(config, place, hardware, s, built.first);
    });
    if (others && alike != out->stages.end()) {
      out->same_as[s] = alike->first;
      continue;
    }
    out->stages.emplace(s, build_pipeline_stage(config, place.spans, s, place.microbatch_rows, place.where(), &device));
  }
  out->update = build_pipeline_update(config, place, out->stages);
  return out;
}

}  // namespace

const PipelineStage& PipelineRank::stage(int s) const {
  const auto alias = same_as.find(s);
  const auto it = stages.find(alias == same_as.end() ? s : alias->second);
  MT_ASSERT(it != stages.end(), "pipeline rank {}: stage {} was not built", place.pp_rank, s);
  return it->second;
}

CpAttentionChoice choose_cp_attention(const config::TrainConfig& config, int world_size,
                                      const sched::HardwareProfile& hardware) {
  using Mode = parallel::ParallelConfig::CpAttention;
  if (config.parallel.cp <= 1 || world_size == 1 || config.parallel.cp_attention != Mode::by_estimate)
    return {config, ""};  // on one rank, cp does not split the sequence
  check_parallel_config(config, world_size);
  config::TrainConfig flat = config;
  flat.parallel.pp = 1;
  flat.parallel.pp_microbatches = 0;
  const int ranks = world_size / static_cast<int>(config.parallel.pp);
  std::map<Mode, double> step_us;
  for (const Mode mode : {Mode::allgather, Mode::ring}) {
    flat.set_cp_attention(mode);
    const std::unique_ptr<FlatStep> step = compile_flat(flat, ranks, 0, hardware, {});
    step_us[mode] = sched::estimate_step(step->running(), step->schedule, {hardware, ranks, nullptr}).step_us;
  }
  const bool ring = step_us[Mode::ring] < step_us[Mode::allgather];
  CpAttentionChoice out{config, ""};
  out.config.set_cp_attention(ring ? Mode::ring : Mode::allgather);
  out.why = fmt::format(
      "cp attention {} (auto: rank 0's step estimated {:.3f} ms with the ring, {:.3f} ms all-gathering "
      "the keys, on {})",
      ring ? "ring" : "allgather", step_us[Mode::ring] / 1e3, step_us[Mode::allgather] / 1e3, hardware.name);
  return out;
}

CompiledRank compile_rank(const config::TrainConfig& config, int world_size, int rank,
                          const sched::HardwareProfile& hardware, const CompileOptions& options) {
  MT_CHECK(world_size >= 1 && world_size <= kMaxLaidOutRanks, "a job of {} ranks: it must have 1 to {}", world_size,
           kMaxLaidOutRanks);
  MT_CHECK(rank >= 0 && rank < world_size, "rank {} is outside the job's {} ranks (0..{})", rank, world_size,
           world_size - 1);
  const config::TrainConfig decided = choose_cp_attention(config, world_size, hardware).config;
  CompiledRank out;
  if (decided.parallel.pp > 1)
    out.pipeline = compile_pipeline(decided, world_size, rank, hardware, options.every_stage);
  else
    out.flat = compile_flat(decided, world_size, rank, hardware, options.measure);
  return out;
}

}  // namespace meshtrain::compile
