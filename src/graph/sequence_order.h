// Context parallelism's load-balanced order of a sequence (dim 1 of
// [batch, seq, ...] activations): the sequence cut into `chunks` equal chunks
// (2 x cp) stored as chunk 0, chunks - 1, 1, chunks - 2, ..., so that cp rank
// i, holding stored chunks 2i and 2i + 1, holds position chunks i and
// 2cp - 1 - i and does as much causal attention as every other rank. rope
// and attention read each row's position through it; reorder_sequence moves
// a sequence between the two orders.
#pragma once

#include <cstdint>

#include "graph/attrs.h"

namespace meshtrain::graph {

struct SequenceOrder {
  int64_t total = 0;   // the whole sequence's length
  int64_t chunks = 1;  // 1: position order
  int64_t first = 0;   // the stored index of the part's first row

  // The position of the part's row i, and the stored index of a position.
  int64_t position(int64_t i) const {
    const int64_t s = first + i;
    if (chunks <= 1) return s;
    const int64_t size = total / chunks, chunk = s / size;
    const int64_t at = chunk % 2 == 0 ? chunk / 2 : chunks - 1 - chunk / 2;
    return at * size + s % size;
  }
  int64_t stored_index(int64_t position) const {
    if (chunks <= 1) return position;
    const int64_t size = total / chunks, at = position / size;
    const int64_t chunk = at < chunks / 2 ? 2 * at : 2 * (chunks - 1 - at) + 1;
    return chunk * size + position % size;
  }
  bool natural() const { return chunks <= 1; }
};

// The order an op's attributes describe for an operand whose dim 1 is `rows` long.
inline SequenceOrder sequence_order(const Attrs& attrs, int64_t rows) {
  return {attrs.get_or(attr::seq_total, rows), attrs.get_or(attr::seq_chunks, int64_t{1}),
          attrs.get_or(attr::seq_first, int64_t{0})};
}

}  // namespace meshtrain::graph
