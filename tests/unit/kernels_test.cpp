// CPU kernels beyond the per-op gradient checks: blocked attention against a
// written-out float64 reference at lengths that cross the query and key
// blocks; every op's bf16 kernel against its f32 kernel on the same
// (bf16-representable) inputs; AdamW with bf16 moments; the fast exp; the
// AVX512_BF16 block GEMM and the bf16 attention built on it against float64.
#include <dnnl.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <functional>
#include <random>

#include "graph/autodiff.h"
#include "graph/builder.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/bf16_matmul.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/kernel_errors.h"
#include "kernels/cpu/op_kernels.h"
#include "runtime/executor.h"
#include "sched/schedule.h"

using namespace meshtrain;
using namespace meshtrain::graph;

namespace {

Tensor random_tensor(const Shape& shape, DType dtype, std::mt19937& rng, double lo = -1.5, double hi = 1.5) {
  std::uniform_real_distribution<double> u(lo, hi);
  Tensor t = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, u(rng));
  return t;
}

// The naive causal attention and its backward in float64, written out from
// the definitions: P = softmax(scale * Q K^T + mask), O = P V;
// dP = dO V^T, dS = P * (dP - rowsum(dO * O)), dQ = scale dS K,
// dK = scale dS^T Q, dV = P^T dO. One batch row, one query head per kv head.
struct NaiveAttention {
  int64_t t, d;
  double scale;
  std::vector<double> out, dq, dk, dv;
  NaiveAttention(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                 const std::vector<double>& dout, int64_t t_, int64_t d_, double scale_)
      : t(t_), d(d_), scale(scale_) {
    const auto n = static_cast<size_t>(t * d);
    out.assign(n, 0);
    dq.assign(n, 0);
    dk.assign(n, 0);
    dv.assign(n, 0);
    std::vector<double> p(static_cast<size_t>(t * t), 0), dp(static_cast<size_t>(t * t), 0);
    for (int64_t i = 0; i < t; ++i) {
      double max = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {
        double s = 0;
        for (int64_t c = 0; c < d; ++c) s += q[i * d + c] * k[j * d + c];
        p[i * t + j] = s * scale;
        max = std::max(max, s * scale);
      }
      double total = 0;
      for (int64_t j = 0; j <= i; ++j) total += p[i * t + j] = std::exp(p[i * t + j] - max);
      for (int64_t j = 0; j <= i; ++j) p[i * t + j] /= total;
      for (int64_t j = 0; j <= i; ++j)
        for (int64_t c = 0; c < d; ++c) out[i * d + c] += p[i * t + j] * v[j * d + c];
    }
    for (int64_t i = 0; i < t; ++i) {
      double delta = 0;
      for (int64_t c = 0; c < d; ++c) delta += dout[i * d + c] * out[i * d + c];
      for (int64_t j = 0; j <= i; ++j) {
        double dpij = 0;
        for (int64_t c = 0; c < d; ++c) dpij += dout[i * d + c] * v[j * d + c];
        const double ds = p[i * t + j] * (dpij - delta);
        for (int64_t c = 0; c < d; ++c) {
          dq[i * d + c] += scale * ds * k[j * d + c];
          dk[j * d + c] += scale * ds * q[i * d + c];
          dv[j * d + c] += p[i * t + j] * dout[i * d + c];
        }
      }
    }
  }
};

double max_abs_diff(const double* a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

}  // namespace

// T = 600 crosses the 64-row query blocks and the 512-key blocks (the online
// softmax's rescaling); odd head size 5.
TEST(Attention, BlockedMatchesNaiveAcrossBlocks) {
  const int64_t T = 600, D = 5;
  const double scale = 0.7;
  std::mt19937 rng(11);
  std::vector<double> q, k, v, dout;
  for (auto* x : {&q, &k, &v, &dout}) {
    const Tensor r = random_tensor({T, D}, DType::f64, rng);
    x->assign(r.data<const double>().begin(), r.data<const double>().end());
  }
  const NaiveAttention want(q, k, v, dout, T, D, scale);
  std::vector<double> out(q.size()), lse(static_cast<size_t>(T)), dq(q.size()), dk(q.size()), dv(q.size());
  const kernels::cpu::AttentionShape shape{1, T, T, 1, 1, D, {}};
  kernels::cpu::attention(q.data(), k.data(), v.data(), out.data(), lse.data(), shape, scale);
  EXPECT_LT(max_abs_diff(out.data(), want.out), 1e-12);
  kernels::cpu::attention_backward(q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(),
                                   dk.data(), dv.data(), shape, scale);
  EXPECT_LT(max_abs_diff(dq.data(), want.dq), 1e-11);
  EXPECT_LT(max_abs_diff(dk.data(), want.dk), 1e-11);
  EXPECT_LT(max_abs_diff(dv.data(), want.dv), 1e-11);
}

