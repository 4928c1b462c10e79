// CUDA kernels of the loss ops (graph/ops/loss.cpp): one block per row of logits, an online max and sum of exps in
// f32, and whole-batch sums in double reduced in a fixed order (deterministic).
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <type_traits>
#include <utility>

#include "kernels/cuda/ops/families.h"

namespace meshtrain::kernels::cuda::ops {

namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kMaxPartials = 1024;      // blocks of a whole-batch sum's first phase
constexpr int64_t kMinSumChunk = 4096;  // the fewest values one of those blocks sums
constexpr int kSumThreads = 256;
constexpr float kExpUnderflow = -87.33654475f;  // below it the CPU's exp_fast gives 0

__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fc00000); }
__device__ __forceinline__ float minus_inf() { return -std::numeric_limits<float>::infinity(); }

// exp as the CPU's exp_of: 0 below -87.34 (and for -inf), NaN stays NaN.
__device__ __forceinline__ float exp_of(float x) { return x < kExpUnderflow ? 0.0f : expf(x); }

// 1 / the whole batch's count of valid targets (an f64 scalar on the device), 0 when there are none.
__device__ __forceinline__ double per_token(const double* count) {
  const double c = *count;
  return c > 0 ? 1.0 / c : 0.0;
}

// The gradient's scale: dloss (f32) / count, in double, then f32 (as the CPU's static_cast<Acc<T>>(scale)).
__device__ __forceinline__ float loss_scale(const float* dloss, const double* count) {
  return static_cast<float>(static_cast<double>(*dloss) * per_token(count));
}

// A running max m and the sum s of exp(x - m) over the values seen so far.
struct MaxSum {
  float m, s;
};

// s, a sum of exps shifted by `from`, shifted by `to` >= from instead.
__device__ __forceinline__ float rescaled(float s, float from, float to) {
  return from == to ? s : s * exp_of(from - to);
}

// exp(x - m), with -inf values adding nothing even while the max is -inf (a row of only -inf is NaN at the end, as
// on the CPU).
__device__ __forceinline__ float exp_term(float x, float m) { return x == minus_inf() ? 0.0f : exp_of(x - m); }

template <int W>
__device__ __forceinline__ MaxSum add_values(MaxSum ms, const float (&v)[W]) {
  float m = ms.m;
#pragma unroll
  for (int k = 0; k < W; ++k) m = fmaxf(m, v[k]);  // passes over NaN, as the CPU's std::max chain
  float s = rescaled(ms.s, ms.m, m);
#pragma unroll
  for (int k = 0; k < W; ++k) s += exp_term(v[k], m);
  return {m, s};
}

