#include "kernels/cpu/moe.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/copy.h"
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

// Each expert's runs in row order (one per group it has rows in), and the
// dropped rows' runs (expert >= e).
struct ExpertRows {
  std::vector<std::vector<Run>> runs;
  std::vector<Run> dropped;
};
// Experts first .. first + e - 1, indexed from 0; the rest dropped.
ExpertRows expert_rows(const int64_t* row_expert, int64_t rows, int64_t e, int64_t first) {
  ExpertRows r{std::vector<std::vector<Run>>(static_cast<size_t>(e)), {}};
  for (Run run : runs_of(row_expert, rows)) {
    run.expert -= first;
    (run.expert >= 0 && run.expert < e ? r.runs[static_cast<size_t>(run.expert)] : r.dropped).push_back(run);
  }
  return r;
}
// Each block's rows [start[b], start[b + 1]) of one group (in expert order);
// start[blocks] the first dropped row.
std::vector<int64_t> block_starts(const int64_t* row_expert, int64_t m, int64_t e, int64_t blocks) {
  MT_CHECK(std::is_sorted(row_expert, row_expert + m), "moe_dispatch: rows are not in expert order");
  std::vector<int64_t> start(static_cast<size_t>(blocks + 1));
  for (int64_t b = 0; b <= blocks; ++b)
    start[static_cast<size_t>(b)] = std::lower_bound(row_expert, row_expert + m, b * (e / blocks)) - row_expert;
  return start;
}
int64_t total_rows(const std::vector<Run>& runs) {
  int64_t n = 0;
  for (const Run& run : runs) n += run.end - run.begin;
  return n;
}
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rows [first, last) of one expert's rows (its runs laid end to end).
struct RowTask {
  int64_t expert, first, last;
  int64_t rows() const { return last - first; }
  // The parts of the runs these rows are, in order.
  std::vector<Run> pieces(const std::vector<Run>& runs) const {
    std::vector<Run> out;
    int64_t at = 0;
    for (const Run& run : runs) {
      const int64_t lo = std::max(first, at), hi = std::min(last, at + run.end - run.begin);
      if (lo < hi) out.push_back({run.begin + lo - at, run.begin + hi - at, run.expert});
      at += run.end - run.begin;
    }
    return out;
  }
};

// The tasks of a grouped GEMM: on one thread, one per expert; on several,
// each expert's rows cut into tasks of about 1/4 of a thread's share (but
// at least kMinTaskRows rows and kMinTaskFlops), so that uneven experts
// still balance, largest first (for_tasks hands them out in order).
constexpr int64_t kMinTaskRows = 64;
constexpr double kMinTaskFlops = 1 << 20;
std::vector<RowTask> row_tasks(const ExpertRows& r, int64_t flops_per_row) {
  int64_t total = 0;
  for (const auto& runs : r.runs) total += total_rows(runs);
  const int64_t threads = omp_get_max_threads();
  const int64_t least = std::max<int64_t>(
      kMinTaskRows, static_cast<int64_t>(kMinTaskFlops / static_cast<double>(std::max<int64_t>(flops_per_row, 1))));
  const int64_t target = threads > 1 ? std::max(least, ceil_div(total, threads * 4)) : total;
  std::vector<RowTask> tasks;
  for (size_t x = 0; x < r.runs.size(); ++x) {
    const int64_t m = total_rows(r.runs[x]);
    const int64_t parts = m == 0 ? 0 : ceil_div(m, std::max<int64_t>(target, 1));
    for (int64_t j = 0; j < parts; ++j) tasks.push_back({static_cast<int64_t>(x), m * j / parts, m * (j + 1) / parts});
  }
  std::stable_sort(tasks.begin(), tasks.end(), [](const RowTask& a, const RowTask& b) { return a.rows() > b.rows(); });
  return tasks;
}