// Context parallelism: each of cp = 3 ranks holds its two load-balanced
// chunks of the queries (of 6 chunks of 100) and every key in position
// order. Its rows of out and dQ are the whole attention's rows at their
// positions; its dK and dV, summed over the ranks, the whole dK and dV.
TEST(Attention, LoadBalancedQueryPartsMatchTheirPositions) {
  const int64_t T = 600, D = 5, cp = 3, part = T / cp;
  const double scale = 0.7;
  std::mt19937 rng(12);
  std::vector<double> q, k, v, dout;
  for (auto* x : {&q, &k, &v, &dout}) {
    const Tensor r = random_tensor({T, D}, DType::f64, rng);
    x->assign(r.data<const double>().begin(), r.data<const double>().end());
  }
  const NaiveAttention want(q, k, v, dout, T, D, scale);
  std::vector<double> dk_sum(k.size(), 0), dv_sum(k.size(), 0);
  for (int64_t r = 0; r < cp; ++r) {
    const kernels::cpu::AttentionShape shape{1, part, T, 1, 1, D, {T, 2 * cp, r * part}};
    // This rank's rows, gathered from their positions.
    std::vector<double> q_part, dout_part;
    for (int64_t i = 0; i < part; ++i)
      for (int64_t c = 0; c < D; ++c) {
        q_part.push_back(q[static_cast<size_t>(shape.queries.position(i) * D + c)]);
        dout_part.push_back(dout[static_cast<size_t>(shape.queries.position(i) * D + c)]);
      }
    std::vector<double> out(q_part.size()), lse(static_cast<size_t>(part)), dq(q_part.size()), dk(k.size()),
        dv(k.size());
    kernels::cpu::attention(q_part.data(), k.data(), v.data(), out.data(), lse.data(), shape, scale);
    kernels::cpu::attention_backward(q_part.data(), k.data(), v.data(), out.data(), lse.data(), dout_part.data(),
                                     dq.data(), dk.data(), dv.data(), shape, scale);
    for (int64_t i = 0; i < part; ++i)
      for (int64_t c = 0; c < D; ++c) {
        const auto at = static_cast<size_t>(shape.queries.position(i) * D + c), mine = static_cast<size_t>(i * D + c);
        ASSERT_NEAR(out[mine], want.out[at], 1e-12) << "rank " << r << " row " << i;
        ASSERT_NEAR(dq[mine], want.dq[at], 1e-11) << "rank " << r << " row " << i;
      }
    for (size_t i = 0; i < k.size(); ++i) {
      dk_sum[i] += dk[i];
      dv_sum[i] += dv[i];
    }
  }
  EXPECT_LT(max_abs_diff(dk_sum.data(), want.dk), 1e-11);
  EXPECT_LT(max_abs_diff(dv_sum.data(), want.dv), 1e-11);
}

namespace {
// An op's CPU kernel on host tensors: fresh outputs of the given shapes and dtypes.
std::vector<Tensor> run_cpu(const std::string& op, const std::vector<const Tensor*>& in,
                            const std::vector<std::pair<Shape, DType>>& outputs, const Attrs& attrs) {
  std::vector<Tensor> out;
  std::vector<Tensor*> out_ptrs;
  for (const auto& [shape, dtype] : outputs) out.push_back(Tensor::zeros(shape, dtype));
  for (Tensor& t : out) out_ptrs.push_back(&t);
  (*kernels::cpu::find_cpu_kernel(op))(kernels::KernelArgs{in, out_ptrs, attrs});
  return out;
}

// Rows [first, first + n) of dim 1 of x.
Tensor rows_of(const Tensor& x, int64_t first, int64_t n) {
  std::vector<int64_t> dims = x.shape().dims();
  const int64_t t = dims[1], inner = x.numel() / (dims[0] * t);
  dims[1] = n;
  Tensor out = Tensor::empty(Shape(dims), x.dtype());
  for (int64_t o = 0; o < dims[0]; ++o)
    for (int64_t e = 0; e < n * inner; ++e) out.set(o * n * inner + e, x.get((o * t + first) * inner + e));
  return out;
}

double largest_difference(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.get(i), y = b.get(i);
    if (std::isinf(x) || std::isinf(y)) {
      if (x != y) return INFINITY;
      continue;
    }
    m = std::max(m, std::abs(x - y));
  }
  return m;
}

