// A pipeline rank's small once-a-step graphs beside its stages' programs:
// the batch's valid-target count, the sum of squares of the rank's
// gradients (summed over the pipeline between the two graphs) and the update
// (the norm from that sum, clipping and AdamW as the single-rank step has
// them), the last two laid out on the stage mesh as the [parallel] plan lays
// out a step's optimizer and lowered for the rank.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "compile/pipeline_place.h"
#include "compile/pipeline_stage.h"
#include "config/config.h"
#include "graph/graph.h"
#include "graph/schedule.h"
#include "sharding/layout.h"

namespace meshtrain::compile {

struct PipelineUpdate {
  std::vector<std::string> names;         // the rank's parameters, its stages' in order
  std::vector<sharding::Layout> layouts;  // each one's on the stage mesh (empty with one rank per stage)
  // Counts the batch's targets that are not ignored: [batch x seq] i64 in, a scalar out.
  graph::Graph count;
  graph::ValueId count_targets;
  // As the rank runs them (lowered on the stage mesh, or the global graphs).
  graph::Graph squares;                          // one output: the sum of squares
  std::vector<graph::ValueId> square_gradients;  // its inputs, by names
  graph::Graph update;
  std::vector<graph::ValueId> parameters, gradients, exp_avg, exp_avg_sq;  // its inputs, by names
  graph::ValueId sum_of_squares, lr, step;                                 // its scalar inputs
  graph::ValueId norm;                     // its output: the global gradient norm, before clipping
  std::vector<graph::Update> write_backs;  // each updated value into its buffer
};

// The update of the rank at `place` holding `stages` (its own, by index).
PipelineUpdate build_pipeline_update(const config::TrainConfig& config, const PipelinePlace& place,
                                     const std::map<int, PipelineStage>& stages);

}  // namespace meshtrain::compile
