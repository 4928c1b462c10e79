#include "spmd/lower.h"

#include <fmt/ranges.h>

#include <optional>
#include <set>
#include <tuple>

#include "core/error.h"
#include "graph/builder.h"
#include "sharding/local_chunk.h"
#include "sharding/redistribute.h"
#include "spmd/ring_attention.h"

namespace meshtrain::spmd {

namespace {

struct Lowering {
  const graph::Graph& g;
  sharding::Planner& planner;
  const sharding::DeviceMesh& mesh;
  std::vector<int> coord;
  LowerOptions options;
  LoweredGraph out;
  std::map<std::pair<graph::ValueId, std::string>, graph::ValueId>
      kept;  // (parameter or scalar, layout) -> redistributed
  // Resharding after forward, what one stretch of backward has gathered: a
  // block's recomputed forward (activation checkpointing) and its backward
  // share each weight's gather, as FSDP unshards a block once for both.
  std::map<std::pair<graph::ValueId, std::string>, graph::ValueId> gathered_in_backward;
  // (experts of ragged rows, layout) -> its local value there.
  std::map<std::pair<graph::ValueId, std::string>, graph::ValueId> experts_in_layout;
  std::set<graph::ValueId> ragged_experts;

  void note_layout(graph::ValueId v, const Layout& l, graph::ValueId local) {
    if (ragged_experts.count(v)) experts_in_layout.emplace(std::make_pair(v, l.to_string()), local);
  }
  // An all_to_all of ragged rows: its experts before and after, where both are known.
  std::optional<std::pair<graph::ValueId, graph::ValueId>> ragged_inputs(graph::ValueId v,
                                                                         const sharding::PlanStep& step) const {
    const auto rows = options.ragged_rows.find(v);
    if (rows == options.ragged_rows.end() || step.collective != comm::OpType::all_to_all) return std::nullopt;
    const auto before = experts_in_layout.find({rows->second, step.before.to_string()});
    const auto after = experts_in_layout.find({rows->second, step.after.to_string()});
    if (before == experts_in_layout.end() || after == experts_in_layout.end()) return std::nullopt;
    return std::make_pair(before->second, after->second);
  }

  // A parameter, or a parameter's copy in another dtype (a cast of one, or
  // its FP8 quantisation: what FSDP gathers in FP8).
  bool is_weight(graph::ValueId v) const {
    const graph::Value& val = g.value(v);
    if (val.kind == graph::ValueKind::parameter) return true;
    if (!val.producer.valid()) return false;
    const graph::Node& p = g.node(val.producer);
    if (p.op->name == "fp8_quantize") return is_weight(p.inputs[0]);
    return p.op->name == "cast" && g.value(p.inputs[0]).kind == graph::ValueKind::parameter;
  }

  Shape local_shape(const Shape& global, const Layout& l) const {
    return sharding::local_chunk(global, l, mesh, coord).shape;
  }

  // This rank's group over `dims`: the ranks that share its coordinates on
  // the other mesh dims, row-major over `dims`.
  std::vector<int64_t> group(const std::vector<int>& dims) const { return mesh.group_ranks(mesh.rank_at(coord), dims); }

  // `local` (global value `v`'s local value in layout `have`) redistributed
  // to `want`, one node per plan step. A scalar (an FP8 amax, a norm) is
  // redistributed once for all its readers.
  graph::ValueId redistribute(graph::ValueId v, graph::ValueId local, const Layout& have, const Layout& want) {
    if (have == want) return local;
    // Where a redistribution is kept for later readers: a scalar's always, a
    // weight's as FSDP's resharding says; others are redone per reader.
    std::map<std::pair<graph::ValueId, std::string>, graph::ValueId>* memo = nullptr;
    if (g.value(v).info.shape.rank() == 0)
      memo = &kept;
    else if (is_weight(v) && (!options.reshard_after_forward || out.graph.phase() == graph::Phase::backward))
      memo = options.reshard_after_forward ? &gathered_in_backward : &kept;
    if (memo == nullptr) return redistribute_now(v, local, have, want);
    const auto key = std::make_pair(v, want.to_string());
    if (const auto it = memo->find(key); it != memo->end()) return it->second;
    return (*memo)[key] = redistribute_now(v, local, have, want);
  }