// Ring attention's arithmetic on one cp rank (cp 2, rank 1: position chunks
// 1 and 2 of 4): its queries against each key chunk alone (key_first), the
// partial results merged by their log-sum-exps (attention_merge), equal its
// queries against every key at once; the backward of each block with the
// merged out and lse gives dQ in parts that sum to the whole dQ, and each
// block's rows of dK and dV. Key chunk 3 lies after every query (rows that
// see no key: 0 and -inf), chunk 2 on the diagonal.
void check_ring_blocks(DType dtype, double tolerance) {
  const int64_t B = 2, T = 24, H = 4, Hkv = 2, D = 6, chunk = T / 4;
  std::mt19937 rng(31);
  const Tensor q = random_tensor({B, 2 * chunk, H, D}, dtype, rng),
               dout = random_tensor({B, 2 * chunk, H, D}, dtype, rng);
  const Tensor k = random_tensor({B, T, Hkv, D}, dtype, rng), v = random_tensor({B, T, Hkv, D}, dtype, rng);
  const Attrs part{attr::scale(0.45), attr::seq_chunks(4), attr::seq_first(2 * chunk), attr::seq_total(T)};
  const Shape q_shape = q.shape(), lse_shape{B, H, 2 * chunk}, kv_chunk{B, chunk, Hkv, D};
  const DType acc = dtype == DType::bf16 ? DType::f32 : dtype;
  const std::vector<std::pair<Shape, DType>> forward{{q_shape, dtype}, {lse_shape, acc}};
  const std::vector<Tensor> whole = run_cpu("attention", {&q, &k, &v}, forward, part);
  const std::vector<Tensor> whole_grads = run_cpu("attention_backward", {&q, &k, &v, &whole[0], &whole[1], &dout},
                                                  {{q_shape, dtype}, {k.shape(), dtype}, {k.shape(), dtype}}, part);
  std::vector<Tensor> partials;
  Tensor dq = Tensor::zeros(q_shape, dtype);
  for (int64_t c = 0; c < 4; ++c) {
    Attrs block = part;
    block.set(attr::key_first, c * chunk);
    const Tensor kc = rows_of(k, c * chunk, chunk), vc = rows_of(v, c * chunk, chunk);
    for (Tensor& t : run_cpu("attention", {&q, &kc, &vc}, forward, block)) partials.push_back(std::move(t));
    const std::vector<Tensor> g = run_cpu("attention_backward", {&q, &kc, &vc, &whole[0], &whole[1], &dout},
                                          {{q_shape, dtype}, {kv_chunk, dtype}, {kv_chunk, dtype}}, block);
    for (int64_t i = 0; i < dq.numel(); ++i) dq.set(i, dq.get(i) + g[0].get(i));
    EXPECT_LE(largest_difference(g[1], rows_of(whole_grads[1], c * chunk, chunk)), tolerance) << "dK of chunk " << c;
    EXPECT_LE(largest_difference(g[2], rows_of(whole_grads[2], c * chunk, chunk)), tolerance) << "dV of chunk " << c;
    if (c == 3) {  // after every query
      for (int64_t i = 0; i < partials[6].numel(); ++i) ASSERT_EQ(partials[6].get(i), 0.0);
      for (int64_t i = 0; i < partials[7].numel(); ++i) ASSERT_EQ(partials[7].get(i), -INFINITY);
    }
  }
  std::vector<const Tensor*> pairs;
  for (const Tensor& t : partials) pairs.push_back(&t);
  const std::vector<Tensor> merged = run_cpu("attention_merge", pairs, forward, {});
  EXPECT_LE(largest_difference(merged[0], whole[0]), tolerance);
  EXPECT_LE(largest_difference(merged[1], whole[1]), tolerance);
  EXPECT_LE(largest_difference(dq, whole_grads[0]), tolerance);
}
}  // namespace

TEST(Attention, RingBlocksOfKeysMergeToTheWholeAttention) { check_ring_blocks(DType::f64, 1e-12); }

