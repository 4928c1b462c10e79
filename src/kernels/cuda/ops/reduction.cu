// CUDA kernels of the reduction ops (graph/ops/reduction.cpp): whole-tensor sums, row softmax and RMSNorm.
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/ops/families.h"

namespace meshtrain::kernels::cuda::ops {

namespace {

// ---------------------------------------------------------------------------
// Shared device helpers: packed loads, warp and block reductions.

// kVec elements loaded or stored as one access (16 bytes when kVec * sizeof(T) == 16).
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};
// Elements of T in 16 bytes: the vector width of the aligned paths.
template <typename T>
constexpr int kPack16 = static_cast<int>(16 / sizeof(T));

template <int kVec, typename T>
__device__ __forceinline__ Pack<T, kVec> load_pack(const T* p, int64_t i) {
  return *reinterpret_cast<const Pack<T, kVec>*>(p + i);
}
template <int kVec, typename T>
__device__ __forceinline__ void store_pack(T* p, int64_t i, const Pack<T, kVec>& pack) {
  *reinterpret_cast<Pack<T, kVec>*>(p + i) = pack;
}


// A double result stored as the CPU's store<T>(double): f32 by a cast, bf16 through f32.
template <typename Out>
__device__ __forceinline__ Out store_f64(double v) {
  if constexpr (std::is_same_v<Out, double>)
    return v;
  else
    return from_f32<Out>(static_cast<float>(v));
}

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The sum (or max) over the block, returned to every thread, in a fixed
// order (deterministic). blockDim.x must be a multiple of 32; every thread
// of the block must call it.
template <typename A>
__device__ A block_sum(A v) {
  __shared__ A warp_totals[32];
  v = warp_sum(v);
  __syncthreads();  // readers of an earlier call are done with warp_totals
  if (threadIdx.x % 32 == 0) warp_totals[threadIdx.x / 32] = v;
  __syncthreads();
  A total = 0;
  for (unsigned w = 0; w < blockDim.x / 32; ++w) total += warp_totals[w];
  return total;
}
// Two block sums at once (one pair of barriers), returned to every thread.
__device__ void block_sum_pair(float& a, float& b) {
  __shared__ float2 warp_totals[32];
  a = warp_sum(a);
  b = warp_sum(b);
  __syncthreads();
  if (threadIdx.x % 32 == 0) warp_totals[threadIdx.x / 32] = make_float2(a, b);
  __syncthreads();
  a = 0;
  b = 0;
  for (unsigned w = 0; w < blockDim.x / 32; ++w) {
    a += warp_totals[w].x;
    b += warp_totals[w].y;
  }
}
__device__ float block_max(float v) {
  __shared__ float warp_maxima[32];
  v = warp_max(v);
  __syncthreads();
  if (threadIdx.x % 32 == 0) warp_maxima[threadIdx.x / 32] = v;
  __syncthreads();
  float total = -INFINITY;
  for (unsigned w = 0; w < blockDim.x / 32; ++w) total = fmaxf(total, warp_maxima[w]);
  return total;
}

// ---------------------------------------------------------------------------
// Whole-tensor sums (sum, sum_squares, mean), accumulated in double as the
// CPU does. Deterministic: a fixed grid (a function of n only) writes one
// partial per block, then one block sums the partials in order.

constexpr int kSumThreads = 256;
constexpr int64_t kSumItemsPerThread = 16;
constexpr int64_t kMaxSumBlocks = 1024;

template <bool kSquare, typename T>
__device__ __forceinline__ double sum_term(T x) {
  const double v = to_f64(x);
  return kSquare ? v * v : v;
}

// out[blockIdx.x] = store(sum over this block's elements of x (or x^2) / divisor).
template <bool kSquare, int kVec, typename T, typename Out>
__global__ void __launch_bounds__(kSumThreads) sum_blocks(const T* x, int64_t n, Out* out, double divisor) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / kVec;
  double acc = 0;
  for (int64_t p = first; p < packs; p += stride) {
    const Pack<T, kVec> pack = load_pack<kVec>(x, p * kVec);
#pragma unroll
    for (int k = 0; k < kVec; ++k) acc += sum_term<kSquare>(pack.v[k]);
  }
  for (int64_t i = packs * kVec + first; i < n; i += stride) acc += sum_term<kSquare>(x[i]);  // the tail
  acc = block_sum(acc);
  if (threadIdx.x == 0) out[blockIdx.x] = store_f64<Out>(acc / divisor);
}

