#include "sched/memory_estimate.h"

#include <algorithm>
#include <set>

#include "core/allocator.h"
#include "graph/op_registry.h"

namespace meshtrain::sched {

const char* memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::parameters:
      return "parameters";
    case MemoryKind::gradients:
      return "gradients";
    case MemoryKind::optimizer_states:
      return "optimizer states";
    case MemoryKind::activations:
      return "activations";
    case MemoryKind::communication:
      return "communication buffers";
    case MemoryKind::other:
      return "other";
  }
  return "?";
}

MemoryEstimate estimate_memory(const graph::Graph& g, const graph::Schedule& schedule, const MemoryKindOf& kind_of) {
  using graph::ValueId;
  const graph::MemoryPlan& plan = schedule.memory;
  const std::vector<graph::NodeId>& steps = schedule.steps;
  auto bytes = [&](ValueId v) {
    return static_cast<double>(g.value(v).info.shape.numel()) * dtype_size(g.value(v).info.dtype);
  };
  auto kind = [&](ValueId v) {
    if (kind_of)
      if (const auto k = kind_of(v)) return *k;
    const graph::Value& value = g.value(v);
    if (!value.producer.valid())
      return value.kind == graph::ValueKind::parameter ? MemoryKind::parameters : MemoryKind::other;
    const graph::Node& node = g.node(value.producer);
    if (node.op->is_collective) return MemoryKind::communication;
    return node.phase == graph::Phase::forward ? MemoryKind::activations : MemoryKind::other;
  };

  MemoryEstimate e;
  std::map<ValueId, size_t> last_use;
  std::set<ValueId> inputs;
  for (size_t s = 0; s < steps.size(); ++s)
    for (ValueId in : g.node(steps[s]).inputs) {
      last_use[plan.storage_of(in)] = s;
      if (!g.value(plan.storage_of(in)).producer.valid()) inputs.insert(plan.storage_of(in));
    }
  std::map<MemoryKind, double> input_kinds;
  for (ValueId v : inputs) {
    e.input_bytes += bytes(v);
    e.allocated_bytes += static_cast<double>(CachingAllocator::block_size(static_cast<size_t>(bytes(v))));
    input_kinds[kind(v)] += bytes(v);
  }
  std::set<ValueId> fetched;
  for (ValueId v : schedule.fetches) fetched.insert(plan.storage_of(v));
  e.arena_bytes = static_cast<double>(plan.peak_bytes);
  e.peak_bytes = e.input_bytes + e.arena_bytes;
  e.allocated_bytes += static_cast<double>(CachingAllocator::block_size(std::max<size_t>(plan.peak_bytes, 1)));

  std::map<ValueId, double> live;  // computed values holding arena ranges
  double live_sum = 0, most = -1;
  std::set<ValueId> produced;  // storage whose range has been taken (it is not taken twice)
  for (size_t s = 0; s < steps.size(); ++s) {
    const graph::Node& node = g.node(steps[s]);
    for (ValueId out : node.outputs) {
      // A bucket member computed in place in its bucket: the bucket's range is taken now.
      if (const ValueId bucket = plan.storage_of(out);
          bucket != out && plan.offsets.count(bucket) && produced.insert(bucket).second) {
        live[bucket] = bytes(bucket);
        live_sum += bytes(bucket);
      }
      const auto at = plan.offsets.find(out);
      if (at == plan.offsets.end() || !produced.insert(out).second)
        continue;                       // a view, or an input's own tensor updated in place, or a bucket taken earlier
      for (ValueId in : node.inputs) {  // computed in place over an input: that range changes hands
        const ValueId owner = plan.storage_of(in);
        const auto in_at = plan.offsets.find(owner);
        if (in_at != plan.offsets.end() && in_at->second == at->second && live.count(owner)) {
          live_sum -= live.at(owner);
          live.erase(owner);
          break;
        }
      }
      live[out] = bytes(out);
      live_sum += bytes(out);
    }
    const double now = e.input_bytes + live_sum;
    e.live_bytes.push_back(now);
    if (now > most) {
      most = now;
      e.peak_step = s;
      e.at_peak = input_kinds;
      for (const auto& [v, b] : live) e.at_peak[kind(v)] += b;
      e.arena_unused_at_peak = e.arena_bytes - live_sum;
    }
    auto release = [&](ValueId v) {
      if (fetched.count(v) || !live.count(v)) return;
      const auto last = last_use.find(v);
      if (last != last_use.end() && last->second != s) return;
      live_sum -= live.at(v);
      live.erase(v);
    };
    for (ValueId in : node.inputs) release(plan.storage_of(in));
    for (ValueId out : node.outputs) release(out);
  }
  return e;
}

}  // namespace meshtrain::sched
