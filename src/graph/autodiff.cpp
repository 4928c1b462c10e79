#include "graph/autodiff.h"

#include <map>

#include "core/error.h"
#include "graph/builder.h"
#include "graph/op_registry.h"

namespace meshtrain::graph {

std::vector<int> append_backward(Graph& g, int loss, const std::vector<int>& wrt) {
  const ValueInfo& li = g.value(loss).info;
  MT_CHECK(li.shape.numel() == 1, "autodiff needs a scalar loss, got {}", g.describe_value(loss));
  Builder b(g);
  std::map<int, int> grad;  // value -> its gradient value
  auto accumulate = [&](int value, int contribution) {
    auto [it, fresh] = grad.emplace(value, contribution);
    if (!fresh) it->second = b.add(it->second, contribution);
  };
  grad[loss] = b.full(li.shape, li.dtype, 1.0);
  // Nodes appended by the loop are backward nodes: walk only the forward ones.
  for (int n = g.value(loss).producer; n >= 0; --n) {
    const Node node = g.node(n);  // copy: appending nodes may move the storage
    std::vector<int> grad_out;
    bool any = false;
    for (int out : node.outputs) {
      auto it = grad.find(out);
      grad_out.push_back(it == grad.end() ? -1 : it->second);
      any |= it != grad.end();
    }
    if (!any) continue;
    MT_CHECK(static_cast<bool>(node.op->backward), "op {} has no backward rule but the loss depends on it",
             node.op->name);
    for (size_t k = 0; k < grad_out.size(); ++k)  // rules may assume every output's gradient exists
      if (grad_out[k] < 0) {
        const ValueInfo& oi = g.value(node.outputs[k]).info;
        grad_out[k] = b.full(oi.shape, oi.dtype, 0.0);
      }
    const std::vector<int> grad_in = node.op->backward(b, node, grad_out);
    for (size_t k = 0; k < grad_in.size() && k < node.inputs.size(); ++k)
      if (grad_in[k] >= 0) accumulate(node.inputs[k], grad_in[k]);
  }
  std::vector<int> out;
  for (int w : wrt) {
    auto it = grad.find(w);
    out.push_back(it == grad.end() ? -1 : it->second);
  }
  return out;
}

}  // namespace meshtrain::graph