// bf16: each block's output is rounded to bf16 before the merge (2^-9 of
// each value), and dQ summed over blocks in bf16.
TEST(Attention, RingBlocksOfKeysMergeInBf16) { check_ring_blocks(DType::bf16, 2e-2); }

TEST(SequenceOrder, HeadTailChunksAndBack) {
  const graph::SequenceOrder whole{12, 4, 0};  // cp 2: chunks of 3, stored as 0, 3, 1, 2
  const std::vector<int64_t> want{0, 1, 2, 9, 10, 11, 3, 4, 5, 6, 7, 8};
  for (int64_t i = 0; i < 12; ++i) {
    EXPECT_EQ(whole.position(i), want[static_cast<size_t>(i)]) << i;
    EXPECT_EQ(whole.stored_index(whole.position(i)), i) << i;
  }
  const graph::SequenceOrder second_rank{12, 4, 6};
  EXPECT_EQ(second_rank.position(0), 3);
  EXPECT_EQ(second_rank.position(5), 8);
  EXPECT_EQ((graph::SequenceOrder{12, 1, 5}.position(2)), 7);  // position order: first + i
}

TEST(Kernels, FastExpWithinTwoUlpAndLimits) {
  // exp is internal to the kernels; softmax of {x, 0} exposes exp(x) / (exp(x) + 1).
  float worst = 0;
  for (float x = -80.0f; x <= 80.0f; x += 0.01234f) {
    const float in[2] = {x, 0.0f};
    float y[2];
    kernels::cpu::softmax(in, y, 1, 2);
    const double want = 1.0 / (1.0 + std::exp(-static_cast<double>(x)));
    worst = std::max(worst, static_cast<float>(std::abs(y[0] - want) / want));
  }
  EXPECT_LT(worst, 4e-7f);  // a few float ulps through exp, the sum and the division
  const float masked[3] = {-INFINITY, 1.0f, -INFINITY};
  float y[3];
  kernels::cpu::softmax(masked, y, 1, 3);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[1], 1.0f);
  const float with_nan[2] = {NAN, 0.0f};
  kernels::cpu::softmax(with_nan, y, 1, 2);
  EXPECT_TRUE(std::isnan(y[1]));
}

namespace {
// Builds f(inputs) in the given dtype, runs it, returns the outputs as f64.
using BuildFn = std::function<std::vector<ValueId>(Builder&, const std::vector<ValueId>&)>;
std::vector<Tensor> run_in(DType dtype, const std::vector<Tensor>& inputs, const BuildFn& f) {
  Graph g;
  Builder b(g);
  std::vector<ValueId> ids;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::string name = "x";
    name += std::to_string(i);
    ids.push_back(g.add_input(name, inputs[i].shape(), inputs[i].dtype() == DType::i64 ? DType::i64 : dtype));
  }
  const std::vector<ValueId> outs = f(b, ids);
  runtime::Executor ex(g, sched::make_schedule(g, outs));
  std::vector<Tensor> bound;
  for (size_t i = 0; i < inputs.size(); ++i) {
    bound.push_back(inputs[i].dtype() == DType::i64 ? inputs[i] : inputs[i].to(dtype));
    ex.bind(ids[i], bound.back());
  }
  ex.run();
  std::vector<Tensor> result;
  for (ValueId o : outs) result.push_back(ex.fetch(o).to(DType::f64));
  return result;
}

// Every output of f in bf16 against f32 on the same inputs (rounded to bf16
// first, so both see identical values): within `tolerance` of the largest
// f32 magnitude, which allows bf16's rounding of the outputs (2^-9 relative)
// and of intermediates that the op stores in bf16.
void expect_bf16_matches_f32(const std::vector<Tensor>& inputs_f32, const BuildFn& f, double tolerance = 1.6e-2) {
  std::vector<Tensor> inputs;
  for (const Tensor& t : inputs_f32) inputs.push_back(t.dtype() == DType::i64 ? t : t.to(DType::bf16).to(DType::f32));
  const auto want = run_in(DType::f32, inputs, f);
  const auto got = run_in(DType::bf16, inputs, f);
  ASSERT_EQ(want.size(), got.size());
  for (size_t o = 0; o < want.size(); ++o) {
    double scale = 1e-30, worst = 0;
    for (int64_t i = 0; i < want[o].numel(); ++i) scale = std::max(scale, std::abs(want[o].get(i)));
    for (int64_t i = 0; i < want[o].numel(); ++i) worst = std::max(worst, std::abs(want[o].get(i) - got[o].get(i)));
    EXPECT_LT(worst / scale, tolerance) << "output " << o;
    EXPECT_GT(scale, 1e-6) << "output " << o << " is all zeros: the comparison would be empty";
  }
}
}  // namespace