  graph::ValueId redistribute_now(graph::ValueId v, graph::ValueId local, const Layout& have, const Layout& want) {
    note_layout(v, have, local);
    const graph::ValueInfo& info = g.value(v).info;
    const auto plan = planner.plan(info.shape, dtype_size(info.dtype), have, want);
    graph::Builder b(out.graph);
    for (const sharding::PlanStep& step : plan->steps) {
      int group_size = 1;
      for (int m : step.mesh_dims) group_size *= mesh.size(m);
      if (group_size == 1) continue;  // a one-rank group: a relabelling
      std::vector<int64_t> dims(step.mesh_dims.begin(), step.mesh_dims.end());
      graph::Attrs attrs{graph::attr::shape(local_shape(info.shape, step.after).dims()),
                         graph::attr::mesh_dims(dims),
                         graph::attr::group(group(step.mesh_dims)),
                         graph::attr::layout_before(step.before.to_string()),
                         graph::attr::layout_after(step.after.to_string()),
                         graph::attr::global_shape(info.shape.dims()),
                         graph::attr::comm_bytes(step.bytes)};
      if (!step.collective) {
        local = b.op("shard_locally", {local}, attrs);
        continue;
      }
      // Started here, waited on at once; sched's sink_waits moves the wait to where the result is first read.
      const sharding::StepBuffers need = sharding::step_buffers(info.shape, step, mesh, coord);
      attrs.set(graph::attr::buffer_elements, need.buffer_elements);
      std::vector<graph::ValueId> inputs{local};
      if (const auto experts = ragged_inputs(v, step)) {  // only the rows that carry tokens: ~1 / group size
        inputs.insert(inputs.end(), {experts->first, experts->second});
        const graph::Node& producer = g.node(g.value(options.ragged_rows.at(v)).producer);
        attrs.set(graph::attr::n_experts, producer.attrs.get(graph::attr::n_experts));
        attrs.set(graph::attr::comm_bytes, step.bytes / group_size);
      }
      const graph::NodeId start = out.graph.add_node(std::string(comm::op_type_name(*step.collective)), inputs, attrs);
      std::vector<graph::ValueId> wait_inputs = out.graph.node(start).outputs;
      if (need.reads_input_until_done) wait_inputs.push_back(local);
      local = b.op("wait", wait_inputs);
    }
    note_layout(v, want, local);
    return local;
  }
};

}  // namespace

LoweredGraph lower(const graph::Graph& g, const Sharding& s, sharding::Planner& planner, int rank,
                   const LowerOptions& options) {
  const sharding::DeviceMesh& mesh = planner.mesh();
  MT_CHECK(rank >= 0 && rank < mesh.num_ranks(), "lower: rank {} is outside the mesh {} of {} ranks", rank,
           mesh.describe(), mesh.num_ranks());
  Lowering l{g, planner, mesh, mesh.coordinate(rank), options, {}, {}, {}, {}, {}};
  for (const auto& [rows, experts] : options.ragged_rows) l.ragged_experts.insert(experts);
  l.out.rank = rank;
  graph::Graph& local = l.out.graph;
  for (int i = 0; i < g.num_values(); ++i) {
    const graph::ValueId v(i);
    const graph::Value& val = g.value(v);
    if (val.kind == graph::ValueKind::intermediate) continue;
    const Shape shape = l.local_shape(val.info.shape, s.values.at(v));
    l.out.values[v] = val.kind == graph::ValueKind::input ? local.add_input(val.name, shape, val.info.dtype)
                                                          : local.add_parameter(val.name, shape, val.info.dtype);
  }
  for (graph::NodeId n : g.order()) {
    const graph::Node& node = g.node(n);
    const NodeSharding& ns = s.nodes.at(n);
    local.set_scope(node.scope);
    local.set_phase(node.phase);
    if (node.phase != graph::Phase::backward) l.gathered_in_backward.clear();
    std::vector<graph::ValueId> inputs;
    graph::ValueInfos global_in;
    std::vector<sharding::LocalChunk> in_chunks, out_chunks;
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      const graph::ValueId v = node.inputs[k];
      inputs.push_back(l.redistribute(v, l.out.values.at(v), s.values.at(v), ns.inputs[k]));
      global_in.push_back(g.value(v).info);
      in_chunks.push_back(sharding::local_chunk(global_in.back().shape, ns.inputs[k], mesh, l.coord));
    }
    for (size_t k = 0; k < node.outputs.size(); ++k)
      out_chunks.push_back(sharding::local_chunk(g.value(node.outputs[k]).info.shape, ns.outputs[k], mesh, l.coord));
    const graph::Attrs attrs = local_attrs({*node.op, node.attrs, global_in, in_chunks, out_chunks});
    std::vector<graph::ValueId> outputs;
    if (const auto ring = ring_place(node, ns, mesh, l.coord)) {
      graph::Builder b(local);
      outputs = expand_ring_attention(b, node, *ring, inputs, attrs);
    } else {
      outputs = local.node(local.add_node(node.op->name, inputs, attrs)).outputs;
    }
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      const graph::ValueId v = node.outputs[k], lv = outputs[k];
      const Shape& want = out_chunks[k].shape;
      MT_CHECK(local.value(lv).info.shape == want,
               "lower: node {} ({}) on rank {} computes output {} as {}, but its layout {} gives {} there", n.index,
               node.op->name, rank, k, local.value(lv).info.shape.to_string(), ns.outputs[k].to_string(),
               want.to_string());
      // A pinned value: redistributed from the node's output layout at once.
      l.note_layout(v, ns.outputs[k], lv);
      l.out.values[v] = l.redistribute(v, lv, ns.outputs[k], s.values.at(v));
      l.note_layout(v, s.values.at(v), l.out.values[v]);
    }
  }
  local.set_scope("");
  for (graph::ValueId v : g.outputs()) {  // in the global graph's order
    if (const graph::NodeId p = g.value(v).producer; p.valid()) {
      local.set_phase(g.node(p).phase);
      local.set_scope(g.node(p).scope);
    }
    local.add_output(l.redistribute(v, l.out.values.at(v), s.values.at(v), s.outputs.at(v)));
  }
  local.set_scope("");
  return std::move(l.out);
}

