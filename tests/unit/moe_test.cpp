// The mixture-of-experts block: its ops chained as the model chains them
// against a plain per-token loop in float64 (dropless and over capacity),
// top-k ties, the model's gradient against finite differences with the
// load-balancing loss on, the Hugging Face names of stacked experts, and the
// config's refusals; the grouped GEMM's f32 and bf16 kernels against a loop
// on every thread count. (Each op's backward: op_gradcheck_test.cpp; the model
// against PyTorch: tests/mpi/moe_parity_test.sh.)
#include "kernels/cpu/moe.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "config/config.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "models/llama.h"
#include "parallel/plan.h"
#include "runtime/executor.h"
#include "sched/schedule.h"
#include "test_util.h"

using namespace meshtrain;

namespace {

Tensor random_tensor(const Shape& shape, std::mt19937& rng, double stddev = 1.0) {
  std::normal_distribution<double> normal(0.0, stddev);
  Tensor t = Tensor::empty(shape, DType::f64);
  for (double& x : t.data<double>()) x = normal(rng);
  return t;
}

struct Block {
  int64_t groups = 3, n = 5, d = 4, e = 4, k = 2, f = 3;
  double capacity = 0;
};

// The reference: for each token, its router's softmax, the top k (ties to
// the lower index), weights renormalised; each chosen expert's SwiGLU
// unless its slot is over the expert's capacity in this group (slots
// counted in token, then choice order); the weighted sum.
std::vector<double> reference_block(const Block& c, const Tensor& x, const Tensor& gate, const Tensor& w1,
                                    const Tensor& w3, const Tensor& w2, int64_t* dropped) {
  auto X = x.data<const double>(), G = gate.data<const double>(), W1 = w1.data<const double>(),
       W3 = w3.data<const double>(), W2 = w2.data<const double>();
  const int64_t capacity = c.capacity > 0 ? static_cast<int64_t>(std::ceil(c.capacity * c.n * c.k / c.e)) : c.n * c.k;
  std::vector<double> out(static_cast<size_t>(c.groups * c.n * c.d), 0.0);
  *dropped = 0;
  for (int64_t g = 0; g < c.groups; ++g) {
    std::vector<int64_t> taken(static_cast<size_t>(c.e), 0);
    for (int64_t t = 0; t < c.n; ++t) {
      const double* xt = &X[static_cast<size_t>((g * c.n + t) * c.d)];
      std::vector<double> p(static_cast<size_t>(c.e));
      double mx = -1e300, z = 0;
      for (int64_t x_ = 0; x_ < c.e; ++x_) {
        double s = 0;
        for (int64_t i = 0; i < c.d; ++i) s += xt[i] * G[static_cast<size_t>(x_ * c.d + i)];
        p[static_cast<size_t>(x_)] = s;
        mx = std::max(mx, s);
      }
      for (double& v : p) z += (v = std::exp(v - mx));
      for (double& v : p) v /= z;
      std::vector<int64_t> idx(static_cast<size_t>(c.e));
      for (int64_t i = 0; i < c.e; ++i) idx[static_cast<size_t>(i)] = i;
      std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
      double sum = 0;
      for (int64_t j = 0; j < c.k; ++j) sum += p[static_cast<size_t>(idx[static_cast<size_t>(j)])];
      for (int64_t j = 0; j < c.k; ++j) {
        const int64_t ex = idx[static_cast<size_t>(j)];
        if (taken[static_cast<size_t>(ex)]++ >= capacity) {
          ++*dropped;
          continue;
        }
        const double weight = p[static_cast<size_t>(ex)] / sum;
        std::vector<double> act(static_cast<size_t>(c.f));
        for (int64_t h = 0; h < c.f; ++h) {
          double a = 0, b = 0;
          for (int64_t i = 0; i < c.d; ++i) {
            a += xt[i] * W1[static_cast<size_t>((ex * c.f + h) * c.d + i)];
            b += xt[i] * W3[static_cast<size_t>((ex * c.f + h) * c.d + i)];
          }
          act[static_cast<size_t>(h)] = a / (1 + std::exp(-a)) * b;
        }
        for (int64_t i = 0; i < c.d; ++i) {
          double y = 0;
          for (int64_t h = 0; h < c.f; ++h)
            y += act[static_cast<size_t>(h)] * W2[static_cast<size_t>((ex * c.d + i) * c.f + h)];
          out[static_cast<size_t>((g * c.n + t) * c.d + i)] += weight * y;
        }
      }
    }
  }
  return out;
}

}  // namespace

