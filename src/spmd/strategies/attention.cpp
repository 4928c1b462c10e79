// Strategies of rope and attention (graph/ops/attention.cpp), on
// [B, T, H, D] operands: the batch, or the heads (Megatron's tensor parallel
// attention). Heads split only evenly, so that each rank's query heads meet
// their own kv heads under grouped-query attention. The sequence is not
// split: rope's angle and the causal mask depend on the global position.
#include "spmd/strategies/families.h"

namespace meshtrain::spmd::strategies {

void add_attention_rules(const AddRule& add) {
  add("rope", [](const StrategyQuery&) {
    return std::vector<DimStrategy>{{{S(0)}, {S(0)}}, {{S(2)}, {S(2)}}, {{P()}, {P()}}};
  });
  add("attention", [](const StrategyQuery&) {  // q, k, v -> out [B, T, Hq, D], lse [B, Hq, T]
    return std::vector<DimStrategy>{{{S(0), S(0)}, {S(0), S(0), S(0)}},
                                    {{S(2), S(1)}, {S(2), S(2), S(2)}, {{1, 2}}}};  // kv heads (input 1, dim 2) even
  });
  add("attention_backward", [](const StrategyQuery&) {  // q, k, v, out, lse, dout -> dq, dk, dv
    return std::vector<DimStrategy>{{{S(0), S(0), S(0)}, {S(0), S(0), S(0), S(0), S(0), S(0)}},
                                    {{S(2), S(2), S(2)}, {S(2), S(2), S(2), S(2), S(1), S(2)}, {{1, 2}}}};
  });
}

}  // namespace meshtrain::spmd::strategies