std::string to_text(const graph::Graph& g, const LoweredGraph& lowered, const Sharding& s) {
  std::map<graph::ValueId, std::string> notes;
  for (const auto& [global, local] : lowered.values) notes[local] = s.values.at(global).to_string();
  for (const auto& [n, ns] : s.nodes)
    if (!ns.has_rule)
      for (graph::ValueId v : g.node(n).outputs) notes[lowered.values.at(v)] += " (replicated: no strategy rule)";
  return graph::to_text(lowered.graph, notes);
}

std::string collective_summary(const graph::Graph& local, const sharding::DeviceMesh& mesh) {
  struct Total {
    int count = 0;
    double bytes = 0;
  };
  // (phase, op, mesh dims, group) -> total
  std::map<std::tuple<int, std::string, std::vector<int64_t>, std::vector<int64_t>>, Total> totals;
  Total all;
  for (graph::NodeId n : local.order()) {
    const graph::Node& node = local.node(n);
    if (!node.op->is_collective) continue;
    Total& t = totals[{static_cast<int>(node.phase), node.op->name, node.attrs.get(graph::attr::mesh_dims),
                       node.attrs.get(graph::attr::group)}];
    const double bytes = node.attrs.get(graph::attr::comm_bytes);
    t.count += 1;
    t.bytes += bytes;
    all.count += 1;
    all.bytes += bytes;
  }
  std::string text;
  for (const auto& [key, t] : totals) {
    const auto& [phase, op, dims, group] = key;
    std::vector<std::string> names;
    for (int64_t d : dims) names.push_back(mesh.names()[static_cast<size_t>(d)]);
    text +=
        fmt::format("# {:<9} {:<14} over {:<20} group {:<14} {:>4} x, {:>10.0f} bytes\n",
                    graph::phase_name(static_cast<graph::Phase>(phase)), op, fmt::format("{}", fmt::join(names, "+")),
                    fmt::format("{}", fmt::join(group, ",")), t.count, t.bytes);
  }
  text += fmt::format("# {} collectives, {:.0f} bytes\n", all.count, all.bytes);
  return text;
}

}  // namespace meshtrain::spmd