// Also with the rows dispatched into 2 and 4 blocks of experts (what
// expert parallelism lays out by block) and back.
TEST(MoeBlock, MatchesAPerTokenLoopInFloat64) {
  for (int64_t blocks : {1, 2, 4})
    for (double capacity : {0.0, 0.6}) {
      SCOPED_TRACE(fmt::format("{} blocks, capacity {}", blocks, capacity));
      const Block c{.capacity = capacity};
      graph::Graph g;
      graph::Builder b(g);
      const auto x = g.add_input("x", {c.groups, c.n, c.d}, DType::f64);
      const auto gate = g.add_input("gate", {c.e, c.d}, DType::f64);
      const auto w1 = g.add_input("w1", {c.e, c.f, c.d}, DType::f64);
      const auto w3 = g.add_input("w3", {c.e, c.f, c.d}, DType::f64);
      const auto w2 = g.add_input("w2", {c.e, c.d, c.f}, DType::f64);
      const auto probs = b.softmax(b.matmul(x, gate, false, true));
      const auto experts = b.moe_topk(probs, c.k);
      const auto sorted = b.moe_sort(experts, c.e, c.capacity);
      auto rows = b.moe_permute(x, sorted.order, c.k);
      auto expert_of_rows = sorted.row_expert;
      const int64_t dispatched = blocks > 1 ? blocks : 0;
      if (dispatched) {
        rows = b.moe_dispatch(rows, sorted.row_expert, blocks, c.e);
        expert_of_rows = b.moe_dispatch_experts(sorted.row_expert, blocks, c.e);
      }
      const auto act = b.swiglu(b.grouped_matmul(rows, w1, expert_of_rows, true, dispatched),
                                b.grouped_matmul(rows, w3, expert_of_rows, true, dispatched));
      auto down = b.grouped_matmul(act, w2, expert_of_rows, true, dispatched);
      if (dispatched) down = b.moe_undispatch(down, sorted.row_expert, blocks, c.e);
      const auto out = b.moe_combine(down, sorted.order, b.moe_route_weights(probs, experts), c.k);
      runtime::Executor ex(g, sched::make_schedule(g, {out, sorted.row_expert}));
      std::mt19937 rng(3);
      std::vector<Tensor> values;
      for (const auto v : {x, gate, w1, w3, w2}) {
        values.push_back(random_tensor(g.value(v).info.shape, rng));
        ex.bind(v, values.back());
      }
      ex.run();
      int64_t dropped = 0;
      const auto want = reference_block(c, values[0], values[1], values[2], values[3], values[4], &dropped);
      const auto got = ex.fetch(out).data<const double>();
      double worst = 0;
      for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
      std::printf("%lld blocks, capacity %.1f: worst difference %.2g, %lld slots dropped\n",
                  static_cast<long long>(blocks), capacity, worst, static_cast<long long>(dropped));
      EXPECT_LT(worst, 1e-13) << "capacity " << capacity;
      const auto row_expert = ex.fetch(sorted.row_expert).data<const int64_t>();
      EXPECT_EQ(std::count(row_expert.begin(), row_expert.end(), c.e), dropped) << "capacity " << capacity;
      if (capacity > 0) {
        EXPECT_GT(dropped, 0);  // the case drops some slots
      }
    }
}

