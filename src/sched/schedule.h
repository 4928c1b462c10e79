// Turning a graph into the Schedule an executor runs: the nodes the fetches
// need, in the graph's order, and their memory plan.
#pragma once

#include <vector>

#include "graph/schedule.h"

namespace meshtrain::sched {

// `updates`: inputs the run updates (each `from` is also fetched). Fails if
// a fetch is not a value of the graph, or an update's `to` is not an input
// of `from`'s shape and dtype.
graph::Schedule make_schedule(const graph::Graph& g, std::vector<graph::ValueId> fetches,
                              std::vector<graph::Update> updates = {});

}  // namespace meshtrain::sched
