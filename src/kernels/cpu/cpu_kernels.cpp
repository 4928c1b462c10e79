#include "kernels/cpu/cpu_kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace meshtrain::kernels::cpu {

namespace {
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c, bool acc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), 1.0f, a, static_cast<int>(ta ? m : k), b,
              static_cast<int>(tb ? k : n), acc ? 1.0f : 0.0f, c, static_cast<int>(n));
}
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a, const double* b, double* c, bool acc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), 1.0, a, static_cast<int>(ta ? m : k), b,
              static_cast<int>(tb ? k : n), acc ? 1.0 : 0.0, c, static_cast<int>(n));
}

// exp for float, branch-free so that loops over it vectorize: Cephes' expf
// (range reduction by ln 2, degree-6 polynomial; within 2 ulp of std::exp).
// 0 below -87.3 (and for -inf), NaN stays NaN.
[[gnu::always_inline]] inline float exp_fast(float x) {
  const float clamped = x > -88.0f ? (x < 88.3762626647949f ? x : 88.3762626647949f) : -88.0f;  // NaN -> -88
  const float k = (clamped * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  const float r = (clamped - k * 0.693359375f) - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  const float result = p * std::bit_cast<float>(std::max(bits, 0));
  return x != x ? x : (x < -87.33654475f ? 0.0f : result);
}
[[gnu::always_inline]] inline float exp_of(float x) { return exp_fast(x); }
inline double exp_of(double x) { return std::exp(x); }

// Per-thread scratch of n elements in one of a few slots, grown on demand and
// kept, so a warm kernel allocates nothing.
template <typename A> A* scratch(size_t n, int slot) {
  thread_local std::vector<A> buffers[9];
  auto& buf = buffers[slot];
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}
}  // namespace

template <typename T>
void matmul(const T* a, const T* b, T* c, int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb,
            int64_t a_stride, int64_t b_stride, bool accumulate) {
  for (int64_t i = 0; i < batch; ++i)
    gemm(ta, tb, m, n, k, a + i * a_stride, b + i * b_stride, c + i * m * n, accumulate);
}

// Loops over elements or rows run on OpenMP threads once they are big
// enough to pay for it.
constexpr int64_t kParallelElements = 1 << 14;

template <typename T> void add(const T* a, const T* b, T* out, int64_t n) {
#pragma omp parallel for simd if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) out[i] = store<T>(load(a[i]) + load(b[i]));
}
template <typename T> void mul(const T* a, const T* b, T* out, int64_t n) {
#pragma omp parallel for simd if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) out[i] = store<T>(load(a[i]) * load(b[i]));
}
template <typename T> void scale(const T* a, double alpha, T* out, int64_t n) {
  const auto s = static_cast<Acc<T>>(alpha);
#pragma omp parallel for simd if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) out[i] = store<T>(s * load(a[i]));
}
template <typename T> void fill(double value, T* out, int64_t n) { std::fill(out, out + n, store<T>(value)); }
template <typename T> double sum(const T* a, int64_t n) {
  double acc = 0;
#pragma omp parallel for reduction(+ : acc) if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) acc += load(a[i]);
  return acc;
}
template <typename T> double sum_squares(const T* a, int64_t n) {
  double acc = 0;
#pragma omp parallel for simd reduction(+ : acc) if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    const double x = load(a[i]);
    acc += x * x;
  }
  return acc;
}

