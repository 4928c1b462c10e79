#include "sched/passes/prefetch_collectives.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>

#include "core/error.h"
#include "graph/op_registry.h"
#include "sched/collective_cost.h"
#include "sched/memory_estimate.h"

namespace meshtrain::sched {

namespace {

// How many nodes deep the preparation of a collective's input may go (a
// cast, a view of it).
constexpr int kPreparationDepth = 3;

double output_bytes(const graph::Graph& g, const graph::Node& node) {
  double sum = 0;
  for (graph::ValueId v : node.outputs)
    sum += static_cast<double>(g.value(v).info.shape.numel()) * static_cast<double>(dtype_size(g.value(v).info.dtype));
  return sum;
}

// One try at the whole order, the live bytes kept within the budget, the
// first `max_starts` collectives movable: for each position of `order`, the
// position its node moves before (order.size() for none). `clock`: the estimated compute before each position, stalls
// not counted. Updates nothing in the graph.
std::vector<size_t> plan_hoists(const graph::Graph& g, const std::vector<graph::NodeId>& order,
                                const std::vector<double>& clock, std::vector<double> live,
                                const PrefetchOptions& options, size_t max_starts) {
  const double room = options.memory_budget_bytes;
  const size_t n = order.size();
  std::map<graph::NodeId, size_t> position;
  for (size_t i = 0; i < n; ++i) position[order[i]] = i;
  std::map<graph::NodeId, size_t> wait_of;  // started collective -> position of its wait
  for (size_t i = 0; i < n; ++i) {
    const graph::Node& node = g.node(order[i]);
    if (node.op->is_wait) wait_of[g.value(node.inputs[0]).producer] = i;
  }
  std::vector<size_t> hoist_to(n, n);
  // When the compute stream reaches each position, waits' stalls included:
  // final for every position before the one being decided, as moving a
  // start earlier changes only when its own wait, further on, returns.
  std::vector<double> now(n + 1, 0.0);
  std::map<graph::NodeId, double> done_at;            // started collective -> when it completes
  std::map<CollectiveStream, double> stream_free_at;  // when each stream is done
  std::map<CollectiveStream, size_t> stream_floor;    // the earliest place for each stream's next start
  for (size_t i = 0; i < n; ++i) {
    const graph::Node& node = g.node(order[i]);
    if (node.op->is_wait) {
      const auto done = done_at.find(g.value(node.inputs[0]).producer);
      now[i + 1] = std::max(now[i], done == done_at.end() ? now[i] : done->second);
      continue;
    }
    if (!node.op->starts_async) {
      now[i + 1] = now[i] + (clock[i + 1] - clock[i]);
      continue;
    }
    now[i + 1] = now[i];
    const bool movable = max_starts-- > 0;
    const CollectiveStream stream = collective_stream(node);
    size_t floor = stream_floor[stream];
    // What computes its inputs from the graph's inputs alone (a parameter's
    // shard cast to the compute dtype) moves up with it; anything else holds it below.
    std::vector<size_t> preparation;
    std::function<void(const graph::Node&, int)> hold_below = [&](const graph::Node& reader, int depth) {
      for (graph::ValueId in : reader.inputs) {
        const graph::NodeId p = g.value(in).producer;
        if (!p.valid()) continue;
        const size_t at = position.at(p);
        const graph::Node& producer = g.node(p);
        if (hoist_to[at] < n) {  // already moved up, with an earlier collective
          floor = std::max(floor, hoist_to[at]);
        } else if (depth < kPreparationDepth && !producer.op->is_collective && !producer.op->is_wait) {
          if (std::find(preparation.begin(), preparation.end(), at) == preparation.end()) preparation.push_back(at);
          hold_below(producer, depth + 1);
        } else {
          floor = std::max(floor, at + 1);
        }
      }
    };
    hold_below(node, 0);
    const double us = options.node_us(order[i]);
    const auto wait = wait_of.find(order[i]);
    // When compute reaches the wait, as far as can be told from here.
    const double wait_time = now[i] + clock[wait == wait_of.end() ? n : wait->second] - clock[i];
    double& free_at = stream_free_at[stream];
    // The latest issue time that still hides it, but no earlier than its stream frees.
    const double issue_by = std::max(wait_time - us, free_at);
    const double bytes = output_bytes(g, node);
    size_t q = i;
    double prepared_bytes = 0;
    for (size_t at : preparation) prepared_bytes += output_bytes(g, g.node(order[at]));
    while (movable && q > floor && now[q] > issue_by && (room <= 0 || live[q - 1] + bytes + prepared_bytes <= room))
      --q;
    if (q < i) {
      hoist_to[i] = q;
      for (size_t k = q; k < i; ++k) live[k] += bytes;
      for (size_t at : preparation) {
        if (at < q) continue;  // already above: stays
        hoist_to[at] = q;
        const double prepared = output_bytes(g, g.node(order[at]));
        for (size_t k = q; k < at; ++k) live[k] += prepared;
      }
    }
    free_at = done_at[order[i]] = std::max(now[q], free_at) + us;
    stream_floor[stream] = q < i ? q : i + 1;
  }
  return hoist_to;
}

std::vector<graph::NodeId> apply_hoists(const std::vector<graph::NodeId>& order, const std::vector<size_t>& hoist_to) {
  const size_t n = order.size();
  std::vector<std::vector<graph::NodeId>> before(n);
  for (size_t i = 0; i < n; ++i)
    if (hoist_to[i] < n) before[hoist_to[i]].push_back(order[i]);
  std::vector<graph::NodeId> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    out.insert(out.end(), before[i].begin(), before[i].end());
    if (hoist_to[i] == n) out.push_back(order[i]);
  }
  return out;
}

}  // namespace

