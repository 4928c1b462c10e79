// What a kernel of any device sees when it runs one graph node: the node's
// input and output tensors (views into the executor's memory) and its attrs,
// and the helpers both devices' kernels read them with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "graph/graph.h"

namespace meshtrain::kernels {

struct KernelArgs {
  std::vector<const Tensor*> in;
  std::vector<Tensor*> out;
  const graph::Attrs& attrs;
};

// What kernels of every device read of their arguments: typed pointers, a
// table's part, rows.
template <typename T>
T* out_ptr(const KernelArgs& a, size_t i = 0) {
  return static_cast<T*>(a.out[i]->raw());
}
template <typename T>
const T* in_ptr(const KernelArgs& a, size_t i) {
  return static_cast<const T*>(a.in[i]->raw());
}

// The part of a table (an embedding's rows, logits' vocabulary) a kernel's
// input holds: its first index and the whole extent (attrs `start` and
// `full_size`, set by lowering for a vocab-parallel part; else the whole).
struct TablePart {
  int64_t start = 0, total = 0;
};
inline TablePart table_part(const KernelArgs& a, int64_t local_extent) {
  return {a.attrs.get_or(graph::attr::start, int64_t{0}), a.attrs.get_or(graph::attr::full_size, local_extent)};
}

// Rows and row length of a tensor reduced over its last dim.
inline std::pair<int64_t, int64_t> rows_of(const Tensor& t) {
  const int64_t d = t.shape().rank() ? t.shape().dim(-1) : 1;
  return {d ? t.numel() / d : 0, d};
}

}  // namespace meshtrain::kernels