template <typename T>
void transpose(const T* a, T* out, const int64_t* shape, int rank, int d0, int d1) {
  // Strides of the input; the output has d0 and d1 swapped.
  std::vector<int64_t> in_stride(static_cast<size_t>(rank), 1), out_shape(shape, shape + rank);
  for (int d = rank - 2; d >= 0; --d) in_stride[d] = in_stride[d + 1] * shape[d + 1];
  std::swap(out_shape[d0], out_shape[d1]);
  std::vector<int64_t> idx(static_cast<size_t>(rank), 0);
  int64_t total = 1;
  for (int d = 0; d < rank; ++d) total *= shape[d];
  for (int64_t o = 0; o < total; ++o) {
    // idx walks the output in row-major order; read the swapped position.
    int64_t src = 0;
    for (int d = 0; d < rank; ++d) {
      const int from = d == d0 ? d1 : d == d1 ? d0 : d;
      src += idx[d] * in_stride[from];
    }
    out[o] = a[src];
    for (int d = rank - 1; d >= 0; --d) {
      if (++idx[d] < out_shape[d]) break;
      idx[d] = 0;
    }
  }
}

template <typename T> void silu(const T* x, T* y, int64_t n) {
  using A = Acc<T>;
#pragma omp parallel for simd if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    const A xi = load(x[i]);
    y[i] = store<T>(xi / (A(1) + exp_of(-xi)));
  }
}
template <typename T> void silu_backward(const T* x, const T* dy, T* dx, int64_t n) {
  using A = Acc<T>;
#pragma omp parallel for simd if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    const A xi = load(x[i]);
    const A s = A(1) / (A(1) + exp_of(-xi));
    dx[i] = store<T>(load(dy[i]) * s * (A(1) + xi * (A(1) - s)));
  }
}

namespace {
// One row's softmax in Acc: y = exp(x - max) / sum.
template <typename T> void softmax_row(const T* x, Acc<T>* y, int64_t d) {
  using A = Acc<T>;
  A max = -std::numeric_limits<A>::infinity();
#pragma omp simd reduction(max : max)
  for (int64_t i = 0; i < d; ++i) max = std::max(max, load(x[i]));
  A total = 0;
#pragma omp simd reduction(+ : total)
  for (int64_t i = 0; i < d; ++i) total += (y[i] = exp_of(load(x[i]) - max));
  const A inv = A(1) / total;
  for (int64_t i = 0; i < d; ++i) y[i] *= inv;
}
}  // namespace

template <typename T> void softmax(const T* x, T* y, int64_t rows, int64_t d) {
  using A = Acc<T>;
#pragma omp parallel for if (rows * d > kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    A* row = scratch<A>(static_cast<size_t>(d), 0);
    softmax_row(x + r * d, row, d);
    for (int64_t i = 0; i < d; ++i) y[r * d + i] = store<T>(row[i]);
  }
}
template <typename T> void softmax_backward(const T* y, const T* dy, T* dx, int64_t rows, int64_t d) {
  using A = Acc<T>;
#pragma omp parallel for if (rows * d > kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    const T* yr = y + r * d;
    const T* gr = dy + r * d;
    A dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t i = 0; i < d; ++i) dot += load(yr[i]) * load(gr[i]);
    for (int64_t i = 0; i < d; ++i) dx[r * d + i] = store<T>(load(yr[i]) * (load(gr[i]) - dot));
  }
}

template <typename T> void rms_norm(const T* x, const T* w, T* y, int64_t rows, int64_t d, double eps) {
  using A = Acc<T>;
#pragma omp parallel for if (rows * d > kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;
    A ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < d; ++i) ss += load(xr[i]) * load(xr[i]);
    const auto inv = static_cast<A>(1.0 / std::sqrt(static_cast<double>(ss) / static_cast<double>(d) + eps));
    for (int64_t i = 0; i < d; ++i) y[r * d + i] = store<T>(load(xr[i]) * inv * load(w[i]));
  }
}
template <typename T>
void rms_norm_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, int64_t rows, int64_t d, double eps) {
  using A = Acc<T>;
  // Rows in parallel for dx; each row's 1/rms is kept for dw, which is then
  // summed over rows column by column (no two threads write one element).
  A* inv_rms = scratch<A>(static_cast<size_t>(rows), 1);
#pragma omp parallel for if (rows * d > kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;
    const T* gr = dy + r * d;
    A ss = 0, dot = 0;
#pragma omp simd reduction(+ : ss, dot)
    for (int64_t i = 0; i < d; ++i) {
      ss += load(xr[i]) * load(xr[i]);
      dot += load(gr[i]) * load(w[i]) * load(xr[i]);
    }
    const auto inv = static_cast<A>(1.0 / std::sqrt(static_cast<double>(ss) / static_cast<double>(d) + eps));
    inv_rms[r] = inv;
    // dx = inv * (g*w) - x * inv^3 / d * sum(g*w*x)
    const A k = dot * inv * inv * inv / static_cast<A>(d);
    for (int64_t i = 0; i < d; ++i) dx[r * d + i] = store<T>(inv * load(gr[i]) * load(w[i]) - k * load(xr[i]));
  }
  // dw[i] = sum_r dy[r,i] x[r,i] inv_rms[r]: rows in chunks per thread, then the chunks' sums.
  const int64_t chunk = 64;
  const int64_t chunks = (rows + chunk - 1) / chunk;
  A* partial = scratch<A>(static_cast<size_t>(chunks * d), 2);
