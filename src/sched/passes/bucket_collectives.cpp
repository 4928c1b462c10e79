#include "sched/passes/bucket_collectives.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "core/error.h"
#include "graph/op_registry.h"
#include "graph/ops/collective.h"
#include "sched/passes/sink_waits.h"
#include "sharding/layout.h"

namespace meshtrain::sched {

std::string_view bucket_mode_name(BucketMode mode) {
  switch (mode) {
    case BucketMode::none:
      return "none";
    case BucketMode::per_block:
      return "per_block";
    case BucketMode::size_cap:
      return "size_cap";
    case BucketMode::automatic:
      return "auto";
  }
  return "?";
}

namespace {

using graph::NodeId;
using graph::ValueId;

// One collective that may join a bucket, with what bounds where the bucket runs.
struct Member {
  NodeId start, wait;
  std::optional<NodeId> prepared_by;  // computes its input from parameters alone: moves up with the bucket
  size_t at = 0;                      // its start's position
  size_t ready = 0;                   // the first position from which its input is there
  size_t first_read = 0;              // the position of the first reader of its result
  double bytes = 0;
};

// Members of one bucket share all of it.
struct Key {
  std::string op;
  std::string reduction;  // a reduce_scatter's or all_reduce's pending sum (P(sum), P(max)...)
  std::vector<int64_t> mesh_dims, group;
  DType dtype;
  graph::Phase phase;
  // Whether the members' inputs come from parameters alone (weights FSDP
  // gathers): a bucket of them stays out of the activations' (context
  // parallelism's keys), which would make it a microbatch's.
  bool of_parameters = false;
  auto operator<=>(const Key&) const = default;
};

struct Bucket {
  Key key;
  std::string block;
  std::vector<Member> members;
  size_t ready = 0, first_read = 0;
  double bytes = 0;
  // Where its collective starts: where its first member started, or later
  // where a member's input is ready only then (prefetch_collectives may
  // move it up).
  size_t start_at() const {
    size_t first = members.front().at;
    for (const Member& m : members) first = std::min(first, m.at);
    return std::max(ready, first);
  }
};

// "layers.3.attention" -> "layers.3"; "output" -> "output".
std::string block_of(const std::string& scope) {
  const size_t dot = scope.find('.');
  if (scope.rfind("layers.", 0) == 0) return scope.substr(0, scope.find('.', dot + 1));
  return scope.substr(0, dot);
}

int64_t numel(const graph::Graph& g, ValueId v) { return g.value(v).info.shape.numel(); }

struct Candidates {
  const graph::Graph& g;
  std::map<NodeId, size_t> position;
  std::map<ValueId, std::vector<NodeId>> readers;
  std::set<ValueId> of_parameters;  // values computed from parameters alone (through collectives too)

  explicit Candidates(const graph::Graph& graph) : g(graph) {
    for (size_t i = 0; i < g.order().size(); ++i) {
      const graph::Node& node = g.node(g.order()[i]);
      position[g.order()[i]] = i;
      for (ValueId in : node.inputs) readers[in].push_back(g.order()[i]);
      const bool derived = !node.inputs.empty() && std::all_of(node.inputs.begin(), node.inputs.end(), [&](ValueId x) {
        return g.value(x).kind == graph::ValueKind::parameter || of_parameters.contains(x);
      });
      if (derived) of_parameters.insert(node.outputs.begin(), node.outputs.end());
    }
  }
  bool from_parameters(ValueId v) const {
    return g.value(v).kind == graph::ValueKind::parameter || of_parameters.contains(v);
  }

