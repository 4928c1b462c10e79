// Strategies of the ops that move elements (graph/ops/shape.cpp): transpose
// carries a shard to the swapped dim; slice, its backward and concat keep
// any dim sharded but the one they cut or join. All of them are linear, so
// Partial(sum) passes through.
#include "graph/attrs.h"
#include "spmd/strategies/families.h"

namespace meshtrain::spmd::strategies {

namespace {
// Every tensor dim but `skip` sharded alike on every operand, and P -> P.
std::vector<DimStrategy> shard_all_but(const StrategyQuery& q, int64_t skip) {
  std::vector<DimStrategy> out;
  for (int d = 0; d < static_cast<int>(q.out[0].shape.rank()); ++d)
    if (d != skip) out.push_back({{S(d)}, std::vector<Placement>(q.in.size(), S(d))});
  out.push_back({{P()}, std::vector<Placement>(q.in.size(), P())});
  return out;
}
}  // namespace

void add_shape_rules(const AddRule& add) {
  add("transpose", [](const StrategyQuery& q) {
    const auto d0 = static_cast<int>(q.attrs.get(graph::attr::dim0)), d1 = static_cast<int>(q.attrs.get(graph::attr::dim1));
    std::vector<DimStrategy> out;
    for (int d = 0; d < static_cast<int>(q.in[0].shape.rank()); ++d)
      out.push_back({{S(d == d0 ? d1 : d == d1 ? d0 : d)}, {S(d)}});
    out.push_back({{P()}, {P()}});
    return out;
  });
  for (const char* op : {"slice", "slice_backward", "concat"})
    add(op, [](const StrategyQuery& q) { return shard_all_but(q, q.attrs.get(graph::attr::dim)); });
}

}  // namespace meshtrain::spmd::strategies
