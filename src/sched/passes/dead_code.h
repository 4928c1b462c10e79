// Dead-code elimination: removes every node none of whose outputs is read by
// a live node or is a graph output.
#pragma once

#include "graph/graph.h"

namespace meshtrain::sched {

bool remove_dead_nodes(graph::Graph& g);  // -> changed

}  // namespace meshtrain::sched
