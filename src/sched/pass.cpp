#include "sched/pass.h"

#include "core/error.h"
#include "sched/passes/dead_code.h"
#include "sched/passes/sink_waits.h"

namespace meshtrain::sched {

PassPipeline& PassPipeline::add(Pass pass) {
  MT_CHECK(!pass.name.empty() && static_cast<bool>(pass.run), "pipeline {}: a pass needs a name and a function", name_);
  passes_.push_back(std::move(pass));
  return *this;
}

bool PassPipeline::run(graph::Graph& g) const {
  // A graph that is broken already is the caller's (InvalidArgument); one
  // that a pass breaks is that pass's bug.
  if (verify_ && !passes_.empty()) {
    try {
      graph::verify(g);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("pipeline {}: the graph given is invalid: {}", name_, e.what()));
    }
  }
  bool changed = false;
  for (const Pass& pass : passes_) {
    const bool pass_changed = pass.run(g);
    changed |= pass_changed;
    if (!verify_ || !pass_changed) continue;
    try {
      graph::verify(g);
    } catch (const InvalidArgument& e) {
      throw InternalError(fmt::format("internal error: pipeline {}: after pass {}: {}", name_, pass.name, e.what()));
    }
  }
  return changed;
}

std::vector<std::string> PassPipeline::pass_names() const {
  std::vector<std::string> out;
  for (const Pass& p : passes_) out.push_back(p.name);
  return out;
}

PassPipeline step_pipeline(ActivationCheckpoint checkpoint, SelectiveMatmuls matmuls) {
  PassPipeline p("step");
  if (checkpoint != ActivationCheckpoint::none)
    p.add({"checkpoint_activations",
           [checkpoint, matmuls](graph::Graph& g) { return checkpoint_activations(g, checkpoint, matmuls); }});
  p.add({"remove_dead_nodes", remove_dead_nodes});
  return p;
}

PassPipeline lowered_step_pipeline(BucketOptions buckets, std::optional<PrefetchOptions> prefetch,
                                   std::optional<AsyncTpOptions> async_tp) {
  PassPipeline p("lowered_step");
  if (async_tp) p.add({"async_tp", [options = *async_tp](graph::Graph& g) { return sched::async_tp(g, options); }});
  if (buckets.mode != BucketMode::none)
    p.add({"bucket_collectives",
           [options = std::move(buckets)](graph::Graph& g) { return bucket_collectives(g, options); }});
  p.add({"sink_waits", sink_waits});
  if (prefetch)
    p.add({"prefetch_collectives",
           [options = std::move(*prefetch)](graph::Graph& g) { return prefetch_collectives(g, options); }});
  return p;
}

}  // namespace meshtrain::sched
