// Reverse-mode autodiff: append the backward pass of a scalar loss to the
// graph, built from each op's backward rule.
#pragma once

#include <vector>

#include "graph/graph.h"

namespace meshtrain::graph {

// The gradient value of each of `wrt` (none where the loss does not depend
// on it). The backward nodes are appended in Phase::backward, each in the
// scope of the forward node it differentiates.
std::vector<ValueId> append_backward(Graph& g, ValueId loss, const std::vector<ValueId>& wrt);

}  // namespace meshtrain::graph
