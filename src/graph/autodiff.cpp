#include "graph/autodiff.h"

#include <algorithm>
#include <unordered_map>

#include "core/error.h"
#include "graph/builder.h"
#include "graph/op_registry.h"

namespace meshtrain::graph {

std::vector<ValueId> append_backward(Graph& g, ValueId loss, const std::vector<ValueId>& wrt,
                                     std::map<ValueId, ValueId>* gradients, ValueId seed) {
  return append_backward(g, {{loss, seed}}, wrt, gradients);
}

std::vector<ValueId> append_backward(Graph& g, const std::vector<SeededOutput>& outputs,
                                     const std::vector<ValueId>& wrt, std::map<ValueId, ValueId>* gradients) {
  MT_CHECK(!outputs.empty(), "autodiff: no output to differentiate");
  MT_CHECK(!g.insertion_point().valid(), "autodiff appends to the end of the graph; clear the insertion point first");
  const std::vector<NodeId> order = g.order();  // the forward nodes, before the loop appends to it
  const std::string saved_scope = g.scope();
  const Phase saved_phase = g.phase();
  g.set_phase(Phase::backward);
  Builder b(g);
  std::unordered_map<ValueId, ValueId> grad;  // value -> its gradient value
  size_t forward_end = 0;                     // the forward nodes up to the last output's producer
  for (const SeededOutput& o : outputs) {
    const ValueInfo info = g.value(o.value).info;  // a copy: adding values moves the storage
    const NodeId producer = g.value(o.value).producer;
    ValueId seed = o.seed;
    if (seed.valid()) {
      MT_CHECK(g.value(seed).info == info, "autodiff: the seed gradient {} must have the shape and dtype of {}",
               g.describe_value(seed), g.describe_value(o.value));
    } else {
      MT_CHECK(info.shape.numel() == 1, "autodiff needs a scalar loss, got {}", g.describe_value(o.value));
      g.set_scope(producer.valid() ? g.node(producer).scope : "");
      seed = b.full(info.shape, info.dtype, 1.0);
    }
    MT_CHECK(grad.emplace(o.value, seed).second, "autodiff: output {} is given twice", g.describe_value(o.value));
    if (producer.valid()) {
      const auto end = std::find(order.begin(), order.end(), producer);
      MT_CHECK(end != order.end(), "autodiff: the producer of {} is not in the graph's order",
               g.describe_value(o.value));
      forward_end = std::max(forward_end, static_cast<size_t>(end - order.begin()) + 1);
    }
  }
  auto accumulate = [&](ValueId value, ValueId contribution) {
    auto [it, fresh] = grad.emplace(value, contribution);
    if (!fresh) it->second = b.add(it->second, contribution);
  };
  // The forward nodes walked backwards (the loop appends backward nodes after them).
  for (size_t i = forward_end; i-- > 0;) {
    const Node node = g.node(order[i]);  // copy: appending nodes may move the storage
    std::vector<ValueId> grad_out;
    bool any = false;
    for (ValueId out : node.outputs) {
      auto it = grad.find(out);
      grad_out.push_back(it == grad.end() ? ValueId{} : it->second);
      any |= it != grad.end();
    }
    if (!any) continue;
    MT_CHECK(static_cast<bool>(node.op->backward), "op {} has no backward rule but the loss depends on it",
             node.op->name);
    g.set_scope(node.scope);
    for (size_t k = 0; k < grad_out.size(); ++k)  // rules may assume every output's gradient exists
      if (!grad_out[k].valid()) {
        const ValueInfo oi = g.value(node.outputs[k]).info;
        grad_out[k] = b.full(oi.shape, oi.dtype, 0.0);
      }
    const std::vector<ValueId> grad_in = node.op->backward(b, node, grad_out);
    for (size_t k = 0; k < grad_in.size() && k < node.inputs.size(); ++k)
      if (grad_in[k].valid()) accumulate(node.inputs[k], grad_in[k]);
  }
  g.set_scope(saved_scope);
  g.set_phase(saved_phase);
  if (gradients) gradients->insert(grad.begin(), grad.end());
  std::vector<ValueId> out;
  for (ValueId w : wrt) {
    auto it = grad.find(w);
    out.push_back(it == grad.end() ? ValueId{} : it->second);
  }
  return out;
}

}  // namespace meshtrain::graph