#pragma omp parallel for if (rows * d > kParallelElements)
  for (int64_t c = 0; c < chunks; ++c) {
    A* acc = partial + c * d;
    std::fill(acc, acc + d, A(0));
    for (int64_t r = c * chunk; r < std::min(rows, (c + 1) * chunk); ++r)
      for (int64_t i = 0; i < d; ++i) acc[i] += load(dy[r * d + i]) * load(x[r * d + i]) * inv_rms[r];
  }
  for (int64_t i = 0; i < d; ++i) {
    A acc = 0;
    for (int64_t c = 0; c < chunks; ++c) acc += partial[c * d + i];
    dw[i] = store<T>(acc);
  }
}

namespace {
template <typename T> void check_targets(const int64_t* targets, int64_t rows, int64_t vocab, int64_t ignore_index) {
  for (int64_t r = 0; r < rows; ++r)
    MT_CHECK(targets[r] == ignore_index || (targets[r] >= 0 && targets[r] < vocab),
             "cross_entropy: target {} of row {} is outside the vocabulary [0, {})", targets[r], r, vocab);
}
}  // namespace

template <typename T>
double cross_entropy(const T* logits, const int64_t* targets, int64_t rows, int64_t vocab, int64_t ignore_index) {
  using A = Acc<T>;
  check_targets<T>(targets, rows, vocab, ignore_index);
  double total = 0;
  int64_t counted = 0;
#pragma omp parallel for reduction(+ : total, counted) if (rows * vocab > kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = targets[r];
    if (t == ignore_index) continue;
    const T* lr = logits + r * vocab;
    A max = -std::numeric_limits<A>::infinity();
#pragma omp simd reduction(max : max)
    for (int64_t i = 0; i < vocab; ++i) max = std::max(max, load(lr[i]));
    A z = 0;
#pragma omp simd reduction(+ : z)
    for (int64_t i = 0; i < vocab; ++i) z += exp_of(load(lr[i]) - max);
    total += std::log(static_cast<double>(z)) + static_cast<double>(max) - static_cast<double>(load(lr[t]));
    ++counted;
  }
  return counted ? total / static_cast<double>(counted) : 0.0;
}
template <typename T>
void cross_entropy_backward(const T* logits, const int64_t* targets, double dloss, T* dlogits, int64_t rows,
                            int64_t vocab, int64_t ignore_index) {
  using A = Acc<T>;
  int64_t counted = 0;
  for (int64_t r = 0; r < rows; ++r) counted += targets[r] != ignore_index;
  const auto g = static_cast<A>(counted ? dloss / static_cast<double>(counted) : 0.0);
#pragma omp parallel for if (rows * vocab > kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    T* dr = dlogits + r * vocab;
    if (targets[r] == ignore_index) {
      std::fill(dr, dr + vocab, store<T>(0.0));
      continue;
    }
    A* p = scratch<A>(static_cast<size_t>(vocab), 0);
    softmax_row(logits + r * vocab, p, vocab);
    p[targets[r]] -= A(1);
    for (int64_t i = 0; i < vocab; ++i) dr[i] = store<T>(p[i] * g);
  }
}