// Columns [p0, p1) of one expert's weight gradient (rows of out[expert]).
struct ColumnTask {
  int64_t expert, p0, p1, work;
};
// The tasks of grouped_matmul_wgrad: each expert's p columns cut into
// blocks (a multiple of 16, at least 64 wide) by the same rule as row_tasks,
// the work of a block its rows x columns; experts with no rows one task each
// (zeros).
std::vector<ColumnTask> column_tasks(const ExpertRows& r, int64_t p, int64_t q) {
  int64_t total = 0;
  for (const auto& runs : r.runs) total += total_rows(runs);
  const int64_t threads = omp_get_max_threads();
  const double least = std::max(kMinTaskFlops / 2 / static_cast<double>(std::max<int64_t>(q, 1)), 64.0 * 64.0);
  const double target =
      threads > 1
          ? std::max(least, static_cast<double>(total) * static_cast<double>(p) / static_cast<double>(threads * 4))
          : 1e300;
  std::vector<ColumnTask> tasks;
  for (size_t x = 0; x < r.runs.size(); ++x) {
    const int64_t m = total_rows(r.runs[x]);
    const double work = static_cast<double>(m) * static_cast<double>(p);
    const int64_t parts =
        std::clamp<int64_t>(static_cast<int64_t>(std::ceil(work / target)), 1, std::max<int64_t>(p / 64, 1));
    const int64_t width = std::min(p, ceil_div(ceil_div(p, parts), 16) * 16);
    for (int64_t p0 = 0; p0 < p; p0 += width) {
      const int64_t p1 = std::min(p, p0 + width);
      tasks.push_back({static_cast<int64_t>(x), p0, p1, m * (p1 - p0)});
    }
  }
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const ColumnTask& a, const ColumnTask& b) { return a.work > b.work; });
  return tasks;
}

// dst (rows x cols, in Acc<T>) = columns [col0, col0 + cols) of the rows of
// `pieces` of src (rows ld apart), in order.
template <typename T>
void gather_rows(const T* src, int64_t ld, const std::vector<Run>& pieces, int64_t col0, int64_t cols,
                 std::vector<Acc<T>>& dst) {
  dst.resize(static_cast<size_t>(total_rows(pieces) * cols));
  Acc<T>* to = dst.data();
  for (const Run& piece : pieces)
    for (int64_t r = piece.begin; r < piece.end; ++r, to += cols) {
      const T* from = src + r * ld + col0;
      for (int64_t j = 0; j < cols; ++j) to[j] = load(from[j]);
    }
}
// The rows of src (n long) back to the rows of `pieces` of out.
template <typename T>
void scatter_rows(const Acc<T>* src, int64_t n, const std::vector<Run>& pieces, T* out) {
  for (const Run& piece : pieces)
    for (int64_t r = piece.begin; r < piece.end; ++r, src += n)
      for (int64_t j = 0; j < n; ++j) out[r * n + j] = store<T>(src[j]);
}
// Which pieces of an expert's rows run as GEMMs of their own, in place, and
// which are gathered into one: a GEMM packs its whole weight (n x k) for
// however few rows it has, gathering copies each row's n + k values, so a
// piece is gathered while its rows x (n + k) is below half of n x k (and
// below 64 rows at least). bf16 gathers all (it widens to f32).
template <typename T>
std::pair<std::vector<Run>, std::vector<Run>> by_length(const std::vector<Run>& pieces, int64_t n, int64_t k) {
  const int64_t direct = std::max<int64_t>(64, n * k / (2 * std::max<int64_t>(n + k, 1)));
  std::pair<std::vector<Run>, std::vector<Run>> out;
  for (const Run& piece : pieces)
    (!std::is_same_v<T, bfloat16> && piece.end - piece.begin >= direct ? out.first : out.second).push_back(piece);
  return out;
}
// `count` values of b as the GEMM takes them: b itself, or widened to f32 in buf.
template <typename T>
const Acc<T>* widened(const T* b, int64_t count, std::vector<Acc<T>>& buf) {
  if constexpr (std::is_same_v<T, Acc<T>>) {
    return b;
  } else {
    buf.resize(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) buf[static_cast<size_t>(i)] = load(b[i]);
    return buf.data();
  }
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
  // At most m (every slot): a huge factor must not overflow the cast.
  const int64_t capacity = capacity_factor > 0
                               ? static_cast<int64_t>(std::min(static_cast<double>(m),
                                                               std::ceil(capacity_factor * static_cast<double>(m) / e)))
                               : m;
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
void moe_dispatch(const T* rows, const int64_t* row_expert, T* out, int64_t groups, int64_t m, int64_t row_len,
                  int64_t e, int64_t blocks, T fill) {
  std::fill(out, out + blocks * groups * m * row_len, fill);
  for (int64_t g = 0; g < groups; ++g) {
    const std::vector<int64_t> start = block_starts(row_expert + g * m, m, e, blocks);
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t first = start[static_cast<size_t>(b)], end = start[static_cast<size_t>(b + 1)];
      copy_elements(out + (b * groups + g) * m * row_len, rows + (g * m + first) * row_len,
                    static_cast<size_t>((end - first) * row_len));
    }
  }
}

