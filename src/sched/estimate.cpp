#include "sched/estimate.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "graph/op_registry.h"

namespace meshtrain::sched {

namespace {
graph::ValueInfos infos(const graph::Graph& g, const std::vector<graph::ValueId>& values) {
  graph::ValueInfos out;
  for (graph::ValueId v : values) out.push_back(g.value(v).info);
  return out;
}

double collective_us(const graph::Node& node, const DeviceProfile& device) {
  std::vector<int> dims;
  for (int64_t d : node.attrs.get(graph::attr::mesh_dims)) {
    MT_CHECK(d >= 0 && static_cast<size_t>(d) < device.comm.links.size(),
             "estimate: a {} runs over mesh dim {}, but the device profile's cost model has links for {} dims",
             node.op->name, d, device.comm.links.size());
    dims.push_back(static_cast<int>(d));
  }
  const sharding::LinkParams link = device.comm.merged_link(dims);
  const double bytes = node.attrs.get(graph::attr::comm_bytes);
  const int n = static_cast<int>(node.attrs.get(graph::attr::group).size());
  if (n <= 1) return 0;
  const std::string& op = node.op->name;
  if (op == "all_gather") return device.comm.all_gather_us(bytes, n, link);
  if (op == "reduce_scatter") return device.comm.reduce_scatter_us(bytes, n, link);
  if (op == "all_reduce") return device.comm.all_reduce_us(bytes, n, link);
  if (op == "all_to_all") return device.comm.all_to_all_us(bytes, n, link);
  MT_CHECK(false, "estimate: no cost rule for collective {}", op);
  return 0;
}
}  // namespace

double node_us(const graph::Graph& g, graph::NodeId id, const DeviceProfile& device) {
  const graph::Node& node = g.node(id);
  if (node.op->is_view) return 0;  // views and waits run nothing
  const graph::ValueInfos in = infos(g, node.inputs), out = infos(g, node.outputs);
  const double bytes = graph::op_bytes(*node.op, in, out, node.attrs);
  const double memory_us = bytes / (device.memory_gbps * device.memory_efficiency) * 1e-3;
  if (node.op->is_collective) return node.outputs.size() > 1 ? collective_us(node, device) : memory_us;
  MT_CHECK(device.peak_gflops_f32 > 0 && device.memory_gbps > 0,
           "estimate: device profile '{}' needs a positive f32 peak and memory bandwidth", device.name);
  const bool bf16 = !out.empty() && out[0].dtype == DType::bf16 && device.peak_gflops_bf16 > 0;
  const double peak = bf16 ? device.peak_gflops_bf16 : device.peak_gflops_f32;
  const double flops = graph::op_flops(*node.op, in, out, node.attrs);
  return std::max(flops / (peak * device.compute_efficiency) * 1e-3, memory_us);
}

StepEstimate estimate_step(const graph::Graph& g, const graph::Schedule& schedule, const DeviceProfile& device) {
  StepEstimate e;
  double now = 0;                                         // the compute stream
  std::map<std::vector<int64_t>, double> stream_free_at;  // per group of mesh dims: its FIFO stream
  std::map<graph::NodeId, double> done_at;                // started collective -> when it completes
  for (graph::NodeId id : schedule.steps) {
    const graph::Node& node = g.node(id);
    if (node.op->is_wait) {
      const graph::NodeId start = g.value(node.inputs[0]).producer;
      const auto it = done_at.find(start);
      MT_CHECK(it != done_at.end(), "estimate: wait node {} comes before the start of its collective", id.index);
      const double until = std::max(now, it->second);
      e.exposed_us += until - now;
      e.timeline.push_back({id, now, until});
      now = until;
      continue;
    }
    const double us = node_us(g, id, device);
    if (node.op->is_collective && node.outputs.size() > 1) {  // started here, in flight until its wait
      double& free_at = stream_free_at[node.attrs.get(graph::attr::mesh_dims)];
      const double begin = std::max(now, free_at);
      free_at = done_at[id] = begin + us;
      e.communication_us += us;
      e.timeline.push_back({id, now, now});
      continue;
    }
    e.timeline.push_back({id, now, now + us});
    e.compute_us += us;
    now += us;
  }
  e.step_us = now;
  return e;
}

}  // namespace meshtrain::sched
