// Every sharding strategy of every op that has a rule, checked numerically
// (as DTensor's op tests do): on a mesh dim of 2 and of 3 ranks, each rank's
// inputs are cut by the strategy's input placements (Shard by the torch.chunk
// rule, uneven; Partial as random parts that sum to the value), the op runs
// on each rank's local operands, and the outputs put back together by the
// output placements must equal the op on the whole operands.
#include <gtest/gtest.h>

#include <random>

#include "core/shape.h"
#include "graph/builder.h"
#include "runtime/executor.h"
#include "sched/schedule.h"
#include "sharding/local_chunk.h"
#include "spmd/strategy.h"
#include "test_util.h"

using namespace meshtrain;
using namespace meshtrain::graph;
using sharding::Placement;

namespace {

struct OpCase {
  std::string op;
  std::vector<ValueInfo> inputs;
  Attrs attrs;
  int64_t id_bound = 2;          // i64 inputs (ids, step) are drawn from [1, id_bound)
  std::vector<size_t> positive;  // inputs drawn from (0, 1) instead of (-1, 1)
};

Tensor random_like(const ValueInfo& v, std::mt19937& rng, bool positive = false, int64_t id_bound = 2) {
  std::uniform_real_distribution<double> u(positive ? 0.05 : -1.0, 1.0);
  std::uniform_int_distribution<int64_t> id(1, id_bound - 1);
  Tensor t = Tensor::empty(v.shape, v.dtype);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, v.dtype == DType::i64 ? static_cast<double>(id(rng)) : u(rng));
  return t;
}

std::vector<Tensor> run_op(const OpCase& c, const std::vector<Tensor>& inputs, const Attrs* attrs = nullptr) {
  Graph g;
  std::vector<ValueId> ids;
  for (size_t i = 0; i < inputs.size(); ++i)
    ids.push_back(g.add_input(fmt::format("x{}", i), inputs[i].shape(), inputs[i].dtype()));
  const std::vector<ValueId> outs = Builder(g).op_outputs(c.op, ids, attrs ? *attrs : c.attrs);
  runtime::Executor ex(g, sched::make_schedule(g, outs));
  for (size_t i = 0; i < inputs.size(); ++i) ex.bind(ids[i], inputs[i]);
  ex.run();
  std::vector<Tensor> result;
  for (ValueId o : outs) result.push_back(ex.fetch(o).clone());
  return result;
}

// Rank r's rows [start, start + length) of t along dim d.
Tensor slice_dim(const Tensor& t, size_t d, int64_t start, int64_t length) {
  std::vector<int64_t> dims = t.shape().dims();
  dims[d] = length;
  Tensor out = Tensor::empty(Shape(dims), t.dtype());
  const AroundDim a = around_dim(t.shape(), d);
  for (int64_t o = 0; o < a.outer; ++o)
    for (int64_t k = 0; k < length; ++k)
      for (int64_t i = 0; i < a.inner; ++i)
        out.set((o * length + k) * a.inner + i, t.get((o * a.dim + start + k) * a.inner + i));
  return out;
}

// Each rank's part of `full` under placement p on a mesh dim of n ranks.
std::vector<Tensor> split(const Tensor& full, const Placement& p, int n, std::mt19937& rng) {
  std::vector<Tensor> parts;
  if (p.is_replicate()) {
    for (int r = 0; r < n; ++r) parts.push_back(full);
  } else if (p.kind == Placement::Kind::shard) {
    const auto sizes = sharding::torch_chunk_sizes(full.shape()[static_cast<size_t>(p.dim)], n);
    int64_t start = 0;
    for (int r = 0; r < n; ++r) {
      parts.push_back(slice_dim(full, static_cast<size_t>(p.dim), start, sizes[static_cast<size_t>(r)]));
      start += sizes[static_cast<size_t>(r)];
    }
  } else {
    EXPECT_TRUE(p.is_partial() && p.reduce == sharding::ReduceOp::sum) << p.to_string();
    Tensor last = full.clone();
    for (int r = 0; r + 1 < n; ++r) {
      parts.push_back(random_like({full.shape(), full.dtype()}, rng));
      for (int64_t i = 0; i < full.numel(); ++i) last.set(i, last.get(i) - parts.back().get(i));
    }
    parts.push_back(last);
  }
  return parts;
}

