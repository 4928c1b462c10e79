#include "sched/memory_plan.h"

#include <algorithm>
#include <map>
#include <set>
#include <string_view>

#include "core/error.h"
#include "graph/op_registry.h"

namespace meshtrain::sched {

namespace {

size_t block_bytes(size_t n) {
  return std::max((n + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment, kArenaAlignment);
}

// First-fit over free ranges of the arena, growing it when nothing fits.
class ArenaPlanner {
 public:
  size_t allocate(size_t bytes) {
    bytes = block_bytes(bytes);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < bytes) continue;
      const size_t offset = it->first;
      const size_t rest = it->second - bytes;
      free_.erase(it);
      if (rest) free_.emplace(offset + bytes, rest);
      return offset;
    }
    // Grow: reuse a free range that ends at the top of the arena.
    size_t offset = end_;
    if (!free_.empty()) {
      auto last = std::prev(free_.end());
      if (last->first + last->second == end_) {
        offset = last->first;
        free_.erase(last);
      }
    }
    end_ = offset + bytes;
    return offset;
  }
  void release(size_t offset, size_t bytes) {
    auto [it, _] = free_.emplace(offset, block_bytes(bytes));
    // Coalesce with the neighbours.
    if (auto next = std::next(it); next != free_.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free_.erase(next);
    }
    if (it != free_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_.erase(it);
      }
    }
  }
  size_t size() const { return end_; }

 private:
  std::map<size_t, size_t> free_;  // offset -> bytes
  size_t end_ = 0;
};

size_t nbytes(const graph::ValueInfo& v) { return static_cast<size_t>(v.shape.numel()) * dtype_size(v.dtype); }

bool copies_members(const graph::Node& bucket_op) { return bucket_op.attrs.get_or(graph::attr::copy_members, false); }

// The members of bucket_packs that can be computed in place in
// their bucket, made views of it (the pack then copies nothing for them):
// each computed here by a node that writes a fresh output (not a view, not
// over an input), read by that pack alone among packs and only once, and
// not fetched; none of a pack marked attr::copy_members.
void place_bucket_members(const graph::Graph& g, const std::vector<graph::NodeId>& steps,
                          const std::vector<graph::ValueId>& fetches, graph::MemoryPlan& plan) {
  const std::set<graph::NodeId> computed(steps.begin(), steps.end());
  const std::set<graph::ValueId> fetched(fetches.begin(), fetches.end());
  std::map<graph::ValueId, int> pack_reads;
  for (graph::NodeId n : steps)
    if (g.node(n).op->name == "bucket_pack")
      for (graph::ValueId in : g.node(n).inputs) ++pack_reads[in];
  auto placeable = [&](graph::ValueId v) {
    const graph::Value& value = g.value(v);
    if (!value.producer.valid() || !computed.count(value.producer) || pack_reads.at(v) != 1) return false;
    const graph::Node& producer = g.node(value.producer);
    return !producer.op->is_view && producer.op->in_place.empty() && producer.op->name != "bucket_unpack" &&
           producer.op->name != "bucket_pack" && !fetched.contains(v);
  };
  for (graph::NodeId n : steps) {
    const graph::Node& node = g.node(n);
    if (node.op->name != "bucket_pack" || copies_members(node)) continue;
    size_t at = 0;
    for (graph::ValueId member : node.inputs) {
      if (placeable(member)) {
        plan.view_of[member] = node.outputs[0];
        if (at) plan.view_offset[member] = at;
      }
      at += nbytes(g.value(member).info);
    }
  }
}

}  // namespace

