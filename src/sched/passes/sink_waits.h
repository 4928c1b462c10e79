// Overlap for a lowered graph: each collective's wait moves down to just
// before the first node that reads its result, so the nodes in between run
// while the collective is in flight. Starts stay where they are. A wait
// never moves below the start of the collective two later on the same
// stream (mesh dims and sharding::comm_stream), nor below the wait of a
// later one: at most two of a stream's collectives (and the buffers they
// hold: a gradient's reduce_scatter holds the whole gradient) are in flight
// at once, as FSDP keeps its reduce-scatters; waits that meet keep their
// collectives' order.
#pragma once

#include "graph/graph.h"

namespace meshtrain::sched {

bool sink_waits(graph::Graph& g);  // -> changed

}  // namespace meshtrain::sched
