#include "sched/estimate.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "graph/op_registry.h"
#include "sched/memory_plan.h"

namespace meshtrain::sched {

namespace {
double collective_us(const graph::Node& node, const RankDevice& device) {
  const double bytes = node.attrs.get(graph::attr::comm_bytes);
  const std::vector<int64_t>& group = node.attrs.get(graph::attr::group);
  // A ring shift sends its block to one rank while another's arrives: one
  // step of a two-rank ring all_gather of both blocks (hosts as the group's
  // first rank and the one `ring_distance` on stand).
  if (node.op->name == "ring_shift") {
    const auto distance = static_cast<size_t>(node.attrs.get_or(graph::attr::ring_distance, int64_t{1}));
    return device.hardware.collective_us(comm::OpType::all_gather, 2 * bytes, {group.at(0), group.at(distance)},
                                         device.world_size, device.others_compute);
  }
  return device.hardware.collective_us(costed_collective(node.op->name), bytes, group, device.world_size,
                                       device.others_compute);
}

// The bytes a started collective moves through its staging buffer (its
// second output): the blocks packed into it before they go out
// (reduce_scatter, all_to_all) or unpacked from it once they arrive
// (all_gather, all_to_all), each element read once and written once.
double staging_bytes(const graph::Node& node, const graph::ValueInfos& out) {
  const int64_t elements = node.attrs.get_or(graph::attr::buffer_elements, int64_t{0});
  if (elements <= 0 || out.empty()) return 0;
  return 2.0 * static_cast<double>(elements) * static_cast<double>(dtype_size(out[0].dtype));
}

// How much faster a group's slowest rank runs while the rest of its group
// waits for it, on a host whose cores (HardwareProfile::host_cores) its
// ranks share: the waiting ranks leave their cores to the world's other
// ranks still computing. The lateness was measured with every rank
// computing; 1 where the host's cores are unknown.
double catch_up_speed(const HardwareProfile& hw, int world_size, int64_t group_size) {
  const int computing = std::max(1, world_size - static_cast<int>(group_size - 1));
  return hw.busy_share(world_size, computing) / hw.rank_share(world_size);
}
}  // namespace

double node_us(const graph::Graph& g, graph::NodeId id, const RankDevice& device) {
  const graph::Node& node = g.node(id);
  if (node.op->is_view) return 0;  // views and waits run nothing
  const HardwareProfile& hw = device.hardware;
  const graph::ValueInfos in = graph::value_infos(g, node.inputs), out = graph::value_infos(g, node.outputs);
  const double share = hw.rank_share(device.world_size);
  const auto at_memory_bandwidth = [&](double bytes) {
    return bytes / (hw.memory_gbps * share * hw.memory_efficiency) * 1e-3;
  };
  const double memory_us = at_memory_bandwidth(graph::op_bytes(*node.op, in, out, node.attrs));
  if (node.op->is_collective)
    return node.op->starts_async ? collective_us(node, device) + at_memory_bandwidth(staging_bytes(node, out))
                                 : memory_us;
  if (device.measured != nullptr)
    if (const auto us = device.measured->find(kernel_key(g, id))) return *us;
  MT_CHECK(hw.peak_gflops_f32 > 0 && hw.memory_gbps > 0,
           "estimate: hardware profile '{}' needs a positive f32 peak and memory bandwidth", hw.name);
  const bool bf16 = !out.empty() && out[0].dtype == DType::bf16 && hw.peak_gflops_bf16 > 0;
  // The FP8 GEMMs (fp8_matmul, fp8_rows_matmul) at the device's FP8 rate.
  const bool fp8 = (node.op->name == "fp8_matmul" || node.op->name == "fp8_rows_matmul") && hw.peak_gflops_fp8 > 0;
  const double peak = (fp8 ? hw.peak_gflops_fp8 : bf16 ? hw.peak_gflops_bf16 : hw.peak_gflops_f32) * share;
  const auto own = hw.op_efficiency.find(node.op->name);
  const double efficiency = own != hw.op_efficiency.end() ? own->second : hw.compute_efficiency;
  const auto call = hw.op_call_us.find(node.op->name);
  const double call_us = call != hw.op_call_us.end() ? call->second / share : 0;
  const double flops = graph::op_flops(*node.op, in, out, node.attrs);
  return std::max(flops / (peak * efficiency) * 1e-3 + call_us, memory_us);
}

double planned_node_us(const graph::Graph& g, graph::NodeId id, const RankDevice& device,
                       const graph::MemoryPlan& plan) {
  const double us = node_us(g, id, device);
  const graph::Node& node = g.node(id);
  const bool bucket_op = node.op->name == "bucket_pack" || node.op->name == "bucket_unpack";
  return bucket_op ? us * bucket_copy_share(g, plan, node) : us;
}

StepEstimate estimate_step(const graph::Graph& g, const graph::Schedule& schedule, const RankDevice& device) {
  StepEstimate e;
  double now = 0;                                     // the compute stream
  std::map<CollectiveStream, double> stream_free_at;  // per stream: when it is done
  std::map<graph::NodeId, double> done_at;            // started collective -> when it completes
  double synced_at = 0;                               // shared host: when this rank last waited for a group
  // What benchmark mode measured, else the profile's.
  const SyncLateness lateness = device.measured != nullptr
                                    ? device.measured->sync_lateness.over(device.hardware.sync_lateness)
                                    : device.hardware.sync_lateness;
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
    const double us = planned_node_us(g, id, device, schedule.memory);
    if (node.op->starts_async) {
      e.communication_us += us;
      if (device.hardware.shared_host) {
        // CPU ranks sharing a host: the cores that compute also copy the
        // collective's bytes, so nothing hides it; and it waits for the
        // group's slowest rank, which trails by its measured lateness over
        // what the ranks computed since they last waited.
        const auto group_size = static_cast<int64_t>(node.attrs.get(graph::attr::group).size());
        const double late = lateness.us(device.world_size, group_size, now - synced_at) /
                            catch_up_speed(device.hardware, device.world_size, group_size);
        e.timeline.push_back({id, now, now + late + us});
        e.exposed_us += us;
        e.waiting_us += late;
        now += late + us;
        synced_at = now;
        done_at[id] = now;
      } else {  // in flight on its group's stream until its wait
        double& free_at = stream_free_at[collective_stream(node)];
        free_at = done_at[id] = std::max(now, free_at) + us;
        e.timeline.push_back({id, now, now});
      }
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
