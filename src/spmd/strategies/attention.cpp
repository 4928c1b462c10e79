// Strategies of rope, attention and reorder_sequence (graph/ops/attention.cpp),
// on [B, T, H, D] operands: the batch, the heads (Megatron's tensor parallel
// attention), or the sequence (context parallelism). Heads split only
// evenly, so that each rank's query heads meet their own kv heads under
// grouped-query attention. Split by sequence, rope and attention take each
// row's position from where the rank's part starts (seq_first); attention
// then needs every key and value (all-gathered: the kv heads are few), and
// its backward leaves partial sums of dK and dV; or, with its `ring`
// attribute, takes them split as the queries are, and lowering runs it as
// ring steps (spmd/ring_attention.h).
#include "graph/sequence_order.h"
#include "spmd/strategies/families.h"

namespace meshtrain::spmd::strategies {

namespace {
// The part of the sequence input 0 holds.
graph::Attrs with_sequence_part(const LocalNode& n) {
  graph::Attrs local = n.attrs;
  local.set(graph::attr::seq_first, n.in[0].offset[1]);
  local.set(graph::attr::seq_total, n.global_in[0].shape[1]);
  return local;
}

// Shard(d) in and out for every dim but the sequence's.
std::vector<DimStrategy> all_but_sequence(const StrategyQuery& q) {
  std::vector<DimStrategy> out;
  for (int d = 0; d < static_cast<int>(q.in[0].shape.rank()); ++d)
    if (d != 1) out.push_back({{S(d)}, {S(d)}});
  out.push_back({{P()}, {P()}});
  return out;
}
}  // namespace

void add_attention_rules(const AddRule& add) {
  add("rope", [](const StrategyQuery&) {
    return std::vector<DimStrategy>{{{S(0)}, {S(0)}}, {{S(2)}, {S(2)}}, {{P()}, {P()}}, {{S(1)}, {S(1)}}};
  });
  add.localize("rope", with_sequence_part);
  add("attention", [](const StrategyQuery& q) {  // q, k, v -> out [B, T, Hq, D], lse [B, Hq, T]
    const bool ring = q.attrs.get_or(graph::attr::ring, false);
    return std::vector<DimStrategy>{{{S(0), S(0)}, {S(0), S(0), S(0)}},
                                    {{S(2), S(1)}, {S(2), S(2), S(2)}, {{1, 2}}},  // kv heads (input 1, dim 2) even
                                    {{S(1), S(2)}, {S(1), ring ? S(1) : R(), ring ? S(1) : R()}}};
  });
  add.localize("attention", with_sequence_part);
  add("attention_backward", [](const StrategyQuery& q) {  // q, k, v, out, lse, dout -> dq, dk, dv
    const bool ring = q.attrs.get_or(graph::attr::ring, false);
    return std::vector<DimStrategy>{{{S(0), S(0), S(0)}, {S(0), S(0), S(0), S(0), S(0), S(0)}},
                                    {{S(2), S(2), S(2)}, {S(2), S(2), S(2), S(2), S(1), S(2)}, {{1, 2}}},
                                    ring ? DimStrategy{{S(1), S(1), S(1)}, {S(1), S(1), S(1), S(1), S(2), S(1)}}
                                         : DimStrategy{{S(1), P(), P()}, {S(1), R(), R(), S(1), S(2), S(1)}}};
  });
  add.localize("attention_backward", with_sequence_part);
  // Into the load-balanced order, each rank picks its part of the whole
  // sequence; back to position order, the whole sequence.
  add("reorder_sequence", [](const StrategyQuery& q) {
    auto out = all_but_sequence(q);
    if (!q.attrs.get(graph::attr::inverse)) out.push_back({{S(1)}, {R()}});
    return out;
  });
  add.localize("reorder_sequence", [](const LocalNode& n) {
    graph::Attrs local = n.attrs;
    local.set(graph::attr::start, n.out[0].offset[1]);
    local.set(graph::attr::length, n.out[0].shape.dim(1));
    return local;
  });
}

}  // namespace meshtrain::spmd::strategies
