// A Schedule: what one run of a graph executes, in which order, and where
// each intermediate value lives — all decided before anything runs (by
// sched/), so an executor only follows it and an estimator can read it
// without allocating a byte.
#pragma once

#include <cstddef>
#include <map>
#include <vector>

#include "graph/graph.h"

namespace meshtrain::graph {

// Where the intermediates of a run live: one arena of `peak_bytes`, each
// computed value at an offset (reused once its last reader has run); a view
// (reshape) shares the storage of the value it views.
struct MemoryPlan {
  std::map<ValueId, size_t> offsets;    // computed value -> byte offset in the arena
  std::map<ValueId, ValueId> view_of;   // view value -> the value that owns its storage
  size_t peak_bytes = 0;                // the arena's size
  // The value whose storage `v` uses: itself unless it is a view.
  ValueId storage_of(ValueId v) const {
    const auto it = view_of.find(v);
    return it == view_of.end() ? v : it->second;
  }
};

struct Schedule {
  std::vector<NodeId> steps;     // the nodes to run, in order
  std::vector<ValueId> fetches;  // values readable after a run; their storage is never reused
  MemoryPlan memory;
};

}  // namespace meshtrain::graph
