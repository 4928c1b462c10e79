// Strategies of the embedding ops (graph/ops/embedding.cpp): a lookup of
// sharded ids gives rows sharded alike; a table sharded by columns gives
// every row's columns sharded alike. The table's gradient, summed over the
// ids, is a partial sum when the ids are sharded, and sharded by columns
// when the incoming gradient is.
#include "spmd/strategies/families.h"

namespace meshtrain::spmd::strategies {

void add_embedding_rules(const AddRule& add) {
  add("embedding", [](const StrategyQuery& q) {  // table [V, D], ids [...] -> [..., D]
    const int ids_rank = static_cast<int>(q.in[1].shape.rank());
    std::vector<DimStrategy> out;
    for (int d = 0; d < ids_rank; ++d) out.push_back({{S(d)}, {R(), S(d)}});
    out.push_back({{S(ids_rank)}, {S(1), R()}});
    out.push_back({{P()}, {P(), R()}});
    return out;
  });
  add("embedding_backward", [](const StrategyQuery& q) {  // ids [...], dout [..., D] -> dtable [V, D]
    const int ids_rank = static_cast<int>(q.in[0].shape.rank());
    std::vector<DimStrategy> out;
    for (int d = 0; d < ids_rank; ++d) out.push_back({{P()}, {S(d), S(d)}});
    out.push_back({{S(1)}, {R(), S(ids_rank)}});
    out.push_back({{P()}, {R(), P()}});
    return out;
  });
}

}  // namespace meshtrain::spmd::strategies
