// Benchmark-mode compute times: each kernel's time, measured on the machine
// for one op, input shapes, dtypes and attributes (its key), so the estimator
// uses the measurement instead of the roofline for nodes it knows. Kept in
// memory and, optionally, in a JSON file that later runs and `meshtrain
// estimate` read (runtime/kernel_benchmark measures and aligns them).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace meshtrain::sched {

// What a node's kernel time depends on: "op(in shapes:dtypes)->(out ...) {attrs}".
std::string kernel_key(const graph::Graph& g, graph::NodeId node);
// A stable 64-bit hash of a key (FNV-1a), the same in every process.
uint64_t kernel_key_hash(const std::string& key);

// Over stretches of `interval_us` computed side by side, the slowest rank of
// a group trailed the group's mean by `share` of that mean.
struct LatenessPoint {
  double interval_us = 0;
  double share = 0;
};

struct KernelTimes {
  std::map<std::string, double> us;  // key -> microseconds per call
  // Ranks that share a host's cores advance unevenly, and a collective waits
  // for its group's slowest rank: per group size, how far the slowest rank
  // trailed over stretches of increasing length (train::measure_sync_lateness;
  // the share falls as a longer stretch evens out). Measured per run, not kept
  // in the cache file.
  std::map<int64_t, std::vector<LatenessPoint>> sync_lateness;
  std::optional<double> find(const std::string& key) const;
  // How long a group of `ranks` waits for its slowest rank after computing
  // `interval_us` side by side, in microseconds: the share at that interval
  // (linear between the measured ones, the nearest one's outside them) times
  // the interval; the group size's own points, else the nearest larger
  // size's, else the largest's; 0 when none was measured.
  double lateness_us(int64_t ranks, double interval_us) const;
};

// The cache file: {"kernels": {key: us, ...}}; an absent file is empty, an
// unreadable or malformed one an error naming it.
KernelTimes load_kernel_times(const std::string& path);
// Written whole to a temporary beside it, then renamed (a crash leaves the old file).
void save_kernel_times(const KernelTimes& times, const std::string& path);

}  // namespace meshtrain::sched