template <typename T> void embedding(const T* table, const int64_t* ids, T* out, int64_t n, int64_t vocab, int64_t dim) {
  for (int64_t i = 0; i < n; ++i)
    MT_CHECK(ids[i] >= 0 && ids[i] < vocab, "embedding: id {} at position {} is outside the table's {} rows", ids[i],
             i, vocab);
#pragma omp parallel for if (n * dim > kParallelElements)
  for (int64_t i = 0; i < n; ++i) std::copy(table + ids[i] * dim, table + (ids[i] + 1) * dim, out + i * dim);
}
template <typename T>
void embedding_backward(const int64_t* ids, const T* dout, T* dtable, int64_t n, int64_t vocab, int64_t dim) {
  using A = Acc<T>;
  // Positions grouped by id, so each table row is summed once in Acc (in
  // position order) and rounded once, and threads own whole rows.
  std::vector<int64_t> order(static_cast<size_t>(n)), start(static_cast<size_t>(vocab) + 1, 0);
  for (int64_t i = 0; i < n; ++i) ++start[static_cast<size_t>(ids[i]) + 1];
  std::partial_sum(start.begin(), start.end(), start.begin());
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(next[static_cast<size_t>(ids[i])]++)] = i;
#pragma omp parallel for schedule(dynamic, 16) if (vocab * dim > kParallelElements)
  for (int64_t row = 0; row < vocab; ++row) {
    A* acc = scratch<A>(static_cast<size_t>(dim), 0);
    std::fill(acc, acc + dim, A(0));
    for (int64_t p = start[static_cast<size_t>(row)]; p < start[static_cast<size_t>(row) + 1]; ++p) {
      const T* g = dout + order[static_cast<size_t>(p)] * dim;
      for (int64_t j = 0; j < dim; ++j) acc[j] += load(g[j]);
    }
    for (int64_t j = 0; j < dim; ++j) dtable[row * dim + j] = store<T>(acc[j]);
  }
}

template <typename T>
void rope(const T* x, T* out, int64_t b, int64_t t, int64_t h, int64_t d, double theta, bool inverse) {
  using A = Acc<T>;
  MT_CHECK(d % 2 == 0, "rope: head dim {} must be even", d);
  const int64_t half = d / 2;
  // cos and sin per (position, frequency), computed in double, kept for the
  // next call with the same length, head size and theta.
  struct Table {
    int64_t t = -1, d = -1;
    double theta = 0;
    std::vector<A> cos, sin;
  };
  thread_local Table table;
  if (table.t != t || table.d != d || table.theta != theta) {
    table.cos.resize(static_cast<size_t>(t * half));
    table.sin.resize(static_cast<size_t>(t * half));
    for (int64_t pos = 0; pos < t; ++pos)
      for (int64_t i = 0; i < half; ++i) {
        const double angle =
            static_cast<double>(pos) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
        table.cos[static_cast<size_t>(pos * half + i)] = static_cast<A>(std::cos(angle));
        table.sin[static_cast<size_t>(pos * half + i)] = static_cast<A>(std::sin(angle));
      }
    table.t = t;
    table.d = d;
    table.theta = theta;
  }
  const A* cos_table = table.cos.data();
  const A* sin_table = table.sin.data();
  const A sin_sign = inverse ? A(-1) : A(1);
#pragma omp parallel for collapse(2) if (b * t * h * d > kParallelElements)
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t pos = 0; pos < t; ++pos) {
      const A* c = cos_table + pos * half;
      const A* s = sin_table + pos * half;
      for (int64_t hi = 0; hi < h; ++hi) {
        const int64_t base = ((bi * t + pos) * h + hi) * d;
        for (int64_t i = 0; i < half; ++i) {
          const A x1 = load(x[base + i]), x2 = load(x[base + i + half]);
          const A sn = sin_sign * s[i];
          out[base + i] = store<T>(x1 * c[i] - x2 * sn);
          out[base + i + half] = store<T>(x2 * c[i] + x1 * sn);
        }
      }
    }
}

