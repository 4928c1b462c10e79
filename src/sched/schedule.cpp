#include "sched/schedule.h"

#include "sched/memory_plan.h"

namespace meshtrain::sched {

graph::Schedule make_schedule(const graph::Graph& g, std::vector<graph::ValueId> fetches) {
  graph::Schedule s;
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
  s.memory = plan_memory(g, s.steps, s.fetches);
  return s;
}

}  // namespace meshtrain::sched
