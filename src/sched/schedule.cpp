#include "sched/schedule.h"

#include <algorithm>

#include "core/error.h"
#include "sched/memory_plan.h"

namespace meshtrain::sched {

graph::Schedule make_schedule(const graph::Graph& g, std::vector<graph::ValueId> fetches,
                              std::vector<graph::Update> updates) {
  graph::Schedule s;
  for (const graph::Update& u : updates) {
    MT_CHECK(!g.value(u.to).producer.valid(), "schedule: update of {}, which is computed by the graph, not an input",
             g.describe_value(u.to));
    MT_CHECK(g.value(u.from).info == g.value(u.to).info,
             "schedule: update of {} with {}: they differ in shape or dtype", g.describe_value(u.to),
             g.describe_value(u.from));
    if (std::find(fetches.begin(), fetches.end(), u.from) == fetches.end()) fetches.push_back(u.from);
  }
  // The nodes the fetches need.
  std::vector<bool> needed(g.num_node_ids(), false);
  std::vector<graph::ValueId> stack;
  for (graph::ValueId v : fetches) {
    g.value(v);  // range check
    stack.push_back(v);
  }
  while (!stack.empty()) {
    const graph::NodeId p = g.value(stack.back()).producer;
    stack.pop_back();
    if (!p.valid() || needed[static_cast<size_t>(p.index)]) continue;
    needed[static_cast<size_t>(p.index)] = true;
    for (graph::ValueId in : g.node(p).inputs) stack.push_back(in);
  }
  for (graph::NodeId n : g.order())
    if (needed[static_cast<size_t>(n.index)]) s.steps.push_back(n);
  s.fetches = std::move(fetches);
  s.updates = std::move(updates);
  s.memory = plan_memory(g, s.steps, s.fetches, s.updates);
  return s;
}

}  // namespace meshtrain::sched
