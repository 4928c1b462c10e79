#include "sched/passes/sink_waits.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "graph/op_registry.h"
#include "sched/collective_cost.h"

namespace meshtrain::sched {

namespace {
constexpr size_t kInFlightPerStream = 2;
}  // namespace

bool sink_waits(graph::Graph& g) {
  const std::vector<graph::NodeId> order = g.order();
  std::map<graph::NodeId, size_t> position;
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = i;
  struct Wait {
    graph::NodeId node;
    size_t start;   // position of the node that started its collective
    size_t before;  // it goes just before the node at this position (order.size(): at the end)
  };
  // The first node that reads each value, in one sweep.
  std::map<graph::ValueId, size_t> first_reader;
  for (size_t i = order.size(); i-- > 0;)
    for (graph::ValueId in : g.node(order[i]).inputs) first_reader[in] = i;
  // Per stream, its waits in the order their collectives start.
  std::map<CollectiveStream, std::vector<Wait>> by_stream;
  for (graph::NodeId n : order) {
    const graph::Node& node = g.node(n);
    if (!node.op->is_wait) continue;
    const graph::NodeId start = g.value(node.inputs[0]).producer;
    const auto reader = first_reader.find(node.outputs[0]);
    by_stream[collective_stream(g.node(start))].push_back(
        {n, position.at(start), reader == first_reader.end() ? order.size() : reader->second});
  }
  std::vector<Wait> waits;
  for (auto& [stream, group] : by_stream) {
    std::sort(group.begin(), group.end(), [](const Wait& a, const Wait& b) { return a.start < b.start; });
    // At most kInFlightPerStream of a stream's collectives in flight: each is
    // waited on before the one that many later starts (what it reads and
    // writes is held until its wait).
    for (size_t k = 0; k + kInFlightPerStream < group.size(); ++k)
      group[k].before = std::min(group[k].before, group[k + kInFlightPerStream].start);
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
