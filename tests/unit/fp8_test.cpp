// FP8 training's pieces against independent references: rounding onto the
// E4M3 and E5M2 grids against a grid enumerated from the formats'
// definitions (ties to even, saturation, subnormals, zeros); the scale from
// an amax; the FP8 GEMMs and their backward against float64 products of the
// same quantised operands; a NaN named; the training.fp8 keys.
#include "core/fp8.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "config/config.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "kernels/cpu/op_kernels.h"
#include "models/llama.h"
#include "runtime/executor.h"
#include "sched/schedule.h"
#include "test_util.h"

using namespace meshtrain;
using namespace meshtrain::graph;

namespace {

// Every finite value >= 0 of the format, ascending, from its fields: E4M3
// (bias 7, no infinities, S.1111.111 the only NaN) and E5M2 (bias 15, IEEE-like).
std::vector<double> grid_of(DType format) {
  const bool e4m3 = format == DType::f8e4m3;
  const int mantissas = e4m3 ? 8 : 4, exponents = e4m3 ? 16 : 31, bias = e4m3 ? 7 : 15;
  std::vector<double> grid;
  for (int e = 0; e < exponents; ++e)
    for (int m = 0; m < mantissas; ++m) {
      if (e4m3 && e == 15 && m == 7) continue;  // NaN
      const double fraction = static_cast<double>(m) / mantissas;
      grid.push_back(e == 0 ? std::ldexp(fraction, 1 - bias) : std::ldexp(1 + fraction, e - bias));
    }
  return grid;
}

// The nearest grid value by search: ties to the even mantissa (every
// exponent has an even number of mantissas, so an even index), saturating.
double reference_round(double y, const std::vector<double>& grid) {
  const double a = std::fabs(y);
  if (a >= grid.back()) return std::copysign(grid.back(), y);
  const auto above = std::upper_bound(grid.begin(), grid.end(), a);
  const size_t hi = static_cast<size_t>(above - grid.begin()), lo = hi - 1;
  const double down = a - grid[lo], up = grid[hi] - a;
  const size_t pick = down < up ? lo : up < down ? hi : (lo % 2 == 0 ? lo : hi);
  return std::copysign(grid[pick], y);
}

TEST(Fp8, RoundingMatchesTheFormatsGrids) {
  std::mt19937 rng(5);
  for (const DType format : {DType::f8e4m3, DType::f8e5m2}) {
    SCOPED_TRACE(dtype_name(format));
    const std::vector<double> grid = grid_of(format);
    EXPECT_EQ(grid.back(), fp8_max(format));
    std::vector<float> ys{0.0f, -0.0f, 1e-30f, 1e30f, -1e30f, std::numeric_limits<float>::infinity()};
    for (size_t i = 0; i + 1 < grid.size(); ++i) {
      const auto mid = static_cast<float>((grid[i] + grid[i + 1]) / 2);  // exact in f32: a tie
      ys.insert(ys.end(), {static_cast<float>(grid[i]), mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)});
    }
    const double beyond = grid.back() + (grid.back() - grid[grid.size() - 2]) / 2;  // the tie past the largest
    ys.insert(ys.end(), {static_cast<float>(beyond), static_cast<float>(beyond * 1.01)});
    std::uniform_real_distribution<double> log2_magnitude(-24, 18);
    for (int i = 0; i < 20000; ++i) ys.push_back(static_cast<float>(std::exp2(log2_magnitude(rng))));
    for (const float y : std::vector<float>(ys)) ys.push_back(-y);
    for (const float y : ys) {
      const double want = reference_round(y, grid);
      ASSERT_EQ(fp8_round(y, format), want) << "y = " << y;
      ASSERT_EQ(std::signbit(fp8_round(y, format)), std::signbit(y)) << "y = " << y;
      // core's conversions (core/dtype.h) land on the same value.
      const float converted = format == DType::f8e4m3 ? e4m3_to_f32(f32_to_e4m3(y)) : e5m2_to_f32(f32_to_e5m2(y));
      ASSERT_EQ(converted, want) << "y = " << y;
    }
  }
}

