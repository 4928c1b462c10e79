// Memory of one rank's step from its schedule, without allocating it: what
// the executor allocates (the inputs it is given, and the memory plan's
// arena for everything the step computes), the live bytes at every step of
// the schedule, and what is live at the peak, by kind.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/schedule.h"

namespace meshtrain::sched {

enum class MemoryKind { parameters, gradients, optimizer_states, activations, communication, other };
const char* memory_kind_name(MemoryKind kind);

struct MemoryEstimate {
  double input_bytes = 0;      // the graph's inputs (parameters, optimizer states, the batch): held throughout
  double arena_bytes = 0;      // the memory plan's arena, which holds every value the step computes
  double peak_bytes = 0;       // input_bytes + arena_bytes: what the executor allocates
  double allocated_bytes = 0;  // the same in the blocks the allocator hands out (each rounded up)
  size_t peak_step = 0;        // the step of the schedule at which the most bytes are live
  // At peak_step: the inputs and the live computed values by kind, and
  // "arena_unused": the arena's bytes no live value holds there (first-fit
  // fragmentation). They sum to peak_bytes.
  std::map<MemoryKind, double> at_peak;
  double arena_unused_at_peak = 0;
  std::vector<double> live_bytes;  // per step of the schedule: the inputs and the values live during it
};

// The default kinds: parameter inputs are parameters, other inputs other;
// values computed by collectives communication buffers; other values by the
// phase of the node computing them (forward: activations; backward,
// optimizer: other). `kind_of` may refine any value (return nullopt to keep
// the default).
using MemoryKindOf = std::function<std::optional<MemoryKind>(graph::ValueId)>;
MemoryEstimate estimate_memory(const graph::Graph& g, const graph::Schedule& schedule,
                               const MemoryKindOf& kind_of = {});

}  // namespace meshtrain::sched