struct AddOp {
  template <typename V>
  __device__ V operator()(V a, V b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct CombineOp {
  __device__ MaxSum operator()(MaxSum a, MaxSum b) const {
    const float m = fmaxf(a.m, b.m);
    return {m, rescaled(a.s, a.m, m) + rescaled(b.s, b.m, m)};
  }
};

__device__ __forceinline__ float shfl_xor(float v, int lane_mask) { return __shfl_xor_sync(kFullMask, v, lane_mask); }
__device__ __forceinline__ double shfl_xor(double v, int lane_mask) { return __shfl_xor_sync(kFullMask, v, lane_mask); }
__device__ __forceinline__ MaxSum shfl_xor(MaxSum v, int lane_mask) {
  return {shfl_xor(v.m, lane_mask), shfl_xor(v.s, lane_mask)};
}
__device__ __forceinline__ float shfl_first(float v) { return __shfl_sync(kFullMask, v, 0); }
__device__ __forceinline__ double shfl_first(double v) { return __shfl_sync(kFullMask, v, 0); }
__device__ __forceinline__ MaxSum shfl_first(MaxSum v) { return {shfl_first(v.m), shfl_first(v.s)}; }

// The warp's values reduced, lane 0's result given to every lane (so that all lanes hold the same bits).
template <typename V, typename Op>
__device__ __forceinline__ V warp_reduce(V v, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, shfl_xor(v, offset));
  return shfl_first(v);
}

// The block's values reduced in a fixed order, returned to every thread. blockDim.x must be a multiple of 32; every
// thread of the block must call it.
template <typename V, typename Op>
__device__ V block_reduce(V v, Op op, V identity) {
  __shared__ V warp_results[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_reduce(v, op);
  if (lane == 0) warp_results[warp] = v;
  __syncthreads();
  v = warp_reduce(lane < warps ? warp_results[lane] : identity, op);  // every warp, the same sum
  __syncthreads();                                                    // warp_results may be reused after
  return v;
}

// Loads and stores of a row, kWidth elements at a time as f32: 16 bytes when kVec (the row's start 16-byte aligned,
// its length a multiple of kWidth), else one element.
template <typename T, bool kVec>
struct RowAccess {
  static constexpr int kWidth = kVec ? static_cast<int>(16 / sizeof(T)) : 1;
  __device__ static void load(const T* row, int64_t i, float (&v)[kWidth]) {
    if constexpr (kVec) {
      const uint4 raw = *reinterpret_cast<const uint4*>(row + i);
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int k = 0; k < kWidth; ++k) v[k] = to_f32(e[k]);
    } else {
      v[0] = to_f32(row[i]);
    }
  }
  __device__ static void store(T* row, int64_t i, const T (&v)[kWidth]) {
    if constexpr (kVec) {
      uint4 raw;
      T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
      for (int k = 0; k < kWidth; ++k) e[k] = v[k];
      *reinterpret_cast<uint4*>(row + i) = raw;
    } else {
      row[i] = v[0];
    }
  }
};

// The first element index of this thread's chunks of a row, and the step between them.
template <int W>
__device__ __forceinline__ int64_t first_of_thread() {
  return static_cast<int64_t>(threadIdx.x) * W;
}
template <int W>
__device__ __forceinline__ int64_t block_step() {
  return static_cast<int64_t>(blockDim.x) * W;
}

// The max and sum of exps of a row of n elements, reduced over the block.
template <typename T, bool kVec>
__device__ MaxSum row_max_sum(const T* row, int64_t n) {
  using Access = RowAccess<T, kVec>;
  constexpr int W = Access::kWidth;
  MaxSum ms{minus_inf(), 0.0f};
  for (int64_t i = first_of_thread<W>(); i < n; i += block_step<W>()) {
    float v[W];
    Access::load(row, i, v);
    ms = add_values(ms, v);
  }
  return block_reduce(ms, CombineOp{}, MaxSum{minus_inf(), 0.0f});
}

// A row filled with one value (0 for ignored rows, NaN for rows whose target is invalid).
template <typename T, bool kVec>
__device__ void fill_row(T* row, int64_t n, float value) {
  using Access = RowAccess<T, kVec>;
  constexpr int W = Access::kWidth;
  T v[W];
#pragma unroll
  for (int k = 0; k < W; ++k) v[k] = from_f32<T>(value);
  for (int64_t i = first_of_thread<W>(); i < n; i += block_step<W>()) Access::store(row, i, v);
}

template <typename T, bool kVec>
__global__ void row_max_kernel(const T* x, int64_t vocab, float* out) {
  using Access = RowAccess<T, kVec>;
  constexpr int W = Access::kWidth;
  const T* row = x + static_cast<int64_t>(blockIdx.x) * vocab;
  float m = minus_inf();
  for (int64_t i = first_of_thread<W>(); i < vocab; i += block_step<W>()) {
    float v[W];
    Access::load(row, i, v);
#pragma unroll
    for (int k = 0; k < W; ++k) m = fmaxf(m, v[k]);
  }
  m = block_reduce(m, MaxOp{}, minus_inf());
  if (threadIdx.x == 0) out[blockIdx.x] = m;
}

template <typename T, bool kVec>
__global__ void sum_exp_kernel(const T* x, const float* shift, int64_t vocab, float* out) {
  using Access = RowAccess<T, kVec>;
  constexpr int W = Access::kWidth;
  const T* row = x + static_cast<int64_t>(blockIdx.x) * vocab;
  const float c = shift[blockIdx.x];
  float total = 0.0f;
  for (int64_t i = first_of_thread<W>(); i < vocab; i += block_step<W>()) {
    float v[W];
    Access::load(row, i, v);
#pragma unroll
    for (int k = 0; k < W; ++k) total += exp_of(v[k] - c);
  }
  total = block_reduce(total, AddOp{}, 0.0f);
  if (threadIdx.x == 0) out[blockIdx.x] = total;
}

// One thread per row: the target's logit when this part of the vocabulary holds it, 0 for another part's target or
// an ignored one, NaN for a target outside [0, total) (the CPU throws).
template <typename T>
__global__ void pick_kernel(const T* x, const int64_t* targets, int64_t rows, int64_t vocab, int64_t start,
                            int64_t total, int64_t ignore, float* out) {
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = targets[r];
    const int64_t v = t - start;
    if (t != ignore && (t < 0 || t >= total))
      out[r] = quiet_nan();
    else
      out[r] = t != ignore && v >= 0 && v < vocab ? to_f32(x[r * vocab + v]) : 0.0f;
  }
}