bool prefetch_collectives(graph::Graph& g, const PrefetchOptions& options) {
  MT_CHECK(options.node_us && options.schedule_of, "prefetch_collectives needs a node cost and a way to schedule");
  const std::vector<graph::NodeId> order = g.order();
  const size_t n = order.size();
  // The stall-free compute clock: the estimated compute before each position.
  std::vector<double> clock(n + 1, 0.0);
  for (size_t i = 0; i < n; ++i) {
    const graph::Node& node = g.node(order[i]);
    const bool computes = !node.op->is_view && !node.op->starts_async;
    clock[i + 1] = clock[i] + (computes ? options.node_us(order[i]) : 0.0);
  }
  const graph::Schedule base = options.schedule_of(g);
  const MemoryEstimate before = estimate_memory(g, base);
  const double budget = options.memory_budget_bytes;
  if (budget > 0 && before.allocated_bytes > budget) return false;  // nothing to spare; the caller reports the budget
  // Live bytes at each position of the order (nodes outside the schedule never run: none).
  std::map<graph::NodeId, double> live_at;
  for (size_t s = 0; s < base.steps.size(); ++s) live_at[base.steps[s]] = before.live_bytes[s];
  std::vector<double> live(n, 0.0);
  for (size_t i = 0; i < n; ++i)
    if (const auto it = live_at.find(order[i]); it != live_at.end()) live[i] = it->second;

  // The first `starts` collectives moved up (all: SIZE_MAX); the order if it
  // fits the budget.
  const auto try_order = [&](size_t starts) -> std::optional<std::vector<graph::NodeId>> {
    std::vector<graph::NodeId> hoisted = apply_hoists(order, plan_hoists(g, order, clock, live, options, starts));
    if (budget <= 0 || hoisted == order) return hoisted;
    g.set_order(hoisted);
    const bool fits = estimate_memory(g, options.schedule_of(g)).allocated_bytes <= budget;
    g.set_order(order);
    return fits ? std::optional(std::move(hoisted)) : std::nullopt;
  };
  std::optional<std::vector<graph::NodeId>> best = try_order(SIZE_MAX);
  if (!best) {
    // The live bytes fit, but the arena's first fit, packing the longer
    // lifetimes, does not: move up fewer collectives, the most that fit
    // (bisected: the arena grows with every collective moved up, give or take).
    size_t fits = 0, over = 0;
    for (size_t i = 0; i < n; ++i) over += g.node(order[i]).op->starts_async ? 1 : 0;
    while (over - fits > 1) {
      const size_t mid = fits + (over - fits) / 2;
      if (auto o = try_order(mid)) {
        fits = mid;
        best = std::move(o);
      } else {
        over = mid;
      }
    }
  }
  if (!best || *best == order) return false;
  g.set_order(std::move(*best));
  return true;
}

}  // namespace meshtrain::sched
