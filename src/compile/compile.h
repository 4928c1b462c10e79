// The step compiler's one entry point: from a config, the job's size, a rank
// and a hardware profile to what that rank runs. A flat step is built as one
// global graph, laid out on the [parallel] mesh, propagated, lowered for the
// rank, put through the lowered-step passes and scheduled; a pipeline rank is
// its place in the pipeline and its stages, each built, laid out and lowered
// on its stage's ranks, passed through the same lowered-step passes and cut
// into the programs its schedule runs.
// `meshtrain train`, `estimate` and `lower` all get a rank's step from here.
#pragma once

#include <map>
#include <memory>
#include <optional>

#include "compile/pipeline_place.h"
#include "compile/pipeline_stage.h"
#include "compile/pipeline_update.h"
#include "compile/step.h"
#include "config/config.h"
#include "graph/schedule.h"
#include "sched/hardware.h"

namespace meshtrain::compile {

// parallel.pp = 1: the whole step as one graph.
struct FlatStep {
  graph::Graph global;  // the step as one global graph, after the step passes
  TrainStepGraph step;  // what its values are (in `global`)
  // On several ranks: the mesh, every value's layout and the rank's lowered
  // graph after the lowered-step passes (none on one rank).
  std::optional<StepLayout> layout;
  std::map<graph::ValueId, graph::ValueId> values;  // each global value's value in running()
  graph::Schedule schedule;                         // running()'s order and memory plan

  const graph::Graph& running() const { return layout ? layout->lowered.graph : global; }
};

// parallel.pp > 1: where the rank stands and its stages.
struct PipelineRank {
  PipelinePlace place;
  // By stage index: the rank's own (place.stages()), or with
  // CompileOptions::every_stage every stage of the pipeline, each laid out
  // for the rank at this rank's place in its stage's mesh.
  std::map<int, PipelineStage> stages;
  // With every_stage, another rank's stage of the same shape as one built
  // (pipeline_stages_alike) is not built again: stage -> the one built.
  std::map<int, int> same_as;
  PipelineUpdate update;  // the rank's once-a-step graphs, for its own stages
  // Stage `s` as built, or the stage built in its place.
  const PipelineStage& stage(int s) const;
};

struct CompileOptions {
  // Benchmark mode: the kernel times the passes cost compute nodes with
  // (lay_out_step); empty: the profile's roofline.
  MeasureKernels measure;
  bool every_stage = false;  // a pipeline: build every stage, not only the rank's
};

// One of the two, as config.parallel.pp says.
struct CompiledRank {
  std::unique_ptr<FlatStep> flat;
  std::unique_ptr<PipelineRank> pipeline;
};

// parallel.cp_attention auto decided (cp > 1): the config with the mode
// whose step is estimated faster on `hardware` (rank 0's flat step; with
// pipelines, the whole model flat on one stage's ranks: each layer's
// attention costs alike either way), and a line saying so; the config as it
// is, and no line, otherwise. Every rank decides alike.
struct CpAttentionChoice {
  config::TrainConfig config;
  std::string why;
};
CpAttentionChoice choose_cp_attention(const config::TrainConfig& config, int world_size,
                                      const sched::HardwareProfile& hardware);

// `rank`'s step of `config` in a job of `world_size` ranks, its passes
// costing on `hardware` (parallel.cp_attention auto decided first). Throws
// naming the key when the config cannot run on that many ranks. Nothing
// runs and no tensor is allocated.
CompiledRank compile_rank(const config::TrainConfig& config, int world_size, int rank,
                          const sched::HardwareProfile& hardware, const CompileOptions& options = {});

}  // namespace meshtrain::compile
