// Every differentiable op's backward rule against finite differences, driven
// by the op registry: an op with a backward rule and no case in the table
// below fails OpGradcheck.EveryDifferentiableOpHasACase.
//
// Each case builds a tiny graph (the op on small random inputs), takes the
// loss sum over outputs y of sum(y * r) with fixed random weights r, and
//  - in f64, compares autodiff's gradients with central finite differences
//    (the 4th-order five-point stencil) within kFdTolerance;
//  - in the case's second dtype (f32; bf16 for some casts), runs the same
//    graph on those kernels and compares its gradients with the f64 ones
//    within the case's tolerance, set from the measured error with a margin
//    of at most 10x (0 where the kernels are exact).
// Errors are max |g - ref| / max |ref| over each gradient tensor; inputs and
// weights are rounded to the second dtype, so both runs see the same numbers.
// Each case prints its errors and records them as test properties. Two rules
// this test found wrong are fixed (broadcast_scalar's shape) or refused
// (attention's log-sum-exp gradient), each with its case.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "graph/op_registry.h"
#include "runtime/executor.h"
#include "sched/schedule.h"
#include "test_util.h"

using namespace meshtrain;
using namespace meshtrain::graph;

namespace {

// f64 autodiff vs the five-point stencil (h = 1e-3): worst measured 3.2e-12
// (attention_two_query_blocks; most cases 1e-13 to 2e-12), the stencil's own
// rounding error, eps |loss| / h.
constexpr double kFdTolerance = 2e-11;

// An op input: a float tensor (random, differentiated; f64 in the f64 run and
// the case's dtype, or `dtype`, in the second), i64 ids or targets, or a
// fixed f64 count (cross_entropy's divisor; the op's rule gives it no gradient).
struct Input {
  enum Kind { kFloat, kIds, kCount };
  Shape shape;
  Kind kind = kFloat;
  std::optional<DType> dtype;  // kFloat: the second run's dtype when not the case's (a cast's source)
  std::vector<int64_t> ids;    // kIds
  double count = 0;            // kCount
};

Input x(Shape s, std::optional<DType> second_dtype = {}) { return {.shape = std::move(s), .dtype = second_dtype}; }
Input ids(Shape s, std::vector<int64_t> v) { return {.shape = std::move(s), .kind = Input::kIds, .ids = std::move(v)}; }
Input count(double n) { return {.shape = Shape{}, .kind = Input::kCount, .count = n}; }

using Outputs = std::vector<ValueId>;
// The op under test on the inputs (`t`: the run's float dtype); its outputs that the loss reads.
using BuildFn = std::function<Outputs(Builder& b, const std::vector<ValueId>& in, DType t)>;

struct Case {
  std::string op;     // the registered op it checks (its graph must contain a node of it)
  std::string label;  // what makes it differ from the op's other cases
  std::vector<Input> inputs;
  BuildFn build;
  double tolerance;  // second run vs f64, from measurement (see the file comment)
  DType dtype = DType::f32;
};

Outputs cast_to(Builder& b, const std::vector<ValueId>& in, DType t) { return {b.cast(in[0], t)}; }

Outputs matmul_case(Builder& b, const std::vector<ValueId>& in, bool ta, bool tb) {
  return {b.matmul(in[0], in[1], ta, tb)};
}

// a [.., M, K] (or [.., K, M] with ta) times b [.., K, N] (or [.., N, K] with tb).
Shape mm(std::vector<int64_t> batch, int64_t rows, int64_t cols, bool transposed) {
  batch.push_back(transposed ? cols : rows);
  batch.push_back(transposed ? rows : cols);
  return Shape(batch);
}

// u = 2^-24 = 6e-8, f32's unit roundoff: f32 tolerances are 3-7x the error
// measured (x86-64 with AVX-512, 2 OpenMP threads), 0 where f32 is exact.
// Mixture-of-experts cases: 2 groups of 3 tokens, each token's 2 of 3
// experts fixed (so that a finite difference never changes the routing),
// sorted in the graph by moe_sort; `capacity` 0.5 keeps one slot per expert
// and group, dropping the rest.
const std::vector<int64_t> kMoeExperts = {0, 2, 1, 0, 2, 1, 0, 1, 2, 0, 0, 2};
Input moe_experts() { return ids({2, 3, 2}, kMoeExperts); }
Builder::MoeSort moe_sorted(Builder& b, ValueId experts, double capacity = 0) {
  return b.moe_sort(experts, 3, capacity);
}

void add_moe_cases(std::vector<Case>& c) {
  c.push_back({"moe_route_weights",
               "of_softmax",  // the router's probabilities, renormalised over the chosen two; 8.6e-8
               {x({2, 3, 3}), moe_experts()},
               [](Builder& b, auto& in, DType) { return Outputs{b.moe_route_weights(b.softmax(in[0]), in[1])}; },
               3e-7});
  c.push_back({"moe_permute",
               "plain",  // 3.6e-8: each token's two rows' gradients summed
               {x({2, 3, 4}), moe_experts()},
               [](Builder& b, auto& in, DType) { return Outputs{b.moe_permute(in[0], moe_sorted(b, in[1]).order, 2)}; },
               1e-7});
  c.push_back({"moe_permute",
               "weighted",  // what moe_combine's backward runs; 5.2e-8
               {x({2, 3, 4}), moe_experts(), x({2, 3, 2})},
               [](Builder& b, auto& in, DType) {
                 return Outputs{b.op("moe_permute", {in[0], moe_sorted(b, in[1]).order, in[2]}, {attr::top_k(2)})};
               },
               1e-7});
  c.push_back(
      {"moe_combine",
       "weighted",  // 3.6e-8
       {x({2, 6, 4}), moe_experts(), x({2, 3, 2})},
       [](Builder& b, auto& in, DType) { return Outputs{b.moe_combine(in[0], moe_sorted(b, in[1]).order, in[2], 2)}; },
       1e-7});
  c.push_back({"moe_combine",
               "plain",  // what moe_permute's backward runs; exact (its backward copies rows)
               {x({2, 6, 4}), moe_experts()},
               [](Builder& b, auto& in, DType) {
                 return Outputs{b.op("moe_combine", {in[0], moe_sorted(b, in[1]).order}, {attr::top_k(2)})};
               },
               0});
  for (bool tb : {false, true})  // 5.7e-8 to 7.4e-8
    for (double capacity : {0.0, 0.5})
      c.push_back({"grouped_matmul",
                   fmt::format("{}{}", tb ? "nt" : "nn", capacity > 0 ? "_dropping" : ""),
                   {x({2, 6, 4}), x(tb ? Shape{3, 5, 4} : Shape{3, 4, 5}), moe_experts()},
                   [tb, capacity](Builder& b, auto& in, DType) {
                     return Outputs{b.grouped_matmul(in[0], in[1], moe_sorted(b, in[2], capacity).row_expert, tb)};
                   },
                   3e-7});
  // Expert parallelism's dispatch into 3 blocks of one expert each, and back: copies (exact).
  c.push_back({"moe_dispatch",
               "",
               {x({2, 6, 4}), moe_experts()},
               [](Builder& b, auto& in, DType) {
                 return Outputs{b.moe_dispatch(in[0], moe_sorted(b, in[1]).row_expert, 3, 3)};
               },
               0});
  c.push_back({"moe_undispatch",
               "",
               {x({3, 2, 6, 4}), moe_experts()},
               [](Builder& b, auto& in, DType) {
                 return Outputs{b.moe_undispatch(in[0], moe_sorted(b, in[1], 0.5).row_expert, 3, 3)};
               },
               0});
  c.push_back({"grouped_matmul",
               "dispatched",  // rows by block of experts, the padding dropped
               {x({3, 2, 6, 4}), x({3, 5, 4}), moe_experts()},
               [](Builder& b, auto& in, DType) {
                 const ValueId re = b.moe_dispatch_experts(moe_sorted(b, in[2]).row_expert, 3, 3);
                 return Outputs{b.grouped_matmul(in[0], in[1], re, true, 3)};
               },
               3e-7});
  c.push_back({"moe_router_stats",
               "",  // the picks take no gradient; the sums' copies theirs to every row: exact
               {x({2, 3, 3}), moe_experts()},
               [](Builder& b, auto& in, DType) { return Outputs{b.moe_router_stats(in[0], in[1])}; },
               0});
  c.push_back({"moe_aux_loss",
               "",  // both rows of the statistics; 2.7e-8
               {x({2, 3})},
               [](Builder& b, auto& in, DType) { return Outputs{b.moe_aux_loss(in[0], 0.25)}; },
               1e-7});
}

std::vector<Case> cases() {
  const std::vector<int64_t> targets = {3, 0, -100, 10, 7, -100};
  const std::vector<int64_t> batch_targets = {3, 0, -1, 10, 7, 2};  // ignore_index -1, count 9 given
  std::vector<Case> c = {
      // cast: the f64 run casts f64 to f64 (the identity); the second run
      // casts between the named dtypes, forward and back: exact.
      {"cast", "f32_to_f64", {x({2, 3}, DType::f32)}, cast_to, 0, DType::f64},
      {"cast", "f64_to_f32", {x({2, 3}, DType::f64)}, cast_to, 0, DType::f32},
      {"cast", "bf16_to_f64", {x({2, 3}, DType::bf16)}, cast_to, 0, DType::f64},
      {"cast", "f64_to_bf16", {x({2, 3}, DType::f64)}, cast_to, 0, DType::bf16},
      {"cast", "f32_to_bf16", {x({2, 3}, DType::f32)}, cast_to, 0, DType::bf16},
      {"cast", "bf16_to_f32", {x({2, 3}, DType::bf16)}, cast_to, 0, DType::f32},

      {"add", "", {x({3, 5}), x({3, 5})}, [](Builder& b, auto& in, DType) { return Outputs{b.add(in[0], in[1])}; }, 0},
      {"mul",
       "",  // measured 2.3e-8
       {x({3, 5}), x({3, 5})},
       [](Builder& b, auto& in, DType) { return Outputs{b.mul(in[0], in[1])}; },
       1e-7},
      {"scale",
       "",  // 2.6e-8
       {x({3, 5})},
       [](Builder& b, auto& in, DType) { return Outputs{b.scale(in[0], -0.7)}; },
       1e-7},
      {"broadcast_scalar",
       "",  // 9.6e-9: a sum of 12 weights
       {x({})},
       [](Builder& b, auto& in, DType) {
         return Outputs{b.broadcast_scalar(in[0], {3, 4})};
       },
       5e-8},
      {"silu", "", {x({3, 7})}, [](Builder& b, auto& in, DType) { return Outputs{b.silu(in[0])}; }, 5e-7},  // 1.0e-7
      {"swiglu",
       "",  // 7.1e-8
       {x({3, 5}), x({3, 5})},
       [](Builder& b, auto& in, DType) { return Outputs{b.swiglu(in[0], in[1])}; },
       3e-7},

      {"sum", "", {x({4, 3})}, [](Builder& b, auto& in, DType) { return Outputs{b.sum(in[0])}; }, 0},
      {"mean",
       "",  // 0 measured; one rounding of weight / 12 at most
       {x({4, 3})},
       [](Builder& b, auto& in, DType) { return Outputs{b.mean(in[0])}; },
       1e-7},
      {"softmax",
       "rank2",  // 7.1e-8
       {x({3, 7})},
       [](Builder& b, auto& in, DType) { return Outputs{b.softmax(in[0])}; },
       3e-7},
      {"softmax",
       "rank3",  // 7.1e-8
       {x({2, 3, 5})},
       [](Builder& b, auto& in, DType) { return Outputs{b.softmax(in[0])}; },
       3e-7},
      {"rms_norm",
       "rank2",  // 5.6e-8
       {x({5, 9}), x({9})},
       [](Builder& b, auto& in, DType) { return Outputs{b.rms_norm(in[0], in[1], 1e-5)}; },
       3e-7},
      {"rms_norm",
       "rank3",  // 7.1e-8
       {x({2, 3, 8}), x({8})},
       [](Builder& b, auto& in, DType) { return Outputs{b.rms_norm(in[0], in[1], 1e-5)}; },
       3e-7},

      {"reshape",
       "",
       {x({2, 3, 5})},
       [](Builder& b, auto& in, DType) {
         return Outputs{b.reshape(in[0], {5, 6})};
       },
       0},
      {"transpose",
       "rank3_0_2",
       {x({2, 3, 5})},
       [](Builder& b, auto& in, DType) { return Outputs{b.transpose(in[0], 0, 2)}; },
       0},
      {"transpose",
       "rank4_1_2",
       {x({2, 3, 4, 2})},
       [](Builder& b, auto& in, DType) { return Outputs{b.transpose(in[0], 1, 2)}; },
       0},
      {"slice", "dim0", {x({4, 5})}, [](Builder& b, auto& in, DType) { return Outputs{b.slice(in[0], 0, 1, 2)}; }, 0},
      {"slice",
       "dim_last",
       {x({2, 3, 5})},
       [](Builder& b, auto& in, DType) { return Outputs{b.slice(in[0], 2, 2, 3)}; },
       0},
      {"concat",
       "dim1_three",
       {x({3, 2}), x({3, 4}), x({3, 1})},
       [](Builder& b, auto& in, DType) {
         return Outputs{b.concat({in[0], in[1], in[2]}, 1)};
       },
       0},
      {"concat",
       "dim0_two",
       {x({1, 4}), x({2, 4})},
       [](Builder& b, auto& in, DType) {
         return Outputs{b.concat({in[0], in[1]}, 0)};
       },
       0},

      {"embedding",
       "repeated_ids",  // 3.2e-8: rows summed
       {x({5, 3}), ids({2, 3}, {4, 1, 4, 0, 2, 4})},
       [](Builder& b, auto& in, DType) { return Outputs{b.embedding(in[0], in[1])}; },
       1e-7},

      {"cross_entropy",
       "ignored_rows",  // 4.6e-8
       {x({6, 11}), ids({6}, targets)},
       [](Builder& b, auto& in, DType) { return Outputs{b.cross_entropy(in[0], in[1])}; },
       2e-7},
      {"cross_entropy",
       "batch_count",  // 4.8e-8
       {x({6, 11}), ids({6}, batch_targets), count(9)},
       [](Builder& b, auto& in, DType) { return Outputs{b.cross_entropy(in[0], in[1], -1, in[2])}; },
       2e-7},
      // row_max, sum_exp, pick and nll_mean: nll_mean's rule differentiates the logits through all of them.
      {"nll_mean",
       "ignored_rows",  // 4.6e-8
       {x({6, 11}), ids({6}, targets)},
       [](Builder& b, auto& in, DType) { return Outputs{b.cross_entropy_split(in[0], in[1])}; },
       2e-7},
      {"nll_mean",
       "batch_count",  // 4.8e-8
       {x({6, 11}), ids({6}, batch_targets), count(9)},
       [](Builder& b, auto& in, DType) { return Outputs{b.cross_entropy_split(in[0], in[1], -1, in[2])}; },
       2e-7},

      {"rope",
       "",  // 4.8e-8
       {x({2, 3, 2, 6})},
       [](Builder& b, auto& in, DType) { return Outputs{b.rope(in[0], 10000.0)}; },
       3e-7},
      {"rope",
       "inverse",  // what rope's backward runs; 6.9e-8
       {x({2, 3, 2, 6})},
       [](Builder& b, auto& in, DType) {
         return Outputs{b.op("rope", {in[0]}, {attr::theta(500.0), attr::inverse(true)})};
       },
       3e-7},
      {"attention",
       "gqa",  // 4 query heads over 2 key/value heads, 5 positions, head dim 3; 1.4e-7
       {x({2, 5, 4, 3}), x({2, 5, 2, 3}), x({2, 5, 2, 3})},
       [](Builder& b, auto& in, DType) { return Outputs{b.attention(in[0], in[1], in[2], 0.57)}; },
       5e-7},
      {"rope",
       "load_balanced",  // positions in context parallelism's order of 4 chunks
       {x({2, 8, 2, 6})},
       [](Builder& b, auto& in, DType) { return Outputs{b.rope(in[0], 10000.0, 4)}; },
       3e-7},
      {"attention",
       "load_balanced",  // queries in the order of 4 chunks, keys in position order
       {x({2, 8, 4, 3}), x({2, 8, 2, 3}), x({2, 8, 2, 3})},
       [](Builder& b, auto& in, DType) { return Outputs{b.attention(in[0], in[1], in[2], 0.57, 4)}; },
       5e-7},
      {"reorder_sequence",
       "into",
       {x({2, 8, 3})},
       [](Builder& b, auto& in, DType) { return Outputs{b.reorder_sequence(in[0], 4)}; },
       1e-7},
      {"reorder_sequence",
       "back",
       {x({2, 8, 3})},
       [](Builder& b, auto& in, DType) { return Outputs{b.reorder_sequence(in[0], 4, true)}; },
       1e-7},
      {"attention",
       "two_query_blocks",  // 65 positions: two 64-query blocks of the CPU kernel; 2.9e-7
       {x({1, 65, 2, 2}), x({1, 65, 1, 2}), x({1, 65, 1, 2})},
       [](Builder& b, auto& in, DType) { return Outputs{b.attention(in[0], in[1], in[2], 0.7)}; },
       1e-6},
  };
  // matmul: plain, batched and with weights shared over the batch, each transpose.
  // Measured 4.5e-8 to 4.8e-8 (2d), 5.5e-8 to 8.6e-8 (batched), 1.3e-7 (shared).
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const std::string t = std::string(ta ? "t" : "n") + (tb ? "t" : "n");
      c.push_back({"matmul",
                   "2d_" + t,
                   {x(mm({}, 3, 4, ta)), x(mm({}, 4, 5, tb))},
                   [ta, tb](Builder& b, auto& in, DType) { return matmul_case(b, in, ta, tb); },
                   2e-7});
      c.push_back({"matmul",
                   "batched_" + t,
                   {x(mm({2}, 3, 4, ta)), x(mm({2}, 4, 5, tb))},
                   [ta, tb](Builder& b, auto& in, DType) { return matmul_case(b, in, ta, tb); },
                   3e-7});
    }
  for (bool tb : {false, true})
    c.push_back({"matmul",
                 std::string("shared_n") + (tb ? "t" : "n"),
                 {x({2, 2, 3, 4}), x(mm({}, 4, 5, tb))},
                 [tb](Builder& b, auto& in, DType) { return matmul_case(b, in, false, tb); },
                 5e-7});
  add_moe_cases(c);
  // A one-element input of rank 1: its gradient keeps the shape [1] (it was
  // returned as a scalar, found by this test).
  c.push_back({"broadcast_scalar",
               "one_element",
               {x({1})},
               [](Builder& b, auto& in, DType) {
                 return Outputs{b.broadcast_scalar(in[0], {2, 3})};
               },
               5e-8});
  return c;
}

