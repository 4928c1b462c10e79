#include "kernels/cpu/moe.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/kernel_support.h"

namespace meshtrain::kernels::cpu {

namespace {

// A run of rows [begin, end) of one expert.
struct Run {
  int64_t begin, end, expert;
};
std::vector<Run> runs_of(const int64_t* row_expert, int64_t rows) {
  std::vector<Run> runs;
  for (int64_t r = 0; r < rows;) {
    int64_t end = r + 1;
    while (end < rows && row_expert[end] == row_expert[r]) ++end;
    MT_CHECK(row_expert[r] >= 0, "grouped_matmul: row {} names expert {}", r, row_expert[r]);
    runs.push_back({r, end, row_expert[r]});
    r = end;
  }
  return runs;
}

// C (m x n) = or += op(A) op(B) on contiguous row-major operands of any
// float type: float and double straight to the GEMM, bf16 widened to f32
// scratch (exact), multiplied there and, unless `c32` takes the f32 result
// (an accumulator), rounded once into c.
void gemm_any(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
              int64_t ldb, float* c, bool acc) {
  gemm(ta, tb, m, n, k, a, lda, b, ldb, c, n, acc);
}
void gemm_any(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b,
              int64_t ldb, double* c, bool acc) {
  gemm(ta, tb, m, n, k, a, lda, b, ldb, c, n, acc);
}
void widen(const bfloat16* from, int64_t count, std::vector<float>& to) {
  to.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) to[static_cast<size_t>(i)] = bf16_to_f32(from[i]);
}
// a is (ta ? k x m : m x k) with rows lda apart; b likewise (contiguous).
void gemm_bf16_into_f32(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const bfloat16* a, const bfloat16* b,
                        float* c32, bool acc) {
  thread_local std::vector<float> wa, wb;
  widen(a, m * k, wa);
  widen(b, k * n, wb);
  gemm(ta, tb, m, n, k, wa.data(), ta ? m : k, wb.data(), tb ? k : n, c32, n, acc);
}

// Runs `tasks` items of work: across threads, each single-threaded, when
// there are enough of them; else one after another, each on every thread.
template <typename Fn>
void for_tasks(int64_t tasks, Fn&& fn) {
  if (tasks >= omp_get_max_threads() && tasks > 1) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < tasks; ++i) fn(i);
  } else {
    for (int64_t i = 0; i < tasks; ++i) fn(i);
  }
}

// Checked before a parallel loop reads them (an exception must not leave an
// OpenMP region): every value in [0, bound).
void check_range(const int64_t* values, int64_t count, int64_t bound, const char* what) {
  for (int64_t i = 0; i < count; ++i)
    MT_CHECK(values[i] >= 0 && values[i] < bound, "{}: entry {} is {}, outside [0, {})", what, i, values[i], bound);
}

// inv[s] = the row holding slot s, for one group's order (checked in range).
void invert(const int64_t* order, int64_t m, std::vector<int64_t>& inv) {
  inv.resize(static_cast<size_t>(m));
  for (int64_t p = 0; p < m; ++p) inv[static_cast<size_t>(order[p])] = p;
}

}  // namespace

template <typename T>
void moe_topk(const T* probs, int64_t* experts, int64_t rows, int64_t e, int64_t k) {
#pragma omp parallel for if (rows * e > kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    const T* p = probs + r * e;
    int64_t* out = experts + r * k;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t x = 0; x < e; ++x) {
        if (std::find(out, out + j, x) != out + j) continue;
        if (best < 0 || load(p[x]) > load(p[best])) best = x;  // strict: a tie keeps the lower index
      }
      out[j] = best;
    }
  }
}

template <typename T>
void moe_route_weights(const T* probs, const int64_t* experts, T* weights, int64_t rows, int64_t e, int64_t k) {
#pragma omp parallel for if (rows * k > kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    Acc<T> s = 0;
    for (int64_t j = 0; j < k; ++j) s += load(probs[r * e + experts[r * k + j]]);
    for (int64_t j = 0; j < k; ++j) weights[r * k + j] = store<T>(load(probs[r * e + experts[r * k + j]]) / s);
  }
}

template <typename T>
void moe_route_weights_backward(const T* probs, const int64_t* experts, const T* dweights, T* dprobs, int64_t rows,
                                int64_t e, int64_t k) {
  // w_j = p_j / s: dp_j = (dw_j - sum_m dw_m w_m) / s, and 0 off the chosen experts.
#pragma omp parallel for if (rows * e > kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t* chosen = experts + r * k;
    Acc<T> s = 0, dot = 0;
    for (int64_t j = 0; j < k; ++j) s += load(probs[r * e + chosen[j]]);
    for (int64_t j = 0; j < k; ++j) dot += load(dweights[r * k + j]) * (load(probs[r * e + chosen[j]]) / s);
    T* out = dprobs + r * e;
    std::fill(out, out + e, store<T>(0.0));
    for (int64_t j = 0; j < k; ++j) out[chosen[j]] = store<T>((load(dweights[r * k + j]) - dot) / s);
  }
}