unsigned sum_grid(int64_t n) {
  const int64_t per_block = kSumThreads * kSumItemsPerThread;
  const int64_t blocks = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxSumBlocks ? kMaxSumBlocks : blocks));
}

template <bool kSquare, typename T, typename Out>
void launch_sum_blocks(const T* x, int64_t n, Out* out, double divisor, unsigned blocks, cudaStream_t stream,
                       const char* op) {
  if (aligned16(x))
    sum_blocks<kSquare, kPack16<T>><<<blocks, kSumThreads, 0, stream>>>(x, n, out, divisor);
  else
    sum_blocks<kSquare, 1><<<blocks, kSumThreads, 0, stream>>>(x, n, out, divisor);
  check_launch(op);
}

// *out = store(sum of x (or x^2) / divisor), the sum in double.
template <bool kSquare, typename T, typename Out>
void launch_sum(const T* x, int64_t n, Out* out, double divisor, const LaunchContext& ctx, const char* op) {
  const unsigned blocks = sum_grid(n);
  if (blocks == 1) return launch_sum_blocks<kSquare>(x, n, out, divisor, 1, stream_of(ctx), op);
  double* partials = scratch_of<double>(ctx, blocks, op);
  launch_sum_blocks<kSquare>(x, n, partials, 1.0, blocks, stream_of(ctx), op);
  sum_blocks<false, 1><<<1, kSumThreads, 0, stream_of(ctx)>>>(partials, static_cast<int64_t>(blocks), out, divisor);
  check_launch(op);
}

// ---------------------------------------------------------------------------
// Row ops (softmax, RMSNorm) over rows of length d, in f32: one warp per row
// for short rows, one block per row for long ones, rows grid-strided.

constexpr int64_t kMaxWarpRow = 1024;  // the longest row given to one warp
constexpr int kRowThreads = 256;
constexpr int64_t kMaxRowBlocks = int64_t{1} << 20;

template <bool kWarpPerRow>
__device__ __forceinline__ int row_lane() {
  return kWarpPerRow ? static_cast<int>(threadIdx.x % 32) : static_cast<int>(threadIdx.x);
}
template <bool kWarpPerRow>
__device__ __forceinline__ int row_threads() {
  return kWarpPerRow ? 32 : static_cast<int>(blockDim.x);
}
template <bool kWarpPerRow>
__device__ __forceinline__ int64_t first_row() {
  return kWarpPerRow ? static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32 : blockIdx.x;
}
template <bool kWarpPerRow>
__device__ __forceinline__ int64_t row_step() {
  return kWarpPerRow ? static_cast<int64_t>(gridDim.x) * (blockDim.x / 32) : gridDim.x;
}
template <bool kWarpPerRow>
__device__ __forceinline__ float row_sum(float v) {
  if constexpr (kWarpPerRow)
    return warp_sum(v);
  else
    return block_sum(v);
}
template <bool kWarpPerRow>
__device__ __forceinline__ void row_sum_pair(float& a, float& b) {
  if constexpr (kWarpPerRow) {
    a = warp_sum(a);
    b = warp_sum(b);
  } else {
    block_sum_pair(a, b);
  }
}
template <bool kWarpPerRow>
__device__ __forceinline__ float row_max(float v) {
  if constexpr (kWarpPerRow)
    return warp_max(v);
  else
    return block_max(v);
}

// The CPU's exp_fast below its cutoff: 0 (no denormals); else expf (NaN stays NaN).
__device__ __forceinline__ float exp_like_cpu(float x) { return x < -87.33654475f ? 0.0f : expf(x); }

