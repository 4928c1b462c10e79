// Benchmark mode ([schedule] estimate = "benchmark"): the compute kernels of
// a step graph timed on this machine, once per sched::kernel_key, and on
// several ranks aligned so that every rank costs a kernel alike and makes
// the same scheduling decisions.
#pragma once

#include <string>
#include <vector>

#include "comm/process_group.h"
#include "graph/graph.h"
#include "sched/kernel_times.h"

namespace meshtrain::train {

struct KernelBenchmark {
  int measured = 0;    // kernels timed by this call
  int known = 0;       // kernels `times` already had (the cache, or an earlier call)
  double seconds = 0;  // the time measuring took
};

// The keys of `g`'s compute nodes that have a CPU kernel (views and
// collectives have none to time), each once, in the graph's order.
std::vector<std::string> measurable_kernels(const graph::Graph& g);

// Times each of those whose key `times` lacks, on fresh tensors of its
// shapes (floating point in [0.25, 0.75), integers 1): one warm-up call, then
// calls until 2 ms have passed (3 to 20 calls), and keeps the median times
// `slowdown`: timed alone on a rank's threads, a kernel runs that much
// slower when the ranks on the host share its cores (train::shared_core_slowdown).
KernelBenchmark measure_kernels(const graph::Graph& g, sched::KernelTimes& times, double slowdown = 1.0);

// Every rank ends with, for each of `keys`, the median (the lower of the two
// middle values) over the ranks that have the key: one all_reduce of the
// entry count and one all_gather of the entries. Every rank calls it.
void align_kernel_times(sched::KernelTimes& times, const std::vector<std::string>& keys, comm::ProcessGroup& world);

}  // namespace meshtrain::train