// ---- attention -----------------------------------------------------------------
//
// Flash-attention style. Each task (a batch row and a head) copies its keys
// and values into Acc scratch ([T, D], contiguous), then takes kQueryBlock
// query rows at a time against blocks of at most kKeyBlock keys, stopping at
// the causal diagonal. The block products are small GEMMs (single-threaded
// BLAS inside the OpenMP task); the softmax is online across key blocks, so
// the largest buffer is kQueryBlock x kKeyBlock, never T x T. Queries are
// pre-multiplied by the scale.

namespace {
constexpr int64_t kQueryBlock = 64;
constexpr int64_t kKeyBlock = 512;

// Copy one head's [T, D] rows of x (row stride `stride`) into packed scratch.
template <typename T, typename A> void gather_head(const T* x, int64_t stride, int64_t t, int64_t d, A* dst) {
  for (int64_t j = 0; j < t; ++j)
    for (int64_t c = 0; c < d; ++c) dst[j * d + c] = load(x[j * stride + c]);
}

// Load `rows` query rows (row stride `stride`) scaled by sc into packed scratch.
template <typename T, typename A> void gather_rows(const T* x, int64_t stride, int64_t rows, int64_t d, A sc, A* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < d; ++c) dst[r * d + c] = load(x[r * stride + c]) * sc;
}

// Keys [j0, j0 + n) that any of the block's queries [i0, i0 + rows) sees.
int64_t keys_in_block(int64_t i0, int64_t rows, int64_t j0) { return std::min(kKeyBlock, i0 + rows - j0); }
// Keys of that block visible to query i (causal: j <= i).
int64_t visible_keys(int64_t i, int64_t j0, int64_t n) { return std::clamp<int64_t>(i - j0 + 1, 0, n); }
}  // namespace

template <typename T>
void attention(const T* q, const T* k, const T* v, T* out, Acc<T>* lse, int64_t b, int64_t t, int64_t hq, int64_t hkv,
               int64_t d, double scale) {
  using A = Acc<T>;
  const int64_t group = hq / hkv;
  const auto neg_inf = -std::numeric_limits<A>::infinity();
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t hk = h / group;
      A* ks = scratch<A>(static_cast<size_t>(t * d), 0);
      A* vs = scratch<A>(static_cast<size_t>(t * d), 1);
      A* qs = scratch<A>(static_cast<size_t>(kQueryBlock * d), 2);
      A* o = scratch<A>(static_cast<size_t>(kQueryBlock * d), 3);
      A* s = scratch<A>(static_cast<size_t>(kQueryBlock * kKeyBlock), 4);
      A row_max[kQueryBlock], row_total[kQueryBlock];
      gather_head(k + (bi * t * hkv + hk) * d, hkv * d, t, d, ks);
      gather_head(v + (bi * t * hkv + hk) * d, hkv * d, t, d, vs);
      for (int64_t i0 = 0; i0 < t; i0 += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, t - i0);
        gather_rows(q + ((bi * t + i0) * hq + h) * d, hq * d, rows, d, static_cast<A>(scale), qs);
        std::fill(o, o + rows * d, A(0));
        std::fill(row_max, row_max + rows, neg_inf);
        std::fill(row_total, row_total + rows, A(0));
        for (int64_t j0 = 0; j0 < i0 + rows; j0 += kKeyBlock) {
          const int64_t n = keys_in_block(i0, rows, j0);
          gemm(false, true, rows, n, d, qs, ks + j0 * d, s, false);  // S = Qs K^T
          for (int64_t r = 0; r < rows; ++r) {
            A* sr = s + r * n;
            const int64_t visible = visible_keys(i0 + r, j0, n);
            if (visible == 0) {
              std::fill(sr, sr + n, A(0));
              continue;
            }
            A block_max = row_max[r];
#pragma omp simd reduction(max : block_max)
            for (int64_t jj = 0; jj < visible; ++jj) block_max = std::max(block_max, sr[jj]);
            const A correction = exp_of(row_max[r] - block_max);
            A block_total = 0;
#pragma omp simd reduction(+ : block_total)
            for (int64_t jj = 0; jj < visible; ++jj) block_total += (sr[jj] = exp_of(sr[jj] - block_max));
            std::fill(sr + visible, sr + n, A(0));
            row_total[r] = row_total[r] * correction + block_total;
            row_max[r] = block_max;
            for (int64_t c = 0; c < d; ++c) o[r * d + c] *= correction;
          }
          gemm(false, false, rows, d, n, s, vs + j0 * d, o, true);  // O += P V
        }
        for (int64_t r = 0; r < rows; ++r) {
          T* dst = out + ((bi * t + i0 + r) * hq + h) * d;
          const A inv = A(1) / row_total[r];
          for (int64_t c = 0; c < d; ++c) dst[c] = store<T>(o[r * d + c] * inv);
          lse[(bi * hq + h) * t + i0 + r] = row_max[r] + std::log(row_total[r]);
        }
      }
    }
}

