// The op registry. Each op is defined once, here in one OpDef: its shape and
// dtype rule, its backward rule (built from other ops), its FLOP and byte
// counts and its CPU kernel. Everything else (builder, autodiff, executor, estimators)
// reads the op from here.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "graph/graph.h"

namespace meshtrain::graph {

class Builder;

// What a kernel sees: input and output tensors (views) and the node's attrs.
struct KernelArgs {
  std::vector<const Tensor*> in;
  std::vector<Tensor*> out;
  const Attrs& attrs;
};

struct OpDef {
  std::string name;
  int num_inputs = 1;  // -1: variadic
  // Output infos from input infos; throws InvalidArgument naming the op and the problem.
  std::function<std::vector<ValueInfo>(const std::vector<ValueInfo>& in, const Attrs& attrs)> infer;
  // Gradients of the inputs (value ids, -1 where none) given the node and
  // the gradients of its outputs (-1 where none flows). Empty: not differentiable.
  std::function<std::vector<int>(Builder& b, const Node& node, const std::vector<int>& grad_out)> backward;
  // Floating-point operations of one execution.
  std::function<double(const std::vector<ValueInfo>& in, const std::vector<ValueInfo>& out, const Attrs& attrs)> flops;
  // Takes f32, f64 and bf16 operands (bf16 computed in f32, rounded once per output element).
  std::function<void(const KernelArgs& args)> cpu_kernel;
  // The output is input 0's bytes under another shape (reshape): the executor
  // aliases the buffer, and the op has no kernel.
  bool view = false;
  // Bytes one execution reads and writes, each operand counted once (the
  // memory traffic of an ideal kernel). Empty: every input read and every
  // output written whole; an op that touches less says so here.
  std::function<double(const std::vector<ValueInfo>& in, const std::vector<ValueInfo>& out, const Attrs& attrs)> bytes = nullptr;
};

// An op's FLOPs and bytes for the given operands (0 FLOPs where the op has
// no rule; bytes by the default rule where it has none; views move nothing).
double op_flops(const OpDef& op, const std::vector<ValueInfo>& in, const std::vector<ValueInfo>& out, const Attrs& attrs);
double op_bytes(const OpDef& op, const std::vector<ValueInfo>& in, const std::vector<ValueInfo>& out, const Attrs& attrs);

// Run an op's CPU kernel.
void run_cpu_kernel(const OpDef& op, const KernelArgs& args);

// Registered ops by name (built-in ops are registered on first use).
// Unknown names fail with the list of registered ops.
const OpDef& find_op(const std::string& name);

}  // namespace meshtrain::graph