TEST(Fp8, ScaleIsTheFormatsLargestOverAmax) {
  EXPECT_EQ(fp8_scale(DType::f8e4m3, 2.0, false), 224.0f);
  EXPECT_EQ(fp8_scale(DType::f8e5m2, 2.0, false), 28672.0f);
  EXPECT_EQ(fp8_scale(DType::f8e4m3, 3.0, false), static_cast<float>(448.0 / 3.0));
  EXPECT_EQ(fp8_scale(DType::f8e4m3, 2.0, true), 128.0f);          // 224 down to a power of two
  EXPECT_EQ(fp8_scale(DType::f8e4m3, 448.0 / 256, true), 256.0f);  // a power of two already
  const float zero = fp8_scale(DType::f8e4m3, 0.0, false);         // an all-zero tensor: finite
  EXPECT_TRUE(std::isfinite(zero) && zero > 0);
  EXPECT_TRUE(std::isfinite(fp8_scale(DType::f8e5m2, 1e-40, true)));
}

// The tensor's elements times the scale of its amax, rounded onto the grid
// by search (the reference's own quantisation), and that scale.
struct Quantised {
  std::vector<double> values;
  double scale;
};
Quantised reference_quantise(const Tensor& t, DType format) {
  double amax = 0;
  for (int64_t i = 0; i < t.numel(); ++i) amax = std::max(amax, std::fabs(t.get(i)));
  const auto scale = static_cast<float>(fp8_max(format) / std::max(amax, 1e-12));
  const std::vector<double> grid = grid_of(format);
  Quantised q{{}, scale};
  for (int64_t i = 0; i < t.numel(); ++i)
    q.values.push_back(reference_round(static_cast<float>(t.get(i)) * scale, grid));
  return q;
}

Tensor normal_tensor(const Shape& shape, DType dtype, std::mt19937& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  Tensor t = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, normal(rng));
  return t;
}

Attrs fp8_attrs(DType format_a, DType format_b) {
  return {attr::format_a(format_a), attr::format_b(format_b), attr::grad_format(DType::f8e5m2), attr::pow2_scale(false),
          attr::tensor("layer"),    attr::operand_a("input"), attr::operand_b("weight")};
}

// y = x W^T on FP8 operands (x [2, 3, K] E4M3, W [N, K] E4M3), and its
// gradients for a given dy (E5M2): each against float64 sums of the
// reference's quantised operands times both inverse scales.
void check_fp8_linear(DType dtype, double tolerance) {
  SCOPED_TRACE(dtype_name(dtype));
  constexpr int64_t kRows = 6, kK = 40, kN = 5;
  std::mt19937 rng(11);
  Tensor x = normal_tensor({2, 3, kK}, dtype, rng), w = normal_tensor({kN, kK}, dtype, rng);
  Tensor dy = normal_tensor({2, 3, kN}, dtype, rng);
  for (int64_t i = 0; i < dy.numel(); ++i) dy.set(i, dy.get(i) * 1e-4);  // gradients are small
  Graph g;
  Builder b(g);
  const ValueId xv = g.add_input("x", x.shape(), dtype), wv = g.add_parameter("w", w.shape(), dtype);
  const ValueId dyv = g.add_input("dy", dy.shape(), dtype);
  const ValueId y =
      b.fp8_matmul(xv, wv, b.amax(xv, "x"), b.amax(wv, "w"), false, true, fp8_attrs(DType::f8e4m3, DType::f8e4m3));
  std::map<ValueId, ValueId> grads;
  const std::vector<ValueId> dxw = append_backward(g, y, {xv, wv}, &grads, dyv);
  std::string text = to_text(g);
  EXPECT_NE(text.find("fp8_rows_matmul"), std::string::npos) << text;  // the weight's gradient, over every row
  runtime::Executor ex(g, sched::make_schedule(g, {y, dxw[0], dxw[1]}));
  ex.bind(xv, x);
  ex.bind(wv, w);
  ex.bind(dyv, dy);
  ex.run();
  const Quantised qx = reference_quantise(x, DType::f8e4m3), qw = reference_quantise(w, DType::f8e4m3);
  const Quantised qdy = reference_quantise(dy, DType::f8e5m2);
  auto expect_sums = [&](ValueId got_id, const Quantised& a, const Quantised& c, int64_t rows, int64_t cols,
                         int64_t inner, auto&& a_at, auto&& c_at, const char* what) {
    const Tensor got = ex.fetch(got_id).to(DType::f64);
    double largest = 0, worst = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k) {
        double sum = 0;
        for (int64_t i = 0; i < inner; ++i) sum += a.values[a_at(r, i)] * c.values[c_at(i, k)];
        const double want = sum / a.scale / c.scale;
        largest = std::max(largest, std::fabs(want));
        worst = std::max(worst, std::fabs(got.get(r * cols + k) - want));
      }
    EXPECT_LE(worst, tolerance * largest) << what;
    EXPECT_GT(largest, 0) << what;
  };
  // y[r, n] = sum_k x[r, k] w[n, k]; dx[r, k] = sum_n dy[r, n] w[n, k]; dw[n, k] = sum_r dy[r, n] x[r, k].
  expect_sums(
      y, qx, qw, kRows, kN, kK, [](int64_t r, int64_t k) { return r * kK + k; },
      [](int64_t k, int64_t n) { return n * kK + k; }, "y");
  expect_sums(
      dxw[0], qdy, qw, kRows, kK, kN, [](int64_t r, int64_t n) { return r * kN + n; },
      [](int64_t n, int64_t k) { return n * kK + k; }, "dx");
  expect_sums(
      dxw[1], qdy, qx, kN, kK, kRows, [](int64_t n, int64_t r) { return r * kN + n; },
      [](int64_t r, int64_t k) { return r * kK + k; }, "dw");
}