// The ops registered before any test body runs: the built-in ones, and any an
// extension registers at load time. (Tests register their own ops in their
// bodies, e.g. custom_op_test.cpp's test_cube, and check them there.)
const std::vector<std::string> kOpsAtStartup = registered_op_names();

// How far a gradient is from a reference: max |a - ref| / max |ref|
// (absolute where ref is all zeros), and the element furthest off.
struct Difference {
  double error = 0;
  int64_t at = 0;
  double got = 0, want = 0;
};
Difference difference(const Tensor& a, const Tensor& ref) {
  Difference d;
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    if (std::fabs(a.get(i) - ref.get(i)) > diff) {
      diff = std::fabs(a.get(i) - ref.get(i));
      d = {0, i, a.get(i), ref.get(i)};
    }
    scale = std::max(scale, std::fabs(ref.get(i)));
  }
  d.error = scale > 0 ? diff / scale : diff;
  return d;
}
std::ostream& operator<<(std::ostream& os, const Difference& d) {
  return os << "relative error " << d.error << ", worst at element " << d.at << ": " << d.got << " where " << d.want;
}

// A case's graph in float dtype `t`, with its loss and the gradients of its float inputs.
struct CaseGraph {
  Graph g;
  std::vector<ValueId> inputs, weights, grads;  // weights: each output's r
  std::vector<size_t> differentiated;           // the float inputs, by index
  ValueId loss;
};

