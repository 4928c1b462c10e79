#include "graph/graph.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "graph/op_registry.h"

namespace meshtrain::graph {

void Attrs::missing(std::string_view name) { throw InvalidArgument(fmt::format("attribute '{}' is missing", name)); }

void Attrs::wrong_type(std::string_view name) const {
  throw InvalidArgument(fmt::format("attribute '{}' holds another type than its key says", name));
}

namespace {
std::string attr_value_text(const Attr::Value& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>)
          return x ? "true" : "false";
        else if constexpr (std::is_same_v<T, DType>)
          return std::string(dtype_name(x));
        else if constexpr (std::is_same_v<T, std::string>)
          return x;
        else if constexpr (std::is_same_v<T, std::vector<int64_t>>)
          return fmt::format("[{}]", fmt::join(x, ", "));
        else
          return fmt::format("{}", x);
      },
      v);
}
}  // namespace

std::string Attrs::to_string() const {
  if (values_.empty()) return "";
  std::string out;
  for (const auto& [name, v] : values_)
    out += fmt::format("{}{}={}", out.empty() ? "{" : ", ", name, attr_value_text(v));
  return out + "}";
}

std::string_view phase_name(Phase p) {
  switch (p) {
    case Phase::forward:
      return "forward";
    case Phase::backward:
      return "backward";
    case Phase::optimizer:
      return "optimizer";
  }
  return "?";
}

ValueId Graph::add_value(Value v) {
  values_.push_back(std::move(v));
  return ValueId(static_cast<int32_t>(values_.size()) - 1);
}

ValueId Graph::add_input(const std::string& name, const Shape& shape, DType dtype) {
  return add_value({{shape, dtype}, ValueKind::input, name, {}});
}

ValueId Graph::add_parameter(const std::string& name, const Shape& shape, DType dtype) {
  return add_value({{shape, dtype}, ValueKind::parameter, name, {}});
}

NodeId Graph::add_node(const std::string& op_name, const std::vector<ValueId>& inputs, const Attrs& attrs) {
  const OpDef& op = find_op(op_name);
  MT_CHECK(op.num_inputs < 0 || static_cast<int>(inputs.size()) == op.num_inputs, "op {} takes {} inputs, got {}",
           op.name, op.num_inputs, inputs.size());
  std::vector<ValueInfo> in;
  for (ValueId v : inputs) in.push_back(value(v).info);
  std::vector<ValueInfo> out;
  try {
    out = op.infer(in, attrs);
  } catch (const InvalidArgument& e) {
    std::string args;
    for (ValueId v : inputs) args += (args.empty() ? "" : ", ") + describe_value(v);
    throw InvalidArgument(fmt::format("{}({}): {}", op.name, args, e.what()));
  }
  const NodeId id(static_cast<int32_t>(nodes_.size()));
  Node node{&op, inputs, {}, attrs, scope_, phase_, false};
  for (size_t k = 0; k < out.size(); ++k)
    node.outputs.push_back(add_value({out[k], ValueKind::intermediate, fmt::format("{}.{}", op.name, id.index), id}));
  nodes_.push_back(std::move(node));
  if (insert_before_.valid()) {
    const auto at = std::find(order_.begin(), order_.end(), insert_before_);
    MT_CHECK(at != order_.end(), "insertion point node {} is not in the graph's order", insert_before_.index);
    order_.insert(at, id);
  } else {
    order_.push_back(id);
  }
  return id;
}

ValueId Graph::only_output(NodeId id) const {
  const Node& n = node(id);
  MT_CHECK(n.outputs.size() == 1, "op {} has {} outputs, not 1", n.op->name, n.outputs.size());
  return n.outputs[0];
}

void Graph::replace_uses(ValueId from, ValueId to) {
  MT_CHECK(value(from).info == value(to).info, "replace_uses: {} and {} differ in shape or dtype", describe_value(from),
           describe_value(to));
  const NodeId to_producer = value(to).producer;
  for (NodeId n : order_) {
    if (n == to_producer) continue;  // `to` is typically computed from `from`
    for (ValueId& in : nodes_[static_cast<size_t>(n.index)].inputs)
      if (in == from) in = to;
  }
  for (ValueId& out : outputs_)
    if (out == from) out = to;
}

void Graph::replace_uses(const std::vector<std::pair<ValueId, ValueId>>& replacements) {
  std::unordered_map<ValueId, std::pair<ValueId, NodeId>> to_of;  // from -> (to, to's producer)
  for (const auto& [from, to] : replacements) {
    MT_CHECK(value(from).info == value(to).info, "replace_uses: {} and {} differ in shape or dtype",
             describe_value(from), describe_value(to));
    MT_CHECK(to_of.emplace(from, std::pair{to, value(to).producer}).second, "replace_uses: {} is replaced twice",
             describe_value(from));
  }
  for (const auto& [from, to] : replacements)
    MT_CHECK(!to_of.count(to), "replace_uses: {} replaces one value and is replaced itself", describe_value(to));
  for (NodeId n : order_)
    for (ValueId& in : nodes_[static_cast<size_t>(n.index)].inputs)
      if (const auto it = to_of.find(in); it != to_of.end() && it->second.second != n) in = it->second.first;
  for (ValueId& out : outputs_)
    if (const auto it = to_of.find(out); it != to_of.end()) out = it->second.first;
}

