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
// (reshape) shares the storage of the value it views, and so does a value
// computed in place over an input it updates (AdamW's new parameter in the
// parameter's own tensor).
struct MemoryPlan {
  std::map<ValueId, size_t> offsets;      // computed value -> byte offset in the arena
  std::map<ValueId, ValueId> view_of;     // view or in-place value -> the value that owns its storage
  std::map<ValueId, size_t> view_offset;  // a view that starts inside that storage -> its byte offset there
  size_t peak_bytes = 0;                  // the arena's size
  // The value whose storage `v` uses: itself unless it is a view.
  ValueId storage_of(ValueId v) const {
    const auto it = view_of.find(v);
    return it == view_of.end() ? v : it->second;
  }
  // Where `v` starts in storage_of(v), in bytes.
  size_t offset_in_storage(ValueId v) const {
    const auto it = view_offset.find(v);
    return it == view_offset.end() ? 0 : it->second;
  }
};

// After a run, input `to` holds the value computed as `from` (a parameter
// or optimizer state the step updates).
struct Update {
  ValueId from;
  ValueId to;
};

// When one node of a schedule ran (measured by an executor), in
// microseconds from a common origin.
struct NodeSpan {
  NodeId node;
  double begin_us = 0;
  double end_us = 0;
};

struct Schedule {
  std::vector<NodeId> steps;     // the nodes to run, in order
  std::vector<ValueId> fetches;  // values readable after a run; their storage is never reused
  // Written in place where the memory plan could (memory.storage_of(from) ==
  // to), else copied into `to` after the run.
  std::vector<Update> updates;
  MemoryPlan memory;
};

}  // namespace meshtrain::graph