template <typename T>
void moe_undispatch(const T* in, const int64_t* row_expert, T* rows, int64_t groups, int64_t m, int64_t row_len,
                    int64_t e, int64_t blocks) {
  for (int64_t g = 0; g < groups; ++g) {
    const std::vector<int64_t> start = block_starts(row_expert + g * m, m, e, blocks);
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t first = start[static_cast<size_t>(b)], end = start[static_cast<size_t>(b + 1)];
      const T* from = in + (b * groups + g) * m * row_len;
      copy_elements(rows + (g * m + first) * row_len, from, static_cast<size_t>((end - first) * row_len));
    }
    std::fill(rows + (g * m + start.back()) * row_len, rows + (g + 1) * m * row_len, store<T>(0.0));
  }
}

template <typename T>
void grouped_matmul(const T* x, const T* w, const int64_t* row_expert, T* out, int64_t rows, int64_t e, int64_t n_out,
                    int64_t k_in, bool tb, int64_t first) {
  using C = Acc<T>;
  const ExpertRows by_expert = expert_rows(row_expert, rows, e, first);
  for (const Run& run : by_expert.dropped) std::fill(out + run.begin * n_out, out + run.end * n_out, store<T>(0.0));
  // Tasks of about equal rows, each on one expert's weights: long pieces of
  // runs straight from x into out, short ones (one expert's runs in
  // different groups) gathered into one GEMM and scattered back.
  const std::vector<RowTask> tasks = row_tasks(by_expert, 2 * n_out * k_in);
  for_tasks(static_cast<int64_t>(tasks.size()), [&](int64_t i) {
    const RowTask& t = tasks[static_cast<size_t>(i)];
    const T* b = w + t.expert * n_out * k_in;
    const int64_t ldb = tb ? k_in : n_out;
    const auto [direct, gathered] = by_length<T>(t.pieces(by_expert.runs[static_cast<size_t>(t.expert)]), n_out, k_in);
    if constexpr (!std::is_same_v<T, bfloat16>)
      for (const Run& piece : direct)
        gemm(false, tb, piece.end - piece.begin, n_out, k_in, x + piece.begin * k_in, k_in, b, ldb,
             out + piece.begin * n_out, n_out, false);
    if (gathered.empty()) return;
    thread_local std::vector<C> a_rows, c_rows, b_wide;
    const int64_t m = total_rows(gathered);
    gather_rows(x, k_in, gathered, 0, k_in, a_rows);
    c_rows.resize(static_cast<size_t>(m * n_out));
    gemm(false, tb, m, n_out, k_in, a_rows.data(), k_in, widened(b, n_out * k_in, b_wide), ldb, c_rows.data(), n_out,
         false);
    scatter_rows(c_rows.data(), n_out, gathered, out);
  });
}

