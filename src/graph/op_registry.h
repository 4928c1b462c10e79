// The op registry. Each op is defined once, in its family's file under
// graph/ops/, as an OpDef: its shape and dtype rule, its backward rule (built
// from other ops) and its FLOP and byte counts. Kernels attach to an op by
// name from kernels/ and sharding strategies from spmd/; nothing here
// knows how an op runs.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace meshtrain::graph {

class Builder;

using ValueInfos = std::vector<ValueInfo>;

// The infos of `values` of `g`, in order (a node's inputs or outputs, as the
// op's rules take them).
ValueInfos value_infos(const Graph& g, const std::vector<ValueId>& values);

struct OpDef {
  static constexpr int kVariadic = -1;
  std::string name;
  int num_inputs = 1;  // or kVariadic
  // Output infos from input infos; throws InvalidArgument naming the problem.
  std::function<ValueInfos(const ValueInfos& in, const Attrs& attrs)> infer;
  // Gradients of the inputs (ValueId{} where none) given the node and the
  // gradients of its outputs. Empty: not differentiable.
  std::function<std::vector<ValueId>(Builder& b, const Node& node, const std::vector<ValueId>& grad_out)> backward;
  // Floating-point operations of one execution. Empty: none.
  std::function<double(const ValueInfos& in, const ValueInfos& out, const Attrs& attrs)> flops;
  // Bytes one execution reads and writes, each operand counted once (the
  // memory traffic of an ideal kernel). Empty: every input read and every
  // output written whole; an op that touches less says so here.
  std::function<double(const ValueInfos& in, const ValueInfos& out, const Attrs& attrs)> bytes;
  // The output is input 0's bytes under another shape (reshape): executors
  // alias the buffer, and the op has no kernel.
  bool is_view = false;
  // A step of a redistribution in a lowered graph (graph/ops/collective.cpp):
  // executors run it on the mesh groups, not with a kernel.
  bool is_collective = false;
  // A collective that communicates from its node until a `wait` node
  // completes it (all_gather, reduce_scatter, all_reduce, all_to_all; not
  // shard_locally, which runs at once).
  bool starts_async = false;
  // Waits for the collective that produced input 0 (graph/ops/collective.cpp);
  // its output is input 0 (a view), readable once the collective completed.
  bool is_wait = false;
  // Outputs that may take an input's bytes when nothing reads that input
  // after this node: the kernel still gives the right result when the two
  // are one buffer. The memory plan decides (an all_reduce then runs in
  // place; AdamW updates the parameter and its moments where they lie).
  struct InPlace {
    int output;
    int input;
  };
  std::vector<InPlace> in_place;
};

// An op's FLOPs and bytes for the given operands (0 FLOPs where the op has
// no rule; bytes by the default rule where it has none; views move nothing).
double op_flops(const OpDef& op, const ValueInfos& in, const ValueInfos& out, const Attrs& attrs);
double op_bytes(const OpDef& op, const ValueInfos& in, const ValueInfos& out, const Attrs& attrs);

// Registered ops by name (the built-in families are registered on first use).
// Unknown names fail with the list of registered ops.
const OpDef& find_op(const std::string& name);
// The names of the registered ops, sorted (the built-in families and any registered so far).
std::vector<std::string> registered_op_names();

// Adds an op defined outside graph/ops (an extension, or a test's). Fails if
// the name is taken. The definition lives as long as the program.
void register_op(OpDef op);

}  // namespace meshtrain::graph