int64_t moe_sort(const int64_t* experts, int64_t* order, int64_t* row_expert, int64_t groups, int64_t n, int64_t k,
                 int64_t e, double capacity_factor) {
  const int64_t m = n * k;
  const int64_t capacity =
      capacity_factor > 0 ? static_cast<int64_t>(std::ceil(capacity_factor * static_cast<double>(m) / e)) : m;
  check_range(experts, groups * m, e, "moe_sort experts");
  int64_t dropped = 0;
#pragma omp parallel for reduction(+ : dropped) if (groups > 1 && groups * m > kParallelElements)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t* ex = experts + g * m;
    std::vector<int64_t> start(static_cast<size_t>(e) + 1, 0);
    for (int64_t s = 0; s < m; ++s) ++start[static_cast<size_t>(ex[s]) + 1];
    for (int64_t x = 0; x < e; ++x)  // each expert's first row, its kept slots only
      start[static_cast<size_t>(x) + 1] =
          start[static_cast<size_t>(x)] + std::min(start[static_cast<size_t>(x) + 1], capacity);
    std::vector<int64_t> taken(static_cast<size_t>(e), 0);
    int64_t last = start[static_cast<size_t>(e)];  // dropped slots follow the kept ones
    for (int64_t s = 0; s < m; ++s) {
      const auto x = static_cast<size_t>(ex[s]);
      const bool keep = taken[x] < capacity;
      const int64_t p = keep ? start[x] + taken[x]++ : last++;
      order[g * m + p] = s;
      row_expert[g * m + p] = keep ? ex[s] : e;
      dropped += keep ? 0 : 1;
    }
  }
  return dropped;
}

void moe_expert_counts(const int64_t* experts, float* counts, int64_t count, int64_t e) {
  std::vector<int64_t> c(static_cast<size_t>(e), 0);
  for (int64_t i = 0; i < count; ++i)
    if (experts[i] >= 0 && experts[i] < e) ++c[static_cast<size_t>(experts[i])];
  for (int64_t x = 0; x < e; ++x) counts[x] = static_cast<float>(c[static_cast<size_t>(x)]);
}

template <typename T>
void moe_permute(const T* x, const int64_t* order, const T* w, T* rows, int64_t groups, int64_t n, int64_t k,
                 int64_t d) {
  const int64_t m = n * k;
  check_range(order, groups * m, m, "moe_permute order");
#pragma omp parallel for if (groups * m * d > kParallelElements)
  for (int64_t r = 0; r < groups * m; ++r) {
    const int64_t g = r / m, s = order[r];
    const T* src = x + (g * n + s / k) * d;
    const Acc<T> scale = w ? load(w[g * m + s]) : Acc<T>(1);
    T* dst = rows + r * d;
    for (int64_t i = 0; i < d; ++i) dst[i] = store<T>(scale * load(src[i]));
  }
}

template <typename T>
void moe_combine(const T* rows, const int64_t* order, const T* w, T* out, int64_t groups, int64_t n, int64_t k,
                 int64_t d) {
  const int64_t m = n * k;
  check_range(order, groups * m, m, "moe_combine order");
#pragma omp parallel for if (groups * m * d > kParallelElements)
  for (int64_t g = 0; g < groups; ++g) {
    thread_local std::vector<int64_t> inv;
    thread_local std::vector<Acc<T>> acc;
    invert(order + g * m, m, inv);
    acc.resize(static_cast<size_t>(d));
    for (int64_t t = 0; t < n; ++t) {
      std::fill(acc.begin(), acc.end(), Acc<T>(0));
      for (int64_t j = 0; j < k; ++j) {
        const int64_t s = t * k + j;
        const Acc<T> scale = w ? load(w[g * m + s]) : Acc<T>(1);
        const T* src = rows + (g * m + inv[static_cast<size_t>(s)]) * d;
        for (int64_t i = 0; i < d; ++i) acc[static_cast<size_t>(i)] += scale * load(src[i]);
      }
      T* dst = out + (g * n + t) * d;
      for (int64_t i = 0; i < d; ++i) dst[i] = store<T>(acc[static_cast<size_t>(i)]);
    }
  }
}