void Graph::remove_nodes(const std::vector<NodeId>& nodes) {
  std::unordered_set<NodeId> removed;
  for (NodeId id : nodes) {
    MT_CHECK(!node(id).removed && removed.insert(id).second, "remove_nodes: node {} ({}) is already removed", id.index,
             node(id).op->name);
  }
  std::unordered_set<ValueId> read(outputs_.begin(), outputs_.end());
  for (NodeId n : order_)
    if (!removed.count(n))
      for (ValueId in : nodes_[static_cast<size_t>(n.index)].inputs) read.insert(in);
  for (NodeId id : nodes)
    for (ValueId out : node(id).outputs)
      MT_CHECK(!read.count(out), "remove_nodes: {} is still used", describe_value(out));
  for (NodeId id : nodes) mutable_node(id).removed = true;
  std::erase_if(order_, [&](NodeId n) { return removed.count(n) > 0; });
  if (removed.count(insert_before_)) insert_before_ = {};
}

void Graph::replace_input(NodeId node, ValueId from, ValueId to) {
  MT_CHECK(value(from).info == value(to).info, "replace_input: {} and {} differ in shape or dtype",
           describe_value(from), describe_value(to));
  for (ValueId& in : mutable_node(node).inputs)
    if (in == from) in = to;
}

void Graph::set_recomputes(NodeId node, NodeId original) {
  MT_CHECK(this->node(node).op == this->node(original).op && this->node(node).attrs == this->node(original).attrs,
           "set_recomputes: node {} ({}) is not the same op with the same attributes as node {} ({})", node.index,
           this->node(node).op->name, original.index, this->node(original).op->name);
  mutable_node(node).recomputes = original;
}

void Graph::remove_node(NodeId id) {
  Node& n = mutable_node(id);
  MT_CHECK(!n.removed, "remove_node: node {} ({}) is already removed", id.index, n.op->name);
  for (ValueId out : n.outputs) {
    const auto users_of = users(out);
    MT_CHECK(users_of.empty() && std::find(outputs_.begin(), outputs_.end(), out) == outputs_.end(),
             "remove_node: {} is still used (by {} nodes{})", describe_value(out), users_of.size(),
             std::find(outputs_.begin(), outputs_.end(), out) != outputs_.end() ? " and as a graph output" : "");
  }
  n.removed = true;
  order_.erase(std::find(order_.begin(), order_.end(), id));
  if (insert_before_ == id) insert_before_ = {};
}

void Graph::set_order(std::vector<NodeId> order) {
  MT_CHECK(order.size() == order_.size(), "set_order: {} nodes given, the graph has {} live nodes", order.size(),
           order_.size());
  std::unordered_set<NodeId> seen;
  for (NodeId n : order) {
    MT_CHECK(!node(n).removed, "set_order: node {} is removed", n.index);
    MT_CHECK(seen.insert(n).second, "set_order: node {} appears twice", n.index);
  }
  order_ = std::move(order);
}

void Graph::add_output(ValueId v) {
  value(v);  // range check
  outputs_.push_back(v);
}

const Value& Graph::value(ValueId id) const {
  MT_CHECK(id.index >= 0 && id.index < num_values(), "value id {} out of range (graph has {} values)", id.index,
           num_values());
  return values_[static_cast<size_t>(id.index)];
}

const Node& Graph::node(NodeId id) const {
  MT_CHECK(id.index >= 0 && static_cast<size_t>(id.index) < nodes_.size(),
           "node id {} out of range (graph has made {} nodes)", id.index, nodes_.size());
  return nodes_[static_cast<size_t>(id.index)];
}

Node& Graph::mutable_node(NodeId id) { return const_cast<Node&>(node(id)); }

std::vector<ValueId> Graph::parameters() const {
  std::vector<ValueId> out;
  for (int v = 0; v < num_values(); ++v)
    if (values_[static_cast<size_t>(v)].kind == ValueKind::parameter) out.emplace_back(v);
  return out;
}

std::vector<NodeId> Graph::users(ValueId v) const {
  std::vector<NodeId> out;
  for (NodeId n : order_) {
    const auto& ins = nodes_[static_cast<size_t>(n.index)].inputs;
    if (std::find(ins.begin(), ins.end(), v) != ins.end()) out.push_back(n);
  }
  return out;
}

std::string Graph::describe_value(ValueId id) const {
  const Value& v = value(id);
  return fmt::format("{}: {}{}", v.name, dtype_name(v.info.dtype), v.info.shape.to_string());
}

ScopeGuard::ScopeGuard(Graph& g, const std::string& name) : g_(g), saved_(g.scope()) {
  g.set_scope(saved_.empty() ? name : saved_ + "." + name);
}

