// Every op's backward against central finite differences in float64, on
// random inputs with odd sizes; the executor's memory plan; graph errors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "gradcheck.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "runtime/executor.h"
#include "sched/schedule.h"
#include "test_util.h"

using namespace meshtrain;
using namespace meshtrain::graph;
using mtest::contains;
using mtest::gradcheck;
using mtest::InputSpec;
using mtest::message_of;
using mtest::random_tensor;

TEST(GradCheck, AddMulScale) {
  gradcheck({{{3, 5}}, {{3, 5}}},
            [](Builder& b, const std::vector<ValueId>& x) { return b.scale(b.add(b.mul(x[0], x[1]), x[0]), -0.7); });
}

TEST(GradCheck, MatmulSharedWeights) {
  for (bool tb : {false, true})
    gradcheck({{{2, 3, 5}}, {tb ? Shape{7, 5} : Shape{5, 7}}},
              [tb](Builder& b, const std::vector<ValueId>& x) { return b.matmul(x[0], x[1], false, tb); });
}

TEST(GradCheck, MatmulBatchedAndTransposed) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      gradcheck({{ta ? Shape{3, 5, 4} : Shape{3, 4, 5}}, {tb ? Shape{3, 6, 5} : Shape{3, 5, 6}}},
                [ta, tb](Builder& b, const std::vector<ValueId>& x) { return b.matmul(x[0], x[1], ta, tb); });
}

TEST(GradCheck, SumMeanBroadcast) {
  gradcheck({{{4, 3}}}, [](Builder& b, const std::vector<ValueId>& x) {
    return b.add(b.broadcast_scalar(b.sum(x[0]), {4, 3}), b.broadcast_scalar(b.mean(b.mul(x[0], x[0])), {4, 3}));
  });
}

TEST(GradCheck, ReshapeTranspose) {
  gradcheck({{{2, 3, 5}}}, [](Builder& b, const std::vector<ValueId>& x) {
    return b.transpose(b.reshape(b.transpose(x[0], 0, 2), {5, 6}), 0, 1);
  });
}

TEST(GradCheck, SiluSoftmax) {
  gradcheck({{{3, 7}}}, [](Builder& b, const std::vector<ValueId>& x) { return b.softmax(b.silu(x[0])); });
}

TEST(GradCheck, RmsNorm) {
  gradcheck({{{5, 9}}, {{9}}}, [](Builder& b, const std::vector<ValueId>& x) { return b.rms_norm(x[0], x[1], 1e-5); });
}

TEST(GradCheck, CrossEntropyWithIgnoredRows) {
  InputSpec targets{{6}, DType::i64, {3, 0, -100, 10, 7, -100}};
  gradcheck({{{6, 11}}, targets},
            [](Builder& b, const std::vector<ValueId>& x) { return b.cross_entropy(x[0], x[1]); });
}

TEST(GradCheck, SplitCrossEntropyWithIgnoredRows) {
  // row_max, sum_exp, pick and nll_mean: the same loss as cross_entropy, in parts.
  InputSpec targets{{6}, DType::i64, {3, 0, -100, 10, 7, -100}};
  gradcheck({{{6, 11}}, targets},
            [](Builder& b, const std::vector<ValueId>& x) { return b.cross_entropy_split(x[0], x[1]); });
}

TEST(CrossEntropy, SplitEqualsFused) {
  Graph g;
  Builder b(g);
  const ValueId z = g.add_input("z", {4, 5}, DType::f64), t = g.add_input("t", {4}, DType::i64);
  const ValueId fused = b.cross_entropy(z, t, -1), split = b.cross_entropy_split(z, t, -1);
  const auto grads = append_backward(g, b.add(fused, b.scale(split, 0.0)), {z});
  Graph g2;
  Builder b2(g2);
  const ValueId z2 = g2.add_input("z", {4, 5}, DType::f64), t2 = g2.add_input("t", {4}, DType::i64);
  const auto grads2 = append_backward(g2, b2.cross_entropy_split(z2, t2, -1), {z2});
  Tensor zt = Tensor::empty({4, 5}, DType::f64), tt = Tensor::empty({4}, DType::i64);
  for (int64_t i = 0; i < 20; ++i) zt.set(i, std::sin(1.7 * static_cast<double>(i)) * 4);
  const int64_t ts[] = {2, -1, 4, 0};
  std::copy(ts, ts + 4, tt.data<int64_t>().begin());
  runtime::Executor ex(g, sched::make_schedule(g, {fused, split, grads[0]}));
  runtime::Executor ex2(g2, sched::make_schedule(g2, {grads2[0]}));
  ex.bind(z, zt);
  ex.bind(t, tt);
  ex2.bind(z2, zt);
  ex2.bind(t2, tt);
  ex.run();
  ex2.run();
  EXPECT_NEAR(ex.fetch(split).get(0), ex.fetch(fused).get(0), 1e-14);
  for (int64_t i = 0; i < 20; ++i) EXPECT_NEAR(ex2.fetch(grads2[0]).get(i), ex.fetch(grads[0]).get(i), 1e-15) << i;
}

