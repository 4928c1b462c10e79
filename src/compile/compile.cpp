#include "compile/compile.h"

#include "core/error.h"

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
  for (const int s : stages)
    out->stages.emplace(s, build_pipeline_stage(config, place.spans, s, place.microbatch_rows, place.where(), &device));
  out->update = build_pipeline_update(config, place, out->stages);
  return out;
}

}  // namespace

CompiledRank compile_rank(const config::TrainConfig& config, int world_size, int rank,
                          const sched::HardwareProfile& hardware, const CompileOptions& options) {
  MT_CHECK(world_size >= 1 && world_size <= kMaxLaidOutRanks, "a job of {} ranks: it must have 1 to {}", world_size,
           kMaxLaidOutRanks);
  MT_CHECK(rank >= 0 && rank < world_size, "rank {} is outside the job's {} ranks (0..{})", rank, world_size,
           world_size - 1);
  CompiledRank out;
  if (config.parallel.pp > 1)
    out.pipeline = compile_pipeline(config, world_size, rank, hardware, options.every_stage);
  else
    out.flat = compile_flat(config, world_size, rank, hardware, options.measure);
  return out;
}

}  // namespace meshtrain::compile
