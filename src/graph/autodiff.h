// Reverse-mode autodiff: append the backward pass of a scalar loss to the
// graph, built from each op's backward rule.
#pragma once

#include <vector>

#include "graph/graph.h"

namespace meshtrain::graph {

// The gradient value of each of `wrt` (-1 where the loss does not depend on it).
std::vector<int> append_backward(Graph& g, int loss, const std::vector<int>& wrt);

}  // namespace meshtrain::graph
