#include "graph/autodiff.h"

#include <algorithm>
#include <unordered_map>

#include "core/error.h"
#include "graph/builder.h"
#include "graph/op_registry.h"

namespace meshtrain::graph {

std::vector<ValueId> append_backward(Graph& g, ValueId loss, const std::vector<ValueId>& wrt,
                                     std::map<ValueId, ValueId>* gradients, ValueId seed) {
  const ValueInfo li = g.value(loss).info;  // a copy: adding values moves the storage
  if (seed.valid())
    MT_CHECK(g.value(seed).info == li, "autodiff: the seed gradient {} must have the shape and dtype of {}",
             g.describe_value(seed), g.describe_value(loss));
  else
    MT_CHECK(li.shape.numel() == 1, "autodiff needs a scalar loss, got {}", g.describe_value(loss));
  MT_CHECK(!g.insertion_point().valid(), "autodiff appends to the end of the graph; clear the insertion point first");
  const std::string saved_scope = g.scope();
  const Phase saved_phase = g.phase();
  g.set_phase(Phase::backward);
  Builder b(g);
  std::unordered_map<ValueId, ValueId> grad;  // value -> its gradient value
  auto accumulate = [&](ValueId value, ValueId contribution) {
    auto [it, fresh] = grad.emplace(value, contribution);
    if (!fresh) it->second = b.add(it->second, contribution);
  };
  g.set_scope(g.value(loss).producer.valid() ? g.node(g.value(loss).producer).scope : "");
  grad[loss] = seed.valid() ? seed : b.full(li.shape, li.dtype, 1.0);
  // The forward nodes up to the loss's producer, walked backwards (the loop
  // appends backward nodes after them).
  std::vector<NodeId> forward;
  if (const NodeId last = g.value(loss).producer; last.valid()) {
    const auto& order = g.order();
    const auto end = std::find(order.begin(), order.end(), last);
    MT_CHECK(end != order.end(), "autodiff: the loss's producer is not in the graph's order");
    forward.assign(order.begin(), end + 1);
  }
  for (auto n = forward.rbegin(); n != forward.rend(); ++n) {
    const Node node = g.node(*n);  // copy: appending nodes may move the storage
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