// Dispatch packs each group's rows of a block of experts to the front of
// its [block, group] and zeros the rest; undispatch puts them back and
// zeros the dropped rows; a grouped GEMM given experts [first, first + e)
// computes only their rows.
TEST(MoeDispatch, PacksEachBlocksRunAndPutsItBack) {
  namespace k = kernels::cpu;
  // 2 groups of 5 rows over 4 experts (4 = dropped), in expert order; blocks {0, 1} and {2, 3}.
  const std::vector<int64_t> re = {0, 1, 1, 3, 4, 2, 2, 3, 3, 3};
  std::vector<double> rows(10);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = 1.0 + static_cast<double>(i);
  std::vector<double> out(2 * 2 * 5, -1.0);
  k::moe_dispatch(rows.data(), re.data(), out.data(), 2, 5, 1, 4, 2, 0.0);
  EXPECT_EQ(out, (std::vector<double>{1, 2, 3, 0, 0, /**/ 0, 0, 0, 0, 0, /**/ 4, 0, 0, 0, 0, /**/ 6, 7, 8, 9, 10}));
  std::vector<int64_t> experts(20, -1);
  k::moe_dispatch(re.data(), re.data(), experts.data(), 2, 5, 1, 4, 2, int64_t{4});
  EXPECT_EQ(experts, (std::vector<int64_t>{0, 1, 1, 4, 4, 4, 4, 4, 4, 4, 3, 4, 4, 4, 4, 2, 2, 3, 3, 3}));
  std::vector<double> back(10, -1.0);
  k::moe_undispatch(out.data(), re.data(), back.data(), 2, 5, 1, 4, 2);
  EXPECT_EQ(back, (std::vector<double>{1, 2, 3, 4, 0, 6, 7, 8, 9, 10}));  // row 4 dropped
  const std::vector<int64_t> unsorted = {1, 0, 2, 3, 3};
  EXPECT_THROW(k::moe_dispatch(rows.data(), unsorted.data(), out.data(), 1, 5, 1, 4, 2, 0.0), InvalidArgument);

  // Experts 2 and 3 of 4 (weights [2, 1, 1]: x 10 and x 100): the other rows 0.
  const std::vector<double> w = {10, 100};
  std::vector<double> y(10, -1.0);
  k::grouped_matmul(rows.data(), w.data(), re.data(), y.data(), 10, 2, 1, 1, true, 2);
  EXPECT_EQ(y, (std::vector<double>{0, 0, 0, 400, 0, 60, 70, 800, 900, 1000}));
  std::vector<double> dw(2, -1.0);
  k::grouped_matmul_wgrad(rows.data(), rows.data(), re.data(), dw.data(), 10, 2, 1, 1, 2);
  EXPECT_EQ(dw, (std::vector<double>{6 * 6 + 7 * 7, 4 * 4 + 8 * 8 + 9 * 9 + 10 * 10}));
}