// dlogits of the split loss: exp(x - shift) / sum_exp * g, minus g at the target when this part holds it (rounded
// twice for bf16, as the CPU stores the row and then subtracts), 0 on ignored rows.
template <typename T, bool kVec>
__global__ void split_loss_backward_kernel(const T* x, const int64_t* targets, const float* shift, const float* sum_exp,
                                           const float* dloss, const double* count, int64_t vocab, int64_t start,
                                           int64_t ignore, T* dx) {
  using Access = RowAccess<T, kVec>;
  constexpr int W = Access::kWidth;
  const int64_t r = blockIdx.x;
  const T* row = x + r * vocab;
  T* drow = dx + r * vocab;
  const int64_t target = targets[r];
  if (target == ignore) return fill_row<T, kVec>(drow, vocab, 0.0f);
  const float g = loss_scale(dloss, count), c = shift[r], se = sum_exp[r];
  const int64_t t = target - start;  // in [0, vocab) when this part holds the target
  for (int64_t i = first_of_thread<W>(); i < vocab; i += block_step<W>()) {
    float v[W];
    Access::load(row, i, v);
    T d[W];
#pragma unroll
    for (int k = 0; k < W; ++k) {
      d[k] = from_f32<T>(exp_of(v[k] - c) / se * g);
      if (i + k == t) d[k] = from_f32<T>(to_f32(d[k]) - g);
    }
    Access::store(drow, i, d);
  }
}

// Each row's loss log(sum exp(x - max)) + max - x[target] in double, 0 for ignored rows, NaN for invalid targets.
template <typename T, bool kVec>
__global__ void cross_entropy_rows_kernel(const T* x, const int64_t* targets, int64_t vocab, int64_t ignore,
                                          double* row_loss) {
  const int64_t r = blockIdx.x;
  const int64_t t = targets[r];
  if (t == ignore || t < 0 || t >= vocab) {  // the same for the whole block: it returns together
    if (threadIdx.x == 0) row_loss[r] = t == ignore ? 0.0 : static_cast<double>(quiet_nan());
    return;
  }
  const T* row = x + r * vocab;
  const MaxSum ms = row_max_sum<T, kVec>(row, vocab);
  if (threadIdx.x != 0) return;
  row_loss[r] = ms.m == minus_inf()
                    ? static_cast<double>(quiet_nan())  // the CPU's exp(-inf - -inf)
                    : log(static_cast<double>(ms.s)) + static_cast<double>(ms.m) - static_cast<double>(to_f32(row[t]));
}