template <typename T>
void attention_backward(const T* q, const T* k, const T* v, const T* out, const Acc<T>* lse, const T* dout, T* dq,
                        T* dk, T* dv, int64_t b, int64_t t, int64_t hq, int64_t hkv, int64_t d, double scale) {
  using A = Acc<T>;
  const int64_t group = hq / hkv;
  // One task per (batch, key/value head): it owns those dK, dV rows and the
  // dQ rows of its query heads, so tasks never write the same memory.
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t hk = 0; hk < hkv; ++hk) {
      const int64_t kv_offset = (bi * t * hkv + hk) * d;
      A* ks = scratch<A>(static_cast<size_t>(t * d), 0);
      A* vs = scratch<A>(static_cast<size_t>(t * d), 1);
      A* dk_acc = scratch<A>(static_cast<size_t>(t * d), 2);
      A* dv_acc = scratch<A>(static_cast<size_t>(t * d), 3);
      A* qs = scratch<A>(static_cast<size_t>(kQueryBlock * d), 4);      // the block's queries, scaled
      A* dos = scratch<A>(static_cast<size_t>(kQueryBlock * d), 5);     // the block's dO
      A* dq_acc = scratch<A>(static_cast<size_t>(kQueryBlock * d), 6);  // the block's dQ / scale
      A* p = scratch<A>(static_cast<size_t>(kQueryBlock * kKeyBlock), 7);
      A* ds = scratch<A>(static_cast<size_t>(kQueryBlock * kKeyBlock), 8);
      A row_lse[kQueryBlock], row_delta[kQueryBlock];
      gather_head(k + kv_offset, hkv * d, t, d, ks);
      gather_head(v + kv_offset, hkv * d, t, d, vs);
      std::fill(dk_acc, dk_acc + t * d, A(0));
      std::fill(dv_acc, dv_acc + t * d, A(0));
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
        for (int64_t i0 = 0; i0 < t; i0 += kQueryBlock) {
          const int64_t rows = std::min(kQueryBlock, t - i0);
          const int64_t first_row = (bi * t + i0) * hq + h;
          gather_rows(q + first_row * d, hq * d, rows, d, static_cast<A>(scale), qs);
          gather_rows(dout + first_row * d, hq * d, rows, d, A(1), dos);
          for (int64_t r = 0; r < rows; ++r) {
            const T* o_row = out + (first_row + r * hq) * d;
            A delta = 0;  // rowsum(dO * O): the softmax backward's correction term
#pragma omp simd reduction(+ : delta)
            for (int64_t c = 0; c < d; ++c) delta += dos[r * d + c] * load(o_row[c]);
            row_delta[r] = delta;
            row_lse[r] = lse[(bi * hq + h) * t + i0 + r];
          }
          std::fill(dq_acc, dq_acc + rows * d, A(0));
          for (int64_t j0 = 0; j0 < i0 + rows; j0 += kKeyBlock) {
            const int64_t n = keys_in_block(i0, rows, j0);
            gemm(false, true, rows, n, d, qs, ks + j0 * d, p, false);   // S = Qs K^T
            gemm(false, true, rows, n, d, dos, vs + j0 * d, ds, false);  // dP = dO V^T
            // P = exp(S - lse) and dS = P * (dP - delta), zero where masked.
            for (int64_t r = 0; r < rows; ++r) {
              A* pr = p + r * n;
              A* dsr = ds + r * n;
              const int64_t visible = visible_keys(i0 + r, j0, n);
              for (int64_t jj = 0; jj < visible; ++jj) {
                pr[jj] = exp_of(pr[jj] - row_lse[r]);
                dsr[jj] = pr[jj] * (dsr[jj] - row_delta[r]);
              }
              std::fill(pr + visible, pr + n, A(0));
              std::fill(dsr + visible, dsr + n, A(0));
            }
            gemm(true, false, n, d, rows, p, dos, dv_acc + j0 * d, true);   // dV += P^T dO
            gemm(true, false, n, d, rows, ds, qs, dk_acc + j0 * d, true);   // dK += dS^T Qs (Qs carries the scale)
            gemm(false, false, rows, d, n, ds, ks + j0 * d, dq_acc, true);  // dQ += dS K
          }
          const auto sc = static_cast<A>(scale);
          for (int64_t r = 0; r < rows; ++r) {
            T* dqr = dq + (first_row + r * hq) * d;
            for (int64_t c = 0; c < d; ++c) dqr[c] = store<T>(dq_acc[r * d + c] * sc);
          }
        }
      for (int64_t j = 0; j < t; ++j) {
        T* dkr = dk + kv_offset + j * hkv * d;
        T* dvr = dv + kv_offset + j * hkv * d;
        for (int64_t c = 0; c < d; ++c) {
          dkr[c] = store<T>(dk_acc[j * d + c]);
          dvr[c] = store<T>(dv_acc[j * d + c]);
        }
      }
    }
}

