// Runtime estimate of one rank's step without running it: each node's time
// on a hardware profile (compute: the roofline of its FLOPs and bytes;
// collectives: the profile's cost of their group), and the step simulated in
// schedule order as one compute stream and the communication streams
// (sched::collective_stream: per group of mesh dims, reduce_scatters apart).
// A collective starts when the compute stream reaches its start node and
// its stream's earlier collectives are done; its wait
// holds the compute stream until it completes, and that hold is the step's
// exposed communication. On a shared host (CPU ranks) the cores that compute
// also move a collective's bytes: it runs on the compute stream where it
// starts, all of it exposed.
#pragma once

#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/schedule.h"
#include "sched/hardware.h"
#include "sched/kernel_times.h"

namespace meshtrain::sched {

// One rank of a `world_size`-rank job on `hardware`: the device share it gets.
struct RankDevice {
  HardwareProfile hardware;
  int world_size = 1;
  // Benchmark mode: compute nodes whose kernel_key is here take the measured
  // time (already the rank's, sharing included) instead of the roofline.
  const KernelTimes* measured = nullptr;
  // The job's other ranks compute while this rank's collectives run (a
  // pipeline stage's collectives beside the other stages' programs): on a
  // shared host, the profile's tables measured so (bench comm
  // --others-compute) cost them.
  bool others_compute = false;
};

// One node's time on the rank's device, in microseconds: its measured time
// in benchmark mode, else max(FLOPs at the peak of its dtype, bytes at the
// memory bandwidth), each at its efficiency;
// 0 for views and waits; a collective's time over its group (shard_locally:
// a copy).
double node_us(const graph::Graph& g, graph::NodeId node, const RankDevice& device);

// node_us under a memory plan: a bucket_pack or bucket_unpack costs only the
// share of its members that `plan` does not lay out in the bucket.
double planned_node_us(const graph::Graph& g, graph::NodeId node, const RankDevice& device,
                       const graph::MemoryPlan& plan);

struct StepEstimate {
  double step_us = 0;
  double compute_us = 0;                  // the compute stream's busy time
  double communication_us = 0;            // the collectives' time, summed
  double exposed_us = 0;                  // the compute stream held by waits
  double waiting_us = 0;                  // shared host: held waiting for a group's slowest rank (SyncLateness)
  std::vector<graph::NodeSpan> timeline;  // each step of the schedule, views included (as 0 long)
};

StepEstimate estimate_step(const graph::Graph& g, const graph::Schedule& schedule, const RankDevice& device);

}  // namespace meshtrain::sched