// The whole value from every rank's part under placement p.
Tensor combine(const std::vector<Tensor>& parts, const Placement& p) {
  if (p.is_replicate()) {
    for (size_t r = 1; r < parts.size(); ++r)
      for (int64_t i = 0; i < parts[0].numel(); ++i) EXPECT_EQ(parts[r].get(i), parts[0].get(i)) << "replicas differ";
    return parts[0];
  }
  if (p.is_partial()) {
    EXPECT_NE(p.reduce, sharding::ReduceOp::min) << p.to_string();
    const double scale = p.reduce == sharding::ReduceOp::avg ? 1.0 / static_cast<double>(parts.size()) : 1.0;
    Tensor sum = parts[0].clone();
    for (size_t r = 1; r < parts.size(); ++r)
      for (int64_t i = 0; i < sum.numel(); ++i)
        sum.set(i, p.reduce == sharding::ReduceOp::max ? std::max(sum.get(i), parts[r].get(i))
                                                       : sum.get(i) + parts[r].get(i));
    for (int64_t i = 0; i < sum.numel(); ++i) sum.set(i, sum.get(i) * scale);
    return sum;
  }
  const auto d = static_cast<size_t>(p.dim);
  std::vector<int64_t> dims = parts[0].shape().dims();
  dims[d] = 0;
  for (const Tensor& t : parts) dims[d] += t.shape()[d];
  Tensor out = Tensor::empty(Shape(dims), parts[0].dtype());
  const AroundDim a = around_dim(out.shape(), d);
  int64_t start = 0;
  for (const Tensor& t : parts) {
    const int64_t len = t.shape()[d];
    for (int64_t o = 0; o < a.outer; ++o)
      for (int64_t k = 0; k < len; ++k)
        for (int64_t i = 0; i < a.inner; ++i)
          out.set((o * a.dim + start + k) * a.inner + i, t.get((o * len + k) * a.inner + i));
    start += len;
  }
  return out;
}

// Checks every strategy of the case's op; returns how many were checked.
int check_strategies(const OpCase& c, double tolerance) {
  const OpDef& op = find_op(c.op);
  std::mt19937 rng(3);
  std::vector<Tensor> inputs;
  ValueInfos in_infos;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const bool positive = std::find(c.positive.begin(), c.positive.end(), i) != c.positive.end();
    inputs.push_back(random_like(c.inputs[i], rng, positive, c.id_bound));
    in_infos.push_back(c.inputs[i]);
  }
  const ValueInfos out_infos = op.infer(in_infos, c.attrs);
  const std::vector<Tensor> want = run_op(c, inputs);
  int checked = 0;
  for (const auto& s : spmd::dim_strategies({op, in_infos, out_infos, c.attrs}))
    for (int n : {2, 3}) {
      SCOPED_TRACE(fmt::format("{} strategy {} on {} ranks", c.op, s.to_string(), n));
      bool even = true;
      for (const auto& e : s.even_splits)
        even &= c.inputs[static_cast<size_t>(e.input)].shape[static_cast<size_t>(e.dim)] % (n * e.multiple) == 0;
      if (!even) continue;  // the strategy does not hold here, and says so
      std::vector<std::vector<Tensor>> per_input;
      for (size_t i = 0; i < inputs.size(); ++i) per_input.push_back(split(inputs[i], s.inputs[i], n, rng));
      std::vector<std::vector<Tensor>> per_output(out_infos.size());
      for (int r = 0; r < n; ++r) {
        std::vector<Tensor> local;
        for (size_t i = 0; i < inputs.size(); ++i) local.push_back(per_input[i][static_cast<size_t>(r)]);
        // The local node's attributes, from the parts its placements give this rank.
        const sharding::DeviceMesh line({n});
        auto chunks = [&](const ValueInfos& infos, const std::vector<Placement>& ps) {
          std::vector<sharding::LocalChunk> out;
          for (size_t k = 0; k < infos.size(); ++k)
            out.push_back(sharding::local_chunk(infos[k].shape, sharding::Layout::from_placements({ps[k]}), line, {r}));
          return out;
        };
        const auto in_chunks = chunks(in_infos, s.inputs), out_chunks = chunks(out_infos, s.outputs);
        const Attrs attrs = spmd::local_attrs({op, c.attrs, in_infos, in_chunks, out_chunks});
        const auto outs = run_op(c, local, &attrs);
        for (size_t k = 0; k < outs.size(); ++k) per_output[k].push_back(outs[k]);
      }
      for (size_t k = 0; k < out_infos.size(); ++k) {
        const Tensor got = combine(per_output[k], s.outputs[k]);
        if (got.shape() != want[k].shape()) {
          ADD_FAILURE() << "output " << k << " comes back as " << got.shape().to_string() << ", not "
                        << want[k].shape().to_string();
          return checked;
        }
        double scale = 1e-30;
        for (int64_t i = 0; i < got.numel(); ++i) scale = std::max(scale, std::fabs(want[k].get(i)));
        for (int64_t i = 0; i < got.numel(); ++i)
          if (std::fabs(got.get(i) - want[k].get(i)) > tolerance * scale) {
            ADD_FAILURE() << "output " << k << " element " << i << ": " << got.get(i) << " vs " << want[k].get(i);
            return checked;
          }
      }
      ++checked;
    }
  return checked;
}

