#include "graph/graph.h"

#include "core/error.h"
#include "graph/op_registry.h"

namespace meshtrain::graph {

Attrs& Attrs::set(const std::string& key, Value v) {
  values_[key] = std::move(v);
  return *this;
}

namespace {
template <typename T>
const T& get(const std::map<std::string, Attrs::Value>& values, const std::string& key, const char* type) {
  auto it = values.find(key);
  MT_CHECK(it != values.end(), "attribute '{}' is missing", key);
  const T* v = std::get_if<T>(&it->second);
  MT_CHECK(v != nullptr, "attribute '{}' is not {}", key, type);
  return *v;
}
}  // namespace

int64_t Attrs::get_int(const std::string& key) const { return get<int64_t>(values_, key, "an integer"); }
double Attrs::get_float(const std::string& key) const { return get<double>(values_, key, "a real number"); }
const std::vector<int64_t>& Attrs::get_ints(const std::string& key) const {
  return get<std::vector<int64_t>>(values_, key, "an integer list");
}

int Graph::add_value(Value v) {
  values_.push_back(std::move(v));
  return static_cast<int>(values_.size()) - 1;
}

int Graph::add_input(const std::string& name, const Shape& shape, DType dtype) {
  return add_value({{shape, dtype}, ValueKind::input, name, -1});
}

int Graph::add_parameter(const std::string& name, const Shape& shape, DType dtype) {
  return add_value({{shape, dtype}, ValueKind::parameter, name, -1});
}

std::vector<int> Graph::apply(const std::string& op_name, const std::vector<int>& inputs, const Attrs& attrs) {
  const OpDef& op = find_op(op_name);
  MT_CHECK(op.num_inputs < 0 || static_cast<int>(inputs.size()) == op.num_inputs, "op {} takes {} inputs, got {}",
           op.name, op.num_inputs, inputs.size());
  std::vector<ValueInfo> in;
  for (int v : inputs) in.push_back(value(v).info);
  std::vector<ValueInfo> out;
  try {
    out = op.infer(in, attrs);
  } catch (const InvalidArgument& e) {
    std::string args;
    for (int v : inputs) args += (args.empty() ? "" : ", ") + describe_value(v);
    throw InvalidArgument(fmt::format("{}({}): {}", op.name, args, e.what()));
  }
  Node node{&op, inputs, {}, attrs};
  const int node_id = static_cast<int>(nodes_.size());
  for (size_t k = 0; k < out.size(); ++k)
    node.outputs.push_back(add_value({out[k], ValueKind::intermediate, fmt::format("{}.{}", op.name, node_id), node_id}));
  nodes_.push_back(std::move(node));
  return nodes_.back().outputs;
}

int Graph::apply1(const std::string& op, const std::vector<int>& inputs, const Attrs& attrs) {
  const auto out = apply(op, inputs, attrs);
  MT_CHECK(out.size() == 1, "op {} has {} outputs, not 1", op, out.size());
  return out[0];
}

const Value& Graph::value(int id) const {
  MT_CHECK(id >= 0 && id < num_values(), "value id {} out of range (graph has {} values)", id, num_values());
  return values_[id];
}

const Node& Graph::node(int id) const {
  MT_CHECK(id >= 0 && id < num_nodes(), "node id {} out of range (graph has {} nodes)", id, num_nodes());
  return nodes_[id];
}

std::vector<int> Graph::parameters() const {
  std::vector<int> out;
  for (int v = 0; v < num_values(); ++v)
    if (values_[v].kind == ValueKind::parameter) out.push_back(v);
  return out;
}

std::string Graph::describe_value(int id) const {
  const Value& v = value(id);
  return fmt::format("{}: {}{}", v.name, dtype_name(v.info.dtype), v.info.shape.to_string());
}

}  // namespace meshtrain::graph
