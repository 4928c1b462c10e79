// Eager redistribution: turn this rank's local tensor under one Layout into
// its local tensor under another, by running the planner's steps as
// collectives on the mesh groups. Every rank calls it with the same layouts.
#pragma once

#include "core/tensor.h"
#include "sharding/device_mesh.h"
#include "sharding/planner.h"

namespace meshtrain::sharding {

// `local` must have the shape `src` gives this rank (local_chunk). Partial
// targets keep the source's pending reduction. Throws with what was wrong.
Tensor redistribute(const Tensor& local, const Shape& global_shape, const Layout& src,
                    const Layout& dst, MeshGroups& groups, Planner& planner);

// Run one step of a plan on this rank's local tensor (a new tensor, or
// `local` itself where the step's group has one rank).
Tensor execute_step(const Tensor& local, const Shape& global_shape, const PlanStep& step, MeshGroups& groups);

// Run an already planned sequence of steps.
Tensor execute_plan(const Tensor& local, const Shape& global_shape, const Plan& plan,
                    MeshGroups& groups);

}  // namespace meshtrain::sharding
