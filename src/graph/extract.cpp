#include "graph/extract.h"

#include <algorithm>
#include <set>

#include "core/error.h"
#include "graph/op_registry.h"

namespace meshtrain::graph {

ExtractedGraph extract_graph(const Graph& g, const std::vector<NodeId>& nodes, const std::vector<ValueId>& outputs) {
  const std::set<NodeId> chosen(nodes.begin(), nodes.end());
  ExtractedGraph out;
  Graph& part = out.graph;
  auto value_here = [&](ValueId v) {
    if (const auto it = out.values.find(v); it != out.values.end()) return it->second;
    const Value& source = g.value(v);
    const std::string name = source.producer.valid() ? fmt::format("%{}", v.index) : source.name;
    const ValueId here = source.kind == ValueKind::parameter
                             ? part.add_parameter(name, source.info.shape, source.info.dtype)
                             : part.add_input(name, source.info.shape, source.info.dtype);
    out.values[v] = here;
    out.reads.push_back(v);
    return here;
  };
  for (const NodeId n : g.order()) {
    if (!chosen.contains(n)) continue;
    const Node& node = g.node(n);
    std::vector<ValueId> inputs;
    for (const ValueId v : node.inputs) inputs.push_back(value_here(v));
    part.set_scope(node.scope);
    part.set_phase(node.phase);
    const NodeId copy = part.add_node(node.op->name, inputs, node.attrs);
    const std::vector<ValueId>& copied = part.node(copy).outputs;
    for (size_t k = 0; k < node.outputs.size(); ++k) out.values[node.outputs[k]] = copied[k];
  }
  MT_CHECK(chosen.size() == part.num_nodes(),
           "extract_graph: {} of the {} nodes asked for are not live nodes of the graph",
           chosen.size() - part.num_nodes(), chosen.size());
  part.set_scope("");
  for (const ValueId v : outputs) {
    const auto it = out.values.find(v);
    MT_CHECK(it != out.values.end(), "extract_graph: output {} is neither computed nor read by the part",
             g.describe_value(v));
    part.add_output(it->second);
  }
  out.outputs = outputs;
  return out;
}

std::vector<NodeId> nodes_needed_for(const Graph& g, const std::vector<ValueId>& targets,
                                     const std::vector<NodeId>& among) {
  const std::set<NodeId> allowed(among.begin(), among.end());
  std::set<NodeId> needed;
  std::vector<ValueId> pending(targets.begin(), targets.end());
  while (!pending.empty()) {
    const ValueId v = pending.back();
    pending.pop_back();
    const NodeId producer = g.value(v).producer;
    if (!producer.valid() || !allowed.contains(producer) || !needed.insert(producer).second) continue;
    for (const ValueId input : g.node(producer).inputs) pending.push_back(input);
  }
  std::vector<NodeId> ordered;
  for (const NodeId n : g.order())
    if (needed.contains(n)) ordered.push_back(n);
  return ordered;
}

FromParameters from_parameters(const Graph& g, bool through_backward) {
  FromParameters out;
  out.values.assign(static_cast<size_t>(g.num_values()), false);
  for (int i = 0; i < g.num_values(); ++i)
    out.values[static_cast<size_t>(i)] = g.value(ValueId(i)).kind == ValueKind::parameter;
  for (const NodeId n : g.order()) {
    const Node& node = g.node(n);
    if ((!through_backward && node.phase != Phase::forward) || node.inputs.empty() ||
        !std::all_of(node.inputs.begin(), node.inputs.end(),
                     [&](ValueId v) { return out.values[static_cast<size_t>(v.index)]; }))
      continue;
    out.nodes.push_back(n);
    for (const ValueId v : node.outputs) out.values[static_cast<size_t>(v.index)] = true;
  }
  return out;
}

}  // namespace meshtrain::graph