TEST(Bf16Kernels, ElementwiseAndRowOpsMatchFloat32) {
  std::mt19937 rng(5);
  const auto x = random_tensor({37, 24}, DType::f32, rng), y = random_tensor({37, 24}, DType::f32, rng);
  const auto w = random_tensor({24}, DType::f32, rng, 0.5, 1.5);
  expect_bf16_matches_f32({x, y}, [](Builder& b, const std::vector<ValueId>& in) {
    return std::vector<ValueId>{b.add(in[0], in[1]),    b.mul(in[0], in[1]), b.scale(in[0], 0.37), b.silu(in[0]),
                                b.swiglu(in[0], in[1]), b.softmax(in[0]),    b.sum(in[0]),         b.mean(in[1])};
  });
  expect_bf16_matches_f32({x, w}, [](Builder& b, const std::vector<ValueId>& in) {
    return std::vector<ValueId>{b.rms_norm(in[0], in[1], 1e-5)};
  });
}

TEST(Bf16Kernels, GradientsMatchFloat32) {
  // The backward kernels (silu, swiglu, softmax, rms_norm, rope, attention,
  // cross-entropy, embedding, slice, concat, matmul) through autodiff of one loss.
  std::mt19937 rng(9);
  const int64_t B = 2, T = 70, H = 2, D = 8, V = 11;
  Tensor ids = Tensor::empty({B, T}, DType::i64), targets = Tensor::empty({B, T}, DType::i64);
  std::uniform_int_distribution<int64_t> tok(0, V - 1);
  for (int64_t i = 0; i < B * T; ++i) {
    ids.data<int64_t>()[i] = tok(rng);
    targets.data<int64_t>()[i] = i % 13 == 0 ? -100 : tok(rng);
  }
  const auto table = random_tensor({V, H * D}, DType::f32, rng),
             wq = random_tensor({H * D, H * D}, DType::f32, rng, -0.3, 0.3),
             wo = random_tensor({H * D, V}, DType::f32, rng, -0.3, 0.3),
             norm_w = random_tensor({H * D}, DType::f32, rng, 0.5, 1.5);
  expect_bf16_matches_f32(
      {table, wq, wo, norm_w, ids, targets},
      [&](Builder& b, const std::vector<ValueId>& in) {
        const ValueId h = b.embedding(in[0], in[4]);
        const ValueId n = b.rms_norm(h, in[3], 1e-5);
        const ValueId q = b.rope(b.reshape(b.matmul(n, in[1]), {B, T, H, D}), 10000.0);
        const ValueId kv = b.reshape(b.silu(n), {B, T, H, D});
        const ValueId a = b.reshape(b.attention(q, kv, kv, 0.35), {B, T, H * D});
        const ValueId mixed = b.concat({b.slice(a, 2, 0, D), b.softmax(b.slice(h, 2, D, D))}, 2);
        const ValueId loss = b.cross_entropy(b.matmul(b.swiglu(mixed, n), in[2]), in[5], -100);
        const auto grads = append_backward(b.graph(), loss, {in[0], in[1], in[2], in[3]});
        std::vector<ValueId> outs{loss};
        outs.insert(outs.end(), grads.begin(), grads.end());
        return outs;
      },
      3e-2);
}

