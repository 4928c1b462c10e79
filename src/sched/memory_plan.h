// Static memory planning: given a graph and the order its nodes will run in,
// where each intermediate value lives in one arena and how big the arena is.
// Computed without allocating the arena, so a plan can be costed (or
// compared across orders) before anything runs.
#pragma once

#include <vector>

#include "graph/schedule.h"

namespace meshtrain::sched {

// Arena offsets are multiples of this (and every block at least this big).
inline constexpr size_t kArenaAlignment = 64;

// Each value computed by `steps` gets an offset, first-fit over the arena's
// free ranges (growing it when nothing fits), and its range is freed after
// the last step that reads it — unless it is among `fetches`, which live to
// the end of the run. Views (reshape) get no storage: they share their
// input's. Where an op may compute an output in place over an input
// (OpDef::in_place) and is that input's last reader, the output takes the
// input's range (an all_reduce in place) or, where the input is a graph
// input that `updates` says this output updates, the input's own tensor
// (AdamW's new parameter, written over the parameter). Inputs and
// parameters are not in the arena.
// A bucket_pack's members that the step computes, each read by that pack
// alone, are computed in place in the bucket, and a bucket_unpack's
// members are its byte ranges: both views of the bucket
// (MemoryPlan::view_offset), which the bucket kernels then do not copy;
// unless the pack or unpack carries attr::copy_members, whose members
// keep their own storage and are copied.
graph::MemoryPlan plan_memory(const graph::Graph& g, const std::vector<graph::NodeId>& steps,
                              const std::vector<graph::ValueId>& fetches,
                              const std::vector<graph::Update>& updates = {});

// The share of a bucket_pack's or bucket_unpack's member bytes that it
// copies: those of the members `plan` did not lay out in the bucket.
double bucket_copy_share(const graph::Graph& g, const graph::MemoryPlan& plan, const graph::Node& node);

}  // namespace meshtrain::sched
