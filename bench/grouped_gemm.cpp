// meshtrain's grouped GEMM (kernels::cpu::grouped_matmul and
// grouped_matmul_wgrad, f32) against ONE dense GEMM of the same total FLOPs
// through the same library, oneDNN's sgemm, as meshtrain's matmul op calls it
// (kernels::cpu::matmul), measured in the same run. Used by
// bench/grouped_gemm.sh.
//
// Each shape routes `tokens` tokens top-2 over its experts from seeded
// router logits (Gaussian, plus a seeded bias per expert, so that the
// experts' loads are uneven as a trained router's are: the spread is
// printed), and sorts them two ways: all the tokens at once ("sorted": one
// run per expert) and each sequence of `seq` tokens on its own ("per seq",
// what meshtrain's MoE layer runs: one run per sequence and expert). Six
// GEMMs per shape, those of one expert MLP's step: the forward of w1 ([E, F,
// D], x @ w1[e]^T) and w2 ([E, D, F]), their input gradients (the
// "transpose" variant, g @ w[e]) and their weight gradients (wgrad, the
// sum over an expert's rows of g^T x). The dense baseline of each is the
// GEMM with the same (m, n, k) and transposes over all the rows at once.
//
// The baseline runs at its best: every rep times it on 1 thread and on
// THREADS (omp_set_num_threads; oneDNN's sgemm follows OpenMP) and keeps the
// faster; the grouped GEMM runs on THREADS, as in a training step. A rep
// times each side over calls of about 50 ms together, and reps alternate
// the sides (this host's speed drifts). Each side's figure is its best rep
// and the ratio is grouped / dense GFLOP/s of those; beside it, the median
// over reps of each rep's own ratio (a rep's two sides run moments apart, so
// a busy host slows both). "step" weighs the six as a training step runs
// them (w3 as w1): total dense time / total grouped time.
//
// Usage: grouped_gemm [--threads N] [--reps R] [--quick] [--only NAME] [--skew S]
//   --quick: only the smallest shapes (a smoke run); --only: the shapes whose
//   name contains NAME; --skew: the spread of the experts' biases (default
//   0.6: with 64 experts the fullest takes about 7x the mean; 0: only the
//   routing's own noise).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/moe.h"

namespace {

namespace k = meshtrain::kernels::cpu;

struct MoeShape {
  const char* name;
  int64_t experts, dim, ffn, tokens, seq;
};

// Seeded top-2 routing of `tokens` tokens, sorted in groups of `seq`: row_expert [tokens * 2].
std::vector<int64_t> route(const MoeShape& s, int64_t seq, float skew, uint32_t seed, std::vector<int64_t>& loads) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> bias(static_cast<size_t>(s.experts));
  for (float& b : bias) b = skew * normal(rng);
  std::vector<float> logits(static_cast<size_t>(s.tokens * s.experts));
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = normal(rng) + bias[i % static_cast<size_t>(s.experts)];
  const int64_t top = 2, rows = s.tokens * top;
  std::vector<int64_t> experts(static_cast<size_t>(rows)), order(experts.size()), row_expert(experts.size());
  k::moe_topk(logits.data(), experts.data(), s.tokens, s.experts, top);
  k::moe_sort(experts.data(), order.data(), row_expert.data(), s.tokens / seq, seq, top, s.experts, 0.0);
  loads.assign(static_cast<size_t>(s.experts), 0);
  for (int64_t e : row_expert) ++loads[static_cast<size_t>(e)];
  return row_expert;
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& x : v) x = u(rng);
  return v;
}

// Seconds per call of fn, over `calls` calls.
double seconds(const std::function<void()>& fn, int calls = 1) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls;
}

struct Variant {
  const char* name;
  double flops;
  double step_weight;  // how many times a training step runs it (w1 and w3 alike)
  std::function<void()> grouped, dense;
};