graph::MemoryPlan plan_memory(const graph::Graph& g, const std::vector<graph::NodeId>& steps,
                              const std::vector<graph::ValueId>& fetches, const std::vector<graph::Update>& updates) {
  using graph::ValueId;
  graph::MemoryPlan plan;
  place_bucket_members(g, steps, fetches, plan);
  auto view = [&](ValueId v, ValueId of, size_t offset) {
    plan.view_of[v] = plan.storage_of(of);
    if (const size_t at = plan.offset_in_storage(of) + offset) plan.view_offset[v] = at;
  };
  // View ops (reshape, wait) alias their input: a value's storage is its
  // root's. A bucket's members are its consecutive byte ranges (unless
  // its unpack copies them out).
  for (graph::NodeId n : steps) {
    const graph::Node& node = g.node(n);
    if (node.op->is_view) view(node.outputs[0], node.inputs[0], 0);
    if (node.op->name == "bucket_unpack" && !copies_members(node)) {
      size_t at = 0;
      for (ValueId member : node.outputs) {
        view(member, node.inputs[0], at);
        at += nbytes(g.value(member).info);
      }
    }
  }
  // Last step that reads each storage; fetched storage lives to the end.
  std::map<ValueId, size_t> last_use;
  for (size_t step = 0; step < steps.size(); ++step)
    for (ValueId in : g.node(steps[step]).inputs) last_use[plan.storage_of(in)] = step;
  std::set<ValueId> fetched;
  for (ValueId v : fetches) fetched.insert(plan.storage_of(v));
  ArenaPlanner arena;
  for (size_t step = 0; step < steps.size(); ++step) {
    const graph::Node& node = g.node(steps[step]);
    // An output the op may compute over an input takes that input's
    // storage when this step is the input's last reader and reads it once.
    std::set<ValueId> handed_over;
    for (const graph::OpDef::InPlace& pair : node.op->in_place) {
      const ValueId in = plan.storage_of(node.inputs.at(static_cast<size_t>(pair.input)));
      const ValueId out = node.outputs.at(static_cast<size_t>(pair.output));
      const auto reads =
          std::count_if(node.inputs.begin(), node.inputs.end(), [&](ValueId v) { return plan.storage_of(v) == in; });
      if (reads != 1 || last_use.at(in) != step || fetched.count(in) ||
          nbytes(g.value(in).info) != nbytes(g.value(out).info))
        continue;
      if (g.value(in).producer.valid()) {  // an intermediate: its arena range
        plan.offsets[out] = plan.offsets.at(in);
        handed_over.insert(in);
      } else if (std::any_of(updates.begin(), updates.end(),
                             [&](const graph::Update& u) { return u.from == out && u.to == in; })) {
        plan.view_of[out] = in;  // the input's own tensor, which this output updates
      }
    }
    for (ValueId out : node.outputs) {
      // A bucket member computed in place in its bucket takes the bucket's
      // range when the first of them is computed.
      if (const ValueId bucket = plan.storage_of(out);
          bucket != out && g.value(bucket).producer.valid() && !plan.offsets.count(bucket))
        plan.offsets[bucket] = arena.allocate(nbytes(g.value(bucket).info));
      if (!plan.view_of.count(out) && !plan.offsets.count(out))
        plan.offsets[out] = arena.allocate(nbytes(g.value(out).info));
    }
    auto release_if_done = [&](ValueId v) {
      if (!g.value(v).producer.valid() || fetched.count(v) || handed_over.count(v)) return;
      auto it = last_use.find(v);
      if (it == last_use.end() || it->second == step) arena.release(plan.offsets.at(v), nbytes(g.value(v).info));
    };
    std::set<ValueId> seen;
    for (ValueId in : node.inputs)
      if (seen.insert(plan.storage_of(in)).second) release_if_done(plan.storage_of(in));
    for (ValueId out : node.outputs)
      if (!plan.view_of.count(out) && !last_use.count(out)) release_if_done(out);  // produced but never read
  }
  plan.peak_bytes = arena.size();
  return plan;
}

double bucket_copy_share(const graph::Graph& g, const graph::MemoryPlan& plan, const graph::Node& node) {
  const bool pack = node.op->name == "bucket_pack";
  MT_CHECK(pack || node.op->name == "bucket_unpack", "bucket_copy_share: {} is not a bucket op", node.op->name);
  const std::vector<graph::ValueId>& members = pack ? node.inputs : node.outputs;
  const graph::ValueId bucket = plan.storage_of(pack ? node.outputs[0] : node.inputs[0]);
  double copied = 0, all = 0;
  for (graph::ValueId m : members) {
    const auto bytes = static_cast<double>(nbytes(g.value(m).info));
    all += bytes;
    if (plan.storage_of(m) != bucket) copied += bytes;
  }
  return all > 0 ? copied / all : 0;
}

}  // namespace meshtrain::sched