DType input_dtype(const Input& in, DType t) {
  if (in.kind == Input::kIds) return DType::i64;
  if (in.kind == Input::kCount || t == DType::f64) return DType::f64;
  return in.dtype.value_or(t);
}

std::unique_ptr<CaseGraph> build(const Case& c, DType t) {
  auto cg = std::make_unique<CaseGraph>();
  Graph& g = cg->g;
  Builder b(g);
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    cg->inputs.push_back(g.add_input(fmt::format("x{}", i), c.inputs[i].shape, input_dtype(c.inputs[i], t)));
    if (c.inputs[i].kind == Input::kFloat) cg->differentiated.push_back(i);
  }
  const Outputs outs = c.build(b, cg->inputs, t);
  bool has_op = false;
  for (NodeId n : g.order()) has_op |= g.node(n).op->name == c.op;
  EXPECT_TRUE(has_op) << "the case's graph has no " << c.op << " node";
  for (ValueId y : outs) {
    const ValueInfo yi = g.value(y).info;
    cg->weights.push_back(g.add_input(fmt::format("r{}", cg->weights.size()), yi.shape, yi.dtype));
    ValueId term = b.sum(b.mul(y, cg->weights.back()));
    if (cg->loss.valid() && g.value(cg->loss).info.dtype != yi.dtype) {  // outputs of two dtypes: add in f64
      cg->loss = b.cast(cg->loss, DType::f64);
      term = b.cast(term, DType::f64);
    }
    cg->loss = cg->loss.valid() ? b.add(cg->loss, term) : term;
  }
  std::vector<ValueId> wrt;
  for (size_t i : cg->differentiated) wrt.push_back(cg->inputs[i]);
  cg->grads = append_backward(g, cg->loss, wrt);
  for (size_t k = 0; k < wrt.size(); ++k) {
    EXPECT_TRUE(cg->grads[k].valid()) << "no gradient reached input " << cg->differentiated[k];
    if (cg->grads[k].valid()) {
      EXPECT_TRUE(g.value(cg->grads[k]).info == g.value(wrt[k]).info)
          << "input " << cg->differentiated[k] << "'s gradient " << g.describe_value(cg->grads[k])
          << " has another shape or dtype than the input " << g.describe_value(wrt[k]);
    }
  }
  return cg;
}