TEST(Fp8, GemmsAreExactForTheQuantisedOperands) {
  check_fp8_linear(DType::f32, 1e-6);   // f32 sums of exact products
  check_fp8_linear(DType::bf16, 4e-3);  // the same, the output rounded to bf16
}

// A weight quantised ahead (fp8_quantize, what FSDP gathers under
// training.fp8_all_gather) gives the GEMM and every gradient bitwise as the
// weight quantised inside the GEMM; the quantised bytes are the formats'.
TEST(Fp8, QuantisedAheadIsTheSameGemm) {
  std::mt19937 rng(3);
  const Tensor x = normal_tensor({2, 3, 16}, DType::bf16, rng), w = normal_tensor({5, 16}, DType::bf16, rng);
  const Tensor dy = normal_tensor({2, 3, 5}, DType::bf16, rng);
  std::vector<Tensor> results[2];
  for (const bool ahead : {false, true}) {
    Graph g;
    Builder b(g);
    const ValueId xv = g.add_input("x", x.shape(), DType::bf16), wv = g.add_parameter("w", w.shape(), DType::bf16);
    const ValueId dyv = g.add_input("dy", dy.shape(), DType::bf16);
    const ValueId w_amax = b.amax(wv, "w");
    const ValueId operand =
        ahead ? b.op("fp8_quantize", {wv, w_amax},
                     {attr::dtype(DType::f8e4m3), attr::pow2_scale(false), attr::tensor("layer weight")})
              : wv;
    const ValueId y =
        b.fp8_matmul(xv, operand, b.amax(xv, "x"), w_amax, false, true, fp8_attrs(DType::f8e4m3, DType::f8e4m3));
    const std::vector<ValueId> grads = append_backward(g, y, {xv, wv}, nullptr, dyv);
    std::vector<ValueId> outs{y, grads[0], grads[1]};
    if (ahead) outs.push_back(operand);
    runtime::Executor ex(g, sched::make_schedule(g, outs));
    ex.bind(xv, x);
    ex.bind(wv, w);
    ex.bind(dyv, dy);
    ex.run();
    for (const ValueId v : outs) results[ahead].push_back(ex.fetch(v).to(DType::f64));  // a copy: the executor goes
  }
  for (size_t i = 0; i < 3; ++i)
    for (int64_t k = 0; k < results[0][i].numel(); ++k)
      ASSERT_EQ(results[0][i].get(k), results[1][i].get(k)) << "output " << i << " element " << k;
  const Quantised qw = reference_quantise(w, DType::f8e4m3);
  for (int64_t k = 0; k < w.numel(); ++k)
    ASSERT_EQ(results[1][3].get(k), qw.values[static_cast<size_t>(k)]) << "quantised weight element " << k;
}

