// Cost of collectives per mesh dim: alpha (latency) + bytes / bandwidth, in
// PyTorch DTensor's form (_collective_utils.py). Units: microseconds, GB/s.
#pragma once

#include <vector>

#include "sharding/device_mesh.h"

namespace meshtrain::sharding {

struct LinkParams {
  double latency_us = 0.6;       // per hop
  double bandwidth_gbps = 87.7;  // GB/s (1e9 bytes/s)
};

struct CostModel {
  std::vector<LinkParams> links;  // one per mesh dim
  double launch_us = 6.6;         // fixed cost of any collective
  // Extra cost of an all_to_all over an all_gather of the same bytes. PyTorch
  // charged +1 µs until #178175 (2026) removed it as artificial; 0 here.
  double all_to_all_penalty_us = 0.0;

  // PyTorch's MeshTopoInfo defaults: mesh dims are filled from the innermost;
  // a dim whose cumulative size (itself and all inner dims) exceeds
  // devices_per_host crosses hosts (bandwidth x0.22, latency 2.7 µs).
  static CostModel for_mesh(const DeviceMesh& mesh, int devices_per_host = 8);

  // bytes: the collective's buffer per rank in the nccl-tests convention
  // (all_gather: output; reduce_scatter: input; all_reduce, all_to_all: the
  // buffer); n ranks.
  double all_gather_us(double bytes, int n, const LinkParams& link) const;
  double reduce_scatter_us(double bytes, int n, const LinkParams& link) const;
  double all_reduce_us(double bytes, int n, const LinkParams& link) const;
  double all_to_all_us(double bytes, int n, const LinkParams& link) const;
  // The bandwidth part alone of moving `bytes` into a rank over the link
  // (an all_gather to n x L bytes moves (n - 1) x L): a lower bound's term.
  double transfer_us(double bytes, const LinkParams& link) const;
  // The link of several mesh dims merged into one group: the slowest of them.
  LinkParams merged_link(const std::vector<int>& dims) const;
};

}  // namespace meshtrain::sharding