TEST(GradCheck, EmbeddingWithRepeatedIds) {
  InputSpec ids{{2, 3}, DType::i64, {4, 1, 4, 0, 2, 4}};
  gradcheck({{{5, 3}}, ids}, [](Builder& b, const std::vector<ValueId>& x) { return b.embedding(x[0], x[1]); });
}

TEST(CrossEntropy, MatchesTheDefinition) {
  // -log softmax(z)[t], averaged over the non-ignored rows, by hand.
  Graph g;
  Builder b(g);
  const ValueId z = g.add_input("z", {2, 3}, DType::f64), t = g.add_input("t", {2}, DType::i64);
  const ValueId loss = b.cross_entropy(z, t, -1);
  runtime::Executor ex(g, sched::make_schedule(g, {loss}));
  Tensor zt = Tensor::empty({2, 3}, DType::f64), tt = Tensor::empty({2}, DType::i64);
  const double zs[] = {1.0, 2.0, 0.5, -1.0, 0.0, 3.0};
  std::copy(zs, zs + 6, zt.data<double>().begin());
  tt.data<int64_t>()[0] = 1;
  tt.data<int64_t>()[1] = -1;
  ex.bind(z, zt);
  ex.bind(t, tt);
  ex.run();
  const double want = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(0.5)) - 2.0;
  EXPECT_NEAR(ex.fetch(loss).data<double>()[0], want, 1e-12);
}

TEST(Executor, ReusesMemoryAfterLastUse) {
  // A chain of 10 elementwise ops on 1 MiB: only two buffers are ever live.
  Graph g;
  Builder b(g);
  const ValueId x = g.add_input("x", {1 << 18}, DType::f32);
  ValueId y = x;
  for (int i = 0; i < 10; ++i) y = b.silu(y);
  runtime::Executor ex(g, sched::make_schedule(g, {y}));
  EXPECT_EQ(ex.arena_bytes(), 2u << 20);
  ex.bind(x, Tensor::zeros({1 << 18}, DType::f32));
  const auto before = default_allocator().stats().allocations;
  ex.run();
  ex.run();
  EXPECT_EQ(default_allocator().stats().allocations, before);  // no allocation in the steady state
}

TEST(Executor, ReshapeIsAViewWithoutCopyOrMemory) {
  // reshape aliases its input: no arena bytes of its own, and the input's
  // buffer stays live as long as any view of it is read.
  Graph g;
  Builder b(g);
  const ValueId x = g.add_input("x", {4, 6}, DType::f64);
  const ValueId y = b.silu(x);                                // 192 bytes in the arena
  const ValueId y2 = b.reshape(b.reshape(y, {24}), {2, 12});  // views of y
  const ValueId z = b.silu(b.reshape(x, {2, 12}));            // a view of the bound input
  const ValueId out = b.add(y2, z);
  runtime::Executor ex(g, sched::make_schedule(g, {out, y2}));
  EXPECT_EQ(ex.arena_bytes(), 3 * 192u);  // y, z and out; y is fetched (through y2), so it is never reused
  std::mt19937 rng(1);
  const Tensor xt = random_tensor({4, 6}, rng);
  ex.bind(x, xt);
  ex.run();
  const auto got = ex.fetch(out).data<const double>();
  const auto xs = xt.data<const double>();
  for (size_t i = 0; i < 24; ++i) {
    const double s = xs[i] / (1 + std::exp(-xs[i]));
    EXPECT_NEAR(got[i], 2 * s, 1e-15);
    EXPECT_EQ(ex.fetch(y2).data<const double>()[i], s);
  }
  EXPECT_EQ(ex.fetch(y2).shape(), (Shape{2, 12}));
}

