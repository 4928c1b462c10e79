// Turning a graph into the Schedule an executor runs: the nodes the fetches
// need, in the graph's order, and their memory plan.
#pragma once

#include <vector>

#include "graph/schedule.h"

namespace meshtrain::sched {

// Fails if a fetch is not a value of the graph.
graph::Schedule make_schedule(const graph::Graph& g, std::vector<graph::ValueId> fetches);

}  // namespace meshtrain::sched
