#include "graph/op_registry.h"

#include "core/error.h"
#include "core/name_registry.h"
#include "graph/ops/families.h"
#include "graph/ops/op_support.h"

namespace meshtrain::graph {

namespace {

// Never destroyed: graphs hold pointers to its OpDefs past static destruction.
NameRegistry<OpDef>& registry() {
  static auto* r = [] {
    auto* reg = new NameRegistry<OpDef>;
    std::vector<OpDef> defs;
    for (auto add : {ops::add_elementwise_ops, ops::add_matmul_ops, ops::add_reduction_ops, ops::add_shape_ops,
                     ops::add_embedding_ops, ops::add_loss_ops, ops::add_attention_ops, ops::add_optimizer_ops,
                     ops::add_moe_ops, ops::add_collective_ops})
      add(defs);
    for (OpDef& d : defs) {
      const std::string name = d.name;
      // The built-in ops, before any of the caller's (register_op): a clash is ours.
      const bool added = reg->add(name, std::move(d));
      MT_ASSERT(added, "built-in op '{}' is defined twice", name);
    }
    return reg;
  }();
  return *r;
}

}  // namespace

ValueInfos value_infos(const Graph& g, const std::vector<ValueId>& values) {
  ValueInfos out;
  out.reserve(values.size());
  for (ValueId v : values) out.push_back(g.value(v).info);
  return out;
}

double op_flops(const OpDef& op, const ValueInfos& in, const ValueInfos& out, const Attrs& attrs) {
  return op.flops ? op.flops(in, out, attrs) : 0.0;
}

double op_bytes(const OpDef& op, const ValueInfos& in, const ValueInfos& out, const Attrs& attrs) {
  if (op.is_view) return 0;
  if (op.bytes) return op.bytes(in, out, attrs);
  double total = 0;
  for (const ValueInfo& v : in) total += ops::bytes_of(v);
  for (const ValueInfo& v : out) total += ops::bytes_of(v);
  return total;
}

const OpDef& find_op(const std::string& name) {
  const OpDef* op = registry().find(name);
  if (!op) throw InvalidArgument(fmt::format("unknown op '{}'; registered ops: {}", name, registry().names()));
  return *op;
}

std::vector<std::string> registered_op_names() { return registry().name_list(); }

void register_op(OpDef op) {
  MT_CHECK(!op.name.empty() && static_cast<bool>(op.infer), "register_op: an op needs a name and a shape rule (infer)");
  MT_CHECK(op.num_inputs >= 0 || op.num_inputs == OpDef::kVariadic, "register_op: op '{}' has {} inputs", op.name,
           op.num_inputs);
  const std::string name = op.name;
  MT_CHECK(registry().add(name, std::move(op)), "register_op: an op named '{}' is already registered", name);
}

}  // namespace meshtrain::graph
