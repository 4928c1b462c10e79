// Overlap for a lowered graph: each collective's wait moves down to just
// before the first node that reads its result, so the nodes in between run
// while the collective is in flight. Starts stay where they are. A wait never
// moves below the wait of a later collective on the same stream (mesh dims
// and sharding::comm_stream), which bounds how many collectives (and the
// inputs they hold) are in flight at once per stream; waits that meet keep
// their collectives' order.
#pragma once

#include "graph/graph.h"

namespace meshtrain::sched {

bool sink_waits(graph::Graph& g);  // -> changed

}  // namespace meshtrain::sched
