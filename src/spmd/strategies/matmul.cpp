// Strategies of matmul (graph/ops/matmul.cpp), C = op(A) op(B) with A
// [..., M, K] and B [K, N] shared over the batch or [..., K, N]: shard a
// batch dim of both, M of A, N of B, or K of both (each rank's product is a
// partial sum); or carry one operand's Partial(sum) through, the other
// replicated. rows_matmul (x [..., P], y [..., Q] -> x^T y): P of x, Q of
// y, or any leading row dim of both (partial sums). fp8_matmul and
// fp8_rows_matmul split as those do, their amaxes replicated (the whole
// tensor's, so every rank quantises as one does), but never carry a Partial
// through: quantising each rank's part of a sum is not quantising the sum.
// fp8_quantize splits as any elementwise op, its amax replicated.
#include "graph/attrs.h"
#include "spmd/strategies/families.h"

namespace meshtrain::spmd::strategies {

namespace {

std::vector<DimStrategy> matmul_strategies(const StrategyQuery& q, bool carry_partial) {
  const int ra = static_cast<int>(q.in[0].shape.rank()), rb = static_cast<int>(q.in[1].shape.rank());
  const bool ta = q.attrs.get(graph::attr::transpose_a), tb = q.attrs.get(graph::attr::transpose_b);
  const bool b_shared = rb == 2 && ra > 2;
  const int a_m = ta ? ra - 1 : ra - 2, a_k = ta ? ra - 2 : ra - 1;
  const int b_k = tb ? rb - 1 : rb - 2, b_n = tb ? rb - 2 : rb - 1;
  const int out_m = ra - 2, out_n = ra - 1;
  std::vector<DimStrategy> out;
  for (int d = 0; d < ra - 2; ++d) out.push_back({{S(d)}, {S(d), b_shared ? R() : S(d)}});
  out.push_back({{S(out_m)}, {S(a_m), R()}});
  out.push_back({{S(out_n)}, {R(), S(b_n)}});
  out.push_back({{P()}, {S(a_k), S(b_k)}});
  if (carry_partial) {
    out.push_back({{P()}, {P(), R()}});
    out.push_back({{P()}, {R(), P()}});
  }
  return out;
}

std::vector<DimStrategy> rows_matmul_strategies(const StrategyQuery& q, bool carry_partial) {
  const int last = static_cast<int>(q.in[0].shape.rank()) - 1;
  std::vector<DimStrategy> out{{{S(0)}, {S(last), R()}}, {{S(1)}, {R(), S(last)}}};
  for (int d = 0; d < last; ++d) out.push_back({{P()}, {S(d), S(d)}});
  if (carry_partial) {
    out.push_back({{P()}, {P(), R()}});
    out.push_back({{P()}, {R(), P()}});
  }
  return out;
}

// An FP8 GEMM's: the plain GEMM's without Partial inputs, the amaxes replicated.
std::vector<DimStrategy> with_replicated_amaxes(std::vector<DimStrategy> strategies) {
  for (DimStrategy& s : strategies) s.inputs.insert(s.inputs.end(), {R(), R()});
  return strategies;
}

}  // namespace

void add_matmul_rules(const AddRule& add) {
  add("matmul", [](const StrategyQuery& q) { return matmul_strategies(q, true); });
  add("rows_matmul", [](const StrategyQuery& q) { return rows_matmul_strategies(q, true); });
  add("fp8_matmul", [](const StrategyQuery& q) { return with_replicated_amaxes(matmul_strategies(q, false)); });
  add("fp8_quantize", [](const StrategyQuery& q) {  // elementwise, the amax the whole tensor's
    std::vector<DimStrategy> out;
    for (int d = 0; d < static_cast<int>(q.in[0].shape.rank()); ++d) out.push_back({{S(d)}, {S(d), R()}});
    return out;
  });
  add("fp8_rows_matmul",
      [](const StrategyQuery& q) { return with_replicated_amaxes(rows_matmul_strategies(q, false)); });
}

}  // namespace meshtrain::spmd::strategies