// Bytes moved per op, each operand once: inputs read and outputs written by
// default; embedding and slice read only what they gather; views move
// nothing. The executor sums them over the plan, as it sums FLOPs.
TEST(Executor, ByteAndFlopCountsFromTheOpRules) {
  Graph g;
  Builder b(g);
  const ValueId x = g.add_input("x", {4, 6}, DType::f32);       // 96 bytes
  const ValueId w = g.add_input("w", {6, 3}, DType::f32);       // 72 bytes
  const ValueId table = g.add_input("t", {11, 6}, DType::f32);  // 264 bytes
  const ValueId ids = g.add_input("ids", {5}, DType::i64);      // 40 bytes
  const ValueId sum = b.add(x, x);                              // 3 * 96
  const ValueId prod = b.matmul(sum, w);                        // 96 + 72 + 48; 2 * 4 * 3 * 6 FLOPs
  const ValueId view = b.reshape(prod, {12});                   // 0
  const ValueId part = b.slice(x, 1, 2, 3);                     // 2 * 48
  const ValueId rows = b.embedding(table, ids);                 // 40 + 2 * 120
  runtime::Executor ex(g, sched::make_schedule(g, {sum, view, part, rows}));
  EXPECT_DOUBLE_EQ(ex.bytes(), 3 * 96 + (96 + 72 + 48) + 0 + 2 * 48 + (40 + 2 * 120));
  EXPECT_DOUBLE_EQ(ex.flops(), 4 * 6 + 2 * 4 * 3 * 6);  // the add's one FLOP per element, and the matmul's
}

TEST(GraphErrors, ClearMessages) {
  Graph g;
  Builder b(g);
  const ValueId a = g.add_input("a", {2, 3}, DType::f32), c = g.add_input("c", {3, 2}, DType::f32);
  EXPECT_TRUE(contains(message_of([&] { b.add(a, c); }), "add(a: f32(2, 3), c: f32(3, 2)): shapes differ"));
  EXPECT_TRUE(contains(message_of([&] { b.matmul(a, a); }), "inner dims differ: 3 vs 2"));
  EXPECT_TRUE(contains(message_of([&] { g.add_node("conv9d", {a}); }), "unknown op 'conv9d'; registered ops:"));
  EXPECT_TRUE(contains(message_of([&] { b.reshape(a, {5}); }), "cannot reshape (2, 3) (6 elements) to (5)"));
  const ValueId loss = b.sum(a);
  runtime::Executor ex(g, sched::make_schedule(g, {loss}));
  EXPECT_TRUE(contains(message_of([&] { ex.run(); }), "a: f32(2, 3) has no tensor bound"));
  EXPECT_TRUE(contains(message_of([&] { ex.bind(a, Tensor::zeros({3, 2}, DType::f32)); }), "a expects f32(2, 3)"));
  EXPECT_TRUE(contains(message_of([&] { append_backward(g, a, {a}); }), "needs a scalar loss"));
}

TEST(GradCheck, RotaryEmbedding) {
  gradcheck({{{2, 3, 2, 6}}}, [](Builder& b, const std::vector<ValueId>& x) { return b.rope(x[0], 10000.0); });
}

TEST(GradCheck, CausalGroupedQueryAttention) {
  // 4 query heads over 2 key/value heads, 5 positions, head dim 3.
  gradcheck({{{2, 5, 4, 3}}, {{2, 5, 2, 3}}, {{2, 5, 2, 3}}},
            [](Builder& b, const std::vector<ValueId>& x) { return b.attention(x[0], x[1], x[2], 0.57); });
}

// Context parallelism's load-balanced order (4 chunks of 2): the queries
// moved into it, rope and attention reading their positions from it, the
// keys moved back to position order, as the model builds them.
ValueId load_balanced_attention(Builder& b, ValueId q, ValueId k, ValueId v, int64_t chunks) {
  const ValueId qs = b.rope(b.reorder_sequence(q, chunks), 500.0, chunks);
  const ValueId ks = b.reorder_sequence(b.rope(b.reorder_sequence(k, chunks), 500.0, chunks), chunks, true);
  return b.attention(qs, ks, v, 0.57, chunks);
}

TEST(GradCheck, LoadBalancedRopeAndAttention) {
  gradcheck({{{2, 8, 4, 4}}, {{2, 8, 2, 4}}, {{2, 8, 2, 4}}},
            [](Builder& b, const std::vector<ValueId>& x) { return load_balanced_attention(b, x[0], x[1], x[2], 4); });
}