template <typename T>
void grouped_matmul_wgrad(const T* a, const T* b, const int64_t* row_expert, T* out, int64_t rows, int64_t e, int64_t p,
                          int64_t q, int64_t first) {
  using C = Acc<T>;
  const ExpertRows by_expert = expert_rows(row_expert, rows, e, first);
  // Tasks: blocks of columns of a (rows of out[x]), each over all of its
  // expert's rows: the long runs' GEMMs added in row order, then one GEMM
  // over the short runs gathered. The sum does not depend on the threads.
  const std::vector<ColumnTask> tasks = column_tasks(by_expert, p, q);
  for_tasks(static_cast<int64_t>(tasks.size()), [&](int64_t i) {
    const ColumnTask& t = tasks[static_cast<size_t>(i)];
    const int64_t pc = t.p1 - t.p0;
    const auto [direct, gathered] = by_length<T>(by_expert.runs[static_cast<size_t>(t.expert)], p, q);
    thread_local std::vector<C> a_rows, b_rows, c32;
    // bf16 sums into f32 scratch and rounds once.
    C* c;
    int64_t ldc;
    if constexpr (std::is_same_v<T, bfloat16>) {
      c32.resize(static_cast<size_t>(pc * q));
      c = c32.data(), ldc = q;
    } else {
      c = out + t.expert * p * q + t.p0 * q, ldc = q;
    }
    bool acc = false;
    if constexpr (!std::is_same_v<T, bfloat16>)
      for (const Run& piece : direct) {
        gemm(true, false, pc, q, piece.end - piece.begin, a + piece.begin * p + t.p0, p, b + piece.begin * q, q, c, ldc,
             acc);
        acc = true;
      }
    if (!gathered.empty()) {
      const int64_t m = total_rows(gathered);
      gather_rows(a, p, gathered, t.p0, pc, a_rows);
      gather_rows(b, q, gathered, 0, q, b_rows);
      gemm(true, false, pc, q, m, a_rows.data(), pc, b_rows.data(), q, c, ldc, acc);
      acc = true;
    }
    if (!acc) std::fill(c, c + pc * q, C(0));  // an expert with no rows
    if constexpr (std::is_same_v<T, bfloat16>) {
      T* o = out + t.expert * p * q + t.p0 * q;
      for (int64_t j = 0; j < pc * q; ++j) o[j] = f32_to_bf16(c32[static_cast<size_t>(j)]);
    }
  });
}

#define MESHTRAIN_INSTANTIATE_MOE(T)                                                                                \
  template void moe_topk<T>(const T*, int64_t*, int64_t, int64_t, int64_t);                                         \
  template void moe_route_weights<T>(const T*, const int64_t*, T*, int64_t, int64_t, int64_t);                      \
  template void moe_route_weights_backward<T>(const T*, const int64_t*, const T*, T*, int64_t, int64_t, int64_t);   \
  template void moe_permute<T>(const T*, const int64_t*, const T*, T*, int64_t, int64_t, int64_t, int64_t);         \
  template void moe_combine<T>(const T*, const int64_t*, const T*, T*, int64_t, int64_t, int64_t, int64_t);         \
  template void moe_combine_weight_grad<T>(const T*, const T*, const int64_t*, T*, int64_t, int64_t, int64_t,       \
                                           int64_t);                                                                \
  template void moe_dispatch<T>(const T*, const int64_t*, T*, int64_t, int64_t, int64_t, int64_t, int64_t, T);      \
  template void moe_undispatch<T>(const T*, const int64_t*, T*, int64_t, int64_t, int64_t, int64_t, int64_t);       \
  template void grouped_matmul<T>(const T*, const T*, const int64_t*, T*, int64_t, int64_t, int64_t, int64_t, bool, \
                                  int64_t);                                                                         \
  template void grouped_matmul_wgrad<T>(const T*, const T*, const int64_t*, T*, int64_t, int64_t, int64_t, int64_t, \
                                        int64_t);
MESHTRAIN_INSTANTIATE_MOE(float)
MESHTRAIN_INSTANTIATE_MOE(double)
MESHTRAIN_INSTANTIATE_MOE(bfloat16)
template void moe_dispatch<int64_t>(const int64_t*, const int64_t*, int64_t*, int64_t, int64_t, int64_t, int64_t,
                                    int64_t, int64_t);
#undef MESHTRAIN_INSTANTIATE_MOE

}  // namespace meshtrain::kernels::cpu
