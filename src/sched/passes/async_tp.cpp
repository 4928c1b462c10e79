#include "sched/passes/async_tp.h"

#include <algorithm>
#include <map>
#include <optional>

#include "core/error.h"
#include "graph/builder.h"
#include "graph/op_registry.h"
#include "sharding/layout.h"

namespace meshtrain::sched {

namespace {

namespace attr = graph::attr;
using graph::NodeId;
using graph::ValueId;

// Where a collective over the tp dim splits its tensor: dim `dim` in `size`
// equal chunks, this rank's the one at `index`.
struct Split {
  int dim = -1;
  int64_t size = 0, index = 0;
  std::vector<int64_t> group;
};

// Whether a mesh dim other than m also splits tensor dim `dim` in `l` (then
// the chunks along it are not simply the group's).
bool others_split(const sharding::Layout& l, int m, int dim) {
  for (size_t d = 0; d < l.placements.size(); ++d)
    if (static_cast<int>(d) != m && l.placements[d].is_sharding() && l.placements[d].dim == dim) return true;
  return false;
}

// The split of an all_gather (gather = true: S(d) to R) or reduce_scatter
// (P(sum) to S(d)) over the tp dim alone, of equal chunks; nullopt for any
// other collective.
std::optional<Split> tp_split(const graph::Graph& g, const graph::Node& start, const AsyncTpOptions& o, bool gather) {
  if (start.op->name != (gather ? "all_gather" : "reduce_scatter")) return std::nullopt;
  if (start.attrs.get(attr::mesh_dims) != std::vector<int64_t>{o.tp_mesh_dim} || start.attrs.has("member_blocks"))
    return std::nullopt;
  const auto before = sharding::Layout::parse(start.attrs.get(attr::layout_before), o.mesh_ndim);
  const auto after = sharding::Layout::parse(start.attrs.get(attr::layout_after), o.mesh_ndim);
  const auto m = static_cast<size_t>(o.tp_mesh_dim);
  const sharding::Placement& split = gather ? before.placements[m] : after.placements[m];
  const sharding::Placement& whole = gather ? after.placements[m] : before.placements[m];
  if (split.kind != sharding::Placement::Kind::shard) return std::nullopt;
  if (gather ? !whole.is_replicate() : !(whole.is_partial() && whole.reduce == comm::ReduceOp::sum))
    return std::nullopt;
  if (others_split(before, o.tp_mesh_dim, split.dim) || others_split(after, o.tp_mesh_dim, split.dim))
    return std::nullopt;
  Split s{split.dim, 0, 0, start.attrs.get(attr::group)};
  s.size = static_cast<int64_t>(s.group.size());
  const auto me = std::find(s.group.begin(), s.group.end(), o.rank);
  MT_ASSERT(me != s.group.end(), "async_tp: rank {} is not in the group of its own {}", o.rank, start.op->name);
  s.index = me - s.group.begin();
  // Equal chunks, and a row dim of every GEMM (not the contraction's, the last).
  const Shape& chunk = g.value(gather ? start.inputs[0] : start.outputs[0]).info.shape;
  const Shape& whole_shape = g.value(gather ? start.outputs[0] : start.inputs[0]).info.shape;
  if (s.dim >= static_cast<int>(chunk.rank()) - 1 || whole_shape[s.dim] != s.size * chunk[s.dim]) return std::nullopt;
  return s;
}

// The one wait node that completes `start`'s collective.
NodeId wait_of(const graph::Graph& g, const graph::Node& start) {
  const std::vector<NodeId> users = g.users(start.outputs[0]);
  MT_ASSERT(users.size() == 1 && g.node(users[0]).op->is_wait, "async_tp: a {} not waited on once", start.op->name);
  return users[0];
}

bool is_gemm(const graph::Node& n) { return n.op->name == "matmul" || n.op->name == "fp8_matmul"; }
// A GEMM of a weight (a matrix) whose every leading dim of the left operand is a row: cut on any of them.
bool rows_of_left(const graph::Graph& g, const graph::Node& n) {
  return is_gemm(n) && !n.attrs.get_or(attr::transpose_a, false) && g.value(n.inputs[1]).info.shape.rank() == 2;
}
bool is_graph_output(const graph::Graph& g, ValueId v) {
  return std::find(g.outputs().begin(), g.outputs().end(), v) != g.outputs().end();
}

// Positions in the order, for "is this value defined before that node".
std::map<NodeId, size_t> positions(const graph::Graph& g) {
  std::map<NodeId, size_t> at;
  for (size_t i = 0; i < g.order().size(); ++i) at[g.order()[i]] = i;
  return at;
}

bool defined_before(const graph::Graph& g, const std::map<NodeId, size_t>& at, ValueId v, size_t position) {
  const NodeId p = g.value(v).producer;
  return !p.valid() || at.at(p) < position;
}

struct Rewrite {
  graph::Graph& g;
  const AsyncTpOptions& options;
  const Split& split;
  int64_t chunk_rows = 0;  // along split.dim