// Random float inputs and output weights, rounded to `round_to`; the ids and counts as given.
struct Values {
  std::vector<Tensor> inputs, weights;  // f64 (i64 for ids)
};

Values make_values(const Case& c, const CaseGraph& cg, DType round_to) {
  std::mt19937 rng(7);
  auto random = [&](const Shape& s) { return mtest::random_tensor(s, rng).to(round_to).to(DType::f64); };
  Values v;
  for (const Input& in : c.inputs) {
    if (in.kind == Input::kIds) {
      Tensor t = Tensor::empty(in.shape, DType::i64);
      std::copy(in.ids.begin(), in.ids.end(), t.data<int64_t>().begin());
      v.inputs.push_back(t);
    } else if (in.kind == Input::kCount) {
      Tensor t = Tensor::empty(in.shape, DType::f64);
      t.set(0, in.count);
      v.inputs.push_back(t);
    } else {
      v.inputs.push_back(random(in.shape));
    }
  }
  for (ValueId r : cg.weights) v.weights.push_back(random(cg.g.value(r).info.shape));
  return v;
}

// Binds `v` (each tensor converted to its input's dtype; f64 tensors bound as they are, so
// that changing them changes the next run's inputs).
void bind(runtime::Executor& ex, const CaseGraph& cg, const Values& v) {
  auto bind_one = [&](ValueId id, const Tensor& t) {
    const DType d = cg.g.value(id).info.dtype;
    ex.bind(id, t.dtype() == d ? t : t.to(d));
  };
  for (size_t i = 0; i < cg.inputs.size(); ++i) bind_one(cg.inputs[i], v.inputs[i]);
  for (size_t k = 0; k < cg.weights.size(); ++k) bind_one(cg.weights[k], v.weights[k]);
}