// dlogits = (softmax(x) - onehot(target)) * dloss / count, 0 on ignored rows, NaN on rows with an invalid target.
template <typename T, bool kVec>
__global__ void cross_entropy_backward_kernel(const T* x, const int64_t* targets, const float* dloss,
                                              const double* count, int64_t vocab, int64_t ignore, T* dx) {
  using Access = RowAccess<T, kVec>;
  constexpr int W = Access::kWidth;
  const int64_t r = blockIdx.x;
  const T* row = x + r * vocab;
  T* drow = dx + r * vocab;
  const int64_t t = targets[r];
  if (t == ignore) return fill_row<T, kVec>(drow, vocab, 0.0f);
  if (t < 0 || t >= vocab) return fill_row<T, kVec>(drow, vocab, quiet_nan());
  const float g = loss_scale(dloss, count);
  const MaxSum ms = row_max_sum<T, kVec>(row, vocab);
  const float inv = 1.0f / ms.s;
  for (int64_t i = first_of_thread<W>(); i < vocab; i += block_step<W>()) {
    float v[W];
    Access::load(row, i, v);
    T d[W];
#pragma unroll
    for (int k = 0; k < W; ++k) {
      float p = __fmul_rn(exp_of(v[k] - ms.m), inv);  // rounded before the onehot, as the CPU's softmax row
      if (i + k == t) p -= 1.0f;
      d[k] = from_f32<T>(p * g);
    }
    Access::store(drow, i, d);
  }
}

// Whole-batch sums, deterministic: blocks sum fixed chunks of the values into partials, then one block sums the
// partials, both in a fixed order.
template <typename Value>
__global__ void partial_sums_kernel(Value value, int64_t n, int64_t chunk, double* partials) {
  const int64_t begin = blockIdx.x * chunk, end = begin + chunk < n ? begin + chunk : n;
  double total = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) total += value(i);
  total = block_reduce(total, AddOp{}, 0.0);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}
template <typename Finish>
__global__ void finish_sum_kernel(const double* partials, int count, Finish finish) {
  double total = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) total += partials[i];
  total = block_reduce(total, AddOp{}, 0.0);
  if (threadIdx.x == 0) finish(total);
}

// Values summed: 1 per valid target; each row's nll from the split loss's parts; per-row values in memory.
struct ValidTarget {
  const int64_t* targets;
  int64_t ignore;
  __device__ double operator()(int64_t i) const { return targets[i] != ignore ? 1.0 : 0.0; }
};
struct SplitNll {
  const float *sum_exp, *shift, *picked;
  const int64_t* targets;
  int64_t ignore;
  __device__ double operator()(int64_t i) const {
    if (targets[i] == ignore) return 0.0;
    return log(static_cast<double>(sum_exp[i])) + static_cast<double>(shift[i]) - static_cast<double>(picked[i]);
  }
};
struct StoredValue {
  const double* values;
  __device__ double operator()(int64_t i) const { return values[i]; }
};

// What a sum becomes: an f64 count, or an f32 mean over the whole batch's count.
struct WriteCount {
  double* out;
  __device__ void operator()(double total) const { *out = total; }
};
struct WriteMean {
  const double* count;
  float* out;
  __device__ void operator()(double total) const { *out = static_cast<float>(total * per_token(count)); }
};

// Sums value(i) for i in [0, n) into finish, with kMaxPartials doubles of scratch at `partials`.
template <typename Value, typename Finish>
void launch_sum(Value value, int64_t n, Finish finish, double* partials, cudaStream_t stream, const char* op) {
  int64_t blocks = (n + kMinSumChunk - 1) / kMinSumChunk;
  blocks = blocks < 1 ? 1 : (blocks > kMaxPartials ? kMaxPartials : blocks);
  const int64_t chunk = (n + blocks - 1) / blocks;
  partial_sums_kernel<<<static_cast<unsigned>(blocks), kSumThreads, 0, stream>>>(value, n, chunk, partials);
  check_launch(op);
  finish_sum_kernel<<<1, kSumThreads, 0, stream>>>(partials, static_cast<int>(blocks), finish);
  check_launch(op);
}

