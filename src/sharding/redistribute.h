// Eager redistribution: turn this rank's local tensor under one Layout into
// its local tensor under another, by running the planner's steps as
// collectives on the mesh groups. Every rank calls it with the same layouts.
#pragma once

#include <functional>
#include <vector>

#include "core/tensor.h"
#include "sharding/device_mesh.h"
#include "sharding/planner.h"

namespace meshtrain::sharding {

// `local` must have the shape `src` gives this rank (local_chunk). Partial
// targets keep the source's pending reduction. Throws with what was wrong.
Tensor redistribute(const Tensor& local, const Shape& global_shape, const Layout& src, const Layout& dst,
                    MeshGroups& groups, Planner& planner);

// Run one step of a plan on this rank's local tensor (a new tensor, or
// `local` itself where the step's group has one rank).
Tensor execute_step(const Tensor& local, const Shape& global_shape, const PlanStep& step, MeshGroups& groups);

// What one step needs on a rank besides its input and output, known before
// it runs: a flat staging buffer of the input's dtype (where the blocks the
// collective sends or receives are not the tensor's bytes in order), and
// whether the collective reads the input until it completes (so the input
// must stay untouched until then).
struct StepBuffers {
  int64_t buffer_elements = 0;
  bool reads_input_until_done = false;
};
StepBuffers step_buffers(const Shape& global_shape, const PlanStep& step, const DeviceMesh& mesh,
                         const std::vector<int>& coord);

// A started step: complete() waits for its collective (if any) and then puts
// what arrived in place. Until then the output, the buffer and (where
// step_buffers says so) the input belong to the collective.
struct InFlightStep {
  comm::WorkPtr work;            // null for a local step, which is done at start
  std::function<void()> finish;  // empty when the collective writes the output itself
  void complete();
};

// Rows [..., M, D] of which each block of M rows holds data in its first
// rows only, zeros after (expert parallelism's dispatched tokens): `before`
// and `after` are the rows' experts [..., M] in the step's layouts before
// and after it, a block's data rows those whose expert is not `padding`.
// An all_to_all of such rows sends the data rows only (MPI_Alltoallv's
// counts from the experts on both sides); the rest arrive as zeros.
struct RaggedRows {
  const Tensor* before = nullptr;
  const Tensor* after = nullptr;
  int64_t padding = 0;
};

// Starts one step of a plan: `out` (this rank's local shape under step.after)
// holds the result once complete() has run; `buffer` has at least
// step_buffers(...).buffer_elements elements. Every rank starts the same
// steps in the same order. `ragged`: an all_to_all of RaggedRows.
InFlightStep start_step(const Tensor& local, Tensor& out, const Tensor& buffer, const Shape& global_shape,
                        const PlanStep& step, MeshGroups& groups, const RaggedRows* ragged = nullptr);

// Starts a bucket's coalesced all_gather or reduce_scatter on the flat
// buffers `local` and `out`: `member_blocks` gives each member's block per
// rank, and the side that holds every rank's block holds each member whole
// (comm::ProcessGroup::all_gather_coalesced).
InFlightStep start_coalesced_step(const Tensor& local, Tensor& out, const PlanStep& step,
                                  const std::vector<int64_t>& member_blocks, MeshGroups& groups);

// Starts a ring shift over `mesh_dim`: `local` goes to the rank `distance`
// places on in this rank's group there (1: the next), and the tensor of the
// rank as many places back arrives in `out` (same shape and dtype). `local`
// is read until complete() has run.
InFlightStep start_ring_shift(const Tensor& local, Tensor& out, int mesh_dim, MeshGroups& groups, int distance = 1);

// Run an already planned sequence of steps.
Tensor execute_plan(const Tensor& local, const Shape& global_shape, const Plan& plan, MeshGroups& groups);

}  // namespace meshtrain::sharding
