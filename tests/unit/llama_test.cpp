// The Llama graph as a whole: its gradient against finite differences in
// float64, a few AdamW steps on a repeated batch lowering the loss, and a
// steady-state step allocating nothing.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <new>
#include <random>

#include "compile/train_step.h"
#include "graph/autodiff.h"
#include "runtime/executor.h"
#include "sched/pass.h"
#include "sched/schedule.h"

using namespace meshtrain;

// Counts C++ heap allocations (operator new) while counting_news is on.
// Replacing the global operator new is process-wide; it only counts, and
// only while a test turns counting on. new and delete are malloc and free
// (GCC takes the pair for a mismatch; it is not one). Not under
// AddressSanitizer, which brings its own operator new.
namespace {
std::atomic<bool> counting_news{false};
std::atomic<int64_t> news{0};
}  // namespace
#ifndef __SANITIZE_ADDRESS__
#define MESHTRAIN_COUNTS_NEWS 1
void* operator new(size_t bytes) {
  if (counting_news.load(std::memory_order_relaxed)) news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes ? bytes : 1)) return p;
  throw std::bad_alloc();
}
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop
#endif

namespace {

models::LlamaConfig tiny(bool tied) {
  models::LlamaConfig c;
  c.dim = 8;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_dim = 12;
  c.vocab_size = 11;
  c.tie_embeddings = tied;
  return c;
}

Tensor tokens(int64_t b, int64_t t, int64_t vocab, int salt) {
  Tensor x = Tensor::empty({b, t}, DType::i64);
  for (int64_t i = 0; i < b * t; ++i) x.data<int64_t>()[static_cast<size_t>(i)] = (i * 7 + salt) % vocab;
  return x;
}

}  // namespace

TEST(Llama, GradientMatchesFiniteDifferences) {
  for (bool tied : {false, true}) {
    graph::Graph g;
    const auto m = models::build_llama(g, tiny(tied), 2, 5, DType::f64);
    std::vector<graph::ValueId> params;
    for (const auto& [name, v] : m.params) params.push_back(v);
    const auto grads = graph::append_backward(g, m.loss, params);
    std::vector<graph::ValueId> fetches{m.loss};
    fetches.insert(fetches.end(), grads.begin(), grads.end());
    runtime::Executor ex(g, sched::make_schedule(g, fetches));
    std::mt19937 rng(11);
    std::normal_distribution<double> normal(0.0, 0.5);
    std::vector<Tensor> values;
    for (graph::ValueId p : params) {
      Tensor t = Tensor::empty(g.value(p).info.shape, DType::f64);
      for (double& x : t.data<double>()) x = normal(rng);
      ex.bind(p, t);
      values.push_back(t);
    }
    ex.bind(m.tokens, tokens(2, 5, 11, 1));
    Tensor targets = tokens(2, 5, 11, 4);
    targets.data<int64_t>()[3] = -100;  // an ignored position
    ex.bind(m.targets, targets);
    ex.run();
    // Check a few elements of every parameter.
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
            << g.value(params[i]).name << "[" << j << "] tied=" << tied;
      }
      ex.run();
    }
  }
}

// Losses of `steps` AdamW steps on one repeated batch of the tiny model,
// from fixed random weights; f32 master weights, compute in `compute`.
// Allocations made by the steps after the first: tensor blocks from the
// default allocator, and C++ heap allocations.
struct SteadyStateAllocations {
  uint64_t tensor_blocks = 0;
  int64_t heap = 0;
};

std::vector<double> train_losses(DType compute, bool tied, int steps, DType state = DType::f32,
                                 SteadyStateAllocations* allocations = nullptr, int64_t micro_batches = 1) {
  graph::Graph g;
  config::OptimizerConfig opt = config::TrainConfig().optimizer;
  opt.lr = 1e-2;
  opt.state_dtype = state;
  const double max_grad_norm = 1.0;
  const auto s = compile::build_train_step(
      g, tiny(tied), 2, 8, opt,
      {.max_grad_norm = max_grad_norm, .compute_dtype = compute, .micro_batches = micro_batches});
  sched::step_pipeline().run(g);  // as the trainer does
  std::vector<graph::Update> updates;
  for (const auto& [from, to] : s.write_backs) updates.push_back({from, to});
  runtime::Executor ex(g, sched::make_schedule(g, g.outputs(), updates));
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  for (const auto& [name, v] : s.model.params) {
    EXPECT_EQ(g.value(v).info.dtype, DType::f32);  // master weights stay f32
    Tensor t = Tensor::empty(g.value(v).info.shape, DType::f32);
    for (float& x : t.data<float>()) x = name.find("norm") != std::string::npos ? 1.0f : normal(rng);
    ex.bind(v, t);
    ex.bind(s.exp_avg.at(name), Tensor::zeros(t.shape(), state));
    ex.bind(s.exp_avg_sq.at(name), Tensor::zeros(t.shape(), state));
  }
  ex.bind(s.model.tokens, tokens(2, 8, 11, 1));
  ex.bind(s.model.targets, tokens(2, 8, 11, 2));
  Tensor lr = Tensor::empty({}, DType::f64), step = Tensor::empty({}, DType::i64);
  lr.data<double>()[0] = opt.lr;
  ex.bind(s.lr, lr);
  ex.bind(s.step, step);
  std::vector<double> losses;
  uint64_t tensor_blocks_before = 0;
  news = 0;
  for (int64_t t = 1; t <= steps; ++t) {
    step.data<int64_t>()[0] = t;
    if (t == 2) tensor_blocks_before = default_allocator().stats().allocations;
    counting_news = allocations != nullptr && t >= 2;
    ex.run();
    counting_news = false;
    losses.push_back(ex.fetch(s.model.loss).get(0));
  }
  if (allocations) *allocations = {default_allocator().stats().allocations - tensor_blocks_before, news.load()};
  return losses;
}