std::vector<ValueId> fetches(const CaseGraph& cg) {
  std::vector<ValueId> f{cg.loss};
  for (ValueId gv : cg.grads)
    if (gv.valid()) f.push_back(gv);
  return f;
}

std::vector<Tensor> gradients(const runtime::Executor& ex, const CaseGraph& cg) {
  std::vector<Tensor> out;
  for (ValueId gv : cg.grads) out.push_back(ex.fetch(gv).to(DType::f64));
  return out;
}

std::string case_name(const Case& c) { return c.label.empty() ? c.op : c.op + "_" + c.label; }
void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }  // gtest's name of a case

void check(const Case& c) {
  // The coarsest dtype of the second run, to which every random number is rounded.
  auto bits = [](DType d) { return d == DType::bf16 ? 8 : d == DType::f32 ? 24 : 53; };
  DType round_to = c.dtype;
  for (const Input& in : c.inputs)
    if (in.dtype && bits(*in.dtype) < bits(round_to)) round_to = *in.dtype;

  // f64: autodiff against the five-point central difference of the loss.
  const auto g64 = build(c, DType::f64);
  for (ValueId gv : g64->grads) ASSERT_TRUE(gv.valid());
  Values v = make_values(c, *g64, round_to);
  runtime::Executor ex(g64->g, sched::make_schedule(g64->g, fetches(*g64)));
  bind(ex, *g64, v);
  ex.run();
  const std::vector<Tensor> analytic = gradients(ex, *g64);
  runtime::Executor forward(g64->g, sched::make_schedule(g64->g, {g64->loss}));  // the loss alone
  bind(forward, *g64, v);
  auto loss_at = [&](double* x, double at) {
    const double saved = *x;
    *x = at;
    forward.run();
    *x = saved;
    return forward.fetch(g64->loss).get(0);
  };
  // Thousands of runs of the loss: on one kernel thread, which on a loaded
  // machine is ~100x faster than waking the team each time. (The gradients
  // compared come from the default threads.)
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const double h = 1e-3;
  double fd_error = 0;
  for (size_t k = 0; k < g64->differentiated.size(); ++k) {
    auto xs = v.inputs[g64->differentiated[k]].data<double>();
    Tensor numeric = Tensor::empty(analytic[k].shape(), DType::f64);
    for (size_t j = 0; j < xs.size(); ++j) {
      const double x0 = xs[j];
      numeric.set(static_cast<int64_t>(j), (loss_at(&xs[j], x0 - 2 * h) - 8 * loss_at(&xs[j], x0 - h) +
                                            8 * loss_at(&xs[j], x0 + h) - loss_at(&xs[j], x0 + 2 * h)) /
                                               (12 * h));
    }
    const Difference d = difference(analytic[k], numeric);
    EXPECT_LE(d.error, kFdTolerance) << case_name(c) << ", input " << g64->differentiated[k]
                                     << ": f64 autodiff vs finite differences, " << d;
    fd_error = std::max(fd_error, d.error);
  }
  omp_set_num_threads(threads);

  // The second dtype's kernels, against the f64 gradients.
  const auto g2 = build(c, c.dtype);
  for (ValueId gv : g2->grads) ASSERT_TRUE(gv.valid());
  runtime::Executor ex2(g2->g, sched::make_schedule(g2->g, fetches(*g2)));
  bind(ex2, *g2, v);
  ex2.run();
  const std::vector<Tensor> second = gradients(ex2, *g2);
  double error = 0;
  for (size_t k = 0; k < second.size(); ++k) {
    const Difference d = difference(second[k], analytic[k]);
    EXPECT_LE(d.error, c.tolerance) << case_name(c) << ", input " << g2->differentiated[k] << ": "
                                    << dtype_name(c.dtype) << " autodiff vs f64, " << d;
    error = std::max(error, d.error);
  }
  testing::Test::RecordProperty("f64_vs_fd", fmt::format("{:.3g}", fd_error));
  testing::Test::RecordProperty(fmt::format("{}_vs_f64", dtype_name(c.dtype)), fmt::format("{:.3g}", error));
  fmt::print("{:<34} f64 vs FD {:9.3g} (tol {:.0e})   {:>4} vs f64 {:9.3g} (tol {:.0e})\n", case_name(c), fd_error,
             kFdTolerance, dtype_name(c.dtype), error, c.tolerance);
}