const DType f64 = DType::f64;

}  // namespace

TEST(SpmdStrategies, ElementwiseOps) {
  const ValueInfo x{{5, 7}, f64};
  int checked = 0;
  for (const char* op : {"add", "mul"}) checked += check_strategies({op, {x, x}, {}}, 1e-13);
  checked += check_strategies({"silu", {x}, {}}, 1e-13);
  checked += check_strategies({"silu_backward", {x, x}, {}}, 1e-13);
  checked += check_strategies({"swiglu", {x, x}, {}}, 1e-13);
  checked += check_strategies({"swiglu_backward", {x, x, x}, {}}, 1e-13);
  checked += check_strategies({"scale", {x}, {attr::alpha(-0.3)}}, 1e-13);
  checked += check_strategies({"scale_by", {x, {{}, f64}}, {}}, 1e-13);
  checked += check_strategies({"cast", {{{5, 7}, DType::f32}}, {attr::dtype(f64)}}, 1e-6);  // widening: P kept
  checked += check_strategies({"cast", {x}, {attr::dtype(DType::f32)}}, 1e-6);
  checked += check_strategies({"sqrt", {x}, {}, 2, {0}}, 1e-13);
  checked +=
      check_strategies({"full", {}, {attr::shape({5, 7}), attr::dtype(f64), attr::value(0.5)}}, 0);  // S(0), S(1), R
  checked += check_strategies({"broadcast_scalar", {{{}, f64}}, {attr::shape({5, 7})}}, 0);          // S(0), S(1), P, R
  // S(0), S(1) and R for each; add + P.P; mul + P.R, R.P; scale, scale_by and
  // the widening cast + P; each on 2 and 3 ranks.
  EXPECT_EQ(checked, 2 * (4 + 5 + 4 * 3 + 4 + 4 + 4 + 3 + 3 + 3 + 4));
}

TEST(SpmdStrategies, NarrowingCastKeepsNoPartial) {
  const ValueInfos in{{{5, 7}, f64}}, out{{{5, 7}, DType::f32}};
  const Attrs attrs{attr::dtype(DType::f32)};
  for (const auto& s : spmd::dim_strategies({find_op("cast"), in, out, attrs})) EXPECT_FALSE(s.outputs[0].is_partial());
}

