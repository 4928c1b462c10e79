#include "sched/passes/dead_code.h"

#include <unordered_map>

namespace meshtrain::sched {

bool remove_dead_nodes(graph::Graph& g) {
  // Readers per value, counted once; then walk the order backwards so a node
  // that only fed dead nodes dies in the same sweep.
  std::unordered_map<graph::ValueId, int> readers;
  for (graph::NodeId n : g.order())
    for (graph::ValueId in : g.node(n).inputs) ++readers[in];
  for (graph::ValueId out : g.outputs()) ++readers[out];
  const std::vector<graph::NodeId> order = g.order();
  bool changed = false;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const graph::Node& node = g.node(*it);
    bool used = false;
    for (graph::ValueId out : node.outputs) used |= readers[out] > 0;
    if (used) continue;
    for (graph::ValueId in : node.inputs) --readers[in];
    g.remove_node(*it);
    changed = true;
  }
  return changed;
}

}  // namespace meshtrain::sched
