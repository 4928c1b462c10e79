// The compute graph: Values (shape, dtype) produced by Nodes (an op applied
// to values, with attributes). Functional: every value is written once;
// parameters and optimizer state are inputs whose updated versions are
// outputs the executor writes back.
//
// The graph is rewritable: passes insert nodes before others, replace every
// use of a value, remove nodes and reorder them. Nodes and values keep their
// ids for the life of the graph (a removed node's id is never reused); the
// node order that runs is `order()`, separate from creation. Each node carries
// the scope it was built in (e.g. "layers.3.attention") and its phase, so
// passes can cut the graph per block.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "graph/attrs.h"

namespace meshtrain::graph {

struct OpDef;

// A typed index: a ValueId cannot be passed where a NodeId is meant. The
// default is "none".
template <typename Tag>
struct Id {
  int32_t index = -1;
  constexpr Id() = default;
  constexpr explicit Id(int32_t i) : index(i) {}
  constexpr bool valid() const { return index >= 0; }
  auto operator<=>(const Id&) const = default;
};
using ValueId = Id<struct ValueTag>;
using NodeId = Id<struct NodeTag>;

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
  NodeId producer;  // none for inputs and parameters
};

// Which part of a training step a node belongs to.
enum class Phase : uint8_t { forward, backward, optimizer };
std::string_view phase_name(Phase p);

struct Node {
  const OpDef* op = nullptr;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  Attrs attrs;
  std::string scope;  // dotted, e.g. "layers.3.attention"; "" at the top
  Phase phase = Phase::forward;
  bool removed = false;
  // Activation checkpointing: the forward node this one runs again in
  // backward (same op, attributes and inputs or their recomputations); it
  // is laid out exactly as that one, so it computes the same bits.
  NodeId recomputes;
};

class Graph {
 public:
  ValueId add_input(const std::string& name, const Shape& shape, DType dtype);
  ValueId add_parameter(const std::string& name, const Shape& shape, DType dtype);

  // Adds a node applying a registered op (checking the inputs and inferring
  // the outputs' shapes and dtypes) at the insertion point: the end of the
  // order, or before the node set by InsertBefore. The node gets the current
  // scope and phase.
  NodeId add_node(const std::string& op, const std::vector<ValueId>& inputs, const Attrs& attrs = {});
  // The node's one output (fails for ops with several).
  ValueId only_output(NodeId node) const;

  // Rewrites. replace_uses: every live node input and graph output that is
  // `from` becomes `to` (same shape and dtype), except in the node that
  // computes `to` (which usually reads `from`). remove_node: fails while any
  // output is still used. set_order: a permutation of the live nodes.
  void replace_uses(ValueId from, ValueId to);
  // Every input of `node` that is `from` becomes `to` (same shape and dtype).
  void replace_input(NodeId node, ValueId from, ValueId to);
  // Marks `node` as a recomputation of `original` (Node::recomputes): same op and attributes.
  void set_recomputes(NodeId node, NodeId original);
  void remove_node(NodeId node);
  // The same for many at once, in one pass over the graph: each pair's
  // uses of `from` become `to` (no `to` is another pair's `from`); the
  // nodes removed together (none may read another's output).
  void replace_uses(const std::vector<std::pair<ValueId, ValueId>>& replacements);
  void remove_nodes(const std::vector<NodeId>& nodes);
  void set_order(std::vector<NodeId> order);

  // Graph outputs: the values a run must produce (loss, updated parameters).
  void add_output(ValueId v);
  const std::vector<ValueId>& outputs() const { return outputs_; }

  const Value& value(ValueId id) const;
  const Node& node(NodeId id) const;
  int num_values() const { return static_cast<int>(values_.size()); }
  const std::vector<NodeId>& order() const { return order_; }  // the live nodes, in run order
  size_t num_nodes() const { return order_.size(); }
  size_t num_node_ids() const { return nodes_.size(); }  // ids handed out, removed nodes included
  std::vector<ValueId> parameters() const;
  // The live nodes that read `v`, in order.
  std::vector<NodeId> users(ValueId v) const;
  std::string describe_value(ValueId id) const;  // "x: f32(2, 3)"

  // Scope and phase of the nodes added while they are set (see ScopeGuard).
  const std::string& scope() const { return scope_; }
  void set_scope(std::string scope) { scope_ = std::move(scope); }
  Phase phase() const { return phase_; }
  void set_phase(Phase p) { phase_ = p; }
  // Where add_node inserts: before `node`, or at the end when none.
  NodeId insertion_point() const { return insert_before_; }
  void set_insertion_point(NodeId before) { insert_before_ = before; }

 private:
  ValueId add_value(Value v);
  Node& mutable_node(NodeId id);
  std::vector<Value> values_;
  std::vector<Node> nodes_;  // by id, removed ones included
  std::vector<NodeId> order_;
  std::vector<ValueId> outputs_;
  std::string scope_;
  Phase phase_ = Phase::forward;
  NodeId insert_before_;
};

// Nodes built while a ScopeGuard lives get `name` appended to the graph's
// scope ("layers.3" then "attention" -> "layers.3.attention").
class ScopeGuard {
 public:
  ScopeGuard(Graph& g, const std::string& name);
  ~ScopeGuard() { g_.set_scope(std::move(saved_)); }
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;

 private:
  Graph& g_;
  std::string saved_;
};

// Nodes added while an InsertBefore lives go before `node`, in the scope and
// phase of `node` (a rewrite belongs where it is put); an invalid `node`:
// at the end, in the graph's current scope and phase.
class InsertBefore {
 public:
  InsertBefore(Graph& g, NodeId node);
  ~InsertBefore();
  InsertBefore(const InsertBefore&) = delete;
  InsertBefore& operator=(const InsertBefore&) = delete;

 private:
  Graph& g_;
  NodeId saved_point_;
  std::string saved_scope_;
  Phase saved_phase_;
};

// The graph as text, one line per input, parameter and node in order, e.g.
//   %3: f32(2, 4) = matmul(%0, %1) {transpose_a=false, transpose_b=true}  # layers.0.attention
// Values print as %id (inputs and parameters with their names). `notes`
// adds a word after a value's type where it is defined (a layout).
std::string to_text(const Graph& g, const std::map<ValueId, std::string>& notes = {});

// Checks the graph's invariants: the order holds each live node once; every
// input of a node is an input, a parameter or the output of a node earlier in
// the order; outputs' shapes and dtypes are what the op infers; graph outputs
// are defined. Throws InvalidArgument naming the first broken one.
void verify(const Graph& g);

}  // namespace meshtrain::graph

template <typename Tag>
struct std::hash<meshtrain::graph::Id<Tag>> {
  size_t operator()(meshtrain::graph::Id<Tag> id) const noexcept { return std::hash<int32_t>{}(id.index); }
};