// Threads of a block that walks a row of `chunks` loads.
int row_threads(int64_t chunks) { return chunks >= 4096 ? 512 : (chunks >= 1024 ? 256 : 128); }


// Blocks and threads of a block-per-row kernel over rows of `vocab` T.
template <typename T, bool kVec>
std::pair<unsigned, int> row_grid(int64_t rows, int64_t vocab, const char* op) {
  MT_CHECK(rows <= std::numeric_limits<int32_t>::max(), "{}: {} rows are more than a CUDA grid holds", op, rows);
  return {static_cast<unsigned>(rows),
          row_threads((vocab + RowAccess<T, kVec>::kWidth - 1) / RowAccess<T, kVec>::kWidth)};
}

void add_split_loss_kernels(const AddKernel& add) {
  add("row_max", [](const KernelArgs& a, const LaunchContext& ctx) {
    const auto [rows, vocab] = rows_of(*a.in[0]);
    if (rows == 0) return;
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      with_row_access<T>(vocab, {a.in[0]->raw()}, [&](auto vec) {
        constexpr bool kVec = decltype(vec)::value;
        const auto [blocks, threads] = row_grid<T, kVec>(rows, vocab, "row_max");
        row_max_kernel<T, kVec><<<blocks, threads, 0, stream_of(ctx)>>>(in_ptr<T>(a, 0), vocab, out_ptr<float>(a));
        check_launch("row_max");
      });
    });
  });
  add("sum_exp", [](const KernelArgs& a, const LaunchContext& ctx) {
    const auto [rows, vocab] = rows_of(*a.in[0]);
    if (rows == 0) return;
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      with_row_access<T>(vocab, {a.in[0]->raw()}, [&](auto vec) {
        constexpr bool kVec = decltype(vec)::value;
        const auto [blocks, threads] = row_grid<T, kVec>(rows, vocab, "sum_exp");
        sum_exp_kernel<T, kVec>
            <<<blocks, threads, 0, stream_of(ctx)>>>(in_ptr<T>(a, 0), in_ptr<float>(a, 1), vocab, out_ptr<float>(a));
        check_launch("sum_exp");
      });
    });
  });
  add("pick", [](const KernelArgs& a, const LaunchContext& ctx) {
    const auto [rows, vocab] = rows_of(*a.in[0]);
    const TablePart part = table_part(a, vocab);
    const int64_t ignore = a.attrs.get(attr::ignore_index);
    if (rows == 0) return;
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      pick_kernel<T><<<blocks_for(rows), 256, 0, stream_of(ctx)>>>(in_ptr<T>(a, 0), in_ptr<int64_t>(a, 1), rows, vocab,
                                                                   part.start, part.total, ignore, out_ptr<float>(a));
      check_launch("pick");
    });
  });
  // Inputs: logits (unread), sum_exp, shift, target logit, targets, count.
  add("nll_mean", [](const KernelArgs& a, const LaunchContext& ctx) {
    by_float_type(a.in[0]->dtype(), [](auto) {});  // f32 and bf16 logits only: their row values are f32
    const int64_t ignore = a.attrs.get(attr::ignore_index), rows = a.in[1]->numel();
    const SplitNll nll{in_ptr<float>(a, 1), in_ptr<float>(a, 2), in_ptr<float>(a, 3), in_ptr<int64_t>(a, 4), ignore};
    launch_sum(nll, rows, WriteMean{in_ptr<double>(a, 5), out_ptr<float>(a)},
               scratch_of<double>(ctx, kMaxPartials, "nll_mean"), stream_of(ctx), "nll_mean");
  });
  // Inputs: logits, targets, shift, sum_exp, dloss, count.
  add("split_loss_backward", [](const KernelArgs& a, const LaunchContext& ctx) {
    const auto [rows, vocab] = rows_of(*a.in[0]);
    const int64_t start = table_part(a, vocab).start, ignore = a.attrs.get(attr::ignore_index);
    if (rows == 0) return;
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      with_row_access<T>(vocab, {a.in[0]->raw(), a.out[0]->raw()}, [&](auto vec) {
        constexpr bool kVec = decltype(vec)::value;
        const auto [blocks, threads] = row_grid<T, kVec>(rows, vocab, "split_loss_backward");
        split_loss_backward_kernel<T, kVec><<<blocks, threads, 0, stream_of(ctx)>>>(
            in_ptr<T>(a, 0), in_ptr<int64_t>(a, 1), in_ptr<float>(a, 2), in_ptr<float>(a, 3), in_ptr<float>(a, 4),
            in_ptr<double>(a, 5), vocab, start, ignore, out_ptr<T>(a));
        check_launch("split_loss_backward");
      });
    });
  });
}

}  // namespace