TEST(Bf16Kernels, AdamWWithBf16MomentsTracksFloat32Moments) {
  // Same update with f32 and bf16 moments over 20 steps: the parameters stay
  // within bf16's relative precision of the moments (2^-8) times the step size.
  std::mt19937 rng(2);
  const int64_t n = 1000;
  const double lr = 1e-2;
  Tensor p32 = random_tensor({n}, DType::f32, rng), p16 = p32.to(DType::f32);
  Tensor m32 = Tensor::zeros({n}, DType::f32), v32 = Tensor::zeros({n}, DType::f32);
  Tensor m16 = Tensor::zeros({n}, DType::bf16), v16 = Tensor::zeros({n}, DType::bf16);
  for (int64_t step = 1; step <= 20; ++step) {
    const Tensor grad = random_tensor({n}, DType::f32, rng);
    kernels::cpu::adamw(p32.data<float>().data(), grad.data<const float>().data(), m32.data<float>().data(),
                        v32.data<float>().data(), n, lr, 0.9, 0.95, 1e-8, 0.1, step);
    kernels::cpu::adamw(p16.data<float>().data(), grad.data<const float>().data(), m16.data<bfloat16>().data(),
                        v16.data<bfloat16>().data(), n, lr, 0.9, 0.95, 1e-8, 0.1, step);
  }
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(p32.get(i) - p16.get(i)));
  EXPECT_GT(worst, 0.0);             // the bf16 moments do round
  EXPECT_LT(worst, 20 * lr * 0.02);  // but each step moves by at most lr, off by ~1%
  double m_max = 0, m_worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    m_max = std::max(m_max, std::abs(m32.get(i)));
    m_worst = std::max(m_worst, std::abs(m16.get(i) - m32.get(i)));
  }
  EXPECT_LT(m_worst, 0.02 * m_max);  // 20 roundings of at most 2^-9 each
}

namespace {
std::vector<bfloat16> random_bf16(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  std::vector<bfloat16> x(n);
  for (auto& e : x) e = f32_to_bf16(u(rng));
  return x;
}
double widen(bfloat16 x) { return bf16_to_f32(x); }
}  // namespace

// Every packing with odd sizes (k's zero pad, the column mask at n = 37 > 32,
// row tiles of 8 at m = 13), overwrite and accumulate, against a float64 sum.
TEST(Bf16Dot, GemmOnEveryPackingMatchesFloat64) {
  if (!kernels::cpu::bf16_dot_enabled()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  using namespace kernels::cpu;
  const int64_t m = 13, n = 37, k = 21, pairs = (k + 1) / 2;
  std::mt19937 rng(3);
  const auto a = random_bf16(m * k, rng), b = random_bf16(k * n, rng);
  std::vector<bfloat16> a_t(static_cast<size_t>(k * m)), b_t(static_cast<size_t>(n * k));  // A^T [k, m], B^T [n, k]
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p) a_t[p * m + i] = a[i * k + p];
  for (int64_t p = 0; p < k; ++p)
    for (int64_t j = 0; j < n; ++j) b_t[j * k + p] = b[p * n + j];
  std::vector<double> want(static_cast<size_t>(m * n), 0.0), bound(want.size(), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p) {
        want[i * n + j] += widen(a[i * k + p]) * widen(b[p * n + j]);
        bound[i * n + j] += std::abs(widen(a[i * k + p]) * widen(b[p * n + j]));
      }
  std::vector<uint32_t> a_rows(m * pairs), a_cols(m * pairs), b_pairs(pairs * n), b_trans(pairs * n);
  pack_rows(a.data(), k, m, k, a_rows.data());
  pack_columns(a_t.data(), m, k, m, a_cols.data());
  pack_pairs(b.data(), n, k, n, b_pairs.data());
  pack_pairs_transposed(b_t.data(), k, n, k, b_trans.data());
  EXPECT_EQ(a_rows, a_cols);
  EXPECT_EQ(b_pairs, b_trans);
  std::vector<float> c(static_cast<size_t>(m * n) + 1, 7.0f);  // one past the end: must stay untouched
  gemm_bf16_pairs(m, n, pairs, a_rows.data(), pairs, b_pairs.data(), n, c.data(), n, false);
  gemm_bf16_pairs(m, n, pairs, a_cols.data(), pairs, b_trans.data(), n, c.data(), n, true);  // C = 2 A B
  for (int64_t i = 0; i < m * n; ++i) EXPECT_NEAR(c[i], 2 * want[i], 2e-6 * bound[i] + 1e-30) << "element " << i;
  EXPECT_EQ(c.back(), 7.0f);
  // From f32 the packing rounds to bf16 first.
  std::vector<float> a_f32(a.size());
  for (size_t i = 0; i < a.size(); ++i) a_f32[i] = static_cast<float>(widen(a[i])) * (1.0f + 1e-4f);
  std::vector<uint32_t> a_rounded(m * pairs);
  pack_rows(a_f32.data(), k, m, k, a_rounded.data());
  EXPECT_EQ(a_rounded, a_rows);
}

