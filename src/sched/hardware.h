// A machine as the estimator sees it: each device's compute and memory
// peaks, the fraction of them kernels reach, its memory capacity, how many
// devices share a host, and what its collectives cost (NCCL's model, or a
// table measured on the machine). Profiles are TOML; some are built in.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sched/collective_cost.h"

namespace meshtrain::sched {

// Ranks that share a host's cores advance unevenly, and a collective waits
// for its group's slowest rank: per job size and group size, how far the
// slowest rank trailed the group's mean over stretches of compute of
// increasing length, as a share of the stretch (it falls as a longer stretch
// evens out).
struct SyncLateness {
  struct Point {
    double interval_us = 0;
    double share = 0;
    bool operator==(const Point&) const = default;
  };
  struct Key {
    int64_t world = 0;  // the job's ranks on the host
    int64_t ranks = 0;  // the group's
    auto operator<=>(const Key&) const = default;
  };
  std::map<Key, std::vector<Point>> tables;  // points by increasing interval

  bool empty() const { return tables.empty(); }
  // How long a group of `ranks` in a job of `world` waits for its slowest
  // rank after computing `interval_us` side by side, in microseconds: the
  // share at that interval (linear between the points; below the first, the
  // first's; beyond the last, the last's) times the interval; the job's
  // points for the group's size, else for the nearest larger size, else for
  // its largest; 0 for a job with none, or a group of one rank.
  double us(int64_t world, int64_t ranks, double interval_us) const;
  // These tables, with `base`'s added where these lack the key.
  SyncLateness over(const SyncLateness& base) const;
};

struct HardwareProfile {
  std::string name, description;
  double peak_gflops_f32 = 0;   // a device's dense f32 peak, GFLOP/s
  double peak_gflops_bf16 = 0;  // its dense bf16 peak (0: as f32)
  double peak_gflops_fp8 = 0;   // its dense FP8 peak, the FP8 GEMMs' (0: as the output's dtype)
  double memory_gbps = 0;       // its memory bandwidth, GB/s
  double memory_gib = 0;        // its memory capacity, GiB (0: unknown)
  // The fractions of the peaks kernels reach: every op's compute by default
  // (PyTorch's roofline uses 0.75), ops named in `op_efficiency` their own.
  double compute_efficiency = 0.75;
  double memory_efficiency = 0.75;
  std::map<std::string, double> op_efficiency;
  // Ops' fixed time per call, microseconds of the whole device, beyond
  // their FLOPs at their efficiency (a small GEMM runs below the rate of a
  // large one); a rank with a share of a shared host pays it over its share.
  std::map<std::string, double> op_call_us;
  int devices_per_host = 8;
  // The job's ranks all run on this one host and share its peaks (CPU
  // cores): each of N ranks gets 1/N of them.
  bool shared_host = false;
  // shared_host: the host's cores (0: unknown). A rank of an N-rank job runs
  // max(1, cores / N) threads, so while only some ranks compute (the others
  // wait in a pipeline's bubble) each may get up to those threads' cores.
  int host_cores = 0;
  // shared_host: how unevenly its ranks advance ([[device.sync_lateness]],
  // bench/calibrate.sh measures it); none: no collective waits for a rank.
  SyncLateness sync_lateness;
  enum class CollectiveModel { nccl, measured } collectives = CollectiveModel::nccl;
  NcclLinks nccl;
  MeasuredCollectives measured;

  // A collective's time over `group` (global ranks) in a job of
  // `world_size` ranks, `bytes` as nccl_collective_us counts them;
  // `others_compute`: while the job's other ranks compute (a pipeline's
  // other stages), where the measured tables say what that costs.
  double collective_us(comm::OpType kind, double bytes, const std::vector<int64_t>& group, int world_size,
                       bool others_compute = false) const;
  // A floor under the summed collective_us of collectives of `kind` over
  // `group` whose bytes add up to `bytes` (nccl_collective_floor_us; 0 for
  // measured collectives, whose tables promise no such floor).
  double collective_floor_us(comm::OpType kind, double bytes, const std::vector<int64_t>& group) const;
  // The hosts `group`'s ranks are on (devices_per_host to a host).
  int host_count(const std::vector<int64_t>& group) const;
  // The share of the peaks one rank of a `world_size`-rank job gets (1 unless shared_host).
  double rank_share(int world_size) const;
  // The share one rank gets while `computing` of the job's ranks compute at
  // once: rank_share, or with host_cores known, the most of its threads'
  // cores and 1/computing of the host (never below rank_share).
  double busy_share(int world_size, int computing) const;
};

// Points of a SyncLateness for groups of `ranks` in a job of `world`,
// checked: 2 <= ranks <= world <= 2^24, as many intervals as shares,
// intervals positive and increasing, each share from 0 to ranks - 1 (the
// most a slowest rank can trail its group's mean by).
std::vector<SyncLateness::Point> checked_lateness(SyncLateness::Key key, const std::vector<double>& interval_us,
                                                  const std::vector<double>& share);

// The built-in profiles' names, and one of them; fails listing them.
std::vector<std::string> builtin_hardware_names();
HardwareProfile builtin_hardware(const std::string& name);
// A profile from TOML text or a file; errors name the key. Keys:
//   name, description
//   [device] peak_gflops_f32, peak_gflops_bf16, peak_gflops_fp8, memory_gbps, memory_gib,
//            compute_efficiency, memory_efficiency, devices_per_host, shared_host,
//            cores (shared_host only: the host's)
//   [device.op_efficiency] <op> = fraction
//   [device.op_call_us] <op> = microseconds (a call's fixed time)
//   [[device.sync_lateness]] world, ranks, interval_us = [...], share = [...]
//            (shared_host only: a group's slowest rank trails by share x interval)
//   [collectives] model = "nccl" | "measured"
//     nccl: arch (volta|ampere|hopper|blackwell), intra_bus_gbps, inter_gbps, channels, amd_host
//     measured: [[collectives.table]] op, ranks, world (the job's ranks when
//               measured; optional), others_compute (measured while the
//               job's other ranks computed; optional), bytes = [...], us = [...]
HardwareProfile parse_hardware(const std::string& toml_text, const std::string& origin);
// NAME of a built-in profile, or the path of a profile file; errors name
// `option`, where the user gave it.
HardwareProfile load_hardware(const std::string& name_or_path, const std::string& option = "--hardware");

}  // namespace meshtrain::sched
