// The forward-only program validation runs: the config's model and loss on
// one global batch, no backward and no update, laid out on the [parallel]
// mesh as the training step lays out the same parameters and batch (so it
// reads the training step's own shards) and lowered for one rank.
#pragma once

#include <map>
#include <memory>
#include <optional>

#include "compile/step.h"
#include "config/config.h"
#include "graph/schedule.h"
#include "models/llama.h"

namespace meshtrain::compile {

struct EvalStep {
  graph::Graph global;       // the forward and loss as one global graph
  models::LlamaGraph model;  // its parameters, batch and loss (in `global`)
  // On several ranks: every value's layout and the rank's lowered graph.
  std::optional<LaidOut> layout;
  std::map<graph::ValueId, graph::ValueId> values;  // each global value's value in running()
  graph::Schedule schedule;                         // running()'s order and memory plan
  const graph::Graph& running() const { return layout ? layout->lowered.graph : global; }
};

// `rank`'s forward-only program of a flat config (parallel.pp = 1) in a job
// of `world_size` ranks. With gradient accumulation the batch's forward runs
// microbatch by microbatch, as the training step's does, so that it holds no
// more activations than a training step; the loss is the batch's mean over
// its valid targets either way.
std::unique_ptr<EvalStep> compile_eval(const config::TrainConfig& config, int world_size, int rank);

}  // namespace meshtrain::compile