// The bf16 GEMM (oneDNN's kernel where the CPU has one) and its widened path
// (what runs where oneDNN has none), both against a float64 sum of the same
// bf16 values: every transpose, B shared or batched, an odd batch stride
// (matrices apart by more than their size). Each element is the exact sum
// rounded once to bf16 (2^-9 relative), after an f32 accumulation.
TEST(Bf16Matmul, OneDnnAndWidenedPathsMatchFloat64) {
  using namespace kernels::cpu;
  const int64_t batch = 3, m = 13, n = 11, k = 17, a_stride = m * k + 5;
  std::mt19937 rng(5);
  for (bool shared : {true, false})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const int64_t b_stride = shared ? 0 : k * n;
        const auto a = random_bf16(static_cast<size_t>(batch * a_stride), rng);
        const auto b = random_bf16(static_cast<size_t>(shared ? k * n : batch * k * n), rng);
        std::vector<double> want(static_cast<size_t>(batch * m * n), 0.0), bound(want.size(), 0.0);
        for (int64_t x = 0; x < batch; ++x)
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j)
              for (int64_t p = 0; p < k; ++p) {
                const double u = widen(a[x * a_stride + (ta ? p * m + i : i * k + p)]);
                const double v = widen(b[x * b_stride + (tb ? j * k + p : p * n + j)]);
                want[(x * m + i) * n + j] += u * v;
                bound[(x * m + i) * n + j] += std::abs(u * v);
              }
        for (const bool widened : {false, true}) {
          std::vector<bfloat16> c(want.size() + 1, f32_to_bf16(7.0f));  // one past the end: must stay untouched
          (widened ? matmul_bf16_widened : matmul_bf16)(a.data(), b.data(), c.data(), batch, m, n, k, ta, tb, a_stride,
                                                        b_stride);
          for (size_t i = 0; i < want.size(); ++i)
            ASSERT_NEAR(widen(c[i]), want[i], std::ldexp(std::abs(want[i]), -8) + 1e-6 * bound[i])
                << "widened=" << widened << " shared=" << shared << " ta=" << ta << " tb=" << tb << " i=" << i;
          EXPECT_EQ(widen(c.back()), 7.0);
        }
      }
}

namespace {
// One (batch, head)'s [T, D] rows of x [B, T, H, D] in float64.
std::vector<double> head_rows(const std::vector<bfloat16>& x, int64_t bi, int64_t h, int64_t t, int64_t heads,
                              int64_t d) {
  std::vector<double> rows(static_cast<size_t>(t * d));
  for (int64_t j = 0; j < t; ++j)
    for (int64_t c = 0; c < d; ++c) rows[j * d + c] = widen(x[((bi * t + j) * heads + h) * d + c]);
  return rows;
}
}  // namespace

// The bf16 attention on the generic path (every CPU) and on the
// AVX512_BF16 path (skipped where the CPU has none), each against float64 on
// the same bf16 values: grouped-query heads, T = 601 across query and key
// blocks and odd, head size 7 odd (k padding).
namespace {
struct Bf16AttentionCase {
  static constexpr int64_t B = 2, T = 601, Hq = 4, Hkv = 2, D = 7;
  static constexpr double scale = 0.6;
  std::vector<bfloat16> q, dout, k, v;
  // Reference per (batch, query head); dK and dV summed over the group.
  std::vector<double> want_out, want_dq, want_dk, want_dv;
  Bf16AttentionCase() {
    std::mt19937 rng(17);
    q = random_bf16(B * T * Hq * D, rng);
    dout = random_bf16(q.size(), rng);
    k = random_bf16(B * T * Hkv * D, rng);
    v = random_bf16(k.size(), rng);
    want_out.resize(q.size());
    want_dq.resize(q.size());
    want_dk.assign(k.size(), 0.0);
    want_dv.assign(k.size(), 0.0);
    for (int64_t bi = 0; bi < B; ++bi)
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t hk = h / (Hq / Hkv);
        const NaiveAttention ref(head_rows(q, bi, h, T, Hq, D), head_rows(k, bi, hk, T, Hkv, D),
                                 head_rows(v, bi, hk, T, Hkv, D), head_rows(dout, bi, h, T, Hq, D), T, D, scale);
        for (int64_t j = 0; j < T; ++j)
          for (int64_t c = 0; c < D; ++c) {
            const int64_t qi = ((bi * T + j) * Hq + h) * D + c, ki = ((bi * T + j) * Hkv + hk) * D + c;
            want_out[qi] = ref.out[j * D + c];
            want_dq[qi] = ref.dq[j * D + c];
            want_dk[ki] += ref.dk[j * D + c];
            want_dv[ki] += ref.dv[j * D + c];
          }
      }
  }
};