// y = exp(x - max) / sum, per row (the CPU's softmax_row).
template <bool kWarpPerRow, int kVec, typename T>
__global__ void __launch_bounds__(kRowThreads) softmax_rows(const T* x, T* y, int64_t rows, int64_t d) {
  const int lane = row_lane<kWarpPerRow>(), threads = row_threads<kWarpPerRow>();
  for (int64_t r = first_row<kWarpPerRow>(); r < rows; r += row_step<kWarpPerRow>()) {
    const T* xr = x + r * d;
    T* yr = y + r * d;
    float max = -INFINITY;
    for (int64_t i = int64_t{lane} * kVec; i < d; i += int64_t{threads} * kVec) {
      const Pack<T, kVec> xs = load_pack<kVec>(xr, i);
#pragma unroll
      for (int k = 0; k < kVec; ++k) max = fmaxf(max, to_f32(xs.v[k]));
    }
    max = row_max<kWarpPerRow>(max);
    float total = 0;
    for (int64_t i = int64_t{lane} * kVec; i < d; i += int64_t{threads} * kVec) {
      const Pack<T, kVec> xs = load_pack<kVec>(xr, i);
#pragma unroll
      for (int k = 0; k < kVec; ++k) total += exp_like_cpu(to_f32(xs.v[k]) - max);
    }
    const float inv = 1.0f / row_sum<kWarpPerRow>(total);
    for (int64_t i = int64_t{lane} * kVec; i < d; i += int64_t{threads} * kVec) {
      const Pack<T, kVec> xs = load_pack<kVec>(xr, i);
      Pack<T, kVec> ys;
#pragma unroll
      for (int k = 0; k < kVec; ++k) ys.v[k] = from_f32<T>(exp_like_cpu(to_f32(xs.v[k]) - max) * inv);
      store_pack<kVec>(yr, i, ys);
    }
  }
}

// dx = y * (dy - sum(y * dy)), per row.
template <bool kWarpPerRow, int kVec, typename T>
__global__ void __launch_bounds__(kRowThreads)
    softmax_backward_rows(const T* y, const T* dy, T* dx, int64_t rows, int64_t d) {
  const int lane = row_lane<kWarpPerRow>(), threads = row_threads<kWarpPerRow>();
  for (int64_t r = first_row<kWarpPerRow>(); r < rows; r += row_step<kWarpPerRow>()) {
    const T* yr = y + r * d;
    const T* gr = dy + r * d;
    float dot = 0;
    for (int64_t i = int64_t{lane} * kVec; i < d; i += int64_t{threads} * kVec) {
      const Pack<T, kVec> ys = load_pack<kVec>(yr, i), gs = load_pack<kVec>(gr, i);
#pragma unroll
      for (int k = 0; k < kVec; ++k) dot += to_f32(ys.v[k]) * to_f32(gs.v[k]);
    }
    dot = row_sum<kWarpPerRow>(dot);
    for (int64_t i = int64_t{lane} * kVec; i < d; i += int64_t{threads} * kVec) {
      const Pack<T, kVec> ys = load_pack<kVec>(yr, i), gs = load_pack<kVec>(gr, i);
      Pack<T, kVec> out;
#pragma unroll
      for (int k = 0; k < kVec; ++k) out.v[k] = from_f32<T>(to_f32(ys.v[k]) * (to_f32(gs.v[k]) - dot));
      store_pack<kVec>(dx + r * d, i, out);
    }
  }
}

// 1 / sqrt(mean(x^2) + eps) from the row's f32 sum of squares, computed in double as the CPU does.
__device__ __forceinline__ float inverse_rms(float sum_squares, int64_t d, double eps) {
  return static_cast<float>(1.0 / sqrt(static_cast<double>(sum_squares) / static_cast<double>(d) + eps));
}

// y = x * inv_rms * w, per row.
template <bool kWarpPerRow, int kVec, typename T>
__global__ void __launch_bounds__(kRowThreads)
    rms_norm_rows(const T* x, const T* w, T* y, int64_t rows, int64_t d, double eps) {
  const int lane = row_lane<kWarpPerRow>(), threads = row_threads<kWarpPerRow>();
  for (int64_t r = first_row<kWarpPerRow>(); r < rows; r += row_step<kWarpPerRow>()) {
    const T* xr = x + r * d;
    float ss = 0;
    for (int64_t i = int64_t{lane} * kVec; i < d; i += int64_t{threads} * kVec) {
      const Pack<T, kVec> xs = load_pack<kVec>(xr, i);
#pragma unroll
      for (int k = 0; k < kVec; ++k) ss += to_f32(xs.v[k]) * to_f32(xs.v[k]);
    }
    const float inv = inverse_rms(row_sum<kWarpPerRow>(ss), d, eps);
    for (int64_t i = int64_t{lane} * kVec; i < d; i += int64_t{threads} * kVec) {
      const Pack<T, kVec> xs = load_pack<kVec>(xr, i), ws = load_pack<kVec>(w, i);
      Pack<T, kVec> ys;
#pragma unroll
      for (int k = 0; k < kVec; ++k) ys.v[k] = from_f32<T>(to_f32(xs.v[k]) * inv * to_f32(ws.v[k]));
      store_pack<kVec>(y + r * d, i, ys);
    }
  }
}

