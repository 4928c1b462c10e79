// What a collective costs on a machine, two ways: NCCL's analytical model
// (its tuning.cc: ring and tree algorithms, each with the LL, LL128 and
// Simple protocols, intra- and inter-host latencies and bandwidths; the time
// is the fastest of the combinations, as NCCL picks), and a table measured
// on the machine itself (`meshtrain bench comm`), interpolated.
#pragma once

#include <map>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/types.h"
#include "graph/graph.h"
#include "sharding/device_mesh.h"

namespace meshtrain::sched {

// The collective named `op` (all_gather, reduce_scatter, all_reduce or
// all_to_all, the ones with a cost rule); fails for others.
comm::OpType costed_collective(std::string_view op);

// The stream a started collective node runs on (sharding::comm_stream): its
// group's mesh dims and the stream of its kind there. A stream runs its
// collectives one after another, in the order they start.
struct CollectiveStream {
  std::vector<int64_t> mesh_dims;
  sharding::CommStream stream = sharding::CommStream::main;
  auto operator<=>(const CollectiveStream&) const = default;
};
CollectiveStream collective_stream(const graph::Node& started);

// The machine as NCCL's model sees it.
struct NcclLinks {
  enum class Arch { volta, ampere, hopper, blackwell };
  Arch arch = Arch::hopper;
  double intra_bus_gbps = 370;  // a GPU's bus bandwidth within a host (NVLink), GB/s, all channels
  double inter_gbps = 50;       // a GPU's network bandwidth across hosts (its NIC), GB/s
  int channels = 16;            // for the per-channel caps
  bool amd_host = false;        // the host CPU (NCCL's network overhead and LL caps across hosts)
};

// Microseconds for a collective of `bytes` (NCCL's nBytes: the whole
// gathered buffer of an all_gather, the whole input of a reduce_scatter, the
// buffer of an all_reduce or all_to_all) over `ranks` ranks on `hosts` hosts.
double nccl_collective_us(comm::OpType kind, double bytes, int ranks, int hosts, const NcclLinks& links);
// A floor under the summed nccl_collective_us of any collectives of `kind`
// whose bytes add up to `bytes` over that group: the bytes at the fastest
// algorithm's bandwidth for all of them at once, with no latency (a larger
// message never gets less bandwidth in the model, so no split beats it).
double nccl_collective_floor_us(comm::OpType kind, double bytes, int ranks, int hosts, const NcclLinks& links);

// Measured times: per collective, group size and the job's ranks on the
// host when measured (0: not said), (bytes, microseconds) points in
// increasing bytes. Between points the time is interpolated linearly; below
// the first it is the first's; beyond the last it grows at the bandwidth of
// the last two.
struct MeasuredCollectives {
  struct Key {
    comm::OpType kind;
    int ranks = 0;  // the group's
    int world = 0;  // the job's, all on the host; 0: any
    // Measured while the job's other ranks computed (bench comm
    // --others-compute: a pipeline's other stages beside a stage's
    // collectives), not while every group ran the same collectives.
    bool others_compute = false;
    auto operator<=>(const Key&) const = default;
  };
  std::map<Key, std::vector<std::pair<double, double>>> tables;
  // The table measured in a job of `world` ranks, else the one measured in
  // the job size nearest it; with `others_compute`, among the tables
  // measured so where there are any for the op and group size. Fails naming
  // the group sizes measured when `ranks` is not one of them.
  double us(comm::OpType kind, double bytes, int ranks, int world = 0, bool others_compute = false) const;
};

}  // namespace meshtrain::sched