InsertBefore::InsertBefore(Graph& g, NodeId node)
    : g_(g), saved_point_(g.insertion_point()), saved_scope_(g.scope()), saved_phase_(g.phase()) {
  if (!node.valid()) {  // at the end
    g.set_insertion_point(node);
    return;
  }
  MT_CHECK(!g.node(node).removed, "InsertBefore: node {} is removed", node.index);
  g.set_insertion_point(node);
  g.set_scope(g.node(node).scope);
  g.set_phase(g.node(node).phase);
}

InsertBefore::~InsertBefore() {
  g_.set_insertion_point(saved_point_);
  g_.set_scope(std::move(saved_scope_));
  g_.set_phase(saved_phase_);
}

namespace {
std::string value_ref(const Graph& g, ValueId v) {
  const Value& val = g.value(v);
  return val.kind == ValueKind::intermediate ? fmt::format("%{}", v.index) : fmt::format("%{}:{}", v.index, val.name);
}
}  // namespace

std::string to_text(const Graph& g, const std::map<ValueId, std::string>& notes) {
  auto note = [&](ValueId v) {
    const auto it = notes.find(v);
    return it == notes.end() ? std::string() : " " + it->second;
  };
  std::string out;
  for (int i = 0; i < g.num_values(); ++i) {
    const ValueId v(i);
    const Value& val = g.value(v);
    if (val.kind == ValueKind::intermediate) continue;
    out += fmt::format("{} %{}:{}: {}{}{}\n", val.kind == ValueKind::input ? "input" : "param", i, val.name,
                       dtype_name(val.info.dtype), val.info.shape.to_string(), note(v));
  }
  for (NodeId n : g.order()) {
    const Node& node = g.node(n);
    std::vector<std::string> outs, ins;
    for (ValueId v : node.outputs)
      outs.push_back(fmt::format("%{}: {}{}{}", v.index, dtype_name(g.value(v).info.dtype),
                                 g.value(v).info.shape.to_string(), note(v)));
    for (ValueId v : node.inputs) ins.push_back(value_ref(g, v));
    const std::string attrs = node.attrs.to_string();
    const std::string again =
        node.recomputes.valid() ? fmt::format(" (recomputes %{})", g.node(node.recomputes).outputs[0].index) : "";
    out += fmt::format("{} = {}({}){}{}  # {}{}{}{}\n", fmt::join(outs, ", "), node.op->name, fmt::join(ins, ", "),
                       attrs.empty() ? "" : " ", attrs, phase_name(node.phase), node.scope.empty() ? "" : " ",
                       node.scope, again);
  }
  std::vector<std::string> outs;
  for (ValueId v : g.outputs()) outs.push_back(value_ref(g, v));
  if (!outs.empty()) out += fmt::format("outputs {}\n", fmt::join(outs, ", "));
  return out;
}

void verify(const Graph& g) {
  std::vector<bool> defined(static_cast<size_t>(g.num_values()), false);
  for (int i = 0; i < g.num_values(); ++i)
    defined[static_cast<size_t>(i)] = g.value(ValueId(i)).kind != ValueKind::intermediate;
  std::unordered_set<NodeId> seen;
  for (NodeId n : g.order()) {
    const Node& node = g.node(n);
    MT_CHECK(!node.removed, "verify: removed node {} ({}) is in the order", n.index, node.op->name);
    MT_CHECK(seen.insert(n).second, "verify: node {} ({}) is in the order twice", n.index, node.op->name);
    std::vector<ValueInfo> in;
    for (ValueId v : node.inputs) {
      MT_CHECK(defined[static_cast<size_t>(v.index)], "verify: node {} ({}) reads {} before it is computed", n.index,
               node.op->name, g.describe_value(v));
      in.push_back(g.value(v).info);
    }
    const std::vector<ValueInfo> out = node.op->infer(in, node.attrs);
    MT_CHECK(out.size() == node.outputs.size(), "verify: node {} ({}) has {} outputs, its op infers {}", n.index,
             node.op->name, node.outputs.size(), out.size());
    for (size_t k = 0; k < out.size(); ++k) {
      const Value& v = g.value(node.outputs[k]);
      MT_CHECK(v.producer == n && v.info == out[k], "verify: output {} of node {} ({}) is {}, its op infers {}{}", k,
               n.index, node.op->name, g.describe_value(node.outputs[k]), dtype_name(out[k].dtype),
               out[k].shape.to_string());
      defined[static_cast<size_t>(node.outputs[k].index)] = true;
    }
  }
  size_t live = 0;
  for (int32_t i = 0; static_cast<size_t>(i) < g.num_node_ids(); ++i) live += g.node(NodeId(i)).removed ? 0 : 1;
  MT_CHECK(live == g.order().size(), "verify: {} live nodes, {} in the order", live, g.order().size());
  for (ValueId v : g.outputs())
    MT_CHECK(defined[static_cast<size_t>(v.index)], "verify: graph output {} is not computed by any live node",
             g.describe_value(v));
}

}  // namespace meshtrain::graph