// dx = inv * dy * w - x * inv^3 / d * sum(dy * w * x), per row; keeps each
// row's inv_rms for the weight gradient.
template <bool kWarpPerRow, int kVec, typename T>
__global__ void __launch_bounds__(kRowThreads)
    rms_norm_backward_rows(const T* x, const T* w, const T* dy, T* dx, float* inv_rms, int64_t rows, int64_t d,
                           double eps) {
  const int lane = row_lane<kWarpPerRow>(), threads = row_threads<kWarpPerRow>();
  for (int64_t r = first_row<kWarpPerRow>(); r < rows; r += row_step<kWarpPerRow>()) {
    const T* xr = x + r * d;
    const T* gr = dy + r * d;
    float ss = 0, dot = 0;
    for (int64_t i = int64_t{lane} * kVec; i < d; i += int64_t{threads} * kVec) {
      const Pack<T, kVec> xs = load_pack<kVec>(xr, i), ws = load_pack<kVec>(w, i), gs = load_pack<kVec>(gr, i);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float xk = to_f32(xs.v[k]);
        ss += xk * xk;
        dot += to_f32(gs.v[k]) * to_f32(ws.v[k]) * xk;
      }
    }
    row_sum_pair<kWarpPerRow>(ss, dot);
    const float inv = inverse_rms(ss, d, eps);
    if (lane == 0) inv_rms[r] = inv;
    const float coef = dot * inv * inv * inv / static_cast<float>(d);
    for (int64_t i = int64_t{lane} * kVec; i < d; i += int64_t{threads} * kVec) {
      const Pack<T, kVec> xs = load_pack<kVec>(xr, i), ws = load_pack<kVec>(w, i), gs = load_pack<kVec>(gr, i);
      Pack<T, kVec> out;
#pragma unroll
      for (int k = 0; k < kVec; ++k)
        out.v[k] = from_f32<T>(inv * to_f32(gs.v[k]) * to_f32(ws.v[k]) - coef * to_f32(xs.v[k]));
      store_pack<kVec>(dx + r * d, i, out);
    }
  }
}

// Rows of up to kCachedElems * kMaxCachedThreads elements, 16-byte aligned,
// also run as one block per row whose threads keep the row in registers
// (kCachedElems elements each, in packs of kVec at (threadIdx.x + p *
// blockDim.x) * kVec), so that x and dy are read from memory once.
constexpr int kCachedElems = 16;
constexpr int kMaxCachedThreads = 512;

__device__ __forceinline__ int64_t cached_col(int p, int kVec) {
  return (static_cast<int64_t>(p) * blockDim.x + threadIdx.x) * kVec;
}

// rms_norm_rows with the row in registers; rows grid-strided.
template <int kVec, typename T>
__global__ void __launch_bounds__(kMaxCachedThreads)
    rms_norm_cached(const T* x, const T* w, T* y, int64_t rows, int64_t d, double eps) {
  constexpr int kPacks = kCachedElems / kVec;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    Pack<T, kVec> xs[kPacks];
    float ss = 0;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      if (cached_col(p, kVec) >= d) continue;
      xs[p] = load_pack<kVec>(x + r * d, cached_col(p, kVec));
#pragma unroll
      for (int k = 0; k < kVec; ++k) ss += to_f32(xs[p].v[k]) * to_f32(xs[p].v[k]);
    }
    const float inv = inverse_rms(block_sum(ss), d, eps);
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      if (cached_col(p, kVec) >= d) continue;
      const Pack<T, kVec> ws = load_pack<kVec>(w, cached_col(p, kVec));
      Pack<T, kVec> ys;
#pragma unroll
      for (int k = 0; k < kVec; ++k) ys.v[k] = from_f32<T>(to_f32(xs[p].v[k]) * inv * to_f32(ws.v[k]));
      store_pack<kVec>(y + r * d, cached_col(p, kVec), ys);
    }
  }
}