TEST(Llama, TrainingStepsLowerTheLoss) {
  const auto losses = train_losses(DType::f32, false, 30);
  EXPECT_NEAR(losses.front(), std::log(11.0), 0.5);  // near uniform at the start
  EXPECT_LT(losses.back(), 0.5 * losses.front())
      << "loss did not go down: " << losses.front() << " -> " << losses.back();
}

// Gradient accumulation: two microbatches of one row each, their gradients
// summed, train as the batch of two rows does (the same loss, the same
// update), step after step.
TEST(Llama, GradientAccumulationMatchesTheWholeBatch) {
  const auto whole = train_losses(DType::f32, false, 10);
  const auto accumulated = train_losses(DType::f32, false, 10, DType::f32, nullptr, 2);
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_NEAR(accumulated[i], whole[i], 1e-5 * whole[i]) << "step " << i + 1;
}

// bf16 compute with f32 master weights: the same training run as f32, from
// the same weights, stays within bf16's precision of it, step after step.
TEST(Llama, Bfloat16TrainingTracksFloat32) {
  const auto f32 = train_losses(DType::f32, true, 10), bf16 = train_losses(DType::bf16, true, 10);
  for (size_t i = 0; i < f32.size(); ++i) EXPECT_NEAR(bf16[i], f32[i], 0.02 * f32[i]) << "step " << i + 1;
  EXPECT_NE(bf16, f32);  // it really computed in bf16
  EXPECT_LT(bf16.back(), 0.8 * bf16.front());
}

// optimizer.state_dtype = bfloat16: moments stored in bf16, math in f32.
TEST(Llama, Bfloat16OptimizerStateTracksFloat32State) {
  const auto f32 = train_losses(DType::f32, false, 10), bf16 = train_losses(DType::f32, false, 10, DType::bf16);
  for (size_t i = 0; i < f32.size(); ++i) EXPECT_NEAR(bf16[i], f32[i], 0.02 * f32[i]) << "step " << i + 1;
  EXPECT_NE(bf16, f32);
}

// The executor plans all memory before the first step; later steps allocate
// no tensor memory, and with f32 compute nothing at all on the C++ heap
// (bf16's oneDNN GEMMs make their own small per-call objects).
// On one thread: kernels keep per-thread scratch that grows on a thread's
// first use, and with more threads the first step need not give every
// thread every kind of work.
TEST(Llama, SteadyStateStepAllocatesNothing) {
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  for (const DType compute : {DType::f32, DType::bf16}) {
    SteadyStateAllocations allocations;
    train_losses(compute, false, 4, DType::f32, &allocations);
    SCOPED_TRACE(std::string(dtype_name(compute)));
    EXPECT_EQ(allocations.tensor_blocks, 0u);
#ifdef MESHTRAIN_COUNTS_NEWS
    if (compute == DType::f32) {
      EXPECT_EQ(allocations.heap, 0);
    }
#endif
  }
  omp_set_num_threads(threads);
}

TEST(Llama, ModelOwnsItsInitialisation) {
  models::LlamaConfig c;
  c.dim = 32, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.ffn_dim = 48, c.vocab_size = 64;
  const auto specs = models::llama_parameters(c);
  EXPECT_EQ(specs.size(), 1 + 2 * 9 + 1 + 1u);  // embedding, 9 per layer, final norm, untied head
  const auto params = models::initial_parameters(specs, 7);
  for (const auto& [name, t] : params) {
    EXPECT_EQ(t.shape(), specs.at(name).shape) << name;
    const auto x = t.data<const float>();
    if (name.find("layernorm") != std::string::npos || name == "model.norm.weight") {
      for (float v : x) ASSERT_EQ(v, 1.0f) << name;
      continue;
    }
    // Hugging Face Llama's initializer: normal(0, 0.02).
    double sum = 0, sum_sq = 0;
    for (float v : x) sum += v, sum_sq += static_cast<double>(v) * v;
    const double n = static_cast<double>(x.size()), mean = sum / n, std = std::sqrt(sum_sq / n - mean * mean);
    EXPECT_NEAR(mean, 0.0, 5 * 0.02 / std::sqrt(n)) << name;
    EXPECT_NEAR(std, 0.02, 0.02 * 6 / std::sqrt(n)) << name;
  }
  // Seeded: the same seed gives the same values, another seed others.
  const auto again = models::initial_parameters(specs, 7), other = models::initial_parameters(specs, 8);
  const auto w = params.at("model.layers.1.mlp.up_proj.weight").data<const float>();
  const auto w_again = again.at("model.layers.1.mlp.up_proj.weight").data<const float>();
  const auto w_other = other.at("model.layers.1.mlp.up_proj.weight").data<const float>();
  EXPECT_TRUE(std::equal(w.begin(), w.end(), w_again.begin()));
  EXPECT_FALSE(std::equal(w.begin(), w.end(), w_other.begin()));
}