class OpCase : public testing::TestWithParam<Case> {};
TEST_P(OpCase, GradientsMatch) { check(GetParam()); }
auto name_of(const testing::TestParamInfo<Case>& param) { return case_name(param.param); }
INSTANTIATE_TEST_SUITE_P(OpGradcheck, OpCase, testing::ValuesIn(cases()), name_of);

TEST(OpGradcheck, EveryDifferentiableOpHasACase) {
  ASSERT_FALSE(kOpsAtStartup.empty()) << "no registered ops";
  std::set<std::string> covered;
  for (const Case& c : cases()) covered.insert(c.op);
  std::vector<std::string> differentiable, not_differentiable;
  for (const std::string& name : kOpsAtStartup) {
    const OpDef& op = find_op(name);
    // Without a backward rule autodiff stops at the op (collectives, optimizer
    // updates, integer ops, backward helpers); with no inputs there is nothing to differentiate (full).
    if (!op.backward || op.num_inputs == 0) {
      not_differentiable.push_back(name);
      continue;
    }
    // FP8's backward rules are straight-through (quantisation's derivative is
    // zero almost everywhere, and they take no f64 operands): fp8_test.cpp
    // checks fp8_matmul's against float64 FP8 GEMMs of the quantised
    // gradient, and fp8_quantize's against fp8_matmul's own.
    if (name == "fp8_matmul" || name == "fp8_quantize") continue;
    differentiable.push_back(name);
    EXPECT_TRUE(covered.count(name)) << "op '" << name
                                     << "' has a backward rule but no finite-difference case in op_gradcheck_test.cpp";
  }
  for (const std::string& name : covered) {
    EXPECT_NE(std::find(differentiable.begin(), differentiable.end(), name), differentiable.end())
        << "the table has cases for '" << name << "', which is not a registered op with a backward rule";
  }
  EXPECT_NE(std::find(differentiable.begin(), differentiable.end(), "matmul"), differentiable.end());
  fmt::print("with a backward rule ({}): {}\nwithout one, or without inputs ({}): {}\n", differentiable.size(),
             fmt::join(differentiable, ", "), not_differentiable.size(), fmt::join(not_differentiable, ", "));
}

}  // namespace