// The grouped GEMM's kernels in f32 (and bf16) against a float64 loop over
// rows, on uneven routing that leaves some runs long (GEMMs in place) and
// some short (gathered), an expert with no rows and dropped rows, on 1, 2
// and 3 threads (tasks cut into rows and columns differently).
TEST(GroupedMatmul, FloatKernelsMatchALoopOnEveryThreadCount) {
  namespace k = kernels::cpu;
  const int64_t groups = 3, n = 300, top = 2, e = 5, m = groups * n * top, p = 136, q = 40;
  std::mt19937 rng(11);
  std::discrete_distribution<int64_t> pick({6, 3, 1, 0, 0.3});  // expert 3 never chosen
  std::vector<int64_t> experts(static_cast<size_t>(m)), order(experts.size()), row_expert(experts.size());
  for (int64_t t = 0; t < groups * n; ++t) {
    int64_t a = pick(rng), b = pick(rng);
    while (b == a) b = pick(rng);
    experts[static_cast<size_t>(t * top)] = a, experts[static_cast<size_t>(t * top + 1)] = b;
  }
  // A factor past every slot drops nothing (the capacity is capped, not an overflowed cast).
  EXPECT_EQ(k::moe_sort(experts.data(), order.data(), row_expert.data(), groups, n, top, e, 1e300), 0);
  const int64_t dropped = k::moe_sort(experts.data(), order.data(), row_expert.data(), groups, n, top, e, 1.5);
  ASSERT_GT(dropped, 0);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto floats = [&](int64_t count) {
    std::vector<float> v(static_cast<size_t>(count));
    for (float& x : v) x = u(rng);
    return v;
  };
  const auto x = floats(m * q), g = floats(m * p), w = floats(e * p * q);  // w [e, p, q]
  // want_fwd[r] = x[r] @ w[e]^T ([p]); want_dgrad[r] = g[r] @ w[e] ([q]); want_wgrad[e] = g^T x ([p, q]).
  std::vector<double> want_fwd(static_cast<size_t>(m * p), 0.0), want_dgrad(static_cast<size_t>(m * q), 0.0),
      want_wgrad(static_cast<size_t>(e * p * q), 0.0);
  for (int64_t r = 0; r < m; ++r) {
    const int64_t ex = row_expert[static_cast<size_t>(r)];
    if (ex == e) continue;
    for (int64_t i = 0; i < p; ++i)
      for (int64_t j = 0; j < q; ++j) {
        const double wij = w[static_cast<size_t>((ex * p + i) * q + j)];
        const double xr = x[static_cast<size_t>(r * q + j)], gr = g[static_cast<size_t>(r * p + i)];
        want_fwd[static_cast<size_t>(r * p + i)] += xr * wij;
        want_dgrad[static_cast<size_t>(r * q + j)] += gr * wij;
        want_wgrad[static_cast<size_t>((ex * p + i) * q + j)] += gr * xr;
      }
  }
  auto worst = [](const auto& got, const std::vector<double>& want) {
    double err = 0, scale = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      err = std::max(err, std::fabs(static_cast<double>(got[i]) - want[i]));
      scale = std::max(scale, std::fabs(want[i]));
    }
    return err / scale;
  };
  auto to_bf16 = [](const std::vector<float>& v) {
    std::vector<bfloat16> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
    return out;
  };
  const int threads = omp_get_max_threads();
  for (int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    std::vector<float> fwd(want_fwd.size(), 7.0f), dgrad(want_dgrad.size(), 7.0f), wgrad(want_wgrad.size(), 7.0f);
    k::grouped_matmul(x.data(), w.data(), row_expert.data(), fwd.data(), m, e, p, q, true);
    k::grouped_matmul(g.data(), w.data(), row_expert.data(), dgrad.data(), m, e, q, p, false);
    k::grouped_matmul_wgrad(g.data(), x.data(), row_expert.data(), wgrad.data(), m, e, p, q);
    EXPECT_LT(worst(fwd, want_fwd), 1e-6) << t << " threads";
    EXPECT_LT(worst(dgrad, want_dgrad), 1e-6) << t << " threads";
    EXPECT_LT(worst(wgrad, want_wgrad), 1e-6) << t << " threads";
    // bf16: the inputs rounded, so only a loose bound (the f32 math is the same code).
    const auto xb = to_bf16(x), gb = to_bf16(g), wb = to_bf16(w);
    std::vector<bfloat16> fwd_b(fwd.size()), wgrad_b(wgrad.size());
    k::grouped_matmul(xb.data(), wb.data(), row_expert.data(), fwd_b.data(), m, e, p, q, true);
    k::grouped_matmul_wgrad(gb.data(), xb.data(), row_expert.data(), wgrad_b.data(), m, e, p, q);
    std::vector<float> fwd_f(fwd_b.size()), wgrad_f(wgrad_b.size());
    for (size_t i = 0; i < fwd_b.size(); ++i) fwd_f[i] = bf16_to_f32(fwd_b[i]);
    for (size_t i = 0; i < wgrad_b.size(); ++i) wgrad_f[i] = bf16_to_f32(wgrad_b[i]);
    EXPECT_LT(worst(fwd_f, want_fwd), 2e-2) << t << " threads";
    EXPECT_LT(worst(wgrad_f, want_wgrad), 2e-2) << t << " threads";
    // Expert 3 has no rows: its weight gradient is 0; dropped rows' outputs are 0.
    for (int64_t i = 0; i < p * q; ++i) EXPECT_EQ(wgrad[static_cast<size_t>(3 * p * q + i)], 0.0f);
  }
  omp_set_num_threads(threads);
}

TEST(MoeBlock, TopKTiesGoToTheLowerExpert) {
  graph::Graph g;
  graph::Builder b(g);
  const auto probs = g.add_input("probs", {2, 5}, DType::f32);
  const auto experts = b.moe_topk(probs, 3);
  runtime::Executor ex(g, sched::make_schedule(g, {experts}));
  Tensor p = Tensor::empty({2, 5}, DType::f32);
  const std::vector<float> values{0.2f, 0.3f, 0.2f, 0.3f, 0.0f, 0.25f, 0.25f, 0.25f, 0.25f, 0.0f};
  std::copy(values.begin(), values.end(), p.data<float>().begin());
  ex.bind(probs, p);
  ex.run();
  const auto got = ex.fetch(experts).data<const int64_t>();
  EXPECT_EQ(std::vector<int64_t>(got.begin(), got.end()), (std::vector<int64_t>{1, 3, 0, 0, 1, 2}));
}

models::LlamaConfig tiny_moe() {
  models::LlamaConfig c;
  c.dim = 8;
  c.n_layers = 3;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.ffn_dim = 12;
  c.vocab_size = 11;
  c.n_experts = 4;
  c.n_experts_per_token = 2;
  c.moe_ffn_dim = 6;
  c.first_dense_layers = 1;
  c.n_shared_experts = 1;
  c.router_aux_loss_coef = 0.3;
  return c;
}