struct Result {
  double grouped_s = 1e30, dense_s = 1e30;     // the best rep of each
  int dense_threads = 0;                       // of the best dense rep
  std::vector<double> grouped_rep, dense_rep;  // each rep's times (dense: its faster thread count)
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

Result measure(const Variant& v, int threads, int reps) {
  omp_set_num_threads(threads);
  v.grouped();  // warm-up: oneDNN JITs its kernels on first use
  // A rep times each side over calls of about 50 ms together.
  const int calls = static_cast<int>(std::clamp(0.05 / seconds(v.dense), 1.0, 100.0));
  Result r;
  std::vector<int> dense_threads{threads};
  if (threads > 1) dense_threads.push_back(1);
  for (int rep = 0; rep < reps; ++rep) {
    double dense = 1e30;
    for (int t : dense_threads) {
      omp_set_num_threads(t);
      const double s = seconds(v.dense, calls);
      dense = std::min(dense, s);
      if (s < r.dense_s) r.dense_s = s, r.dense_threads = t;
    }
    omp_set_num_threads(threads);
    const double grouped = seconds(v.grouped, calls);
    r.grouped_s = std::min(r.grouped_s, grouped);
    r.dense_rep.push_back(dense);
    r.grouped_rep.push_back(grouped);
  }
  return r;
}

void run_shape(const MoeShape& s, int threads, int reps, float skew) {
  const int64_t rows = s.tokens * 2, e = s.experts, d = s.dim, f = s.ffn;
  const auto w1 = random_floats(static_cast<size_t>(e * f * d), 1);  // [E, F, D]
  const auto w2 = random_floats(static_cast<size_t>(e * d * f), 2);  // [E, D, F]
  const auto x = random_floats(static_cast<size_t>(rows * d), 3);    // rows [R, D]
  const auto h = random_floats(static_cast<size_t>(rows * f), 4);    // rows [R, F]
  std::vector<float> out_f(static_cast<size_t>(rows * f)), out_d(static_cast<size_t>(rows * d));
  std::vector<float> dw1(w1.size()), dw2(w2.size());
  // The dense baseline's weights: one expert's shape (the same GEMM dims).
  const std::vector<float> w1_dense(w1.begin(), w1.begin() + f * d), w2_dense(w2.begin(), w2.begin() + d * f);
  std::vector<float> dw_dense(static_cast<size_t>(f * d));

  for (const int64_t seq : {s.tokens, s.seq}) {
    std::vector<int64_t> loads;
    const std::vector<int64_t> re = route(s, seq, skew, 42, loads);
    const double mean = static_cast<double>(rows) / static_cast<double>(e);
    const auto [lo, hi] = std::minmax_element(loads.begin(), loads.end());
    const int64_t runs = (s.tokens / seq) * e;
    const double gf = 2.0 * static_cast<double>(rows * d * f);
    const int64_t* rp = re.data();
    const std::vector<Variant> variants{
        {"fwd w1", gf, 2, [&] { k::grouped_matmul(x.data(), w1.data(), rp, out_f.data(), rows, e, f, d, true); },
         [&] { k::matmul(x.data(), w1_dense.data(), out_f.data(), 1, rows, f, d, false, true, 0, 0); }},
        {"fwd w2", gf, 1, [&] { k::grouped_matmul(h.data(), w2.data(), rp, out_d.data(), rows, e, d, f, true); },
         [&] { k::matmul(h.data(), w2_dense.data(), out_d.data(), 1, rows, d, f, false, true, 0, 0); }},
        {"dgrad w1", gf, 2, [&] { k::grouped_matmul(h.data(), w1.data(), rp, out_d.data(), rows, e, d, f, false); },
         [&] { k::matmul(h.data(), w1_dense.data(), out_d.data(), 1, rows, d, f, false, false, 0, 0); }},
        {"dgrad w2", gf, 1, [&] { k::grouped_matmul(x.data(), w2.data(), rp, out_f.data(), rows, e, f, d, false); },
         [&] { k::matmul(x.data(), w2_dense.data(), out_f.data(), 1, rows, f, d, false, false, 0, 0); }},
        {"wgrad w1", gf, 2, [&] { k::grouped_matmul_wgrad(h.data(), x.data(), rp, dw1.data(), rows, e, f, d); },
         [&] { k::matmul(h.data(), x.data(), dw_dense.data(), 1, f, d, rows, true, false, 0, 0); }},
        {"wgrad w2", gf, 1, [&] { k::grouped_matmul_wgrad(x.data(), h.data(), rp, dw2.data(), rows, e, d, f); },
         [&] { k::matmul(x.data(), h.data(), dw_dense.data(), 1, d, f, rows, true, false, 0, 0); }},
    };
    std::printf(
        "%s: %ld experts, dim %ld, moe_ffn %ld, %ld tokens top-2 = %ld rows, %s: %ld runs, rows per expert "
        "%ld..%ld (mean %.0f)\n",
        s.name, static_cast<long>(e), static_cast<long>(d), static_cast<long>(f), static_cast<long>(s.tokens),
        static_cast<long>(rows), seq == s.tokens ? "sorted at once" : ("per seq of " + std::to_string(seq)).c_str(),
        static_cast<long>(runs), static_cast<long>(*lo), static_cast<long>(*hi), mean);
    double step_dense = 0, step_grouped = 0;
    std::vector<double> rep_dense(static_cast<size_t>(reps), 0.0), rep_grouped(rep_dense);
    for (const Variant& v : variants) {
      const Result r = measure(v, threads, reps);
      std::vector<double> ratios;
      for (size_t i = 0; i < r.dense_rep.size(); ++i) {
        ratios.push_back(r.dense_rep[i] / r.grouped_rep[i]);
        rep_dense[i] += v.step_weight * r.dense_rep[i];
        rep_grouped[i] += v.step_weight * r.grouped_rep[i];
      }
      std::printf("  %-9s grouped %6.1f GFLOP/s  dense %6.1f GFLOP/s (%d thr)  ratio %.2f  (median rep %.2f)\n", v.name,
                  v.flops / r.grouped_s / 1e9, v.flops / r.dense_s / 1e9, r.dense_threads, r.dense_s / r.grouped_s,
                  median(ratios));
      step_dense += v.step_weight * r.dense_s;
      step_grouped += v.step_weight * r.grouped_s;
    }
    std::vector<double> step_ratios;
    for (size_t i = 0; i < rep_dense.size(); ++i) step_ratios.push_back(rep_dense[i] / rep_grouped[i]);
    std::printf("  %-9s ratio %.2f  (median rep %.2f): dense time / grouped time over a step's nine expert GEMMs\n",
                "step", step_dense / step_grouped, median(step_ratios));
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int threads = omp_get_max_threads(), reps = 5;
  bool quick = false;
  std::string only;
  float skew = 0.6f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--skew" && i + 1 < argc) {
      skew = std::strtof(argv[++i], nullptr);
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--quick") {
      quick = true;
    } else {
      std::fprintf(stderr, "usage: grouped_gemm [--threads N] [--reps R] [--quick] [--only NAME] [--skew S]\n");
      return 2;
    }
  }
  if (threads < 1 || reps < 1) {
    std::fprintf(stderr, "grouped_gemm: --threads and --reps must be >= 1\n");
    return 2;
  }
  // name, experts, dim, moe_ffn, tokens, seq
  const std::vector<MoeShape> shapes{
      {"bench step", 8, 256, 256, 2048, 256},  // bench/moe_train.sh's MoE layer: batch 8 x seq 256
      {"E8 small", 8, 512, 256, 8192, 1024},   {"E8 large", 8, 2048, 1408, 4096, 2048},
      {"E64 small", 64, 512, 256, 8192, 1024}, {"E64 large", 64, 2048, 1408, 4096, 2048},
  };
  std::printf(
      "f32, grouped GEMM on %d threads, dense baseline on the faster of 1 and %d threads, best of %d reps; "
      "router logits N(0, 1) + a bias per expert N(0, %.2f)\n",
      threads, threads, reps, skew);
  for (const MoeShape& s : shapes) {
    if ((quick && s.dim > 512) || (!only.empty() && std::string(s.name).find(only) == std::string::npos)) continue;
    run_shape(s, threads, reps, skew);
  }
  return 0;
}