// The same attention in either order: the load-balanced result, moved back
// to position order, is the position-order result.
TEST(Attention, LoadBalancedOrderGivesThePositionOrderResult) {
  std::mt19937 rng(5);
  Graph g;
  Builder b(g);
  const Shape qs{2, 12, 4, 4}, ks{2, 12, 2, 4};
  const ValueId q = g.add_input("q", qs, DType::f64), k = g.add_input("k", ks, DType::f64),
                v = g.add_input("v", ks, DType::f64);
  const ValueId natural = b.attention(b.rope(q, 500.0), b.rope(k, 500.0), v, 0.57);
  const ValueId balanced = b.reorder_sequence(load_balanced_attention(b, q, k, v, 6), 6, true);
  runtime::Executor ex(g, sched::make_schedule(g, {natural, balanced}));
  ex.bind(q, random_tensor(qs, rng));
  ex.bind(k, random_tensor(ks, rng));
  ex.bind(v, random_tensor(ks, rng));
  ex.run();
  const auto want = ex.fetch(natural).data<const double>(), got = ex.fetch(balanced).data<const double>();
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-13) << i;
}

TEST(GradCheck, SwiGluSliceConcat) {
  gradcheck({{{3, 5}}, {{3, 5}}, {{3, 2}}}, [](Builder& b, const std::vector<ValueId>& x) {
    const ValueId h = b.swiglu(x[0], x[1]);
    return b.concat({b.slice(h, 1, 1, 3), x[2], b.slice(h, 0, 0, 3)}, 1);
  });
}

// Attention against a naive reference: explicit scores, causal mask, softmax.
TEST(Attention, MatchesNaiveReference) {
  const int64_t B = 2, T = 6, Hq = 4, Hkv = 2, D = 5;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::mt19937 rng(3);
  Graph g;
  Builder b(g);
  const ValueId q = g.add_input("q", {B, T, Hq, D}, DType::f64), k = g.add_input("k", {B, T, Hkv, D}, DType::f64),
                v = g.add_input("v", {B, T, Hkv, D}, DType::f64);
  const ValueId out = b.attention(q, k, v, scale);
  runtime::Executor ex(g, sched::make_schedule(g, {out}));
  Tensor qt = random_tensor({B, T, Hq, D}, rng), kt = random_tensor({B, T, Hkv, D}, rng),
         vt = random_tensor({B, T, Hkv, D}, rng);
  ex.bind(q, qt);
  ex.bind(k, kt);
  ex.bind(v, vt);
  ex.run();
  const auto got = ex.fetch(out).data<const double>();
  const auto Q = qt.data<const double>(), K = kt.data<const double>(), V = vt.data<const double>();
  for (int64_t bi = 0; bi < B; ++bi)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> p(static_cast<size_t>(i + 1));
        double total = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (int64_t c = 0; c < D; ++c)
            s += Q[((bi * T + i) * Hq + h) * D + c] * K[((bi * T + j) * Hkv + h / 2) * D + c];
          total += p[static_cast<size_t>(j)] = std::exp(s * scale);
        }
        for (int64_t c = 0; c < D; ++c) {
          double want = 0;
          for (int64_t j = 0; j <= i; ++j)
            want += p[static_cast<size_t>(j)] / total * V[((bi * T + j) * Hkv + h / 2) * D + c];
          ASSERT_NEAR(got[static_cast<size_t>(((bi * T + i) * Hq + h) * D + c)], want, 1e-12);
        }
      }
}

