// Where a rank of a pipeline-parallel job stands: the pipeline's mesh, the
// schedule the [parallel] keys ask for (validated, lowered with its sends
// and receives), the stages' layers and the microbatches' rows.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "compile/pipeline_stage.h"
#include "config/config.h"
#include "parallel/pipeline_schedule.h"
#include "sched/hardware.h"
#include "sharding/device_mesh.h"

namespace meshtrain::compile {

// The schedule `config` asks for on `ranks` pipeline ranks, validated and
// lowered with its sends and receives (and, with `fsdp_actions`, FSDP's
// UNSHARD, REDUCE_GRAD and RESHARD). Throws naming the [parallel] key.
parallel::PpSchedule pipeline_schedule(const config::TrainConfig& config, int ranks, bool fsdp_actions = false);

// The mesh of a pipeline composed with data and tensor parallelism: (pp,
// dp_replicate, dp_shard, tp), pp outermost, for `world_size` ranks; a
// stage's ranks are those of one pp coordinate. Throws naming the key.
sharding::DeviceMesh pipeline_mesh(const config::TrainConfig& config, int world_size);

// Where rank `rank` of a pipeline job on `world_size` ranks stands: the
// mesh, its stage's mesh (dp_replicate, dp_shard, tp) and its place there
// (none when a stage has one rank), the schedule, the stages' layers and the
// microbatches' rows. The runner, `meshtrain estimate` and `meshtrain lower`
// all start from it. Throws naming the key when the config cannot run.
struct PipelinePlace {
  sharding::DeviceMesh mesh;
  int rank = 0;  // in the job
  int stage_size = 1, stage_rank = 0, pp_rank = 0;
  std::optional<sharding::DeviceMesh> stage_mesh;
  parallel::PpSchedule schedule;
  std::vector<models::LlamaSpan> spans;
  int64_t accumulation = 1;      // training.grad_accum_steps: the schedule runs this many times a step
  int64_t microbatch_rows = 0;   // the step's rows / (microbatches x accumulation)
  bool splits_backward = false;  // zero-bubble: backward as its input and weight halves

  StageMesh where() const { return stage_mesh ? StageMesh{&*stage_mesh, stage_rank} : StageMesh{}; }
  std::vector<int> stages() const;  // this rank's, in order
};
PipelinePlace pipeline_place(const config::TrainConfig& config, int world_size, int rank, bool fsdp_actions = false);

// The programs a pipeline rank runs, as `meshtrain lower` and `train
// --dump-graph` print them: the rank's place, its actions, and each of its
// stages' programs (the unshard program, forward, and backward or its
// halves) as text.
std::string pipeline_programs_text(const PipelinePlace& place, const std::vector<const PipelineStage*>& stages);

// Whether stages `a` and `b` of `place`'s pipeline lower to programs that
// cost the same on `hardware`: spans of one shape (the embedding, the head,
// the layers and which are mixtures of experts, the router statistics
// taken and given), no FP8 exceptions by name, and stage ranks laid on
// hosts alike (a stage's ranks fill whole hosts, or a host holds whole stages).
bool pipeline_stages_alike(const config::TrainConfig& config, const PipelinePlace& place,
                           const sched::HardwareProfile& hardware, int a, int b);

// Whether `schedule` runs backward as its input and weight halves (zero bubble).
bool splits_backward(const parallel::PpSchedule& schedule);

}  // namespace meshtrain::compile