  ValueId rows(ValueId whole, int64_t c) {
    return graph::Builder(g).slice(whole, split.dim, c * chunk_rows, chunk_rows);
  }

  // `v` sent to the rank `distance` places on in the group while the tensor of the rank as many back arrives.
  ValueId shift(ValueId v, int64_t distance) {
    return graph::Builder(g).ring_shift(v, options.tp_mesh_dim, split.group, distance);
  }

  // Σ terms in order, a low-precision dtype in f32 rounded once: add_n, as comm::reduce_rows sums.
  ValueId sum_in_order(const std::vector<ValueId>& terms) { return g.only_output(g.add_node("add_n", terms)); }

  void remove(NodeId n) {
    if (!g.node(n).removed) g.remove_node(n);
  }
  void remove_collective(NodeId start, NodeId wait) {
    remove(wait);
    remove(start);
  }
};

// --- all_gather -> GEMMs ---------------------------------------------------

// A reader of the gathered value that can run on its row chunks: a GEMM
// with it as the rows of its left operand, its chunks' outputs then
// concatenated. (A weight gradient, rows_matmul, sums over the rows: cut,
// its partial sums would be rounded apart, so it reads the whole.)
bool chunkable(const graph::Graph& g, const graph::Node& reader, ValueId gathered) {
  return reader.outputs.size() == 1 && rows_of_left(g, reader) && reader.inputs[0] == gathered &&
         std::count(reader.inputs.begin(), reader.inputs.end(), gathered) == 1;
}

// The reader run on a chunk of the gathered value. `reader` is a copy: the
// graph grows (and its nodes move) meanwhile.
ValueId run_on_chunk(graph::Graph& g, const graph::Node reader, ValueId chunk) {
  std::vector<ValueId> inputs = reader.inputs;
  inputs[0] = chunk;
  return g.only_output(g.add_node(reader.op->name, inputs, reader.attrs));
}

// An amax of this rank's part of the gathered value (a shard_locally over
// tp, as propagation splits an FP8 operand's amax) taken of the rank's own
// chunk instead: the same partial max over the same group, the whole
// tensor's once all-reduced, and no longer waiting for the gather (which
// the FP8 GEMMs' scales then would).
bool amax_of_own_chunk(graph::Graph& g, ValueId gathered, ValueId mine, const AsyncTpOptions& options) {
  bool changed = false;
  for (NodeId n : g.users(gathered)) {
    const graph::Node& part = g.node(n);
    if (part.op->name != "shard_locally" ||
        part.attrs.get(attr::mesh_dims) != std::vector<int64_t>{options.tp_mesh_dim})
      continue;
    const ValueId piece = part.outputs[0];
    const std::vector<NodeId> amaxes = g.users(piece);
    if (amaxes.empty() ||
        !std::all_of(amaxes.begin(), amaxes.end(), [&](NodeId a) { return g.node(a).op->name == "amax"; }))
      continue;
    for (NodeId a : amaxes) {
      const graph::InsertBefore here(g, a);
      const graph::Node old = g.node(a);
      g.replace_uses(old.outputs[0], g.only_output(g.add_node("amax", {mine}, old.attrs)));
      g.remove_node(a);
    }
    g.remove_node(n);
    changed = true;
  }
  return changed;
}

bool rewrite_gather(graph::Graph& g, NodeId start_id, const Split& split, const AsyncTpOptions& options) {
  const graph::Node start = g.node(start_id);
  const NodeId wait = wait_of(g, start);
  const ValueId gathered = g.node(wait).outputs[0], mine = start.inputs[0];
  const bool amax_moved = amax_of_own_chunk(g, gathered, mine, options);
  const std::vector<NodeId> readers = g.users(gathered);
  if (readers.empty()) {
    if (is_graph_output(g, gathered)) return amax_moved;
    g.remove_node(wait);  // the amax was all that read it
    g.remove_node(start_id);
    return true;
  }
  const auto at = positions(g);
  const size_t first = at.at(readers.front());
  std::vector<NodeId> chunked;
  for (NodeId n : readers) {
    const graph::Node& reader = g.node(n);
    const bool ready = std::all_of(reader.inputs.begin(), reader.inputs.end(),
                                   [&](ValueId v) { return v == gathered || defined_before(g, at, v, first); });
    if (chunkable(g, reader, gathered) && ready) chunked.push_back(n);
  }
  if (chunked.empty()) return amax_moved;

  Rewrite r{g, options, split, g.value(mine).info.shape[split.dim]};
  const int64_t n = split.size, i = split.index;
  std::vector<ValueId> chunks(static_cast<size_t>(n));
  std::map<NodeId, ValueId> replaced;  // reader -> its output computed from the chunks
  ValueId whole;                       // the chunks concatenated, for the other readers
  {
    graph::InsertBefore here(g, readers.front());
    std::map<NodeId, std::vector<ValueId>> parts;  // per reader, its output's chunks
    chunks[static_cast<size_t>(i)] = mine;
    for (int64_t k = 0; k < n; ++k) {
      // The next chunk moves while this one's GEMMs run.
      if (k + 1 < n) chunks[static_cast<size_t>((i - k - 1 + n) % n)] = r.shift(mine, k + 1);
      const auto c = static_cast<size_t>((i - k + n) % n);
      for (NodeId reader : chunked) {
        std::vector<ValueId>& p = parts[reader];
        p.resize(static_cast<size_t>(n));
        p[c] = run_on_chunk(g, g.node(reader), chunks[c]);
      }
    }
    for (NodeId reader : chunked) replaced[reader] = graph::Builder(g).concat(parts.at(reader), split.dim);
    if (chunked.size() < readers.size() || is_graph_output(g, gathered))
      whole = graph::Builder(g).concat(chunks, split.dim);
  }
  for (const auto& [reader, out] : replaced) {
    g.replace_uses(g.node(reader).outputs[0], out);
    g.remove_node(reader);
  }
  if (whole.valid()) g.replace_uses(gathered, whole);
  r.remove_collective(start_id, wait);
  return true;
}

// --- GEMMs -> reduce_scatter -----------------------------------------------

// Whether `v`'s rows can be computed chunk by chunk: a GEMM's with its rows
// on the left, or a sum of such, each read only where it is summed.
bool row_computable(const graph::Graph& g, ValueId v) {
  const NodeId p = g.value(v).producer;
  if (!p.valid() || g.users(v).size() != 1 || is_graph_output(g, v)) return false;
  const graph::Node& node = g.node(p);
  if (rows_of_left(g, node)) return true;
  return node.op->name == "add" && g.value(node.inputs[0]).info == g.value(node.inputs[1]).info &&
         (row_computable(g, node.inputs[0]) || row_computable(g, node.inputs[1]));
}

// Chunk c of `v`'s rows, computed from the chunk of its GEMMs' left
// operands; `dead` collects the nodes the whole `v` took.
ValueId rows_computed(Rewrite& r, ValueId v, int64_t c, std::vector<NodeId>& dead) {
  graph::Graph& g = r.g;
  if (!row_computable(g, v)) return r.rows(v, c);
  const NodeId p = g.value(v).producer;
  const graph::Node node = g.node(p);
  dead.push_back(p);
  if (node.op->name == "add") {  // the terms in order, so that every rank builds the same graph
    const ValueId a = rows_computed(r, node.inputs[0], c, dead), b = rows_computed(r, node.inputs[1], c, dead);
    return graph::Builder(g).add(a, b);
  }
  std::vector<ValueId> inputs = node.inputs;
  inputs[0] = r.rows(inputs[0], c);
  return g.only_output(g.add_node(node.op->name, inputs, node.attrs));
}

bool rewrite_scatter(graph::Graph& g, NodeId start_id, const Split& split, const AsyncTpOptions& options) {
  const graph::Node start = g.node(start_id);
  const ValueId partial = start.inputs[0];
  if (!row_computable(g, partial)) return false;
  const NodeId wait = wait_of(g, start);
  Rewrite r{g, options, split, g.value(start.outputs[0]).info.shape[split.dim]};
  graph::InsertBefore here(g, start_id);
  const int64_t n = split.size, i = split.index;
  std::vector<ValueId> from(static_cast<size_t>(n));  // the partial sums of this rank's chunk, by the rank computing
  std::vector<NodeId> dead;
  // Each other rank's chunk first, sent while the next is computed; this rank's own last.
  for (int64_t k = 1; k < n; ++k)
    from[static_cast<size_t>((i - k + n) % n)] = r.shift(rows_computed(r, partial, (i + k) % n, dead), k);
  from[static_cast<size_t>(i)] = rows_computed(r, partial, i, dead);
  g.replace_uses(g.node(wait).outputs[0], r.sum_in_order(from));
  r.remove_collective(start_id, wait);
  // The whole partial's nodes, each once nothing reads it.
  for (bool removed = true; removed;) {
    removed = false;
    for (NodeId d : dead)
      if (!g.node(d).removed && g.users(g.node(d).outputs[0]).empty()) {
        g.remove_node(d);
        removed = true;
      }
  }
  return true;
}

}  // namespace

bool async_tp(graph::Graph& g, const AsyncTpOptions& options) {
  MT_ASSERT(options.tp_mesh_dim >= 0 && options.tp_mesh_dim < options.mesh_ndim && options.rank >= 0,
            "async_tp: tp mesh dim {} of {}, rank {}", options.tp_mesh_dim, options.mesh_ndim, options.rank);
  bool changed = false;
  const std::vector<NodeId> order = g.order();  // the rewrites add nodes; the collectives are these
  for (NodeId n : order) {
    if (g.node(n).removed) continue;
    if (const auto gather = tp_split(g, g.node(n), options, true))
      changed |= rewrite_gather(g, n, *gather, options);
    else if (const auto scatter = tp_split(g, g.node(n), options, false))
      changed |= rewrite_scatter(g, n, *scatter, options);
  }
  return changed;
}

}  // namespace meshtrain::sched