// rms_norm_backward_rows with the row in registers, fused with the weight
// gradient: block b runs rows [b * rows_per_block, (b + 1) * rows_per_block)
// and writes its sum over them of dy * x * inv_rms to dw_partial[b * d + c],
// for launch_column_sums to add up in order.
template <int kVec, typename T>
__global__ void __launch_bounds__(kMaxCachedThreads)
    rms_norm_backward_cached(const T* x, const T* w, const T* dy, T* dx, float* dw_partial, int64_t rows, int64_t d,
                             int64_t rows_per_block, double eps) {
  constexpr int kPacks = kCachedElems / kVec;
  float ws[kPacks][kVec], dw[kPacks][kVec];
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const bool in_row = cached_col(p, kVec) < d;
    Pack<T, kVec> pack;
    if (in_row) pack = load_pack<kVec>(w, cached_col(p, kVec));
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      ws[p][k] = in_row ? to_f32(pack.v[k]) : 0.0f;
      dw[p][k] = 0.0f;
    }
  }
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t end = begin + rows_per_block < rows ? begin + rows_per_block : rows;
  for (int64_t r = begin; r < end; ++r) {
    Pack<T, kVec> xs[kPacks], gs[kPacks];
    float ss = 0, dot = 0;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      if (cached_col(p, kVec) >= d) continue;
      xs[p] = load_pack<kVec>(x + r * d, cached_col(p, kVec));
      gs[p] = load_pack<kVec>(dy + r * d, cached_col(p, kVec));
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float xk = to_f32(xs[p].v[k]);
        ss += xk * xk;
        dot += to_f32(gs[p].v[k]) * ws[p][k] * xk;
      }
    }
    block_sum_pair(ss, dot);
    const float inv = inverse_rms(ss, d, eps);
    const float coef = dot * inv * inv * inv / static_cast<float>(d);
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      if (cached_col(p, kVec) >= d) continue;
      Pack<T, kVec> out;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float xk = to_f32(xs[p].v[k]), gk = to_f32(gs[p].v[k]);
        out.v[k] = from_f32<T>(inv * gk * ws[p][k] - coef * xk);
        dw[p][k] += gk * xk * inv;
      }
      store_pack<kVec>(dx + r * d, cached_col(p, kVec), out);
    }
  }
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    if (cached_col(p, kVec) >= d) continue;
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      dw_partial[static_cast<int64_t>(blockIdx.x) * d + cached_col(p, kVec) + k] = dw[p][k];
  }
}

// The weight gradient dw[c] = sum_r dy[r,c] * x[r,c] * inv_rms[r], without
// atomics: each block sums a tile of kDwCols columns over one chunk of rows
// into partial[chunk * d + c]; then each column's chunks are summed in order.
constexpr int kDwCols = 32, kDwRowLanes = 8;
constexpr int64_t kDwRowsPerChunk = 64;
constexpr int64_t kMaxDwChunks = 65535;  // gridDim.y

template <typename T>
__global__ void __launch_bounds__(kDwCols* kDwRowLanes)
    rms_norm_dw_partials(const T* x, const T* dy, const float* inv_rms, int64_t rows, int64_t d, int64_t rows_per_chunk,
                         float* partial) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kDwCols + threadIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  float acc = 0;
  if (col < d)
    for (int64_t r = begin + threadIdx.y; r < end; r += kDwRowLanes)
      acc += to_f32(dy[r * d + col]) * to_f32(x[r * d + col]) * inv_rms[r];
  __shared__ float lane_sums[kDwRowLanes][kDwCols];
  lane_sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || col >= d) return;
  float total = 0;
  for (int l = 0; l < kDwRowLanes; ++l) total += lane_sums[l][threadIdx.x];
  partial[static_cast<int64_t>(blockIdx.y) * d + col] = total;
}

// Column sums of a [chunks, d] matrix of partial sums, in a fixed order:
// out[s * d + c] = the sum over chunks [s * per_split, (s + 1) * per_split)
// of partial[chunk * d + c] (0 for none). A block per kDwCols columns and
// split (blockIdx.y); its kDwRowLanes lanes take every kDwRowLanes-th chunk,
// four loads at a time.
constexpr int64_t kChunksPerSplit = 256;

template <typename Out>
__global__ void __launch_bounds__(kDwCols* kDwRowLanes)
    sum_column_splits(const float* partial, int64_t chunks, int64_t d, int64_t per_split, Out* out) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kDwCols + threadIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * per_split;
  const int64_t end = begin + per_split < chunks ? begin + per_split : chunks;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (col < d) {
    int64_t k = begin + threadIdx.y;
    for (; k + 3 * kDwRowLanes < end; k += 4 * kDwRowLanes)
#pragma unroll
      for (int u = 0; u < 4; ++u) acc[u] += partial[(k + u * kDwRowLanes) * d + col];
    for (; k < end; k += kDwRowLanes) acc[0] += partial[k * d + col];
  }
  __shared__ float lane_sums[kDwRowLanes][kDwCols];
  lane_sums[threadIdx.y][threadIdx.x] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  __syncthreads();
  if (threadIdx.y != 0 || col >= d) return;
  float total = 0;
  for (int l = 0; l < kDwRowLanes; ++l) total += lane_sums[l][threadIdx.x];
  out[static_cast<int64_t>(blockIdx.y) * d + col] = from_f32<Out>(total);
}

