// Async tensor parallelism (`[parallel] async_tp`): the collectives that
// sequence parallelism puts around a rank's tensor-parallel GEMMs, cut into
// point-to-point steps that run while the GEMMs do (the collective-matmul
// decomposition; PyTorch's micro-pipelined TP, TransformerEngine's
// comm-GEMM overlap). On a rank's lowered step, over the tp mesh dim:
//
// - An all_gather of a tensor split evenly on a row dim, read by GEMMs whose
//   rows those are (matmul and fp8_matmul with it as the left operand): at
//   step k each rank sends its own chunk to the rank k places on and takes
//   the chunk of the rank k back (ring_shift with ring_distance k) while the
//   GEMMs run on the chunk that came at step k - 1; each GEMM's row chunks
//   are concatenated. Readers that are no such GEMM, or whose other operands
//   come later, read the chunks concatenated: the gathered tensor, at no
//   extra transfer. A weight gradient (rows_matmul) is one of those: cut,
//   it would sum its rows' partial products in another order.
// - A reduce_scatter of partial sums (a matmul's, or a sum of matmuls')
//   split on a row dim: each rank computes the rows of each other rank's
//   chunk and sends them straight to it (ring_shift by k) while it computes
//   the next, its own chunk last; the partials of its chunk are then summed
//   in rank order by add_n, low-precision dtypes in f32 with one rounding,
//   exactly as the reduce_scatter sums (comm/reduce.h).
//
// FP8 GEMMs take their scales from amaxes all-reduced before any chunk is
// quantised, so each chunk is quantised as the whole tensor is; an amax that
// read this rank's part of the gathered tensor reads its own chunk instead
// (the same max once all-reduced), so that the scales need no gather.
#pragma once

#include <cstdint>

#include "graph/graph.h"

namespace meshtrain::sched {

struct AsyncTpOptions {
  int mesh_ndim = 0;     // the mesh the graph was lowered on
  int tp_mesh_dim = -1;  // its tp dim: only collectives over it alone are rewritten
  int64_t rank = -1;     // the rank whose graph this is (its place in each group)
};

// Rewrites each such all_gather and reduce_scatter; true if any was.
bool async_tp(graph::Graph& g, const AsyncTpOptions& options);

}  // namespace meshtrain::sched
