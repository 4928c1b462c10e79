// Strategies of the optimizer ops (graph/ops/optimizer.cpp): AdamW is
// elementwise over a parameter, its gradient and its moments, so any dim
// sharded alike on the four (ZeRO / FSDP); lr and step stay replicated. The
// clipping coefficient, a nonlinear function of the whole norm, runs
// replicated (its one strategy).
#include "spmd/strategies/families.h"

namespace meshtrain::spmd::strategies {

void add_optimizer_rules(const AddRule& add) {
  add("clip_coefficient", [](const StrategyQuery&) { return std::vector<DimStrategy>{{{R()}, {R()}}}; });
  add("adamw", [](const StrategyQuery& q) {  // param, grad, m, v, lr, step -> param, m, v
    std::vector<DimStrategy> out;
    for (int d = 0; d < static_cast<int>(q.in[0].shape.rank()); ++d)
      out.push_back({{S(d), S(d), S(d)}, {S(d), S(d), S(d), S(d), R(), R()}});
    return out;
  });
}

}  // namespace meshtrain::spmd::strategies
