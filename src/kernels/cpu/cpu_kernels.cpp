#include "kernels/cpu/cpu_kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
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
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}
template <typename T> void mul(const T* a, const T* b, T* out, int64_t n) {
#pragma omp parallel for simd if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
}
template <typename T> void scale(const T* a, T alpha, T* out, int64_t n) {
#pragma omp parallel for simd if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) out[i] = alpha * a[i];
}
template <typename T> void fill(T value, T* out, int64_t n) { std::fill(out, out + n, value); }
template <typename T> T sum(const T* a, int64_t n) {
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += a[i];
  return static_cast<T>(acc);
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
#pragma omp parallel for if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (T(1) + std::exp(-x[i]));
}
template <typename T> void silu_backward(const T* x, const T* dy, T* dx, int64_t n) {
#pragma omp parallel for if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    const T s = T(1) / (T(1) + std::exp(-x[i]));
    dx[i] = dy[i] * s * (T(1) + x[i] * (T(1) - s));
  }
}

template <typename T> void softmax(const T* x, T* y, int64_t rows, int64_t d) {
#pragma omp parallel for if (rows * d > kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;
    T* yr = y + r * d;
    const T max = *std::max_element(xr, xr + d);
    T total = 0;
    for (int64_t i = 0; i < d; ++i) total += (yr[i] = std::exp(xr[i] - max));
    for (int64_t i = 0; i < d; ++i) yr[i] /= total;
  }
}
template <typename T> void softmax_backward(const T* y, const T* dy, T* dx, int64_t rows, int64_t d) {
#pragma omp parallel for if (rows * d > kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    const T* yr = y + r * d;
    const T* gr = dy + r * d;
    T dot = 0;
    for (int64_t i = 0; i < d; ++i) dot += yr[i] * gr[i];
    for (int64_t i = 0; i < d; ++i) dx[r * d + i] = yr[i] * (gr[i] - dot);
  }
}

template <typename T> void rms_norm(const T* x, const T* w, T* y, int64_t rows, int64_t d, double eps) {
#pragma omp parallel for if (rows * d > kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const auto inv = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
    for (int64_t i = 0; i < d; ++i) y[r * d + i] = xr[i] * inv * w[i];
  }
}
template <typename T>
void rms_norm_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, int64_t rows, int64_t d, double eps) {
  // Rows in parallel for dx; each row's 1/rms is kept for dw, which is then
  // summed over rows column by column (no two threads write one element).
  std::vector<double> inv_rms(static_cast<size_t>(rows));
#pragma omp parallel for if (rows * d > kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;
    const T* gr = dy + r * d;
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
    inv_rms[static_cast<size_t>(r)] = inv;
    // dx = inv * (g*w) - x * inv^3 / d * sum(g*w*x)
    double dot = 0;
    for (int64_t i = 0; i < d; ++i) dot += static_cast<double>(gr[i]) * w[i] * xr[i];
    const double k = dot * inv * inv * inv / static_cast<double>(d);
    for (int64_t i = 0; i < d; ++i) dx[r * d + i] = static_cast<T>(inv * gr[i] * w[i] - k * xr[i]);
  }
#pragma omp parallel for if (rows * d > kParallelElements)
  for (int64_t i = 0; i < d; ++i) {
    double acc = 0;
    for (int64_t r = 0; r < rows; ++r) acc += static_cast<double>(dy[r * d + i]) * x[r * d + i] * inv_rms[static_cast<size_t>(r)];
    dw[i] = static_cast<T>(acc);
  }
}

template <typename T>
T cross_entropy(const T* logits, const int64_t* targets, int64_t rows, int64_t vocab, int64_t ignore_index) {
  for (int64_t r = 0; r < rows; ++r)
    MT_CHECK(targets[r] == ignore_index || (targets[r] >= 0 && targets[r] < vocab),
             "cross_entropy: target {} of row {} is outside the vocabulary [0, {})", targets[r], r, vocab);
  double total = 0;
  int64_t counted = 0;
#pragma omp parallel for reduction(+ : total, counted) if (rows * vocab > kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = targets[r];
    if (t == ignore_index) continue;
    const T* lr = logits + r * vocab;
    const T max = *std::max_element(lr, lr + vocab);
    double z = 0;
    for (int64_t i = 0; i < vocab; ++i) z += std::exp(static_cast<double>(lr[i] - max));
    total += std::log(z) + static_cast<double>(max) - static_cast<double>(lr[t]);
    ++counted;
  }
  return counted ? static_cast<T>(total / static_cast<double>(counted)) : T(0);
}
template <typename T>
void cross_entropy_backward(const T* logits, const int64_t* targets, T dloss, T* dlogits, int64_t rows, int64_t vocab,
                            int64_t ignore_index) {
  int64_t counted = 0;
  for (int64_t r = 0; r < rows; ++r) counted += targets[r] != ignore_index;
  const T g = counted ? dloss / static_cast<T>(counted) : T(0);
#pragma omp parallel for if (rows * vocab > kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    T* dr = dlogits + r * vocab;
    if (targets[r] == ignore_index) {
      std::fill(dr, dr + vocab, T(0));
      continue;
    }
    softmax(logits + r * vocab, dr, 1, vocab);
    dr[targets[r]] -= T(1);
    for (int64_t i = 0; i < vocab; ++i) dr[i] *= g;
  }
}

