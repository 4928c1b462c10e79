#include "kernels/cpu/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/copy.h"
#include "core/error.h"
#include "kernels/cpu/kernel_support.h"

namespace meshtrain::kernels::cpu {

void throw_gemm_failure(int status, int64_t m, int64_t n, int64_t k) {
  const std::string what = fmt::format("oneDNN's sgemm of {} x {} x {} (m, n, k)", m, n, k);
  if (status == dnnl_out_of_memory)
    throw Error(what +
                " ran out of memory: the step needs more than this machine has free; lower "
                "data.batch_size, set activation_checkpoint.mode or shard the "
                "model over more ranks");
  throw Error(fmt::format("{} failed with oneDNN status {}", what, status));
}

template <typename T>
void matmul(const T* a, const T* b, T* c, int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb,
            int64_t a_stride, int64_t b_stride, bool accumulate) {
  for (int64_t i = 0; i < batch; ++i)
    gemm(ta, tb, m, n, k, a + i * a_stride, b + i * b_stride, c + i * m * n, accumulate);
}

template <typename T>
[[MESHTRAIN_AVX512_CLONES]] void add(const T* a, const T* b, T* out, int64_t n) {
#pragma omp parallel for simd if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) out[i] = store<T>(load(a[i]) + load(b[i]));
}
template <typename T>
[[MESHTRAIN_AVX512_CLONES]] void mul(const T* a, const T* b, T* out, int64_t n) {
#pragma omp parallel for simd if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) out[i] = store<T>(load(a[i]) * load(b[i]));
}
template <typename T>
[[MESHTRAIN_AVX512_CLONES]] void scale(const T* a, double alpha, T* out, int64_t n) {
  const auto s = static_cast<Acc<T>>(alpha);
#pragma omp parallel for simd if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) out[i] = store<T>(s * load(a[i]));
}
template <typename T>
void fill(double value, T* out, int64_t n) {
  std::fill(out, out + n, store<T>(value));
}
template <typename T>
[[MESHTRAIN_AVX512_CLONES]] double sum(const T* a, int64_t n) {
  double acc = 0;
#pragma omp parallel for reduction(+ : acc) if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) acc += load(a[i]);
  return acc;
}
template <typename T>
[[MESHTRAIN_AVX512_CLONES]] double sum_squares(const T* a, int64_t n) {
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

template <typename T>
[[MESHTRAIN_AVX512_CLONES]] void silu(const T* x, T* y, int64_t n) {
  using A = Acc<T>;
#pragma omp parallel for simd if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    const A xi = load(x[i]);
    y[i] = store<T>(xi / (A(1) + exp_of(-xi)));
  }
}
template <typename T>
[[MESHTRAIN_AVX512_CLONES]] void silu_backward(const T* x, const T* dy, T* dx, int64_t n) {
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
template <typename T>
void softmax_row(const T* x, Acc<T>* y, int64_t d) {
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

template <typename T>
[[MESHTRAIN_AVX512_CLONES]] void softmax(const T* x, T* y, int64_t rows, int64_t d) {
  using A = Acc<T>;
#pragma omp parallel for if (rows * d > kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    A* row = scratch<A>(static_cast<size_t>(d), 0);
    softmax_row(x + r * d, row, d);
    for (int64_t i = 0; i < d; ++i) y[r * d + i] = store<T>(row[i]);
  }
}
template <typename T>
[[MESHTRAIN_AVX512_CLONES]] void softmax_backward(const T* y, const T* dy, T* dx, int64_t rows, int64_t d) {
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

template <typename T>
[[MESHTRAIN_AVX512_CLONES]] void rms_norm(const T* x, const T* w, T* y, int64_t rows, int64_t d, double eps) {
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
[[MESHTRAIN_AVX512_CLONES]] void rms_norm_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, int64_t rows,
                                                   int64_t d, double eps) {
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
template <typename T>
void check_targets(const int64_t* targets, int64_t rows, int64_t vocab, int64_t ignore_index) {
  for (int64_t r = 0; r < rows; ++r)
    MT_CHECK(targets[r] == ignore_index || (targets[r] >= 0 && targets[r] < vocab),
             "cross_entropy: target {} of row {} is outside the vocabulary [0, {})", targets[r], r, vocab);
}
}  // namespace

template <typename T>
[[MESHTRAIN_AVX512_CLONES]] double cross_entropy(const T* logits, const int64_t* targets, int64_t rows, int64_t vocab,
                                                 int64_t ignore_index) {
  using A = Acc<T>;
  check_targets<T>(targets, rows, vocab, ignore_index);
  double total = 0;
#pragma omp parallel for reduction(+ : total) if (rows * vocab > kParallelElements)
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
  }
  return total;
}
template <typename T>
[[MESHTRAIN_AVX512_CLONES]] void cross_entropy_backward(const T* logits, const int64_t* targets, double scale,
                                                        T* dlogits, int64_t rows, int64_t vocab, int64_t ignore_index) {
  using A = Acc<T>;
  const auto g = static_cast<A>(scale);
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

template <typename T>
void embedding(const T* table, const int64_t* ids, T* out, int64_t n, int64_t rows, int64_t dim, int64_t first_row,
               int64_t total_rows) {
  for (int64_t i = 0; i < n; ++i)
    MT_CHECK(ids[i] >= 0 && ids[i] < total_rows, "embedding: id {} at position {} is outside the table's {} rows",
             ids[i], i, total_rows);
#pragma omp parallel for if (n * dim > kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = ids[i] - first_row;
    if (row >= 0 && row < rows)
      copy_elements(out + i * dim, table + row * dim, static_cast<size_t>(dim));
    else
      std::fill(out + i * dim, out + (i + 1) * dim, T(0));  // another rank's row
  }
}
template <typename T>
void embedding_backward(const int64_t* ids, const T* dout, T* dtable, int64_t n, int64_t rows, int64_t dim,
                        int64_t first_row) {
  using A = Acc<T>;
  // Positions grouped by row, so each table row is summed once in Acc (in
  // position order) and rounded once, and threads own whole rows. Ids of
  // rows outside this table part are another rank's.
  auto row_of = [&](int64_t i) { return ids[i] - first_row; };
  auto here = [&](int64_t i) { return row_of(i) >= 0 && row_of(i) < rows; };
  int64_t* order = scratch<int64_t>(static_cast<size_t>(n), 0);
  int64_t* start = scratch<int64_t>(static_cast<size_t>(rows) + 1, 1);  // first position of each row
  int64_t* next = scratch<int64_t>(static_cast<size_t>(rows), 2);
  std::fill(start, start + rows + 1, 0);
  for (int64_t i = 0; i < n; ++i)
    if (here(i)) ++start[row_of(i) + 1];
  std::partial_sum(start, start + rows + 1, start);
  std::copy(start, start + rows, next);
  for (int64_t i = 0; i < n; ++i)
    if (here(i)) order[next[row_of(i)]++] = i;
#pragma omp parallel for schedule(dynamic, 16) if (rows * dim > kParallelElements)
  for (int64_t row = 0; row < rows; ++row) {
    A* acc = scratch<A>(static_cast<size_t>(dim), 0);
    std::fill(acc, acc + dim, A(0));
    for (int64_t p = start[row]; p < start[row + 1]; ++p) {
      const T* g = dout + order[p] * dim;
      for (int64_t j = 0; j < dim; ++j) acc[j] += load(g[j]);
    }
    for (int64_t j = 0; j < dim; ++j) dtable[row * dim + j] = store<T>(acc[j]);
  }
}

// Not cloned for AVX-512: GCC 12 leaves the bf16 x86-64-v4 clone's inner loop
// scalar, 4x slower than this build.
template <typename T>
void rope(const T* x, T* out, int64_t b, int64_t t, int64_t h, int64_t d, double theta, bool inverse,
          const graph::SequenceOrder& order) {
  using A = Acc<T>;
  const int64_t positions = std::max(t, order.total);
  MT_ASSERT(d % 2 == 0, "rope: head dim {} must be even", d);  // the rope op's shape rule refuses an odd D
  const int64_t half = d / 2;
  // cos and sin per (position, frequency), computed in double, kept for the
  // next call with the same length, head size and theta.
  struct Table {
    int64_t t = -1, d = -1;
    double theta = 0;
    std::vector<A> cos, sin;
  };
  thread_local Table table;
  if (table.t != positions || table.d != d || table.theta != theta) {
    table.cos.resize(static_cast<size_t>(positions * half));
    table.sin.resize(static_cast<size_t>(positions * half));
    for (int64_t pos = 0; pos < positions; ++pos)
      for (int64_t i = 0; i < half; ++i) {
        const double angle =
            static_cast<double>(pos) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
        table.cos[static_cast<size_t>(pos * half + i)] = static_cast<A>(std::cos(angle));
        table.sin[static_cast<size_t>(pos * half + i)] = static_cast<A>(std::sin(angle));
      }
    table.t = positions;
    table.d = d;
    table.theta = theta;
  }
  const A* cos_table = table.cos.data();
  const A* sin_table = table.sin.data();
  const A sin_sign = inverse ? A(-1) : A(1);
#pragma omp parallel for collapse(2) if (b * t * h * d > kParallelElements)
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t row = 0; row < t; ++row) {
      const int64_t pos = order.position(row);
      const A* c = cos_table + pos * half;
      const A* s = sin_table + pos * half;
      for (int64_t hi = 0; hi < h; ++hi) {
        const int64_t base = ((bi * t + row) * h + hi) * d;
        for (int64_t i = 0; i < half; ++i) {
          const A x1 = load(x[base + i]), x2 = load(x[base + i + half]);
          const A sn = sin_sign * s[i];
          out[base + i] = store<T>(x1 * c[i] - x2 * sn);
          out[base + i + half] = store<T>(x2 * c[i] + x1 * sn);
        }
      }
    }
}

template <typename T>
[[MESHTRAIN_AVX512_CLONES]] void swiglu(const T* gate, const T* up, T* out, int64_t n) {
  using A = Acc<T>;
#pragma omp parallel for simd if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    const A g = load(gate[i]);
    out[i] = store<T>(g / (A(1) + exp_of(-g)) * load(up[i]));
  }
}
template <typename T>
[[MESHTRAIN_AVX512_CLONES]] void swiglu_backward(const T* gate, const T* up, const T* dout, T* dgate, T* dup,
                                                 int64_t n) {
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
    copy_elements(dst + (o * dst_dim + dst_start) * inner, src + (o * src_dim + src_start) * inner,
                  static_cast<size_t>(len * inner));
}