// AdamW against torch.optim.AdamW's documented algorithm, written out:
// theta -= lr*wd*theta; m, v; m_hat = m/(1-b1^t); v_hat = v/(1-b2^t);
// theta -= lr * m_hat / (sqrt(v_hat) + eps). Three steps, with clipping.
TEST(Optimizer, AdamWAndClippingMatchPyTorchDefinitions) {
  const double lr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, max_norm = 0.5;
  Graph g;
  Builder b(g);
  const ValueId p = g.add_input("p", {4}, DType::f64), grad = g.add_input("g", {4}, DType::f64),
                m = g.add_input("m", {4}, DType::f64), v = g.add_input("v", {4}, DType::f64),
                lr_in = g.add_input("lr", {}, DType::f64), step_in = g.add_input("step", {}, DType::i64);
  const ValueId norm = b.global_norm({grad});
  const ValueId clipped = b.scale_by(grad, b.clip_coefficient(norm, max_norm));
  const auto upd = b.adamw(p, clipped, m, v, lr_in, step_in, b1, b2, eps, wd);
  runtime::Executor ex(g, sched::make_schedule(g, {norm, upd[0], upd[1], upd[2]}));
  Tensor P = Tensor::empty({4}, DType::f64), G = Tensor::empty({4}, DType::f64), M = Tensor::zeros({4}, DType::f64),
         Vt = Tensor::zeros({4}, DType::f64), LR = Tensor::empty({}, DType::f64), S = Tensor::empty({}, DType::i64);
  const double p0[] = {0.5, -1.0, 2.0, 0.0}, g0[] = {0.3, -0.4, 0.1, 0.9};
  std::copy(p0, p0 + 4, P.data<double>().begin());
  std::copy(g0, g0 + 4, G.data<double>().begin());
  LR.data<double>()[0] = lr;
  ex.bind(p, P);
  ex.bind(grad, G);
  ex.bind(m, M);
  ex.bind(v, Vt);
  ex.bind(lr_in, LR);
  ex.bind(step_in, S);
  std::vector<double> rp(p0, p0 + 4), rm(4, 0.0), rv(4, 0.0);
  double gnorm = 0;
  for (double x : g0) gnorm += x * x;
  gnorm = std::sqrt(gnorm);
  const double coef = std::min(1.0, max_norm / (gnorm + 1e-6));
  for (int64_t t = 1; t <= 3; ++t) {
    S.data<int64_t>()[0] = t;
    ex.run();
    EXPECT_NEAR(ex.fetch(norm).data<double>()[0], gnorm, 1e-15);
    for (int i = 0; i < 4; ++i) {
      const double gi = g0[i] * coef;
      rp[i] -= lr * wd * rp[i];
      rm[i] = b1 * rm[i] + (1 - b1) * gi;
      rv[i] = b2 * rv[i] + (1 - b2) * gi * gi;
      const double m_hat = rm[i] / (1 - std::pow(b1, t)), v_hat = rv[i] / (1 - std::pow(b2, t));
      rp[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
    // Write the updated state back, as the trainer does.
    std::copy_n(ex.fetch(upd[0]).data<const double>().begin(), 4, P.data<double>().begin());
    std::copy_n(ex.fetch(upd[1]).data<const double>().begin(), 4, M.data<double>().begin());
    std::copy_n(ex.fetch(upd[2]).data<const double>().begin(), 4, Vt.data<double>().begin());
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(P.data<double>()[static_cast<size_t>(i)], rp[static_cast<size_t>(i)], 1e-14)
          << "step " << t << " i " << i;
      EXPECT_NEAR(M.data<double>()[static_cast<size_t>(i)], rm[static_cast<size_t>(i)], 1e-15);
      // The second moment too (1e-3 to 4e-2 here), relative as it is small:
      // measured 0 here (the same operations in the same order), held to
      // 1e-15, a few f64 roundings (a build that fuses a multiply-add).
      EXPECT_NEAR(Vt.data<double>()[static_cast<size_t>(i)], rv[static_cast<size_t>(i)],
                  1e-15 * rv[static_cast<size_t>(i)])
          << "step " << t << " i " << i;
    }
  }
}

// Hugging Face Llama's rotate-half RoPE written out for one head, D = 4:
// angle_i = pos * theta^(-2i/D); out[i] = x[i]cos - x[i+2]sin, out[i+2] = x[i+2]cos + x[i]sin.
TEST(Rope, MatchesRotateHalfConvention) {
  const double theta = 500.0;
  Graph g;
  Builder b(g);
  const ValueId x = g.add_input("x", {1, 3, 1, 4}, DType::f64);
  const ValueId y = b.rope(x, theta);
  runtime::Executor ex(g, sched::make_schedule(g, {y}));
  Tensor xt = Tensor::empty({1, 3, 1, 4}, DType::f64);
  for (int64_t i = 0; i < 12; ++i) xt.set(i, 0.1 * static_cast<double>(i + 1) - 0.5);
  ex.bind(x, xt);
  ex.run();
  const auto out = ex.fetch(y).data<const double>();
  const auto in = xt.data<const double>();
  for (int pos = 0; pos < 3; ++pos)
    for (int i = 0; i < 2; ++i) {
      const double angle = pos * std::pow(theta, -2.0 * i / 4);
      const double x1 = in[static_cast<size_t>(pos * 4 + i)], x2 = in[static_cast<size_t>(pos * 4 + i + 2)];
      EXPECT_NEAR(out[static_cast<size_t>(pos * 4 + i)], x1 * std::cos(angle) - x2 * std::sin(angle), 1e-15);
      EXPECT_NEAR(out[static_cast<size_t>(pos * 4 + i + 2)], x2 * std::cos(angle) + x1 * std::sin(angle), 1e-15);
    }
}

// bf16 matmul (oneDNN) against f32 GEMM on the same bf16-exact inputs: equal
// up to the final rounding to bf16, for every transpose and batching mode.
TEST(Matmul, Bf16MatchesFloat32UpToRounding) {
  std::mt19937 rng(9);
  for (bool shared : {true, false})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const Shape as = ta ? Shape{3, 17, 13} : Shape{3, 13, 17};
        const Shape bs = shared ? (tb ? Shape{11, 17} : Shape{17, 11}) : (tb ? Shape{3, 11, 17} : Shape{3, 17, 11});
        Graph g;
        Builder b(g);
        const ValueId a32 = g.add_input("a", as, DType::f32), b32 = g.add_input("b", bs, DType::f32);
        const ValueId ref = b.matmul(a32, b32, ta, tb);
        const ValueId got = b.matmul(b.cast(a32, DType::bf16), b.cast(b32, DType::bf16), ta, tb);
        runtime::Executor ex(g, sched::make_schedule(g, {ref, got}));
        // Inputs already bf16-exact, so the f32 reference sees the same numbers.
        Tensor at = random_tensor(as, rng).to(DType::bf16).to(DType::f32),
               bt = random_tensor(bs, rng).to(DType::bf16).to(DType::f32);
        ex.bind(a32, at);
        ex.bind(b32, bt);
        ex.run();
        const Tensor r = ex.fetch(ref), o = ex.fetch(got);
        ASSERT_EQ(o.dtype(), DType::bf16);
        for (int64_t i = 0; i < r.numel(); ++i)
          ASSERT_NEAR(o.get(i), r.get(i), std::ldexp(std::fabs(r.get(i)), -8) + 1e-6)
              << "shared=" << shared << " ta=" << ta << " tb=" << tb << " i=" << i;
      }
}