template <typename T> void swiglu(const T* gate, const T* up, T* out, int64_t n) {
  using A = Acc<T>;
#pragma omp parallel for simd if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    const A g = load(gate[i]);
    out[i] = store<T>(g / (A(1) + exp_of(-g)) * load(up[i]));
  }
}
template <typename T> void swiglu_backward(const T* gate, const T* up, const T* dout, T* dgate, T* dup, int64_t n) {
  using A = Acc<T>;
#pragma omp parallel for simd if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    const A g = load(gate[i]), u = load(up[i]), go = load(dout[i]);
    const A s = A(1) / (A(1) + exp_of(-g));
    dup[i] = store<T>(go * g * s);
    dgate[i] = store<T>(go * u * s * (A(1) + g * (A(1) - s)));
  }
}

template <typename T>
void copy_slice(const T* src, T* dst, int64_t outer, int64_t src_dim, int64_t dst_dim, int64_t src_start,
                int64_t dst_start, int64_t len, int64_t inner) {
  for (int64_t o = 0; o < outer; ++o)
    std::copy(src + (o * src_dim + src_start) * inner, src + (o * src_dim + src_start + len) * inner,
              dst + (o * dst_dim + dst_start) * inner);
}

template <typename T, typename S>
void adamw(T* param, const T* grad, S* m, S* v, int64_t n, double lr, double beta1, double beta2, double eps,
           double weight_decay, int64_t step) {
  using A = Acc<T>;
  // Per-step constants in double, element math in Acc (f32 as PyTorch's, f64 for f64).
  const auto b1 = static_cast<A>(beta1), b2 = static_cast<A>(beta2), eps_a = static_cast<A>(eps);
  const auto decay = static_cast<A>(1.0 - lr * weight_decay);  // decoupled weight decay
  const auto step_size = static_cast<A>(lr / (1.0 - std::pow(beta1, static_cast<double>(step))));
  const auto bias2_sqrt = static_cast<A>(std::sqrt(1.0 - std::pow(beta2, static_cast<double>(step))));
#pragma omp parallel for simd if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    const A g = load(grad[i]);
    A p = load(param[i]) * decay;
    const A mi = b1 * load(m[i]) + (A(1) - b1) * g;
    const A vi = b2 * load(v[i]) + (A(1) - b2) * g * g;
    p -= step_size * mi / (std::sqrt(vi) / bias2_sqrt + eps_a);
    m[i] = store<S>(mi);
    v[i] = store<S>(vi);
    param[i] = store<T>(p);
  }
}