void add_loss_kernels(const AddKernel& add) {
  add_split_loss_kernels(add);
  add("count_valid", [](const KernelArgs& a, const LaunchContext& ctx) {
    const int64_t ignore = a.attrs.get(attr::ignore_index), n = a.in[0]->numel();
    launch_sum(ValidTarget{in_ptr<int64_t>(a, 0), ignore}, n, WriteCount{out_ptr<double>(a)},
               scratch_of<double>(ctx, kMaxPartials, "count_valid"), stream_of(ctx), "count_valid");
  });
  add("cross_entropy", [](const KernelArgs& a, const LaunchContext& ctx) {
    const auto [rows, vocab] = rows_of(*a.in[0]);
    const int64_t ignore = a.attrs.get(attr::ignore_index);
    double* partials = scratch_of<double>(ctx, kMaxPartials + static_cast<size_t>(rows), "cross_entropy");
    double* row_loss = partials + kMaxPartials;
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      if (rows > 0) {
        with_row_access<T>(vocab, {a.in[0]->raw()}, [&](auto vec) {
          constexpr bool kVec = decltype(vec)::value;
          const auto [blocks, threads] = row_grid<T, kVec>(rows, vocab, "cross_entropy");
          cross_entropy_rows_kernel<T, kVec>
              <<<blocks, threads, 0, stream_of(ctx)>>>(in_ptr<T>(a, 0), in_ptr<int64_t>(a, 1), vocab, ignore, row_loss);
          check_launch("cross_entropy");
        });
      }
      launch_sum(StoredValue{row_loss}, rows, WriteMean{in_ptr<double>(a, 2), out_ptr<float>(a)}, partials,
                 stream_of(ctx), "cross_entropy");
    });
  });
  // Inputs: logits, targets, dloss, count.
  add("cross_entropy_backward", [](const KernelArgs& a, const LaunchContext& ctx) {
    const auto [rows, vocab] = rows_of(*a.in[0]);
    const int64_t ignore = a.attrs.get(attr::ignore_index);
    if (rows == 0) return;
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      with_row_access<T>(vocab, {a.in[0]->raw(), a.out[0]->raw()}, [&](auto vec) {
        constexpr bool kVec = decltype(vec)::value;
        const auto [blocks, threads] = row_grid<T, kVec>(rows, vocab, "cross_entropy_backward");
        cross_entropy_backward_kernel<T, kVec>
            <<<blocks, threads, 0, stream_of(ctx)>>>(in_ptr<T>(a, 0), in_ptr<int64_t>(a, 1), in_ptr<float>(a, 2),
                                                     in_ptr<double>(a, 3), vocab, ignore, out_ptr<T>(a));
        check_launch("cross_entropy_backward");
      });
    });
  });
}

}  // namespace meshtrain::kernels::cuda::ops