template <typename T> void embedding(const T* table, const int64_t* ids, T* out, int64_t n, int64_t vocab, int64_t dim) {
  for (int64_t i = 0; i < n; ++i) {
    MT_CHECK(ids[i] >= 0 && ids[i] < vocab, "embedding: id {} at position {} is outside the table's {} rows", ids[i],
             i, vocab);
    std::copy(table + ids[i] * dim, table + (ids[i] + 1) * dim, out + i * dim);
  }
}
template <typename T>
void embedding_backward(const int64_t* ids, const T* dout, T* dtable, int64_t n, int64_t vocab, int64_t dim) {
  std::fill(dtable, dtable + vocab * dim, T(0));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < dim; ++j) dtable[ids[i] * dim + j] += dout[i * dim + j];
}

template <typename T>
void rope(const T* x, T* out, int64_t b, int64_t t, int64_t h, int64_t d, double theta, bool inverse) {
  MT_CHECK(d % 2 == 0, "rope: head dim {} must be even", d);
  const int64_t half = d / 2;
  for (int64_t pos = 0; pos < t; ++pos) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos) * std::pow(theta, -2.0 * static_cast<double>(i) / d);
      const T c = static_cast<T>(std::cos(angle));
      const T sn = static_cast<T>(inverse ? -std::sin(angle) : std::sin(angle));
      for (int64_t bi = 0; bi < b; ++bi)
        for (int64_t hi = 0; hi < h; ++hi) {
          const int64_t base = ((bi * t + pos) * h + hi) * d;
          const T x1 = x[base + i], x2 = x[base + i + half];
          out[base + i] = x1 * c - x2 * sn;
          out[base + i + half] = x2 * c + x1 * sn;
        }
    }
  }
}

// Attention math runs in the tensor's own type (float math for f32, as
// PyTorch's), threads over independent (batch, head) pairs.
template <typename T>
void attention(const T* q, const T* k, const T* v, T* out, T* lse, int64_t b, int64_t t, int64_t hq, int64_t hkv,
               int64_t d, double scale) {
  const int64_t group = hq / hkv;
  const T sc = static_cast<T>(scale);
#pragma omp parallel
  {
    std::vector<T> acc(static_cast<size_t>(d));
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t h = 0; h < hq; ++h) {
        const int64_t hk = h / group;
        for (int64_t i = 0; i < t; ++i) {
          const T* qi = q + ((bi * t + i) * hq + h) * d;
          T max = -INFINITY, total = 0;
          std::fill(acc.begin(), acc.end(), T(0));
          for (int64_t j = 0; j <= i; ++j) {  // causal: keys up to the query's position
            const T* kj = k + ((bi * t + j) * hkv + hk) * d;
            const T* vj = v + ((bi * t + j) * hkv + hk) * d;
            T score = 0;
            for (int64_t c = 0; c < d; ++c) score += qi[c] * kj[c];
            score *= sc;
            const T new_max = std::max(max, score);
            const T correction = std::exp(max - new_max), p = std::exp(score - new_max);
            total = total * correction + p;
            for (int64_t c = 0; c < d; ++c) acc[c] = acc[c] * correction + p * vj[c];
            max = new_max;
          }
          T* oi = out + ((bi * t + i) * hq + h) * d;
          for (int64_t c = 0; c < d; ++c) oi[c] = acc[c] / total;
          lse[(bi * hq + h) * t + i] = max + std::log(total);
        }
      }
  }
}

template <typename T>
void attention_backward(const T* q, const T* k, const T* v, const T* out, const T* lse, const T* dout, T* dq, T* dk,
                        T* dv, int64_t b, int64_t t, int64_t hq, int64_t hkv, int64_t d, double scale) {
  const int64_t group = hq / hkv;
  const T sc = static_cast<T>(scale);
  std::fill(dq, dq + b * t * hq * d, T(0));
  std::fill(dk, dk + b * t * hkv * d, T(0));
  std::fill(dv, dv + b * t * hkv * d, T(0));
  // One task per (batch, key/value head): it owns those dK, dV rows, and the
  // dQ rows of its query heads, so tasks never write the same memory.
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t hk = 0; hk < hkv; ++hk)
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
        for (int64_t i = 0; i < t; ++i) {
          const int64_t qrow = ((bi * t + i) * hq + h) * d;
          // D = rowsum(dO * O): the softmax backward's correction term.
          T dot_do_o = 0;
          for (int64_t c = 0; c < d; ++c) dot_do_o += dout[qrow + c] * out[qrow + c];
          const T row_lse = lse[(bi * hq + h) * t + i];
          for (int64_t j = 0; j <= i; ++j) {
            const int64_t krow = ((bi * t + j) * hkv + hk) * d;
            T score = 0, dp = 0;
            for (int64_t c = 0; c < d; ++c) {
              score += q[qrow + c] * k[krow + c];
              dp += dout[qrow + c] * v[krow + c];
            }
            const T p = std::exp(score * sc - row_lse);
            const T ds = p * (dp - dot_do_o) * sc;
            for (int64_t c = 0; c < d; ++c) {
              dv[krow + c] += p * dout[qrow + c];
              dq[qrow + c] += ds * k[krow + c];
              dk[krow + c] += ds * q[qrow + c];
            }
          }
        }
}