TEST(SpmdStrategies, Matmul) {
  int checked = 0;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const Attrs attrs{attr::transpose_a(ta), attr::transpose_b(tb)};
      const ValueInfo a2{ta ? Shape{7, 5} : Shape{5, 7}, f64}, b2{tb ? Shape{9, 7} : Shape{7, 9}, f64};
      checked += check_strategies({"matmul", {a2, b2}, attrs}, 1e-13);
      const ValueInfo a3{ta ? Shape{3, 7, 5} : Shape{3, 5, 7}, f64}, b3{tb ? Shape{3, 9, 7} : Shape{3, 7, 9}, f64};
      checked += check_strategies({"matmul", {a3, b3}, attrs}, 1e-13);
      if (!ta) checked += check_strategies({"matmul", {a3, b2}, attrs}, 1e-13);  // weights shared over the batch
    }
  // 2-d: M, N, K, P.R, R.P, R = 6; batched: + 1 batch dim = 7; each on 2 and 3 ranks.
  EXPECT_EQ(checked, 2 * (4 * 6 + 4 * 7 + 2 * 7));
}

TEST(SpmdStrategies, OpsWithoutARuleRunReplicated) {
  const ValueInfos in{{{5, 7}, f64}}, out{{{5, 7}, f64}};
  const ValueInfos scalar{{{}, f64}};
  const auto s = spmd::dim_strategies({find_op("shard_locally"), in, out, {}});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].to_string(), "R -> R");
  EXPECT_FALSE(spmd::has_strategy_rule("shard_locally"));  // lowering's own op: never propagated
  for (const char* op : {"full", "broadcast_scalar", "clip_coefficient", "sum_squares", "count_valid"})
    EXPECT_TRUE(spmd::has_strategy_rule(op)) << op;
  EXPECT_TRUE(spmd::has_strategy_rule("matmul"));
  EXPECT_TRUE(mtest::contains(mtest::message_of([] {
                                spmd::register_strategy_rule("matmul", [](const spmd::StrategyQuery&) {
                                  return std::vector<spmd::DimStrategy>{};
                                });
                              }),
                              "op 'matmul' already has a strategy rule"));
}

TEST(SpmdStrategies, ReductionAndRowOps) {
  const ValueInfo x{{5, 7}, f64}, x3{{5, 3, 7}, f64}, w{{7}, f64};
  int checked = check_strategies({"sum", {x}, {}}, 1e-13);               // S(0), S(1), P, R
  checked += check_strategies({"sum_squares", {x}, {}}, 1e-13);          // S(0), S(1), R
  checked += check_strategies({"mean", {{{6, 7}, f64}}, {}}, 1e-13);     // S(0) even on 2 and 3, S(1) on neither, P, R
  checked += check_strategies({"softmax", {x}, {}}, 1e-13);              // S(0), R
  checked += check_strategies({"softmax_backward", {x, x}, {}}, 1e-13);  // S(0), R
  checked += check_strategies({"rms_norm", {x3, w}, {attr::eps(1e-5)}}, 1e-13);               // S(0), S(1), R
  checked += check_strategies({"rms_norm_backward", {x3, w, x3}, {attr::eps(1e-5)}}, 1e-12);  // S(0), S(1), R
  EXPECT_EQ(checked, 2 * (4 + 3 + 3 + 2 + 2 + 3 + 3));
}

// The load-balancing loss's router statistics of sharded tokens are partial
// sums; the loss, their product, takes them whole.
TEST(SpmdStrategies, MoeRouterStatistics) {
  const ValueInfo probs{{5, 3, 4}, f64}, experts{{5, 3, 2}, DType::i64}, stats{{2, 4}, f64};
  int checked = check_strategies({"moe_router_stats", {probs, experts}, {}, 4}, 1e-13);  // S(0), S(1), R
  checked += check_strategies({"moe_router_stats_backward", {probs, stats}, {}}, 0);     // S(0), S(1), R
  checked += check_strategies({"moe_aux_loss", {stats}, {attr::scale(0.3)}}, 1e-13);     // R
  checked += check_strategies({"moe_aux_loss_backward", {stats, {{}, f64}}, {attr::scale(0.3)}}, 1e-13);  // R
  EXPECT_EQ(checked, 2 * (3 + 3 + 1 + 1));
}

