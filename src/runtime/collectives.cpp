#include "runtime/collectives.h"

#include "core/error.h"
#include "graph/op_registry.h"

namespace meshtrain::runtime {

std::optional<CollectiveStep> collective_step(const graph::Node& node, const sharding::DeviceMesh& mesh) {
  if (!node.op->is_collective) return std::nullopt;
  CollectiveStep c;
  sharding::PlanStep& s = c.step;
  for (int64_t m : node.attrs.get(graph::attr::mesh_dims)) {
    MT_CHECK(m >= 0 && m < mesh.ndim(), "{} node: mesh dim {} is outside the mesh {}", node.op->name, m,
             mesh.describe());
    s.mesh_dims.push_back(static_cast<int>(m));
  }
  MT_CHECK(!s.mesh_dims.empty(), "{} node names no mesh dim", node.op->name);
  if (node.op->name == "ring_shift") {
    c.ring_shift = true;
    c.ring_distance = static_cast<int>(node.attrs.get_or(graph::attr::ring_distance, int64_t{1}));
    s.collective = comm::OpType::send;
    s.bytes = node.attrs.get(graph::attr::comm_bytes);
    return c;
  }
  s.before = sharding::Layout::parse(node.attrs.get(graph::attr::layout_before), mesh.ndim());
  s.after = sharding::Layout::parse(node.attrs.get(graph::attr::layout_after), mesh.ndim());
  s.from = s.before.placements[static_cast<size_t>(s.mesh_dims.front())];
  s.to = s.after.placements[static_cast<size_t>(s.mesh_dims.front())];
  if (node.op->name != "shard_locally") s.collective = comm::parse_op_type(node.op->name);
  s.bytes = node.attrs.get(graph::attr::comm_bytes);
  c.global_shape = Shape(node.attrs.get(graph::attr::global_shape));
  c.member_blocks = node.attrs.get_or(graph::attr::member_blocks, {});
  if (node.inputs.size() == 3) c.ragged_padding = node.attrs.get(graph::attr::n_experts);
  return c;
}

}  // namespace meshtrain::runtime
