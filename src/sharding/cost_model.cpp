#include "sharding/cost_model.h"

#include <algorithm>

namespace meshtrain::sharding {

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
}

CostModel CostModel::for_mesh(const DeviceMesh& mesh, int devices_per_host) {
  CostModel model;
  model.links.assign(static_cast<size_t>(mesh.ndim()), LinkParams{});
  int64_t total = 1;
  for (int m = mesh.ndim() - 1; m >= 0; --m) {
    total *= mesh.size(m);
    if (total > devices_per_host) model.links[m] = LinkParams{2.7, 87.7 * 0.22};
  }
  return model;
}

// PyTorch: 6.6 + (n-1)*lat + (GiB*(n-1)/n)/bw*1e6, bytes counted in GiB while
// bandwidth is in GB/s — kept as is so that costs match PyTorch's.
double CostModel::all_gather_us(double bytes, int n, const LinkParams& l) const {
  const double gib = bytes / kGiB;
  return launch_us + (n - 1) * l.latency_us + gib * (n - 1) / n / l.bandwidth_gbps * 1e6;
}

double CostModel::transfer_us(double bytes, const LinkParams& l) const { return bytes / kGiB / l.bandwidth_gbps * 1e6; }

double CostModel::reduce_scatter_us(double bytes, int n, const LinkParams& l) const {
  return all_gather_us(bytes, n, l);
}

double CostModel::all_reduce_us(double bytes, int n, const LinkParams& l) const {
  const double gib = bytes / kGiB;
  return launch_us + 2 * (n - 1) * l.latency_us + gib * 2 * (n - 1) / n / l.bandwidth_gbps * 1e6;
}

double CostModel::all_to_all_us(double bytes, int n, const LinkParams& l) const {
  return all_gather_us(bytes, n, l) + all_to_all_penalty_us;
}

LinkParams CostModel::merged_link(const std::vector<int>& dims) const {
  LinkParams merged{0.0, 1e300};
  for (int d : dims) {
    merged.latency_us = std::max(merged.latency_us, links[d].latency_us);
    merged.bandwidth_gbps = std::min(merged.bandwidth_gbps, links[d].bandwidth_gbps);
  }
  return merged;
}

}  // namespace meshtrain::sharding