TEST(SpmdStrategies, ShapeOps) {
  int checked =
      check_strategies({"transpose", {{{5, 7, 3}, f64}}, {attr::dim0(0), attr::dim1(2)}}, 1e-14);  // 3 S, P, R
  checked += check_strategies({"slice", {{{5, 7}, f64}}, {attr::dim(1), attr::start(2), attr::length(3)}},
                              1e-14);  // S(0), P, R
  checked += check_strategies({"slice_backward", {{{5, 3}, f64}}, {attr::dim(1), attr::start(2), attr::full_size(7)}},
                              1e-14);                                                              // S(0), P, R
  checked += check_strategies({"concat", {{{5, 3}, f64}, {{5, 4}, f64}}, {attr::dim(1)}}, 1e-14);  // S(0), P, R
  EXPECT_EQ(checked, 2 * (5 + 3 + 3 + 3));
}

TEST(SpmdStrategies, Reshape) {
  auto reshape = [](Shape from, Shape to) {
    return check_strategies({"reshape", {{from, f64}}, {attr::shape(to.dims())}}, 1e-14);
  };
  // Strategies checked, over 2 and 3 ranks; P and R always (4).
  EXPECT_EQ(reshape({6, 4, 5}, {24, 5}), 2 + 2 + 4);  // 6 merges into 24 (6 splits evenly over 2 and 3); 5 stays
  EXPECT_EQ(reshape({24, 5}, {6, 4, 5}), 2 + 2 + 4);  // 24 splits into 6 x 4 (6 even over 2 and 3); 5 stays
  EXPECT_EQ(reshape({3, 5, 8}, {3, 5, 2, 4}), 2 + 2 + 1 + 4);  // 3, 5 stay; 8 splits into 2 x 4: even over 2 only
  EXPECT_EQ(reshape({4, 6}, {2, 12}), 1 + 4);                  // 4 splits into 2 x 2: even over 2 only; 6 is cut
  EXPECT_EQ(reshape({2, 6}, {4, 3}), 1 + 4);                   // 2 merges with part of 6 into 4: even over 2 only
}

TEST(SpmdStrategies, Embedding) {
  const ValueInfo table{{11, 7}, f64}, ids{{5, 3}, DType::i64}, dout{{5, 3, 7}, f64};
  // ids S(0), S(1); table S(1), S(0) (vocab-parallel, 11 rows uneven), P; R
  int checked = check_strategies({"embedding", {table, ids}, {}, 11}, 1e-14);
  // S(0), S(1), S(1) of dout, rows S(0), P, R
  checked += check_strategies({"embedding_backward", {ids, dout}, {attr::vocab(11)}, 11}, 1e-13);
  EXPECT_EQ(checked, 2 * (6 + 6));
}

TEST(SpmdStrategies, Loss) {
  // Ids drawn from [1, 7): ignore_index 1 leaves some rows out of the mean.
  const ValueInfo logits{{5, 3, 7}, f64}, targets{{5, 3}, DType::i64}, count{{}, f64}, dloss{{}, f64};
  const Attrs ignore{attr::ignore_index(1)};
  int checked = check_strategies({"count_valid", {targets}, ignore, 7}, 0);  // S(0), S(1), R
  // Any positive count: it is the divisor every rank is given.
  checked +=
      check_strategies({"cross_entropy", {logits, targets, count}, ignore, 7, {2}}, 1e-13);  // rows S(0), S(1); R
  checked += check_strategies({"cross_entropy_backward", {logits, targets, dloss, count}, ignore, 7, {3}}, 1e-13);
  EXPECT_EQ(checked, 2 * (3 + 3 + 3));
}

TEST(SpmdStrategies, SplitLoss) {
  // Logits of 11 vocabulary entries: split over 2 and 3 ranks unevenly.
  const ValueInfo logits{{5, 3, 11}, f64}, rows{{5, 3}, f64}, targets{{5, 3}, DType::i64}, count{{}, f64};
  const Attrs ignore{attr::ignore_index(1)};
  int checked = check_strategies({"row_max", {logits}, {}}, 0);             // rows S(0), S(1); P(max); R
  checked += check_strategies({"sum_exp", {logits, rows}, {}}, 1e-13);      // rows; vocab P; R
  checked += check_strategies({"pick", {logits, targets}, ignore, 11}, 0);  // rows; vocab P; R
  // rows (P); the unread logits split by vocabulary (R); R
  checked += check_strategies({"nll_mean", {logits, rows, rows, rows, targets, count}, ignore, 11, {1, 5}}, 1e-13);
  // rows; vocab (the target's gradient where its part lies); R
  checked +=
      check_strategies({"split_loss_backward", {logits, targets, rows, rows, count, count}, ignore, 11, {3, 5}}, 1e-13);
  EXPECT_EQ(checked, 2 * (4 + 4 + 4 + 4 + 4));
}