// Largest error relative to the largest reference magnitude.
double relative_error(const std::vector<bfloat16>& got, const std::vector<double>& want) {
  double worst = 0, scale_of = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(widen(got[i]) - want[i]));
    scale_of = std::max(scale_of, std::abs(want[i]));
  }
  return worst / scale_of;
}

// The forward and backward on the AVX512_BF16 path (`dot`) or the generic one, against float64.
void check_bf16_attention(bool dot) {
  using C = Bf16AttentionCase;
  static const C c;
  const bool before = kernels::cpu::set_bf16_dot_enabled(dot);
  ASSERT_EQ(kernels::cpu::bf16_dot_enabled(), dot);
  std::vector<bfloat16> out(c.q.size()), dq(c.q.size()), dk(c.k.size()), dv(c.k.size());
  std::vector<float> lse(static_cast<size_t>(C::B * C::Hq * C::T));
  const kernels::cpu::AttentionShape shape{C::B, C::T, C::T, C::Hq, C::Hkv, C::D, {}};
  kernels::cpu::attention(c.q.data(), c.k.data(), c.v.data(), out.data(), lse.data(), shape, C::scale);
  kernels::cpu::attention_backward(c.q.data(), c.k.data(), c.v.data(), out.data(), lse.data(), c.dout.data(), dq.data(),
                                   dk.data(), dv.data(), shape, C::scale);
  kernels::cpu::set_bf16_dot_enabled(before);
  // bf16 outputs round at 2^-9; the dot path also rounds P and dS to bf16.
  // Measured (out, dQ, dK, dV): AVX512_BF16 path 2.4e-3 to 3.7e-3; generic
  // path 2.0e-3 to 2.6e-3, the same on an AVX-512 CPU and on an AVX2-only
  // one (QEMU -cpu Haswell). Held to 8e-3 (2.2x and 3.1x: the bf16 rounding
  // of the outputs alone is up to 2^-9 = 2e-3 of each value).
  const double errors[4] = {relative_error(out, c.want_out), relative_error(dq, c.want_dq),
                            relative_error(dk, c.want_dk), relative_error(dv, c.want_dv)};
  const std::string measured =
      fmt::format("out {:.2e}, dQ {:.2e}, dK {:.2e}, dV {:.2e}", errors[0], errors[1], errors[2], errors[3]);
  std::printf("%s path: relative errors to float64: %s\n", dot ? "AVX512_BF16" : "generic", measured.c_str());
  ::testing::Test::RecordProperty("relative_errors", measured);
  for (const double e : errors) EXPECT_LT(e, 8e-3) << measured;
}
}  // namespace

TEST(Attention, Bf16GenericPathMatchesFloat64) { check_bf16_attention(false); }

TEST(Attention, Bf16DotPathMatchesFloat64) {
  if (!kernels::cpu::bf16_dot_enabled()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  check_bf16_attention(true);
}

// A failure inside an OpenMP region (an allocation, a GEMM) reaches the
// caller as the exception it was, where it used to end the process.
TEST(KernelFailures, CarriedOutOfAParallelRegion) {
  kernels::cpu::RegionErrors errors;
  std::atomic<int> ran{0};
#pragma omp parallel for schedule(dynamic)
  for (int i = 0; i < 1000; ++i) {
    if (errors.failed()) continue;
    try {
      if (i == 37) throw std::runtime_error("body 37 failed");
      ran.fetch_add(1);
    } catch (...) {
      errors.keep(std::current_exception());
    }
  }
  EXPECT_LT(ran.load(), 1000);
  EXPECT_THROW(
      {
        try {
          errors.rethrow();
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "body 37 failed");
          throw;
        }
      },
      std::runtime_error);
}

// oneDNN's statuses are named: out of memory says what to do, not "status 1".
TEST(KernelFailures, GemmOutOfMemoryIsNamed) {
  try {
    kernels::cpu::throw_gemm_failure(dnnl_out_of_memory, 4096, 4096, 512);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("oneDNN's sgemm of 4096 x 4096 x 512 (m, n, k) ran out of memory"), std::string::npos) << what;
    EXPECT_NE(what.find("lower data.batch_size"), std::string::npos) << what;
  }
}