// ---------------------------------------------------------------------------
// Host side of the row ops.

// Calls fn(warp_per_row, vec) with std::integral_constant values: a warp per
// row for short rows; 16-byte packs when every row of every pointer is
// 16-byte aligned (the pointers are and d is a multiple of the pack).
template <typename T, typename Fn>
void by_row_layout(int64_t d, bool pointers_aligned, Fn&& fn) {
  const bool packed = pointers_aligned && d % kPack16<T> == 0;
  auto with_pack = [&](auto warp_per_row) {
    if (packed)
      fn(warp_per_row, std::integral_constant<int, kPack16<T>>{});
    else
      fn(warp_per_row, std::integral_constant<int, 1>{});
  };
  if (d <= kMaxWarpRow)
    with_pack(std::true_type{});
  else
    with_pack(std::false_type{});
}

unsigned row_grid(int64_t rows, bool warp_per_row) {
  const int64_t per_block = warp_per_row ? kRowThreads / 32 : 1;
  const int64_t blocks = (rows + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxRowBlocks ? kMaxRowBlocks : blocks));
}

template <typename T>
void launch_softmax(const KernelArgs& a, const LaunchContext& ctx) {
  const auto [rows, d] = rows_of(*a.in[0]);
  if (rows == 0) return;
  const T* x = in_ptr<T>(a, 0);
  T* y = out_ptr<T>(a);
  by_row_layout<T>(d, aligned16(x) && aligned16(y), [&](auto warp_per_row, auto vec) {
    softmax_rows<decltype(warp_per_row)::value, decltype(vec)::value>
        <<<row_grid(rows, warp_per_row), kRowThreads, 0, stream_of(ctx)>>>(x, y, rows, d);
  });
  check_launch("softmax");
}

template <typename T>
void launch_softmax_backward(const KernelArgs& a, const LaunchContext& ctx) {
  const auto [rows, d] = rows_of(*a.in[0]);
  if (rows == 0) return;
  const T* y = in_ptr<T>(a, 0);
  const T* dy = in_ptr<T>(a, 1);
  T* dx = out_ptr<T>(a);
  by_row_layout<T>(d, aligned16(y) && aligned16(dy) && aligned16(dx), [&](auto warp_per_row, auto vec) {
    softmax_backward_rows<decltype(warp_per_row)::value, decltype(vec)::value>
        <<<row_grid(rows, warp_per_row), kRowThreads, 0, stream_of(ctx)>>>(y, dy, dx, rows, d);
  });
  check_launch("softmax_backward");
}

// Threads of a block that keeps a row of d elements in registers
// (rms_norm_cached, rms_norm_backward_cached), or 0 where the row cannot be
// cached: too long, or not in 16-byte aligned packs.
template <typename T>
int cached_row_threads(int64_t d, bool pointers_aligned) {
  if (!pointers_aligned || d % kPack16<T> != 0 || d > int64_t{kCachedElems} * kMaxCachedThreads) return 0;
  const int64_t threads = (d + kCachedElems - 1) / kCachedElems;
  return static_cast<int>((threads + 31) / 32 * 32);
}

template <typename T>
void launch_rms_norm(const KernelArgs& a, const LaunchContext& ctx) {
  const auto [rows, d] = rows_of(*a.in[0]);
  const double eps = a.attrs.get(attr::eps);
  if (rows == 0) return;
  const T* x = in_ptr<T>(a, 0);
  const T* w = in_ptr<T>(a, 1);
  T* y = out_ptr<T>(a);
  const bool aligned = aligned16(x) && aligned16(w) && aligned16(y);
  const int cached_threads = cached_row_threads<T>(d, aligned);
  if (sizeof(T) == 4 && d > kMaxWarpRow && cached_threads > 0) {  // bf16 measured faster streamed
    const auto blocks = static_cast<unsigned>(rows < kMaxRowBlocks ? rows : kMaxRowBlocks);
    rms_norm_cached<kPack16<T>><<<blocks, cached_threads, 0, stream_of(ctx)>>>(x, w, y, rows, d, eps);
  } else {
    by_row_layout<T>(d, aligned, [&](auto warp_per_row, auto vec) {
      rms_norm_rows<decltype(warp_per_row)::value, decltype(vec)::value>
          <<<row_grid(rows, warp_per_row), kRowThreads, 0, stream_of(ctx)>>>(x, w, y, rows, d, eps);
    });
  }
  check_launch("rms_norm");
}