// attention's backward takes the gradient of its output only: a loss that
// also reads the log-sum-exp (its second output) is refused, where it got
// wrong gradients for q and k (found by this test: q[0] 0 against -1.03).
TEST(OpGradcheck, AttentionRefusesALossOnItsLogSumExp) {
  Graph g;
  Builder b(g);
  const ValueId q = g.add_input("q", Shape({1, 4, 2, 3}), DType::f64);
  const ValueId k = g.add_input("k", Shape({1, 4, 1, 3}), DType::f64),
                v = g.add_input("v", Shape({1, 4, 1, 3}), DType::f64);
  const auto out = b.op_outputs("attention", {q, k, v}, {attr::scale(0.57)});
  const ValueId loss = b.add(b.sum(out[0]), b.sum(out[1]));
  const std::string message = mtest::message_of([&] { append_backward(g, loss, {q, k, v}); });
  EXPECT_NE(message.find("the loss depends on attention's second output, the log-sum-exp"), std::string::npos)
      << message;
  Graph fine;
  Builder c(fine);
  const ValueId q2 = fine.add_input("q", Shape({1, 4, 2, 3}), DType::f64);
  const ValueId k2 = fine.add_input("k", Shape({1, 4, 1, 3}), DType::f64);
  const ValueId v2 = fine.add_input("v", Shape({1, 4, 1, 3}), DType::f64);
  const auto out2 = c.op_outputs("attention", {q2, k2, v2}, {attr::scale(0.57)});
  EXPECT_EQ(append_backward(fine, c.sum(out2[0]), {q2, k2, v2}).size(), 3u);
}
