// Benchmark-mode compute times: each kernel's time, measured on the machine
// for one op, input shapes, dtypes and attributes (its key), so the estimator
// uses the measurement instead of the roofline for nodes it knows. Kept in
// memory and, optionally, in a JSON file that later runs and `meshtrain
// estimate` read (estimate/kernel_benchmark.h measures and aligns them).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "graph/graph.h"
#include "sched/hardware.h"

namespace meshtrain::sched {

// What a node's kernel time depends on: "op(in shapes:dtypes)->(out ...) {attrs}".
std::string kernel_key(const graph::Graph& g, graph::NodeId node);
// A stable 64-bit hash of a key (FNV-1a), the same in every process.
uint64_t kernel_key_hash(const std::string& key);

struct KernelTimes {
  std::map<std::string, double> us;  // key -> microseconds per call
  // How unevenly the job's ranks advanced side by side, measured with the
  // kernels (estimate::measure_sync_lateness); the estimate takes it over the
  // hardware profile's.
  SyncLateness sync_lateness;
  std::optional<double> find(const std::string& key) const;
};

// The cache file: {"kernels": {key: us, ...}, "sync_lateness": [{"world": n,
// "ranks": m, "interval_us": [...], "share": [...]}, ...]} (the latter
// optional); an absent file is empty, an unreadable or malformed one an
// error naming it.
KernelTimes load_kernel_times(const std::string& path);
// Written whole to a temporary beside it, then renamed (a crash leaves the old file).
void save_kernel_times(const KernelTimes& times, const std::string& path);

}  // namespace meshtrain::sched