// A NaN or infinity in an operand: its amax is +inf (which an all-reduce
// by max keeps on every rank), the FP8 GEMM gives NaNs (so the step is not
// finite, and the trainer stops or passes it over as any such step) and
// notes the layer and the operand for the trainer to name.
TEST(Fp8, NanInAnOperandIsNamed) {
  Graph g;
  Builder b(g);
  const ValueId x = g.add_input("x", {2, 4}, DType::f32), w = g.add_input("w", {3, 4}, DType::f32);
  const ValueId x_amax = b.amax(x, "x");
  Attrs attrs = fp8_attrs(DType::f8e4m3, DType::f8e4m3);
  attrs.set(attr::tensor, std::string("model.layers.0.mlp.up_proj"));
  const ValueId y = b.fp8_matmul(x, w, x_amax, b.amax(w, "w"), false, true, attrs);
  runtime::Executor ex(g, sched::make_schedule(g, {x_amax, y}));
  Tensor xt = Tensor::zeros({2, 4}, DType::f32), wt = Tensor::zeros({3, 4}, DType::f32);
  xt.set(0, -3.0);
  ex.bind(x, xt);
  ex.bind(w, wt);
  ex.run();
  EXPECT_EQ(ex.fetch(x_amax).get(0), 3.0);
  EXPECT_EQ(ex.fetch(y).get(0), 0.0);
  EXPECT_EQ(kernels::cpu::take_fp8_nonfinite_operand(), "");
  for (const double bad : {std::nan(""), -std::numeric_limits<double>::infinity()}) {
    xt.set(5, bad);
    ex.run();
    EXPECT_EQ(ex.fetch(x_amax).get(0), std::numeric_limits<double>::infinity());
    EXPECT_TRUE(std::isnan(ex.fetch(y).get(0)));
    EXPECT_EQ(kernels::cpu::take_fp8_nonfinite_operand(), "model.layers.0.mlp.up_proj input");
    EXPECT_EQ(kernels::cpu::take_fp8_nonfinite_operand(), "");  // taken
  }
}

// Which linear layers run in FP8: the blocks', less the router and fp8_skip's.
TEST(Fp8, AppliesToTheBlocksLinearsLessSkipped) {
  models::Fp8Linears fp8{.enabled = true, .skip = {"mlp.down_proj", "layers.1."}};
  EXPECT_TRUE(fp8.applies_to("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_TRUE(fp8.applies_to("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_FALSE(fp8.applies_to("model.layers.0.mlp.down_proj.weight"));
  EXPECT_FALSE(fp8.applies_to("model.layers.1.self_attn.q_proj.weight"));
  EXPECT_FALSE(fp8.applies_to("model.layers.0.block_sparse_moe.gate.weight"));
  EXPECT_FALSE(fp8.applies_to("lm_head.weight"));
  fp8.enabled = false;
  EXPECT_FALSE(fp8.applies_to("model.layers.0.self_attn.q_proj.weight"));
}

TEST(Fp8, ConfigKeys) {
  using config::load_config;
  const std::string file = MESHTRAIN_SOURCE_DIR "/configs/debug.toml";
  const config::TrainConfig c = load_config(file, {{"training.fp8", "tensorwise"},
                                                   {"training.fp8_format", "e4m3"},
                                                   {"training.fp8_pow2_scale", "true"},
                                                   {"training.fp8_all_gather", "true"},
                                                   {"training.fp8_skip", "down_proj,layers.0."}});
  EXPECT_TRUE(c.model.fp8.enabled);
  EXPECT_EQ(c.model.fp8.grad_format, DType::f8e4m3);
  EXPECT_TRUE(c.model.fp8.pow2_scale);
  EXPECT_TRUE(c.model.fp8.all_gather);
  EXPECT_EQ(c.model.fp8.skip, (std::vector<std::string>{"down_proj", "layers.0."}));
  EXPECT_EQ(load_config(file, {}).model.fp8.grad_format, DType::f8e5m2);  // hybrid
  auto error = [&](const std::vector<std::pair<std::string, std::string>>& overrides) {
    return mtest::message_of([&] { load_config(file, overrides); });
  };
  EXPECT_TRUE(mtest::contains(error({{"training.fp8_skip", "output"}}), "training.fp8 is none")) << "ignored key";
  EXPECT_TRUE(mtest::contains(error({{"training.fp8", "rowwise"}}), "none, tensorwise"));
  EXPECT_TRUE(mtest::contains(error({{"training.fp8", "tensorwise"}, {"training.fp8_skip", "a,,b"}}), "non-empty"));
  EXPECT_TRUE(mtest::contains(error({{"training.fp8", "tensorwise"}, {"training.fp8_skip", "down_prj"}}),
                              "'down_prj' is in the name of no linear layer"));
  EXPECT_TRUE(mtest::contains(error({{"training.fp8", "tensorwise"}, {"training.fp8_skip", "gate.weight"}}),
                              "no linear layer"));  // a router is not one, and names are the weight's less .weight

  EXPECT_TRUE(
      mtest::contains(error({{"training.fp8", "tensorwise"}, {"training.device", "cuda"}}), "CPU kernels only"));
}

}  // namespace
