// Strategies of the optimizer ops (graph/ops/optimizer.cpp): AdamW is
// elementwise over a parameter, its gradient and its moments, so any dim
// sharded alike on the four (ZeRO / FSDP); lr, step and the norm that
// gates the update stay replicated. The
// clipping coefficient, a nonlinear function of the whole norm, runs
// replicated (its one strategy).
#include "spmd/strategies/families.h"

namespace meshtrain::spmd::strategies {

void add_optimizer_rules(const AddRule& add) {
  add("clip_coefficient", [](const StrategyQuery&) { return std::vector<DimStrategy>{{{R()}, {R()}}}; });
  add("adamw", [](const StrategyQuery& q) {  // param, grad, m, v, lr, step [, apply_if_finite] -> param, m, v
    std::vector<DimStrategy> out;
    for (int d = 0; d < static_cast<int>(q.in[0].shape.rank()); ++d) {
      DimStrategy s{{S(d), S(d), S(d)}, {S(d), S(d), S(d), S(d), R(), R()}};
      if (q.in.size() == 7) s.inputs.push_back(R());
      out.push_back(std::move(s));
    }
    return out;
  });
}

}  // namespace meshtrain::spmd::strategies
