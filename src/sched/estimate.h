// Runtime estimate of one rank's step without running it: each node's time
// from a device profile (compute: the roofline of its FLOPs and bytes;
// collectives: the sharding cost model of their group's link), and the step
// simulated in schedule order as one compute stream and one communication
// stream per group of mesh dims. A collective starts when the compute stream
// reaches its start node and its group's earlier collectives are done; its
// wait holds the compute stream until it completes, and that hold is the
// step's exposed communication.
#pragma once

#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/schedule.h"
#include "sharding/cost_model.h"

namespace meshtrain::sched {

struct DeviceProfile {
  std::string name;
  double peak_gflops_f32 = 0;   // the device's dense GEMM peak, GFLOP/s
  double peak_gflops_bf16 = 0;  // 0: as f32
  double memory_gbps = 0;       // memory bandwidth, GB/s (1e9 bytes/s)
  // Fractions of the peaks a kernel reaches (PyTorch's roofline uses 0.75).
  double compute_efficiency = 0.75;
  double memory_efficiency = 0.75;
  sharding::CostModel comm;  // links per mesh dim of the mesh the step was lowered for
};

// One node's time on the device, in microseconds: max(FLOPs at the peak of
// its dtype, bytes at the memory bandwidth), each at its efficiency; 0 for
// views and waits; a collective's time on its link (shard_locally: a copy).
double node_us(const graph::Graph& g, graph::NodeId node, const DeviceProfile& device);

struct StepEstimate {
  double step_us = 0;
  double compute_us = 0;          // the compute stream's busy time
  double communication_us = 0;    // the collectives' time, summed
  double exposed_us = 0;          // the compute stream held by waits
  std::vector<graph::NodeSpan> timeline;  // each step of the schedule, views included (as 0 long)
};

StepEstimate estimate_step(const graph::Graph& g, const graph::Schedule& schedule, const DeviceProfile& device);

}  // namespace meshtrain::sched