  std::optional<Member> member(NodeId n) const {
    const graph::Node& node = g.node(n);
    const std::string& op = node.op->name;
    if (op != "all_gather" && op != "reduce_scatter" && op != "all_reduce") return std::nullopt;
    if (node.attrs.get(graph::attr::mesh_dims).size() != 1 || node.attrs.get(graph::attr::buffer_elements) != 0)
      return std::nullopt;
    const auto ranks = static_cast<int64_t>(node.attrs.get(graph::attr::group).size());
    const int64_t in = numel(g, node.inputs[0]), out = numel(g, node.outputs[0]);
    const bool even = op == "all_gather" ? out == ranks * in : op == "reduce_scatter" ? in == ranks * out : in == out;
    if (!even || in == 0) return std::nullopt;
    const auto wait_readers = readers.find(node.outputs[0]);
    if (wait_readers == readers.end() || wait_readers->second.size() != 1) return std::nullopt;
    Member m{.start = n, .wait = wait_readers->second.front(), .at = position.at(n)};
    if (!g.node(m.wait).op->is_wait) return std::nullopt;
    m.first_read = g.order().size();
    if (const auto r = readers.find(g.node(m.wait).outputs[0]); r != readers.end())
      for (NodeId reader : r->second) m.first_read = std::min(m.first_read, position.at(reader));
    if (const NodeId p = g.value(node.inputs[0]).producer; p.valid()) {
      const graph::Node& producer = g.node(p);
      const bool from_parameters = !producer.op->is_collective && !producer.op->is_wait &&
                                   std::all_of(producer.inputs.begin(), producer.inputs.end(), [&](ValueId x) {
                                     return g.value(x).kind == graph::ValueKind::parameter;
                                   });
      if (from_parameters)
        m.prepared_by = p;
      else
        m.ready = position.at(p) + 1;
    }
    m.bytes = node.attrs.get(graph::attr::comm_bytes);
    return m;
  }
};

std::vector<Bucket> group_buckets(const graph::Graph& g, BucketMode mode, double cap, int mesh_ndim) {
  const Candidates c(g);
  std::vector<Bucket> done;
  std::map<Key, Bucket> open;
  for (NodeId n : g.order()) {
    const std::optional<Member> m = c.member(n);
    if (!m) continue;
    const graph::Node& node = g.node(n);
    const auto d = static_cast<size_t>(node.attrs.get(graph::attr::mesh_dims).front());
    const std::string reduction =
        node.op->name == "all_gather"
            ? ""
            : sharding::Layout::parse(node.attrs.get(graph::attr::layout_before), mesh_ndim).placements[d].to_string();
    const Key key{node.op->name,
                  reduction,
                  node.attrs.get(graph::attr::mesh_dims),
                  node.attrs.get(graph::attr::group),
                  g.value(node.inputs[0]).info.dtype,
                  node.phase,
                  c.from_parameters(node.inputs[0])};
    const std::string block = block_of(node.scope);
    auto it = open.find(key);
    if (it != open.end()) {
      Bucket& b = it->second;
      const bool fits = mode == BucketMode::per_block ? b.block == block : b.bytes + m->bytes <= cap;
      if (fits && std::max(b.ready, m->ready) <= std::min(b.first_read, m->first_read)) {
        b.members.push_back(*m);
        b.ready = std::max(b.ready, m->ready);
        b.first_read = std::min(b.first_read, m->first_read);
        b.bytes += m->bytes;
        continue;
      }
      done.push_back(std::move(b));
      open.erase(it);
    }
    open.emplace(key, Bucket{key, block, {*m}, m->ready, m->first_read, m->bytes});
  }
  for (auto& [key, b] : open) done.push_back(std::move(b));
  std::erase_if(done, [](const Bucket& b) { return b.members.size() < 2; });
  return done;
}

// The bucket's collective: the first member's, on the flat buffer.
graph::Attrs bucket_attrs(const graph::Graph& g, const Bucket& b, int mesh_ndim, int64_t in_total, int64_t out_total) {
  const graph::Node& first = g.node(b.members.front().start);
  graph::Attrs attrs = first.attrs;
  const auto d = static_cast<size_t>(first.attrs.get(graph::attr::mesh_dims).front());
  const sharding::Layout before = sharding::Layout::parse(first.attrs.get(graph::attr::layout_before), mesh_ndim);
  const sharding::Layout after = sharding::Layout::parse(first.attrs.get(graph::attr::layout_after), mesh_ndim);
  std::vector<sharding::Placement> from(static_cast<size_t>(mesh_ndim)), to(static_cast<size_t>(mesh_ndim));
  from[d] = b.key.op == "all_gather" ? sharding::Placement::shard(0) : before.placements[d];
  to[d] = b.key.op == "reduce_scatter" ? sharding::Placement::shard(0) : after.placements[d];
  // The bucket as a [ranks, per_rank] tensor under the collective's layouts:
  // they say how many bytes each rank holds before and after. Which bytes lie
  // where on the side of every rank's blocks is the coalesced collective's
  // (member_blocks: member by member), not this tensor's rows.
  const auto ranks = static_cast<int64_t>(first.attrs.get(graph::attr::group).size());
  const int64_t per_rank = b.key.op == "all_gather" ? in_total : out_total;
  const std::vector<int64_t> global{b.key.op == "all_reduce" ? 1 : ranks, per_rank};
  attrs.set(graph::attr::layout_before, sharding::Layout::from_placements(from).to_string());
  attrs.set(graph::attr::layout_after, sharding::Layout::from_placements(to).to_string());
  attrs.set(graph::attr::global_shape, global);
  attrs.set(graph::attr::shape, std::vector<int64_t>{b.key.op == "all_gather" ? ranks : 1, per_rank});
  attrs.set(graph::attr::comm_bytes, b.bytes);
  attrs.set(graph::attr::buffer_elements, int64_t{0});
  return attrs;
}

bool apply_buckets(graph::Graph& g, const std::vector<Bucket>& buckets, int mesh_ndim, bool member_views) {
  if (buckets.empty()) return false;
  const std::vector<NodeId> order = g.order();
  const auto anchor = [&](size_t at) { return at < order.size() ? order[at] : NodeId{}; };
  std::map<NodeId, std::vector<NodeId>> prepared_before;  // a bucket's pack -> what moves up to just before it
  std::vector<std::pair<ValueId, ValueId>> results;       // a member's waited result -> its unpacked one
  std::vector<NodeId> retired;
  const graph::Phase saved_phase = g.phase();
  const std::string saved_scope = g.scope();
  for (const Bucket& b : buckets) {
    g.set_phase(b.key.phase);  // its members' (a pipeline stage's programs are cut by phase)
    std::vector<ValueId> inputs;
    std::vector<Shape> results_shapes;
    std::vector<int64_t> member_blocks;  // each member's block per rank
    int64_t in_total = 0, out_total = 0;
    bool reads_input = false;
    for (const Member& m : b.members) {
      const graph::Node& start = g.node(m.start);
      inputs.push_back(start.inputs[0]);
      results_shapes.push_back(g.value(start.outputs[0]).info.shape);
      in_total += numel(g, start.inputs[0]);
      out_total += numel(g, start.outputs[0]);
      member_blocks.push_back(numel(g, b.key.op == "reduce_scatter" ? start.outputs[0] : start.inputs[0]));
      reads_input |= g.node(m.wait).inputs.size() == 3;
    }
    graph::Attrs attrs = bucket_attrs(g, b, mesh_ndim, in_total, out_total);
    if (b.key.op != "all_reduce") attrs.set(graph::attr::member_blocks, member_blocks);
    graph::Attrs copy_attrs;
    if (!member_views) copy_attrs.set(graph::attr::copy_members, true);
    NodeId pack, start;
    {
      graph::InsertBefore at(g, anchor(b.start_at()));
      g.set_scope(g.node(b.members.front().start).scope);
      pack = g.add_node("bucket_pack", inputs, copy_attrs);
      start = g.add_node(b.key.op, {g.only_output(pack)}, attrs);
    }
    {
      graph::InsertBefore at(g, anchor(b.first_read));
      std::vector<ValueId> wait_inputs = g.node(start).outputs;
      if (reads_input) wait_inputs.push_back(g.only_output(pack));
      const NodeId wait = g.add_node("wait", wait_inputs);
      graph::Attrs unpack_attrs = copy_attrs;
      unpack_attrs.set(graph::attr::member_shapes, graph::ops::bucket_member_shapes_attr(results_shapes));
      const NodeId unpack = g.add_node("bucket_unpack", {g.only_output(wait)}, unpack_attrs);
      for (size_t k = 0; k < b.members.size(); ++k)
        results.emplace_back(g.node(b.members[k].wait).outputs[0], g.node(unpack).outputs[k]);
    }
    for (const Member& m : b.members) {
      if (m.prepared_by) prepared_before[pack].push_back(*m.prepared_by);
      retired.push_back(m.wait);
      retired.push_back(m.start);
    }
  }
  g.set_phase(saved_phase);
  g.set_scope(saved_scope);
  g.replace_uses(results);
  g.remove_nodes(retired);
  // What prepares a member's input runs where it did or, where that is
  // later, just before its bucket's pack (the first of them): only ever up.
  std::map<NodeId, bool> emitted;
  for (const auto& [pack, nodes] : prepared_before)
    for (NodeId n : nodes) emitted[n] = false;
  std::vector<NodeId> reordered;
  for (NodeId n : g.order()) {
    if (const auto it = prepared_before.find(n); it != prepared_before.end())
      for (NodeId p : it->second)
        if (!std::exchange(emitted[p], true)) reordered.push_back(p);
    if (const auto e = emitted.find(n); e != emitted.end() && std::exchange(e->second, true)) continue;
    reordered.push_back(n);
  }
  g.set_order(std::move(reordered));
  return true;
}

}  // namespace

bool bucket_collectives(graph::Graph& g, const BucketOptions& options) {
  if (options.mode == BucketMode::none) return false;
  if (options.mode != BucketMode::automatic)
    return apply_buckets(g, group_buckets(g, options.mode, options.cap_bytes, options.mesh_ndim), options.mesh_ndim,
                         options.member_views);
  MT_CHECK(static_cast<bool>(options.step_us), "bucket_collectives: automatic bucketing needs a step-time estimate");
  // Each way of bucketing, scored by the estimated step with its waits sunk.
  const auto score = [&](const graph::Graph& candidate) {
    graph::Graph sunk = candidate;
    sink_waits(sunk);
    return options.step_us(sunk);
  };
  graph::Graph best = g;
  double best_us = score(g);
  std::vector<std::pair<BucketMode, double>> tries{{BucketMode::per_block, 0}};
  for (const double mib : {1.0, 4.0, 16.0, 64.0}) tries.emplace_back(BucketMode::size_cap, mib * (1 << 20));
  for (const auto& [mode, cap] : tries) {
    graph::Graph candidate = g;
    if (!apply_buckets(candidate, group_buckets(candidate, mode, cap, options.mesh_ndim), options.mesh_ndim,
                       options.member_views))
      continue;
    if (const double us = score(candidate); us < best_us) {
      best_us = us;
      best = std::move(candidate);
    }
  }
  if (best.order() == g.order() && best.num_node_ids() == g.num_node_ids()) return false;
  g = std::move(best);
  return true;
}

}  // namespace meshtrain::sched
