// Strategies of the embedding ops (graph/ops/embedding.cpp): a lookup of
// sharded ids gives rows sharded alike; a table sharded by columns gives
// every row's columns sharded alike; a table sharded by rows (Megatron's
// vocab-parallel embedding) gives a partial sum: each rank looks up the ids
// its rows hold and zeros for the rest. The table's gradient, summed over the
// ids, is a partial sum when the ids are sharded, sharded by columns when
// the incoming gradient is, and by rows when each rank keeps its own rows'.
#include "graph/attrs.h"
#include "spmd/strategies/families.h"

namespace meshtrain::spmd::strategies {

graph::Attrs with_part_of_input0(const LocalNode& n, int dim) {
  graph::Attrs local = n.attrs;
  local.set(graph::attr::start, n.in[0].offset[static_cast<size_t>(dim)]);
  local.set(graph::attr::full_size, n.global_in[0].shape.dim(dim));
  return local;
}

void add_embedding_rules(const AddRule& add) {
  add("embedding", [](const StrategyQuery& q) {  // table [V, D], ids [...] -> [..., D]
    const int ids_rank = static_cast<int>(q.in[1].shape.rank());
    std::vector<DimStrategy> out;
    for (int d = 0; d < ids_rank; ++d) out.push_back({{S(d)}, {R(), S(d)}});
    out.push_back({{S(ids_rank)}, {S(1), R()}});
    out.push_back({{P()}, {S(0), R()}});
    out.push_back({{P()}, {P(), R()}});
    return out;
  });
  // The table's part on this rank: its first row and the whole table's rows.
  add.localize("embedding", [](const LocalNode& n) { return with_part_of_input0(n, 0); });
  add("embedding_backward", [](const StrategyQuery& q) {  // ids [...], dout [..., D] -> dtable [V, D]
    const int ids_rank = static_cast<int>(q.in[0].shape.rank());
    std::vector<DimStrategy> out;
    for (int d = 0; d < ids_rank; ++d) out.push_back({{P()}, {S(d), S(d)}});
    out.push_back({{S(1)}, {R(), S(ids_rank)}});
    out.push_back({{S(0)}, {R(), R()}});
    out.push_back({{P()}, {R(), P()}});
    return out;
  });
  add.localize("embedding_backward", [](const LocalNode& n) {  // this rank's rows of the gradient
    graph::Attrs local = n.attrs;
    local.set(graph::attr::vocab, n.out[0].shape.dim(0));
    local.set(graph::attr::start, n.out[0].offset[0]);
    return local;
  });
}

}  // namespace meshtrain::spmd::strategies
