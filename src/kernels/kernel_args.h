// What a kernel of any device sees when it runs one graph node: the node's
// input and output tensors (views into the executor's memory) and its attrs.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "graph/graph.h"

namespace meshtrain::kernels {

struct KernelArgs {
  std::vector<const Tensor*> in;
  std::vector<Tensor*> out;
  const graph::Attrs& attrs;
};

}  // namespace meshtrain::kernels
