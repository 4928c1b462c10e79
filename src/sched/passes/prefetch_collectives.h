// Overlap reordering: collectives started earlier, so that compute hides
// them — FSDP's all_gathers of parameters prefetched ahead of their use, in
// forward and in backward — within a memory budget and without changing
// what any node computes (only the order of the graph changes).
#pragma once

#include <functional>

#include "graph/graph.h"
#include "graph/schedule.h"

namespace meshtrain::sched {

struct PrefetchOptions {
  // Each node's estimated time, in microseconds (sched::node_us).
  std::function<double(graph::NodeId)> node_us;
  // The schedule the graph's current order makes (its memory plan included):
  // the pass costs the memory of its orders with it.
  std::function<graph::Schedule(const graph::Graph&)> schedule_of;
  // What the step allocates (sched::estimate_memory's allocated_bytes) may not exceed
  // this; 0: no budget.
  double memory_budget_bytes = 0;
};

// Walks the collectives in order, each on its stream
// (sched::collective_stream), timed as sched::estimate_step times the step:
// compute one node after another, a wait holding it until its collective is
// done. A collective whose wait comes too soon for the compute in between to
// hide it is started earlier: at the latest point from which it completes
// by its wait or, where its stream's earlier collectives keep the stream
// busy past that, where the stream frees — never earlier than that (what it
// brings would be held longer for nothing), than its inputs are computed,
// or than its stream's previous collective starts (every rank issues a
// stream's collectives in one order); and never where the bytes live at
// some step would exceed the budget. What computes its inputs from the
// graph's inputs alone (a parameter's shard cast to the compute dtype)
// moves up with it. The exact allocation of the new order (the arena's
// first fit included) is checked at the end; where it is over the budget,
// only the first collectives, as many as fit (bisected), are moved, and
// none where not even one fits. Waits stay where they are (sink_waits puts
// them at the first use). Returns whether the order changed.
bool prefetch_collectives(graph::Graph& g, const PrefetchOptions& options);

}  // namespace meshtrain::sched