template <typename T, typename S>
[[MESHTRAIN_AVX512_CLONES]] void adamw(T* param, const T* grad, S* m, S* v, int64_t n, double lr, double beta1,
                                       double beta2, double eps, double weight_decay, int64_t step) {
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

template void matmul<float>(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t, bool, bool, int64_t,
                            int64_t, bool);
template void matmul<double>(const double*, const double*, double*, int64_t, int64_t, int64_t, int64_t, bool, bool,
                             int64_t, int64_t, bool);

#define MESHTRAIN_INSTANTIATE(T)                                                                                      \
  template void add<T>(const T*, const T*, T*, int64_t);                                                              \
  template void mul<T>(const T*, const T*, T*, int64_t);                                                              \
  template void scale<T>(const T*, double, T*, int64_t);                                                              \
  template void fill<T>(double, T*, int64_t);                                                                         \
  template double sum<T>(const T*, int64_t);                                                                          \
  template double sum_squares<T>(const T*, int64_t);                                                                  \
  template void transpose<T>(const T*, T*, const int64_t*, int, int, int);                                            \
  template void silu<T>(const T*, T*, int64_t);                                                                       \
  template void silu_backward<T>(const T*, const T*, T*, int64_t);                                                    \
  template void softmax<T>(const T*, T*, int64_t, int64_t);                                                           \
  template void softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t);                                        \
  template void rms_norm<T>(const T*, const T*, T*, int64_t, int64_t, double);                                        \
  template void rms_norm_backward<T>(const T*, const T*, const T*, T*, T*, int64_t, int64_t, double);                 \
  template double cross_entropy<T>(const T*, const int64_t*, int64_t, int64_t, int64_t);                              \
  template void cross_entropy_backward<T>(const T*, const int64_t*, double, T*, int64_t, int64_t, int64_t);           \
  template void embedding<T>(const T*, const int64_t*, T*, int64_t, int64_t, int64_t, int64_t, int64_t);              \
  template void embedding_backward<T>(const int64_t*, const T*, T*, int64_t, int64_t, int64_t, int64_t);              \
  template void rope<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, double, bool, const graph::SequenceOrder&); \
  template void swiglu<T>(const T*, const T*, T*, int64_t);                                                           \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t);                                    \
  template void copy_slice<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);           \
  template void adamw<T, T>(T*, const T*, T*, T*, int64_t, double, double, double, double, double, int64_t);
MESHTRAIN_INSTANTIATE(float)
MESHTRAIN_INSTANTIATE(double)
template void copy_slice<int64_t>(const int64_t*, int64_t*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                  int64_t);  // ids: microbatches of tokens
MESHTRAIN_INSTANTIATE(bfloat16)
#undef MESHTRAIN_INSTANTIATE
template void adamw<float, bfloat16>(float*, const float*, bfloat16*, bfloat16*, int64_t, double, double, double,
                                     double, double, int64_t);

}  // namespace meshtrain::kernels::cpu