TEST(MoeModel, GradientMatchesFiniteDifferences) {
  graph::Graph g;
  const auto m = models::build_llama(g, tiny_moe(), 2, 5, DType::f64);
  ASSERT_TRUE(m.aux_loss.valid());
  std::vector<graph::ValueId> params;
  for (const auto& [name, v] : m.params) params.push_back(v);
  const auto grads = graph::append_backward(g, m.loss, params);
  std::vector<graph::ValueId> fetches{m.loss, m.aux_loss};
  fetches.insert(fetches.end(), grads.begin(), grads.end());
  runtime::Executor ex(g, sched::make_schedule(g, fetches));
  std::mt19937 rng(11);
  std::vector<Tensor> values;
  for (graph::ValueId p : params) {
    values.push_back(random_tensor(g.value(p).info.shape, rng, 0.5));
    ex.bind(p, values.back());
  }
  Tensor tokens = Tensor::empty({2, 5}, DType::i64), targets = Tensor::empty({2, 5}, DType::i64);
  for (int64_t i = 0; i < 10; ++i) {
    tokens.data<int64_t>()[static_cast<size_t>(i)] = (i * 7 + 1) % 11;
    targets.data<int64_t>()[static_cast<size_t>(i)] = (i * 7 + 4) % 11;
  }
  ex.bind(m.tokens, tokens);
  ex.bind(m.targets, targets);
  ex.run();
  // The aux loss is k (2) for routing balanced over experts, n_experts x k at worst.
  const double aux = ex.fetch(m.aux_loss).data<const double>()[0];
  EXPECT_GT(aux, 1.0);
  EXPECT_LT(aux, 8.0);
  int checked = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor analytic = ex.fetch(grads[i]).clone();
    auto x = values[i].data<double>();
    for (size_t j = 0; j < x.size(); j += std::max<size_t>(1, x.size() / 3)) {
      const double saved = x[j], h = 1e-6;
      x[j] = saved + h;
      ex.run();
      const double up = ex.fetch(m.loss).data<double>()[0];
      x[j] = saved - h;
      ex.run();
      const double down = ex.fetch(m.loss).data<double>()[0];
      x[j] = saved;
      const double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(analytic.data<const double>()[j], numeric, 1e-6 * std::max(1.0, std::fabs(numeric)))
          << g.value(params[i]).name << "[" << j << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 60);
}