TEST(SpmdStrategies, RopeAndAttention) {
  const ValueInfo q{{3, 5, 12, 4}, f64}, kv{{3, 5, 6, 4}, f64}, lse{{3, 12, 5}, f64};
  // rope: S(0), S(2), P, the sequence (each part at its positions: 3 and 2, or 2, 2 and 1), R; attention and its
  // backward: the batch, the heads, the queries' sequence (the keys whole), R.
  int checked = check_strategies({"rope", {q}, {attr::theta(10000.0), attr::inverse(false)}}, 1e-13);
  checked += check_strategies({"attention", {q, kv, kv}, {attr::scale(0.5)}}, 1e-13);
  checked += check_strategies({"attention_backward", {q, kv, kv, q, lse, q}, {attr::scale(0.5)}}, 1e-12);
  EXPECT_EQ(checked, 2 * (5 + 4 + 4));
  // Three kv heads do not split over two ranks: the heads strategy is skipped there, on three it holds.
  const ValueInfo q6{{3, 5, 6, 4}, f64}, kv3{{3, 5, 3, 4}, f64};
  EXPECT_EQ(check_strategies({"attention", {q6, kv3, kv3}, {attr::scale(0.5)}}, 1e-13), 3 + 2 + 2);
}

// Context parallelism's load-balanced order of 12 chunks of 1 (a sequence of
// 12): split over 2 and 3 ranks, each rank's part is chunks from both ends.
TEST(SpmdStrategies, LoadBalancedSequence) {
  const ValueInfo q{{2, 12, 4, 4}, f64}, kv{{2, 12, 2, 4}, f64}, lse{{2, 4, 12}, f64}, tokens{{2, 12}, DType::i64};
  const Attrs order{attr::seq_chunks(12)};
  Attrs rope = order, attention = order;
  rope.set(attr::theta, 500.0).set(attr::inverse, false);
  attention.set(attr::scale, 0.5);
  int checked = check_strategies({"rope", {q}, rope}, 1e-13);
  checked += check_strategies({"attention", {q, kv, kv}, attention}, 1e-13);
  checked += check_strategies({"attention_backward", {q, kv, kv, q, lse, q}, attention}, 1e-12);
  EXPECT_EQ(checked, 2 * (5 + 4 + 4) - 2);  // as above, but two kv heads do not split over three ranks
  Attrs into = order, back = order;
  into.set(attr::inverse, false);
  back.set(attr::inverse, true);
  // Into the order: the batch, each rank's part of the sequence from the whole, P, R; i64 tokens too.
  EXPECT_EQ(check_strategies({"reorder_sequence", {kv}, into}, 1e-15), 2 * (3 + 1 + 1 + 1));
  EXPECT_EQ(check_strategies({"reorder_sequence", {tokens}, into, 50}, 0), 2 * (1 + 1 + 1 + 1));
  // Back: the batch, the heads, the head dim, P, R (never a part of the sequence).
  EXPECT_EQ(check_strategies({"reorder_sequence", {kv}, back}, 1e-15), 2 * (3 + 1 + 1));
}

TEST(SpmdStrategies, AdamW) {
  const ValueInfo p{{5, 7}, f64};
  const OpCase c{"adamw",
                 {p, p, p, p, {{}, f64}, {{}, DType::i64}},
                 {attr::beta1(0.9), attr::beta2(0.95), attr::eps(1e-8), attr::weight_decay(0.1)},
                 5,
                 {3, 4}};                        // v and lr positive
  EXPECT_EQ(check_strategies(c, 1e-13), 2 * 3);  // S(0), S(1), R
}