// The rows and tensors of one rms_norm_backward.
template <typename T>
struct RmsNormBackward {
  const T *x, *w, *dy;
  T *dx, *dw;
  int64_t rows, d;
  double eps;
};

// Floats of scratch that launch_column_sums needs besides the partial sums.
int64_t column_sums_spare(int64_t chunks, int64_t d) {
  return chunks > kChunksPerSplit ? (chunks + kChunksPerSplit - 1) / kChunksPerSplit * d : 0;
}

// out[c] = the sum over chunks of partial[chunk * d + c], in a fixed order:
// directly for a few chunks, else first per split of kChunksPerSplit chunks
// into spare (column_sums_spare floats), then over the splits.
template <typename T>
void launch_column_sums(const float* partial, int64_t chunks, int64_t d, float* spare, T* out, cudaStream_t stream,
                        const char* op) {
  const auto column_tiles = static_cast<unsigned>((d + kDwCols - 1) / kDwCols);
  const dim3 block(kDwCols, kDwRowLanes);
  if (chunks > kChunksPerSplit) {
    const int64_t splits = (chunks + kChunksPerSplit - 1) / kChunksPerSplit;
    sum_column_splits<<<dim3(column_tiles, static_cast<unsigned>(splits)), block, 0, stream>>>(partial, chunks, d,
                                                                                               kChunksPerSplit, spare);
    check_launch(op);
    partial = spare;
    chunks = splits;
  }
  sum_column_splits<<<dim3(column_tiles, 1), block, 0, stream>>>(partial, chunks, d, chunks, out);
  check_launch(op);
}

// Blocks of rms_norm_backward_cached: enough for about 2^18 threads in all,
// each block running at least 16 rows (fewer partial sums to add up).
constexpr int64_t kCachedBackwardThreads = int64_t{1} << 18;
constexpr int64_t kMinRowsPerBlock = 16;

template <typename T>
void launch_rms_norm_backward_cached(const RmsNormBackward<T>& b, int threads, const LaunchContext& ctx) {
  const int64_t target_blocks = kCachedBackwardThreads / threads;
  int64_t rows_per_block = (b.rows + target_blocks - 1) / target_blocks;
  if (rows_per_block < kMinRowsPerBlock) rows_per_block = kMinRowsPerBlock;
  const int64_t blocks = (b.rows + rows_per_block - 1) / rows_per_block;
  const int64_t floats = blocks * b.d + column_sums_spare(blocks, b.d);
  float* partial = scratch_of<float>(ctx, static_cast<size_t>(floats), "rms_norm_backward");
  rms_norm_backward_cached<kPack16<T>><<<static_cast<unsigned>(blocks), threads, 0, stream_of(ctx)>>>(
      b.x, b.w, b.dy, b.dx, partial, b.rows, b.d, rows_per_block, b.eps);
  check_launch("rms_norm_backward");
  launch_column_sums(partial, blocks, b.d, partial + blocks * b.d, b.dw, stream_of(ctx), "rms_norm_backward");
}

// Chunks of rows for the weight gradient's partial sums: about
// kDwRowsPerChunk rows each, within the grid's and the scratch's limits.
int64_t dw_chunks(int64_t rows, int64_t d, size_t scratch_floats) {
  int64_t chunks = (rows + kDwRowsPerChunk - 1) / kDwRowsPerChunk;
  if (chunks > kMaxDwChunks) chunks = kMaxDwChunks;
  // Room for rows inverse rms values, chunks * d partial sums and at most
  // (chunks / kChunksPerSplit + 1) * d more for launch_column_sums.
  const int64_t room = (static_cast<int64_t>(scratch_floats) - rows) / d - 1;
  if (chunks > room * kChunksPerSplit / (kChunksPerSplit + 1)) chunks = room * kChunksPerSplit / (kChunksPerSplit + 1);
  return chunks < 1 ? 1 : chunks;
}

