// Benchmark mode ([schedule] estimate = "benchmark"): the compute kernels of
// a step graph timed on this machine, once per sched::kernel_key, and on
// several ranks aligned so that every rank costs a kernel alike and makes
// the same scheduling decisions.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "config/config.h"
#include "graph/graph.h"
#include "sched/kernel_times.h"

namespace meshtrain::estimate {

struct KernelBenchmark {
  int measured = 0;    // kernels timed by this call
  int known = 0;       // kernels `times` already had (the cache, or an earlier call)
  double seconds = 0;  // the time measuring took
};

// The keys of `g`'s compute nodes that have a CPU kernel (views and
// collectives have none to time), each once, in the graph's order.
std::vector<std::string> measurable_kernels(const graph::Graph& g);

// How measure_kernels times a kernel: after one warm-up call, calls until
// `window` has passed (at least 3), the mean of their wall time (a rank that
// shares cores pays its time slices in the mean, which is what a step pays),
// times `slowdown`.
struct KernelTiming {
  std::chrono::microseconds window{20000};
  // 1 when the ranks of the host time side by side, as they run the step; a
  // kernel timed alone on a rank's threads runs that much slower when the
  // host's ranks share its cores (runtime::shared_core_slowdown).
  double slowdown = 1.0;
};

// Times each of those whose key `times` lacks, on fresh tensors of its
// shapes (floating point in [0.25, 0.75), integers 1).
KernelBenchmark measure_kernels(const graph::Graph& g, sched::KernelTimes& times, const KernelTiming& timing = {});

// Every rank ends with, for each of `keys`, the median (the lower of the two
// middle values) over the ranks that have the key: one all_reduce of the
// entry count and one all_gather of the entries. Every rank calls it.
void align_kernel_times(sched::KernelTimes& times, const std::vector<std::string>& keys, comm::ProcessGroup& world);

// How unevenly the ranks advance when they share a host's cores (a
// collective waits for its group's slowest rank): every rank times a kernel
// (its step's with the most FLOPs) side by side in `windows` windows of
// timing.window, which end at the same times after the barrier on every rank
// (each holds at least one call). For stretches of 1, 2, 4, ... windows (up
// to a quarter of them, so that each length is seen at least 4 times), per
// group size: over every stretch of every group of `groups` (world ranks) of
// that size, the slowest member's time per call less the group's mean,
// summed, over the group's mean, summed, at the stretch's mean length. Every
// rank calls it, after a barrier, and gets the same figures, or the same
// error where a rank failed (none where a rank had no kernel to time).
sched::SyncLateness measure_sync_lateness(const graph::Graph& g, const std::vector<std::vector<int64_t>>& groups,
                                          comm::ProcessGroup& world, const KernelTiming& timing = {}, int windows = 64);

// measure_sync_lateness's figures from its windows: `per_rank` holds each
// world rank's `windows` times per call, one rank after another; a window
// lasts `window_us`; keyed by the world's size and each group's.
sched::SyncLateness sync_lateness_of(std::span<const double> per_rank, int world_size, int windows,
                                     const std::vector<std::vector<int64_t>>& groups, double window_us);

// Waits for `work` sleeping between polls, so that the wait takes no part of
// a core from a rank of this host that is still computing.
void wait_sleeping(const comm::WorkPtr& work);

// Benchmark mode for a training run: the kernels of the graphs it is given
// timed by every rank side by side (after those of config.schedule.kernel_cache,
// read once), the ranks' figures aligned, and once per run how unevenly the
// ranks advance (measure_sync_lateness), unless the cache has it for every
// group size of the mesh. A rank that fails to time fails every rank.
class BenchmarkMode {
 public:
  // `world`: the job's ranks (null: one rank).
  BenchmarkMode(const config::TrainConfig& config, comm::ProcessGroupPtr world);
  // Times what `g` adds (every rank calls it) and returns the figures so far.
  const sched::KernelTimes* measure(const graph::Graph& g);
  // Rank 0 writes the figures to config.schedule.kernel_cache, if set.
  void save_cache() const;

 private:
  int rank() const;
  config::TrainConfig config_;
  comm::ProcessGroupPtr world_;
  sched::KernelTimes kernel_times_;
  bool kernel_cache_read_ = false;
};

}  // namespace meshtrain::estimate
