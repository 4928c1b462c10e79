#include "sched/passes/sink_waits.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "graph/op_registry.h"

namespace meshtrain::sched {

bool sink_waits(graph::Graph& g) {
  const std::vector<graph::NodeId> order = g.order();
  std::map<graph::NodeId, size_t> position;
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = i;
  struct Wait {
    graph::NodeId node;
    size_t start;   // position of the node that started its collective
    size_t before;  // it goes just before the node at this position (order.size(): at the end)
  };
  // Per group of mesh dims, its waits in the order their collectives start.
  std::map<std::vector<int64_t>, std::vector<Wait>> by_group;
  for (graph::NodeId n : order) {
    const graph::Node& node = g.node(n);
    if (!node.op->is_wait) continue;
    const graph::Node& start = g.node(g.value(node.inputs[0]).producer);
    size_t first_reader = order.size();
    for (graph::NodeId user : g.users(node.outputs[0])) first_reader = std::min(first_reader, position.at(user));
    by_group[start.attrs.get(graph::attr::mesh_dims)].push_back(
        {n, position.at(g.value(node.inputs[0]).producer), first_reader});
  }
  std::vector<Wait> waits;
  for (auto& [dims, group] : by_group) {
    std::sort(group.begin(), group.end(), [](const Wait& a, const Wait& b) { return a.start < b.start; });
    for (size_t k = group.size(); k-- > 1;) group[k - 1].before = std::min(group[k - 1].before, group[k].before);
    waits.insert(waits.end(), group.begin(), group.end());
  }
  std::sort(waits.begin(), waits.end(),
            [](const Wait& a, const Wait& b) { return std::tie(a.before, a.start) < std::tie(b.before, b.start); });
  std::vector<graph::NodeId> sunk;
  sunk.reserve(order.size());
  auto next_wait = waits.begin();
  for (size_t i = 0; i <= order.size(); ++i) {
    for (; next_wait != waits.end() && next_wait->before == i; ++next_wait) sunk.push_back(next_wait->node);
    if (i < order.size() && !g.node(order[i]).op->is_wait) sunk.push_back(order[i]);
  }
  if (sunk == order) return false;
  g.set_order(std::move(sunk));
  return true;
}

}  // namespace meshtrain::sched
