// The one reduction kernel every backend uses where it reduces on the host:
// floating types accumulate in f32 (f64 in f64) and round once at the end;
// integers in i64.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/types.h"
#include "core/dtype.h"

namespace meshtrain::comm {

// out[i] = op over k of rows[k][i], in row order k = 0..n-1; avg divides the sum by n.
// out may alias rows[0] (the result is written after each element is read).
void reduce_rows(DType dtype, ReduceOp op, const void* const* rows, int n, void* out, size_t count);

// Whether the dtype needs meshtrain's own reduction (no native MPI type, or f32-accumulation needed).
bool needs_host_reduction(DType dtype);

// Exclusive prefix sums of counts (the displacement of each rank's block).
std::vector<int64_t> displacements(const std::vector<int64_t>& counts);

// torch.chunk's split rule, as DTensor's Shard applies it and an
// all_reduce splits its buffer into the blocks ranks reduce: `total`
// elements into n blocks of ceil(total / n), the trailing ones smaller or
// empty (5 over 4 gives 2, 2, 1, 0).
std::vector<int64_t> torch_chunk_sizes(int64_t total, int n);

}  // namespace meshtrain::comm
