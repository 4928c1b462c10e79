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

// reshape: input dim d_in keeps its shard in output dim d_out when the dims
// before them hold the same number of elements and d_in maps to d_out whole,
// or splits into d_out and dims after it (then d_out must split evenly, so
// each rank's part is whole rows of the split), or merges with dims after it
// into d_out (then d_in must split evenly). Partial sums pass through.
std::vector<DimStrategy> reshape_strategies(const StrategyQuery& q) {
  const Shape& in = q.in[0].shape;
  const Shape& out = q.out[0].shape;
  std::vector<DimStrategy> result;
  int64_t in_prefix = 1;
  for (size_t d_in = 0; d_in < in.rank(); in_prefix *= in[d_in], ++d_in) {
    if (in[d_in] <= 1) continue;  // nothing to shard
    int64_t out_prefix = 1;
    for (size_t d_out = 0; d_out < out.rank() && out_prefix <= in_prefix; out_prefix *= out[d_out], ++d_out) {
      if (out_prefix != in_prefix || out[d_out] <= 1) continue;
      const int a = static_cast<int>(d_in), b = static_cast<int>(d_out);
      if (in[d_in] == out[d_out])
        result.push_back({{S(b)}, {S(a)}});
      else if (in[d_in] % out[d_out] == 0)
        result.push_back({{S(b)}, {S(a)}, {{0, a, in[d_in] / out[d_out]}}});
      else if (out[d_out] % in[d_in] == 0)
        result.push_back({{S(b)}, {S(a)}, {{0, a, 1}}});
      break;
    }
  }
  result.push_back({{P()}, {P()}});
  return result;
}

graph::Attrs with_local_shape(const LocalNode& n) {
  graph::Attrs local = n.attrs;
  local.set(graph::attr::shape, n.out[0].shape.dims());
  return local;
}

void add_shape_rules(const AddRule& add) {
  add("reshape", reshape_strategies);
  add.localize("reshape", with_local_shape);
  add("transpose", [](const StrategyQuery& q) {
    const auto d0 = static_cast<int>(q.attrs.get(graph::attr::dim0)),
               d1 = static_cast<int>(q.attrs.get(graph::attr::dim1));
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
