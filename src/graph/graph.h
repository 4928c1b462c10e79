// The compute graph: Values (shape, dtype) produced by Nodes (an op applied
// to values, with attributes). Functional: every value is written once;
// parameters and optimizer state are inputs whose updated versions are
// outputs the executor writes back.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"

namespace meshtrain::graph {

struct OpDef;

// Named attributes of a node: integers, reals, integer lists.
class Attrs {
 public:
  using Value = std::variant<int64_t, double, std::vector<int64_t>>;
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<const std::string, Value>> init) : values_(init) {}
  Attrs& set(const std::string& key, Value v);
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  const std::vector<int64_t>& get_ints(const std::string& key) const;
  bool has(const std::string& key) const { return values_.count(key) != 0; }

 private:
  std::map<std::string, Value> values_;
};

struct ValueInfo {
  Shape shape;
  DType dtype = DType::f32;
  bool operator==(const ValueInfo&) const = default;
};

enum class ValueKind : uint8_t { input, parameter, intermediate };

struct Value {
  ValueInfo info;
  ValueKind kind = ValueKind::intermediate;
  std::string name;
  int producer = -1;  // node index, -1 for inputs and parameters
};

struct Node {
  const OpDef* op = nullptr;
  std::vector<int> inputs;
  std::vector<int> outputs;
  Attrs attrs;
};

class Graph {
 public:
  int add_input(const std::string& name, const Shape& shape, DType dtype);
  int add_parameter(const std::string& name, const Shape& shape, DType dtype);
  // Apply a registered op: checks and infers output shapes and dtypes.
  std::vector<int> apply(const std::string& op, const std::vector<int>& inputs, const Attrs& attrs = {});
  int apply1(const std::string& op, const std::vector<int>& inputs, const Attrs& attrs = {});

  const Value& value(int id) const;
  const Node& node(int id) const;
  int num_values() const { return static_cast<int>(values_.size()); }
  int num_nodes() const { return static_cast<int>(nodes_.size()); }
  const std::vector<Node>& nodes() const { return nodes_; }
  std::vector<int> parameters() const;
  std::string describe_value(int id) const;  // "x: f32(2, 3)"

 private:
  int add_value(Value v);
  std::vector<Value> values_;
  std::vector<Node> nodes_;
};

}  // namespace meshtrain::graph