template <typename T>
void moe_combine_weight_grad(const T* a, const T* rows, const int64_t* order, T* out, int64_t groups, int64_t n,
                             int64_t k, int64_t d) {
  const int64_t m = n * k;
  check_range(order, groups * m, m, "moe_combine_weight_grad order");
#pragma omp parallel for if (groups * m * d > kParallelElements)
  for (int64_t g = 0; g < groups; ++g) {
    thread_local std::vector<int64_t> inv;
    invert(order + g * m, m, inv);
    for (int64_t s = 0; s < m; ++s) {
      const T* at = a + (g * n + s / k) * d;
      const T* row = rows + (g * m + inv[static_cast<size_t>(s)]) * d;
      Acc<T> dot = 0;
      for (int64_t i = 0; i < d; ++i) dot += load(at[i]) * load(row[i]);
      out[g * m + s] = store<T>(dot);
    }
  }
}

template <typename T>
void grouped_matmul(const T* x, const T* w, const int64_t* row_expert, T* out, int64_t rows, int64_t e, int64_t n_out,
                    int64_t k_in, bool tb) {
  const std::vector<Run> runs = runs_of(row_expert, rows);
  for_tasks(static_cast<int64_t>(runs.size()), [&](int64_t i) {
    const Run& run = runs[static_cast<size_t>(i)];
    const int64_t m = run.end - run.begin;
    T* c = out + run.begin * n_out;
    if (run.expert >= e) {  // dropped rows
      std::fill(c, c + m * n_out, store<T>(0.0));
      return;
    }
    const T* a = x + run.begin * k_in;
    const T* b = w + run.expert * n_out * k_in;
    if constexpr (std::is_same_v<T, bfloat16>) {
      thread_local std::vector<float> c32;
      c32.resize(static_cast<size_t>(m * n_out));
      gemm_bf16_into_f32(false, tb, m, n_out, k_in, a, b, c32.data(), false);
      for (int64_t j = 0; j < m * n_out; ++j) c[j] = f32_to_bf16(c32[static_cast<size_t>(j)]);
    } else {
      gemm_any(false, tb, m, n_out, k_in, a, k_in, b, tb ? k_in : n_out, c, false);
    }
  });
}

template <typename T>
void grouped_matmul_wgrad(const T* a, const T* b, const int64_t* row_expert, T* out, int64_t rows, int64_t e, int64_t p,
                          int64_t q) {
  std::vector<std::vector<Run>> by_expert(static_cast<size_t>(e));
  for (const Run& run : runs_of(row_expert, rows))
    if (run.expert < e) by_expert[static_cast<size_t>(run.expert)].push_back(run);
  // Each expert's runs added in row order, by one thread: the same sum on every run.
  for_tasks(e, [&](int64_t x) {
    T* c = out + x * p * q;
    if constexpr (std::is_same_v<T, bfloat16>) {
      thread_local std::vector<float> c32;
      c32.assign(static_cast<size_t>(p * q), 0.0f);
      for (const Run& run : by_expert[static_cast<size_t>(x)])
        gemm_bf16_into_f32(true, false, p, q, run.end - run.begin, a + run.begin * p, b + run.begin * q, c32.data(),
                           true);
      for (int64_t j = 0; j < p * q; ++j) c[j] = f32_to_bf16(c32[static_cast<size_t>(j)]);
    } else {
      std::fill(c, c + p * q, T(0));
      for (const Run& run : by_expert[static_cast<size_t>(x)])
        gemm_any(true, false, p, q, run.end - run.begin, a + run.begin * p, p, b + run.begin * q, q, c, true);
    }
  });
}

#define MESHTRAIN_INSTANTIATE_MOE(T)                                                                                 \
  template void moe_topk<T>(const T*, int64_t*, int64_t, int64_t, int64_t);                                          \
  template void moe_route_weights<T>(const T*, const int64_t*, T*, int64_t, int64_t, int64_t);                       \
  template void moe_route_weights_backward<T>(const T*, const int64_t*, const T*, T*, int64_t, int64_t, int64_t);    \
  template void moe_permute<T>(const T*, const int64_t*, const T*, T*, int64_t, int64_t, int64_t, int64_t);          \
  template void moe_combine<T>(const T*, const int64_t*, const T*, T*, int64_t, int64_t, int64_t, int64_t);          \
  template void moe_combine_weight_grad<T>(const T*, const T*, const int64_t*, T*, int64_t, int64_t, int64_t,        \
                                           int64_t);                                                                 \
  template void grouped_matmul<T>(const T*, const T*, const int64_t*, T*, int64_t, int64_t, int64_t, int64_t, bool); \
  template void grouped_matmul_wgrad<T>(const T*, const T*, const int64_t*, T*, int64_t, int64_t, int64_t, int64_t);
MESHTRAIN_INSTANTIATE_MOE(float)
MESHTRAIN_INSTANTIATE_MOE(double)
MESHTRAIN_INSTANTIATE_MOE(bfloat16)
#undef MESHTRAIN_INSTANTIATE_MOE

}  // namespace meshtrain::kernels::cpu
