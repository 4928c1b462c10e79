// Reverse-mode autodiff: append the backward pass of a scalar loss to the
// graph, built from each op's backward rule.
#pragma once

#include <map>
#include <vector>

#include "graph/graph.h"

namespace meshtrain::graph {

// The gradient value of each of `wrt` (none where the loss does not depend
// on it). The backward nodes are appended in Phase::backward, each in the
// scope of the forward node it differentiates.
// `gradients`, when given, receives every value the loss depends on with its
// (accumulated) gradient value (what a parallel plan lays out in the backward).
// `seed`, when given, is the gradient of `loss` (a value of its shape and
// dtype, e.g. the gradient a later pipeline stage sent back), so `loss` need
// not be a scalar; without it `loss` must be a scalar and its gradient is 1.
std::vector<ValueId> append_backward(Graph& g, ValueId loss, const std::vector<ValueId>& wrt,
                                     std::map<ValueId, ValueId>* gradients = nullptr, ValueId seed = {});

// The backward of several outputs at once, each with its seed gradient (a
// value of its shape and dtype; none: 1, for a scalar): the gradients of
// `wrt` are the sums of what reaches them from every output (a pipeline
// stage's residual stream and router statistics, each with the gradient the
// next stage sent back).
struct SeededOutput {
  ValueId value, seed;
};
std::vector<ValueId> append_backward(Graph& g, const std::vector<SeededOutput>& outputs,
                                     const std::vector<ValueId>& wrt, std::map<ValueId, ValueId>* gradients = nullptr);

}  // namespace meshtrain::graph