// Any row length and alignment: dx and each row's inv_rms, then the weight
// gradient's partial sums over chunks of rows (reading x and dy again), then
// their sums. With no rows, dw = 0.
template <typename T>
void launch_rms_norm_backward_streamed(const RmsNormBackward<T>& b, bool aligned, const LaunchContext& ctx) {
  const cudaStream_t stream = stream_of(ctx);
  int64_t chunks = 0;
  const float* partial = nullptr;
  float* spare = nullptr;
  if (b.rows > 0) {
    chunks = dw_chunks(b.rows, b.d, ctx.scratch_bytes / sizeof(float));
    const int64_t rows_per_chunk = (b.rows + chunks - 1) / chunks;
    chunks = (b.rows + rows_per_chunk - 1) / rows_per_chunk;
    const int64_t floats = b.rows + chunks * b.d + column_sums_spare(chunks, b.d);
    float* inv_rms = scratch_of<float>(ctx, static_cast<size_t>(floats), "rms_norm_backward");
    float* partial_sums = inv_rms + b.rows;
    spare = partial_sums + chunks * b.d;
    by_row_layout<T>(b.d, aligned, [&](auto warp_per_row, auto vec) {
      rms_norm_backward_rows<decltype(warp_per_row)::value, decltype(vec)::value>
          <<<row_grid(b.rows, warp_per_row), kRowThreads, 0, stream>>>(b.x, b.w, b.dy, b.dx, inv_rms, b.rows, b.d,
                                                                       b.eps);
    });
    check_launch("rms_norm_backward");
    const dim3 grid(static_cast<unsigned>((b.d + kDwCols - 1) / kDwCols), static_cast<unsigned>(chunks));
    rms_norm_dw_partials<<<grid, dim3(kDwCols, kDwRowLanes), 0, stream>>>(b.x, b.dy, inv_rms, b.rows, b.d,
                                                                          rows_per_chunk, partial_sums);
    check_launch("rms_norm_backward");
    partial = partial_sums;
  }
  launch_column_sums(partial, chunks, b.d, spare, b.dw, stream, "rms_norm_backward");
}

template <typename T>
void launch_rms_norm_backward(const KernelArgs& a, const LaunchContext& ctx) {
  const auto [rows, d] = rows_of(*a.in[0]);
  const RmsNormBackward<T> b{
      in_ptr<T>(a, 0),       in_ptr<T>(a, 1), in_ptr<T>(a, 2), out_ptr<T>(a, 0), out_ptr<T>(a, 1), rows, d,
      a.attrs.get(attr::eps)};
  if (d == 0) return;
  const bool aligned = aligned16(b.x) && aligned16(b.w) && aligned16(b.dy) && aligned16(b.dx);
  const int cached_threads = cached_row_threads<T>(d, aligned);
  if (rows > 0 && cached_threads > 0)
    launch_rms_norm_backward_cached(b, cached_threads, ctx);
  else
    launch_rms_norm_backward_streamed(b, aligned, ctx);
}

}  // namespace

void add_reduction_kernels(const AddKernel& add) {
  add("sum", [](const KernelArgs& a, const LaunchContext& ctx) {
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      launch_sum<false>(in_ptr<T>(a, 0), a.in[0]->numel(), out_ptr<T>(a), 1.0, ctx, "sum");
    });
  });
  add("sum_squares", [](const KernelArgs& a, const LaunchContext& ctx) {
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      launch_sum<true>(in_ptr<T>(a, 0), a.in[0]->numel(), out_ptr<double>(a), 1.0, ctx, "sum_squares");
    });
  });
  add("mean", [](const KernelArgs& a, const LaunchContext& ctx) {
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      const int64_t n = a.in[0]->numel();
      launch_sum<false>(in_ptr<T>(a, 0), n, out_ptr<T>(a), static_cast<double>(n), ctx, "mean");
    });
  });
  add("softmax", [](const KernelArgs& a, const LaunchContext& ctx) {
    by_float_type(a.in[0]->dtype(), [&](auto z) { launch_softmax<decltype(z)>(a, ctx); });
  });
  add("softmax_backward", [](const KernelArgs& a, const LaunchContext& ctx) {
    by_float_type(a.in[0]->dtype(), [&](auto z) { launch_softmax_backward<decltype(z)>(a, ctx); });
  });
  add("rms_norm", [](const KernelArgs& a, const LaunchContext& ctx) {
    by_float_type(a.in[0]->dtype(), [&](auto z) { launch_rms_norm<decltype(z)>(a, ctx); });
  });
  add("rms_norm_backward", [](const KernelArgs& a, const LaunchContext& ctx) {
    by_float_type(a.in[0]->dtype(), [&](auto z) { launch_rms_norm_backward<decltype(z)>(a, ctx); });
  });
}

}  // namespace meshtrain::kernels::cuda::ops