template void matmul<float>(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t, bool, bool,
                            int64_t, int64_t, bool);
template void matmul<double>(const double*, const double*, double*, int64_t, int64_t, int64_t, int64_t, bool, bool,
                             int64_t, int64_t, bool);

#define MESHTRAIN_INSTANTIATE(T)                                                                                 \
  template void add<T>(const T*, const T*, T*, int64_t);                                                         \
  template void mul<T>(const T*, const T*, T*, int64_t);                                                         \
  template void scale<T>(const T*, double, T*, int64_t);                                                         \
  template void fill<T>(double, T*, int64_t);                                                                    \
  template double sum<T>(const T*, int64_t);                                                                     \
  template double sum_squares<T>(const T*, int64_t);                                                             \
  template void transpose<T>(const T*, T*, const int64_t*, int, int, int);                                       \
  template void silu<T>(const T*, T*, int64_t);                                                                  \
  template void silu_backward<T>(const T*, const T*, T*, int64_t);                                               \
  template void softmax<T>(const T*, T*, int64_t, int64_t);                                                      \
  template void softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t);                                   \
  template void rms_norm<T>(const T*, const T*, T*, int64_t, int64_t, double);                                   \
  template void rms_norm_backward<T>(const T*, const T*, const T*, T*, T*, int64_t, int64_t, double);            \
  template double cross_entropy<T>(const T*, const int64_t*, int64_t, int64_t, int64_t);                         \
  template void cross_entropy_backward<T>(const T*, const int64_t*, double, T*, int64_t, int64_t, int64_t);      \
  template void embedding<T>(const T*, const int64_t*, T*, int64_t, int64_t, int64_t);                           \
  template void embedding_backward<T>(const int64_t*, const T*, T*, int64_t, int64_t, int64_t);                 \
  template void rope<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, double, bool);                         \
  template void attention<T>(const T*, const T*, const T*, T*, Acc<T>*, int64_t, int64_t, int64_t, int64_t,      \
                             int64_t, double);                                                                   \
  template void attention_backward<T>(const T*, const T*, const T*, const T*, const Acc<T>*, const T*, T*, T*,  \
                                      T*, int64_t, int64_t, int64_t, int64_t, int64_t, double);                  \
  template void swiglu<T>(const T*, const T*, T*, int64_t);                                                      \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t);                               \
  template void copy_slice<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);     \
  template void adamw<T, T>(T*, const T*, T*, T*, int64_t, double, double, double, double, double, int64_t);
MESHTRAIN_INSTANTIATE(float)
MESHTRAIN_INSTANTIATE(double)
MESHTRAIN_INSTANTIATE(bfloat16)
#undef MESHTRAIN_INSTANTIATE
template void adamw<float, bfloat16>(float*, const float*, bfloat16*, bfloat16*, int64_t, double, double, double,
                                     double, double, int64_t);

}  // namespace meshtrain::kernels::cpu