TEST(MoeModel, ExpertsConvertToAndFromHuggingFaceNames) {
  const models::LlamaConfig c = tiny_moe();
  const auto specs = models::llama_parameters(c);
  ASSERT_TRUE(specs.contains("model.layers.1.block_sparse_moe.experts.w1.weight"));
  EXPECT_EQ(specs.at("model.layers.1.block_sparse_moe.experts.w2.weight").shape, (Shape{4, 8, 6}));
  EXPECT_TRUE(specs.contains("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_FALSE(specs.contains("model.layers.1.mlp.gate_proj.weight"));
  auto params = models::initial_parameters(specs, 7);
  const auto hf = models::hf_tensors(params);
  ASSERT_TRUE(hf.contains("model.layers.2.block_sparse_moe.experts.3.w2.weight"));
  EXPECT_EQ(hf.at("model.layers.2.block_sparse_moe.experts.3.w2.weight").shape(), (Shape{8, 6}));
  EXPECT_FALSE(hf.contains("model.layers.2.block_sparse_moe.experts.w2.weight"));
  EXPECT_EQ(hf.at("model.layers.2.block_sparse_moe.experts.3.w1.weight").get(5),
            params.at("model.layers.2.block_sparse_moe.experts.w1.weight").get(3 * 6 * 8 + 5));
  const auto back = models::from_hf_tensors(hf, specs);
  ASSERT_EQ(back.size(), params.size());
  for (const auto& [name, t] : params) {
    ASSERT_TRUE(back.contains(name)) << name;
    ASSERT_EQ(back.at(name).shape(), t.shape()) << name;
    for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(back.at(name).get(i), t.get(i)) << name;
  }
  auto missing = hf;
  missing.erase("model.layers.1.block_sparse_moe.experts.2.w3.weight");
  EXPECT_TRUE(mtest::contains(mtest::message_of([&] { models::from_hf_tensors(missing, specs); }),
                              "tensor 'model.layers.1.block_sparse_moe.experts.2.w3.weight' is missing"));
}

// A file of another kind of model is named as such: a dense MLP where the
// model has experts and the reverse, fewer experts, no shared experts.
TEST(MoeModel, AMissingTensorSaysWhatTheFileHoldsInstead) {
  models::LlamaConfig moe = tiny_moe();
  moe.n_shared_experts = 0;
  models::LlamaConfig dense = moe, more = moe;
  dense.n_experts = 0;
  dense.first_dense_layers = 0;
  more.n_experts = 8;
  const auto moe_file = models::hf_tensors(models::initial_parameters(models::llama_parameters(moe), 7));
  const auto dense_file = models::initial_parameters(models::llama_parameters(dense), 7);
  auto message = [](const std::map<std::string, Tensor>& file, const models::LlamaConfig& c) {
    return mtest::message_of([&] { models::from_hf_tensors(file, models::llama_parameters(c)); });
  };
  EXPECT_TRUE(mtest::contains(message(dense_file, moe),
                              "the file's layer 1 has a dense MLP (mlp.*): set model.n_experts 0, or "
                              "model.first_dense_layers above 1"));
  EXPECT_TRUE(mtest::contains(message(moe_file, more),
                              "(expert 4 of 8); the file's layer 1 holds 4 experts: set "
                              "model.n_experts 4"));
  // The trainer's own checks (shared experts, a dense model's MLP) ask the same function.
  EXPECT_EQ(models::missing_tensor_hint("model.layers.1.block_sparse_moe.shared_experts.w1.weight", moe_file),
            "; the file's layer 1 has no shared experts: set model.n_shared_experts 0");
  EXPECT_EQ(models::missing_tensor_hint("model.layers.1.mlp.down_proj.weight", moe_file),
            "; the file's layer 1 is a mixture of experts (block_sparse_moe.*), not a dense MLP: set "
            "model.n_experts (and model.first_dense_layers) as the file's model had them");
  EXPECT_EQ(models::missing_tensor_hint("model.layers.1.mlp.down_proj.weight", dense_file), "");
  EXPECT_EQ(models::missing_tensor_hint("model.norm.weight", moe_file), "");
}

TEST(MoeConfig, RefusesWhatCannotWork) {
  auto message = [](std::vector<std::pair<std::string, std::string>> overrides) {
    overrides.emplace_back("data.path", "x.txt");
    return mtest::message_of([&] { config::load_config(MESHTRAIN_SOURCE_DIR "/configs/debug.toml", overrides); });
  };
  EXPECT_TRUE(mtest::contains(message({{"model.n_experts", "4"}, {"model.n_experts_per_token", "5"}}),
                              "n_experts_per_token 5 must be between 1 and n_experts 4"));
  EXPECT_TRUE(mtest::contains(message({{"model.n_experts", "4"}, {"model.router_aux_loss_coef", "-0.1"}}),
                              "model.router_aux_loss_coef"));
  EXPECT_TRUE(mtest::contains(message({{"model.n_shared_experts", "1"}}),
                              "model.n_shared_experts = 1 applies to a mixture of experts, but model.n_experts is 0"));
  EXPECT_TRUE(mtest::contains(message({{"model.n_experts", "4"}, {"model.first_dense_layers", "6"}}),
                              "first_dense_layers 6 leaves none of the 6 layers"));
  // Infinity means nothing here (and a capacity of it would overflow an integer).
  for (const char* key : {"model.capacity_factor", "model.router_aux_loss_coef"})
    EXPECT_TRUE(mtest::contains(message({{"model.n_experts", "4"}, {key, "inf"}}),
                                fmt::format("config key {}: 'inf' is not a number >= 0", key)));
  EXPECT_EQ(message({{"model.n_experts", "4"}, {"model.router_aux_loss_coef", "0.01"}}), "(no error)");
  EXPECT_EQ(message({{"model.n_experts", "4"}, {"model.router_aux_loss_coef", "0.01"}, {"parallel.pp", "2"}}),
            "(no error)");
}

TEST(MoeConfig, RefusesExpertParallelismThatCannotSplit) {
  auto message = [](std::vector<std::pair<std::string, std::string>> overrides) {
    overrides.emplace_back("data.path", "x.txt");
    return mtest::message_of([&] { config::load_config(MESHTRAIN_SOURCE_DIR "/configs/debug.toml", overrides); });
  };
  EXPECT_TRUE(mtest::contains(message({{"parallel.ep", "2"}}), "parallel.ep 2 needs a mixture of experts"));
  EXPECT_TRUE(mtest::contains(message({{"model.n_experts", "4"}, {"parallel.ep", "3"}}),
                              "parallel.ep 3 must divide model.n_experts 4"));
  EXPECT_TRUE(mtest::contains(message({{"model.n_experts", "4"}, {"parallel.expert_tp", "2"}}),
                              "parallel.expert_tp 2 must be 1 or parallel.tp 1"));
  EXPECT_EQ(message({{"model.n_experts", "4"}, {"parallel.ep", "4"}}), "(no error)");
  parallel::ParallelConfig p;
  p.ep = 4;
  EXPECT_TRUE(mtest::contains(mtest::message_of([&] { parallel::make_mesh(p, 2); }),
                              "parallel.ep 4 must divide parallel.dp_shard 2"));
}

// What step_layouts sees of a MoE step: the token ids [8, seq], a dense
// weight and an expert weight w1 [4, 6, 6].
struct MoeWeights {
  graph::Graph g;
  graph::ValueId tokens, dense, w1;
  parallel::StepRoles roles;
  explicit MoeWeights(int64_t seq) {
    tokens = g.add_input("tokens", {8, seq}, DType::i64);
    dense = g.add_parameter("dense", {6, 6}, DType::f32);
    w1 = g.add_parameter("experts.w1", {4, 6, 6}, DType::f32);
    roles.parameters = {dense, w1};
    roles.experts = {w1};
    roles.batch_inputs = {tokens};
  }
};

// ep takes its ranks from dp_shard: the mesh (dp_replicate, dp_shard / ep,
// ep, tp); the batch split over all three data-parallel dims, dense weights
// FSDP-sharded over dp_shard and ep, the experts split by expert over ep and
// by dim 1 over the rest of dp_shard (tp first where expert_tp splits dim 1).
TEST(MoeLayouts, ExpertsSplitByExpertOverEpAndDenseOverAllOfDpShard) {
  parallel::ParallelConfig p;
  p.ep = 2;
  p.tp = 2;
  p.expert_tp = 2;
  const sharding::DeviceMesh mesh = parallel::make_mesh(p, 8);
  EXPECT_EQ(mesh.describe(), "(dp_replicate=1, dp_shard=2, ep=2, tp=2)");
  EXPECT_EQ(parallel::data_parallel_degree(mesh), 4);
  MoeWeights m(5);
  const graph::ValueId tokens = m.tokens, dense = m.dense, w1 = m.w1;
  m.roles.tp_dims = {{dense, 0},
                     {w1, parallel::llama_tp_dim("layers.1.block_sparse_moe.experts.w1.weight", true).value()}};
  const parallel::StepLayouts l = parallel::step_layouts(mesh, m.g, m.roles, p);
  EXPECT_EQ(l.given.at(tokens).to_string(), "RS(0)[0]S(0)[1]R");
  EXPECT_EQ(l.given.at(dense).to_string(), "RS(0)[1]S(0)[2]S(0)[0]");
  EXPECT_EQ(l.given.at(w1).to_string(), "RS(1)[1]S(0)S(1)[0]");
  EXPECT_EQ(parallel::pending_over_data_parallel(mesh, l.given.at(w1), true).to_string(), "RP(sum)S(0)S(1)");
  EXPECT_EQ(parallel::pending_over_data_parallel(mesh, l.given.at(dense), false).to_string(), "RP(sum)P(sum)S(0)");
}

// The run header's model line: a dense MLP's width only where a layer has one.
TEST(MoeConfig, DescribeNamesTheDenseWidthOnlyWhereALayerIsDense) {
  models::LlamaConfig c;
  c.n_experts = 8;
  c.moe_ffn_dim = 32;
  EXPECT_EQ(models::describe(c),
            "Llama dim 256 x 6 layers, 16 heads (16 kv), vocab 256, 8 experts (top 2, ffn 32) in layers 0-5");
  c.first_dense_layers = 1;
  c.n_shared_experts = 1;
  EXPECT_EQ(models::describe(c),
            "Llama dim 256 x 6 layers, 16 heads (16 kv), ffn 768, vocab 256, 8 experts (top 2, ffn 32, 1 shared) in "
            "layers 1-5");
}

// With context parallelism too, ep still takes its ranks from dp_shard: the
// mesh (dp_replicate, dp_shard / ep, ep, cp, tp). Dense weights FSDP over
// dp_shard, ep and cp; the experts by expert over ep and by dim 1 over
// the rest of dp_shard and cp; the batch split over the data-parallel dims
// and whole over cp (each cp rank picks its part of the sequence).
TEST(MoeLayouts, ContextParallelKeepsEpOnDpShard) {
  parallel::ParallelConfig p;
  p.ep = 2;
  p.cp = 2;
  const sharding::DeviceMesh mesh = parallel::make_mesh(p, 8);
  EXPECT_EQ(mesh.describe(), "(dp_replicate=1, dp_shard=2, ep=2, cp=2, tp=1)");
  const MoeWeights m(8);
  const parallel::StepLayouts l = parallel::step_layouts(mesh, m.g, m.roles, p);
  EXPECT_EQ(l.given.at(m.tokens).to_string(), "RS(0)[0]S(0)[1]RR");
  EXPECT_EQ(l.given.at(m.dense).to_string(), "RS(0)[0]S(0)[1]S(0)[2]R");
  EXPECT_EQ(l.given.at(m.w1).to_string(), "RS(1)[0]S(0)S(1)[1]R");
  p.ep = 3;
  EXPECT_TRUE(
      mtest::contains(mtest::message_of([&] { parallel::make_mesh(p, 8); }),
                      "parallel.ep 3 must divide parallel.dp_shard 4, or be parallel.cp 2 times a divisor of it"));
}

// Where ep does not divide dp_shard but is cp times a divisor of it, ep
// takes every cp rank and ep / cp of dp_shard's (torchtitan's
// dp_shard_in_ep): the experts split by expert over dp_shard_in_ep x cp and
// FSDP-sharded over the rest of dp_shard, the dense weights over all of
// dp_shard x cp, the dispatched rows by block over dp_shard_in_ep x cp.
TEST(MoeLayouts, EpTakesTheCpRanksWhereDpShardCannotHoldIt) {
  parallel::ParallelConfig p;
  p.cp = 2;
  p.ep = 4;
  const sharding::DeviceMesh mesh = parallel::make_mesh(p, 8);  // dp_shard 4: ep 4 divides it, from dp_shard alone
  EXPECT_EQ(mesh.describe(), "(dp_replicate=1, dp_shard=1, ep=4, cp=2, tp=1)");
  p.dp_shard = 2;
  const sharding::DeviceMesh over_cp = parallel::make_mesh(p, 4);
  EXPECT_EQ(over_cp.describe(), "(dp_replicate=1, dp_shard=1, dp_shard_in_ep=2, cp=2, tp=1)");
  EXPECT_EQ(parallel::expert_dims(over_cp), (std::vector<int>{2, 3}));
  EXPECT_EQ(parallel::data_parallel_degree(over_cp), 2);
  MoeWeights m(8);
  const graph::ValueId rows = m.g.add_input("rows", {4, 8, 2, 6, 6}, DType::f32);  // [blocks, batch, cp parts, ...]
  m.roles.dispatched = {rows};
  const parallel::StepLayouts l = parallel::step_layouts(over_cp, m.g, m.roles, p);
  EXPECT_EQ(l.given.at(rows).to_string(), "RRS(0)[0]S(0)[1]R");
  EXPECT_EQ(l.given.at(m.tokens).to_string(), "RRS(0)RR");
  EXPECT_EQ(l.given.at(m.dense).to_string(), "RRS(0)[0]S(0)[1]R");
  EXPECT_EQ(l.given.at(m.w1).to_string(), "RRS(0)[0]S(0)[1]R");
  EXPECT_EQ(parallel::pending_over_data_parallel(over_cp, l.given.at(m.w1), true).to_string(), "RRS(0)[0]S(0)[1]R");
  EXPECT_EQ(parallel::pending_over_data_parallel(over_cp, l.given.at(m.dense), false).to_string(), "RRP(sum)P(sum)R");
  p.dp_shard = 4;
  p.ep = 8;  // 2 of dp_shard's 4 and both cp ranks: the experts FSDP-sharded over the other 2
  const sharding::DeviceMesh wide = parallel::make_mesh(p, 8);
  EXPECT_EQ(wide.describe(), "(dp_replicate=1, dp_shard=1, dp_shard_in_ep=4, cp=2, tp=1)");
  p.dp_shard = 3;
  p.ep = 4;
  EXPECT_TRUE(mtest::contains(mtest::message_of([&] { parallel::make_mesh(p, 6); }),
                              "parallel.ep 4 must divide parallel.dp_shard 3, or be parallel.cp 2 times a divisor"));
}
