// Graph passes and the pipeline that runs them. A pass has a name and
// rewrites or reorders a graph in place, returning whether it changed
// anything (XLA's HloPassPipeline is the model). In debug builds the
// pipeline checks the graph's invariants (graph::verify) after every pass
// that changed it, so a broken rewrite is caught at the pass that made it.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "sched/passes/async_tp.h"
#include "sched/passes/bucket_collectives.h"
#include "sched/passes/checkpoint_activations.h"
#include "sched/passes/prefetch_collectives.h"

namespace meshtrain::sched {

struct Pass {
  std::string name;
  std::function<bool(graph::Graph&)> run;  // -> changed
};

class PassPipeline {
 public:
  explicit PassPipeline(std::string name) : name_(std::move(name)) {}
  PassPipeline& add(Pass pass);
  // Runs every pass once, in order; true if any changed the graph. With
  // verify on, a graph given broken throws InvalidArgument, and an invariant
  // broken by a pass (the pass's bug) InternalError naming the pipeline and
  // the pass.
  bool run(graph::Graph& g) const;
  // Verify after each changing pass: on in debug builds, off in release.
  void set_verify(bool on) { verify_ = on; }
  std::vector<std::string> pass_names() const;

 private:
  std::string name_;
  std::vector<Pass> passes_;
#ifdef NDEBUG
  bool verify_ = false;
#else
  bool verify_ = true;
#endif
};

// The passes every training step's graph goes through before it is laid
// out and scheduled: activations checkpointed as `checkpoint` says, then
// dead nodes removed.
PassPipeline step_pipeline(ActivationCheckpoint checkpoint = ActivationCheckpoint::none,
                           SelectiveMatmuls matmuls = SelectiveMatmuls::all);

// The passes a rank's lowered step goes through (spmd::lower's output)
// before it is scheduled: given `async_tp`, tp's collectives cut into steps
// under their GEMMs; collectives bucketed as `buckets` says, waits sunk to
// where results are first read, then, given `prefetch`, collectives started
// early enough to hide them.
PassPipeline lowered_step_pipeline(BucketOptions buckets = {}, std::optional<PrefetchOptions> prefetch = std::nullopt,
                                   std::optional<AsyncTpOptions> async_tp = std::nullopt);

}  // namespace meshtrain::sched
