#include "sched/passes/checkpoint_activations.h"

#include <algorithm>
#include <map>
#include <set>

#include "graph/op_registry.h"

namespace meshtrain::sched {

std::string_view activation_checkpoint_name(ActivationCheckpoint mode) {
  switch (mode) {
    case ActivationCheckpoint::none:
      return "none";
    case ActivationCheckpoint::full:
      return "full";
    case ActivationCheckpoint::selective:
      return "selective";
  }
  return "?";
}

std::string_view selective_matmuls_name(SelectiveMatmuls matmuls) {
  return matmuls == SelectiveMatmuls::all ? "all" : "every_other";
}

namespace {

// "layers.3.attention" -> "layers.3"; "" outside the transformer blocks.
std::string_view block_of(std::string_view scope) {
  constexpr std::string_view prefix = "layers.";
  if (scope.substr(0, prefix.size()) != prefix) return {};
  return scope.substr(0, scope.find('.', prefix.size()));
}

// One pass through a block: its forward nodes, in order.
struct BlockPass {
  std::string block;
  std::vector<graph::NodeId> nodes;
};

std::vector<BlockPass> block_passes(const graph::Graph& g) {
  std::vector<BlockPass> passes;
  bool open = false;
  for (graph::NodeId n : g.order()) {
    const graph::Node& node = g.node(n);
    const std::string block(node.phase == graph::Phase::forward ? block_of(node.scope) : std::string_view{});
    if (block.empty()) {
      open = false;
      continue;
    }
    if (!open || passes.back().block != block) passes.push_back({block, {}});
    open = true;
    passes.back().nodes.push_back(n);
  }
  return passes;
}

// Recomputes what backward reads of one pass through a block; true if any.
// `readers` and `position`: of the graph before any pass was recomputed
// (what is recomputed for one pass neither reads nor is read by another's).
bool recompute(graph::Graph& g, const BlockPass& pass, ActivationCheckpoint mode, SelectiveMatmuls matmuls,
               const std::set<graph::ValueId>& from_parameters,
               const std::map<graph::ValueId, std::vector<graph::NodeId>>& readers,
               const std::map<graph::NodeId, size_t>& position) {
  const auto users = [&](graph::ValueId v) -> const std::vector<graph::NodeId>& {
    static const std::vector<graph::NodeId> none;
    const auto it = readers.find(v);
    return it == readers.end() ? none : it->second;
  };
  const std::set<graph::NodeId> members(pass.nodes.begin(), pass.nodes.end());
  const auto inside = [&](graph::ValueId v) {
    const graph::NodeId p = g.value(v).producer;
    return p.valid() && members.count(p) > 0;
  };
  // Under selective, the matmuls (FP8 ones too) and attention whose outputs the block keeps.
  std::set<graph::NodeId> kept_outputs;
  if (mode == ActivationCheckpoint::selective) {
    int matmul_count = 0;
    for (graph::NodeId n : pass.nodes) {
      const std::string& op = g.node(n).op->name;
      if (op == "attention" || op == "amax") kept_outputs.insert(n);  // an FP8 scale's amax: a scalar
      if ((op == "matmul" || op == "fp8_matmul") && (matmuls == SelectiveMatmuls::all || ++matmul_count % 2 == 1))
        kept_outputs.insert(n);
    }
  }
  const auto kept = [&](graph::ValueId v) {
    if (from_parameters.count(v)) return true;
    if (kept_outputs.count(g.value(v).producer)) return true;
    for (graph::NodeId user : users(v)) {
      const graph::Node& u = g.node(user);
      if (u.phase == graph::Phase::forward && !members.count(user)) return true;  // the block's output
    }
    return false;
  };
  // What backward reads of the block and the block does not keep, and what it is recomputed from.
  std::set<graph::NodeId> redo;
  std::vector<graph::ValueId> todo;
  for (graph::NodeId n : pass.nodes)
    for (graph::ValueId out : g.node(n).outputs)
      for (graph::NodeId user : users(out))
        if (g.node(user).phase == graph::Phase::backward && !kept(out)) todo.push_back(out);
  while (!todo.empty()) {
    const graph::ValueId v = todo.back();
    todo.pop_back();
    const graph::NodeId p = g.value(v).producer;
    if (!redo.insert(p).second) continue;
    for (graph::ValueId in : g.node(p).inputs)
      if (inside(in) && !kept(in)) todo.push_back(in);
  }
  if (redo.empty()) return false;
  // Just before the first backward node that reads any of it.
  graph::NodeId first_reader;
  size_t first_at = SIZE_MAX;
  for (graph::NodeId n : redo)
    for (graph::ValueId out : g.node(n).outputs)
      for (graph::NodeId user : users(out))
        if (g.node(user).phase == graph::Phase::backward && position.at(user) < first_at) {
          first_at = position.at(user);
          first_reader = user;
        }
  std::map<graph::ValueId, graph::ValueId> again;  // forward value -> its recomputation
  {
    graph::InsertBefore at(g, first_reader);  // backward's phase
    for (graph::NodeId n : pass.nodes) {
      if (!redo.count(n)) continue;
      const graph::Node node = g.node(n);  // a copy: adding nodes may move the storage
      std::vector<graph::ValueId> inputs;
      for (graph::ValueId in : node.inputs) inputs.push_back(again.count(in) ? again.at(in) : in);
      g.set_scope(node.scope);
      const graph::NodeId clone = g.add_node(node.op->name, inputs, node.attrs);
      g.set_recomputes(clone, n);
      for (size_t k = 0; k < node.outputs.size(); ++k) again[node.outputs[k]] = g.node(clone).outputs[k];
    }
  }
  for (const auto& [original, recomputed] : again)
    for (graph::NodeId user : users(original))
      if (g.node(user).phase == graph::Phase::backward) g.replace_input(user, original, recomputed);
  return true;
}

}  // namespace

bool checkpoint_activations(graph::Graph& g, ActivationCheckpoint mode, SelectiveMatmuls matmuls) {
  if (mode == ActivationCheckpoint::none) return false;
  // Values computed from parameters alone (a parameter cast to the compute dtype): kept, never recomputed.
  std::set<graph::ValueId> from_parameters;
  for (graph::NodeId n : g.order()) {
    const graph::Node& node = g.node(n);
    const bool only_parameters = std::all_of(node.inputs.begin(), node.inputs.end(), [&](graph::ValueId in) {
      return g.value(in).kind == graph::ValueKind::parameter || from_parameters.count(in) > 0;
    });
    if (only_parameters && !node.inputs.empty()) from_parameters.insert(node.outputs.begin(), node.outputs.end());
  }
  std::map<graph::ValueId, std::vector<graph::NodeId>> readers;
  std::map<graph::NodeId, size_t> position;
  for (size_t i = 0; i < g.order().size(); ++i) {
    const graph::NodeId n = g.order()[i];
    position[n] = i;
    for (graph::ValueId in : g.node(n).inputs) readers[in].push_back(n);
  }
  bool changed = false;
  for (const BlockPass& pass : block_passes(g))
    changed |= recompute(g, pass, mode, matmuls, from_parameters, readers, position);
  return changed;
}

}  // namespace meshtrain::sched