template <typename T> void swiglu(const T* gate, const T* up, T* out, int64_t n) {
#pragma omp parallel for if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (T(1) + std::exp(-gate[i])) * up[i];
}
template <typename T> void swiglu_backward(const T* gate, const T* up, const T* dout, T* dgate, T* dup, int64_t n) {
#pragma omp parallel for if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    const T s = T(1) / (T(1) + std::exp(-gate[i]));
    dup[i] = dout[i] * gate[i] * s;
    dgate[i] = dout[i] * up[i] * s * (T(1) + gate[i] * (T(1) - s));
  }
}

template <typename T>
void copy_slice(const T* src, T* dst, int64_t outer, int64_t src_dim, int64_t dst_dim, int64_t src_start,
                int64_t dst_start, int64_t len, int64_t inner) {
  for (int64_t o = 0; o < outer; ++o)
    std::copy(src + (o * src_dim + src_start) * inner, src + (o * src_dim + src_start + len) * inner,
              dst + (o * dst_dim + dst_start) * inner);
}

template <typename T>
void adamw(T* param, const T* grad, T* m, T* v, int64_t n, double lr, double beta1, double beta2, double eps,
           double weight_decay, int64_t step) {
  const double bias1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias2_sqrt = std::sqrt(1.0 - std::pow(beta2, static_cast<double>(step)));
  const double step_size = lr / bias1;
#pragma omp parallel for if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    const double g = grad[i];
    double p = static_cast<double>(param[i]) * (1.0 - lr * weight_decay);  // decoupled weight decay
    const double mi = beta1 * m[i] + (1.0 - beta1) * g;
    const double vi = beta2 * v[i] + (1.0 - beta2) * g * g;
    p -= step_size * mi / (std::sqrt(vi) / bias2_sqrt + eps);
    m[i] = static_cast<T>(mi);
    v[i] = static_cast<T>(vi);
    param[i] = static_cast<T>(p);
  }
}

#define MESHTRAIN_INSTANTIATE(T)                                                                               \
  template void matmul<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, int64_t, bool, bool, int64_t,    \
                          int64_t, bool);                                                                      \
  template void add<T>(const T*, const T*, T*, int64_t);                                                       \
  template void mul<T>(const T*, const T*, T*, int64_t);                                                       \
  template void scale<T>(const T*, T, T*, int64_t);                                                            \
  template void fill<T>(T, T*, int64_t);                                                                       \
  template T sum<T>(const T*, int64_t);                                                                        \
  template void transpose<T>(const T*, T*, const int64_t*, int, int, int);                                     \
  template void silu<T>(const T*, T*, int64_t);                                                                \
  template void silu_backward<T>(const T*, const T*, T*, int64_t);                                             \
  template void softmax<T>(const T*, T*, int64_t, int64_t);                                                    \
  template void softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t);                                 \
  template void rms_norm<T>(const T*, const T*, T*, int64_t, int64_t, double);                                 \
  template void rms_norm_backward<T>(const T*, const T*, const T*, T*, T*, int64_t, int64_t, double);          \
  template T cross_entropy<T>(const T*, const int64_t*, int64_t, int64_t, int64_t);                            \
  template void cross_entropy_backward<T>(const T*, const int64_t*, T, T*, int64_t, int64_t, int64_t);         \
  template void embedding<T>(const T*, const int64_t*, T*, int64_t, int64_t, int64_t);                         \
  template void embedding_backward<T>(const int64_t*, const T*, T*, int64_t, int64_t, int64_t);               \
  template void rope<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, double, bool);                       \
  template void attention<T>(const T*, const T*, const T*, T*, T*, int64_t, int64_t, int64_t, int64_t, int64_t, \
                             double);                                                                          \
  template void attention_backward<T>(const T*, const T*, const T*, const T*, const T*, const T*, T*, T*, T*,  \
                                      int64_t, int64_t, int64_t, int64_t, int64_t, double);                    \
  template void swiglu<T>(const T*, const T*, T*, int64_t);                                                    \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t);                             \
  template void copy_slice<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);   \
  template void adamw<T>(T*, const T*, T*, T*, int64_t, double, double, double, double, double, int64_t);
MESHTRAIN_INSTANTIATE(float)
MESHTRAIN_INSTANTIATE(double)
#undef MESHTRAIN_INSTANTIATE

}  // namespace meshtrain::kernels::cpu