// attention's FLOPs count the (query, key) pairs the causal mask keeps: the
// whole sequence's T (T + 1) / 2 pairs; a cp rank's load-balanced part
// exactly its share; and its ring blocks (keys from key_first) add up to
// that part's.
TEST(AttentionFlops, CountTheCausalPairsOfWholeSequencesPartsAndBlocks) {
  const int64_t B = 2, T = 24, H = 4, D = 8, cp = 3, chunk = T / (2 * cp);
  const OpDef& op = find_op("attention");
  const auto flops = [&](int64_t q_rows, int64_t keys, const Attrs& at) {
    const ValueInfos in{
        {Shape{B, q_rows, H, D}, DType::f32}, {Shape{B, keys, H, D}, DType::f32}, {Shape{B, keys, H, D}, DType::f32}};
    return op_flops(op, in, {}, at);
  };
  const double per_pair = 4.0 * B * H * D;
  EXPECT_EQ(flops(T, T, {attr::scale(1.0)}), per_pair * T * (T + 1) / 2);
  double parts = 0;
  for (int64_t r = 0; r < cp; ++r) {
    const Attrs part{attr::scale(1.0), attr::seq_chunks(2 * cp), attr::seq_first(r * 2 * chunk), attr::seq_total(T)};
    const double whole_keys = flops(2 * chunk, T, part);
    double blocks = 0;
    for (int64_t c = 0; c < 2 * cp; ++c) {
      Attrs block = part;
      block.set(attr::key_first, c * chunk);
      blocks += flops(2 * chunk, chunk, block);
    }
    EXPECT_EQ(blocks, whole_keys) << "rank " << r;
    EXPECT_EQ(whole_keys, per_pair * T * (T + 1) / 2 / cp) << "rank " << r;  // balanced: an equal share
    parts += whole_keys;
  }
  EXPECT_EQ(parts, per_pair * T * (T + 1) / 2);
}
