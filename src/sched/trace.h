// Pictures of a step for Perfetto and chrome://tracing (the Trace Event
// Format): each rank a process with a compute track, every node that ran at
// its time, and a communication track, each collective from its start to
// the end of its wait, so that what overlaps shows.
#pragma once

#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/schedule.h"

namespace meshtrain::sched {

// One rank's events as the text of a JSON array (pid = rank). Every span's
// node must be a node of `g`.
std::string chrome_trace_events(const graph::Graph& g, const std::vector<graph::NodeSpan>& spans, int rank);

// Work named by the caller rather than a graph's node (a pipeline's actions:
// "1F3" on the compute track, a receive waited for on the communication
// track), in microseconds from a common origin.
struct NamedSpan {
  std::string name;
  bool communication = false;
  double begin_us = 0, end_us = 0;
};
std::string chrome_trace_events(const std::vector<NamedSpan>& spans, int rank);

// The trace document of the ranks' event arrays (as chrome_trace_events writes them).
std::string chrome_trace(const std::vector<std::string>& rank_events);

}  // namespace meshtrain::sched
