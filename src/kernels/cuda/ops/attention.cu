// CUDA kernels of the attention ops (graph/ops/attention.cpp): rope and flash-style causal GQA, forward and backward
// (f32 here; bf16 on tensor cores in attention_tensor_cores.cu where the head size allows).
#include <climits>
#include <type_traits>

#include "kernels/cuda/ops/attention_tensor_cores.h"
#include "kernels/cuda/ops/families.h"

namespace meshtrain::kernels::cuda::ops {

namespace {

// ---- rope ----------------------------------------------------------------------------------------------------------

// cos and sin of angle pos * theta^(-2i/D) for pos < t, i < half, computed in double and kept in f32, as the CPU's
// table: table[pos * half + i] = cos, table[t * half + pos * half + i] = sin.
__global__ void rope_table_kernel(float* table, int64_t t, int64_t half, int64_t d, double theta) {
  const int64_t n = t * half;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t pos = idx / half, i = idx % half;
    const double angle = static_cast<double>(pos) * pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
    table[idx] = static_cast<float>(cos(angle));
    table[n + idx] = static_cast<float>(sin(angle));
  }
}

// Hugging Face rotate-half: element i pairs with i + D/2 in each row of x [B, T, H, D].
template <typename T>
__global__ void rope_kernel(const T* x, T* out, const float* table, int64_t pairs, int64_t t, int64_t h, int64_t half,
                            float sin_sign) {
  const float* sin_table = table + t * half;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < pairs;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = idx / half, i = idx % half;
    const int64_t pos = (row / h) % t;
    const int64_t base = row * 2 * half;
    const float c = table[pos * half + i], sn = sin_sign * sin_table[pos * half + i];
    const float x1 = to_f32(x[base + i]), x2 = to_f32(x[base + i + half]);
    out[base + i] = from_f32<T>(x1 * c - x2 * sn);
    out[base + i + half] = from_f32<T>(x2 * c + x1 * sn);
  }
}

template <typename T>
void launch_rope(const T* x, T* out, int64_t b, int64_t t, int64_t h, int64_t d, double theta, bool inverse,
                 const LaunchContext& ctx) {
  const int64_t half = d / 2, pairs = b * t * h * half;
  if (pairs == 0) return;
  float* table = scratch_of<float>(ctx, static_cast<size_t>(2 * t * half), "rope");
  rope_table_kernel<<<blocks_for(t * half), 256, 0, stream_of(ctx)>>>(table, t, half, d, theta);
  check_launch("rope");
  rope_kernel<T>
      <<<blocks_for(pairs), 256, 0, stream_of(ctx)>>>(x, out, table, pairs, t, h, half, inverse ? -1.0f : 1.0f);
  check_launch("rope");
}

// ---- attention: shared pieces ------------------------------------------------------------------------------------
//
// A block of 256 threads as a 16 x 16 grid (ty = threadIdx.x / 16, tx = threadIdx.x % 16; the 16 threads of one ty
// are one half of a warp). Tiles of kTile queries or keys sit in shared memory in f32, rows padded to kMaxD + 1
// floats (no bank conflicts when 16 threads read 16 rows at one column), zero beyond T and beyond D, so dot
// products run over kMaxD columns unmasked. A score tile (kTile x kTile) is held by the grid as kPer x kPer values
// per thread: rows ty + 16a, columns tx + 16b. A row tile of accumulators (kTile x kMaxD) as kPer x kCols values:
// rows ty + 16a, columns tx + 16c.

constexpr int kThreads = 256;
constexpr int kSide = 16;

template <int kMaxD>
struct Tiling {
  static constexpr int kTile = kMaxD <= 128 ? 64 : 32;  // queries or keys per tile (shared memory bounds it)
  static constexpr int kStride = kMaxD + 1;             // floats per row of a Q, K, V or dO tile
  static constexpr int kScoreStride = kTile + 1;        // floats per row of a P or dS tile
  static constexpr int kPer = kTile / kSide;            // rows (and score columns) per thread
  static constexpr int kCols = kMaxD / kSide;           // accumulator columns per thread
  static constexpr int kRowTile = kTile * kStride;      // floats of a Q, K, V or dO tile
  static constexpr int kScoreTile = kTile * kScoreStride;
};

// One head's rows of a [B, T, H, D] tensor: element (row, c) at data[row * stride + c].
template <typename T>
struct HeadRows {
  T* data;
  int64_t stride;
};

template <typename T>
__device__ HeadRows<T> head_rows(T* x, int64_t bi, int64_t t, int64_t heads, int64_t head, int64_t d) {
  return {x + (bi * t * heads + head) * d, heads * d};
}

// Rows [row0, row0 + kTile) of a head into a shared tile, widened to f32, zero at rows >= t and columns >= d.
template <typename T, int kMaxD>
__device__ void load_tile(HeadRows<const T> src, int row0, int t, int d, float* tile) {
  using Tl = Tiling<kMaxD>;
  for (int idx = threadIdx.x; idx < Tl::kTile * kMaxD; idx += kThreads) {
    const int r = idx / kMaxD, c = idx % kMaxD;
    const int row = row0 + r;
    tile[r * Tl::kStride + c] = row < t && c < d ? to_f32(src.data[row * src.stride + c]) : 0.0f;
  }
}

// Per-row values (lse or delta, [B, H, T] rows of one head) for rows [row0, row0 + kTile); zero at rows >= t.
template <int kTile>
__device__ void load_row_values(const float* src, int row0, int t, float* dst) {
  for (int r = threadIdx.x; r < kTile; r += kThreads) dst[r] = row0 + r < t ? src[row0 + r] : 0.0f;
}

// s[a][b] = dot(rows[ty + 16a], cols[tx + 16b]) over kMaxD columns of two shared tiles.
template <int kMaxD>
__device__ void tile_dots(const float* rows, const float* cols, float (&s)[Tiling<kMaxD>::kPer][Tiling<kMaxD>::kPer]) {
  using Tl = Tiling<kMaxD>;
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
#pragma unroll
  for (int a = 0; a < Tl::kPer; ++a)
#pragma unroll
    for (int b = 0; b < Tl::kPer; ++b) s[a][b] = 0.0f;
#pragma unroll 4
  for (int c = 0; c < kMaxD; ++c) {
    float row_values[Tl::kPer], col_values[Tl::kPer];
#pragma unroll
    for (int a = 0; a < Tl::kPer; ++a) row_values[a] = rows[(ty + kSide * a) * Tl::kStride + c];
#pragma unroll
    for (int b = 0; b < Tl::kPer; ++b) col_values[b] = cols[(tx + kSide * b) * Tl::kStride + c];
#pragma unroll
    for (int a = 0; a < Tl::kPer; ++a)
#pragma unroll
      for (int b = 0; b < Tl::kPer; ++b) s[a][b] = fmaf(row_values[a], col_values[b], s[a][b]);
  }
}

// acc[a][c] += sum over r < kTile of weights(r, ty + 16a) * tile[r][tx + 16c], where weights(r, x) is
// w[x * kScoreStride + r] (kTransposed false: w holds [acc row][r]) or w[r * kScoreStride + x] (true).
template <int kMaxD, bool kTransposed>
__device__ void accumulate_product(const float* w, const float* tile,
                                   float (&acc)[Tiling<kMaxD>::kPer][Tiling<kMaxD>::kCols]) {
  using Tl = Tiling<kMaxD>;
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
#pragma unroll 2
  for (int r = 0; r < Tl::kTile; ++r) {
    float weight[Tl::kPer];
#pragma unroll
    for (int a = 0; a < Tl::kPer; ++a) {
      const int x = ty + kSide * a;
      weight[a] = kTransposed ? w[r * Tl::kScoreStride + x] : w[x * Tl::kScoreStride + r];
    }
#pragma unroll
    for (int c = 0; c < Tl::kCols; ++c) {
      const float value = tile[r * Tl::kStride + tx + kSide * c];
#pragma unroll
      for (int a = 0; a < Tl::kPer; ++a) acc[a][c] = fmaf(weight[a], value, acc[a][c]);
    }
  }
}

// Store accumulator rows [row0 + ty + 16a] (those < t), columns < d, times `scales[a]`, into a head's rows.
template <typename T, int kMaxD>
__device__ void store_rows(const float (&acc)[Tiling<kMaxD>::kPer][Tiling<kMaxD>::kCols],
                           const float (&scales)[Tiling<kMaxD>::kPer], HeadRows<T> dst, int row0, int t, int d) {
  using Tl = Tiling<kMaxD>;
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
#pragma unroll
  for (int a = 0; a < Tl::kPer; ++a) {
    const int row = row0 + ty + kSide * a;
    if (row >= t) continue;
#pragma unroll
    for (int c = 0; c < Tl::kCols; ++c) {
      const int col = tx + kSide * c;
      if (col < d) dst.data[row * dst.stride + col] = from_f32<T>(acc[a][c] * scales[a]);
    }
  }
}

// Reductions over the 16 threads of a half warp (one tile row); every lane of the warp takes part.
__device__ float half_warp_max(float x) {
  for (int offset = kSide / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
__device__ float half_warp_sum(float x) {
  for (int offset = kSide / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Key j is visible to query i when j <= i (causal) and both are rows of the sequence.
__device__ bool visible(int i, int j, int t) { return j <= i && i < t; }

// ---- attention forward ---------------------------------------------------------------------------------------------

// One block per (query tile, query head, batch): the tile's queries against the key tiles up to the causal
// diagonal, softmax online (running max and total per row, kept by each of the row's 16 threads).
template <typename T, int kMaxD>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(const T* q, const T* k, const T* v, T* out, float* lse, AttentionShape s) {
  using Tl = Tiling<kMaxD>;
  extern __shared__ float smem[];
  float* q_tile = smem;
  float* k_tile = q_tile + Tl::kRowTile;
  float* v_tile = k_tile + Tl::kRowTile;
  float* p_tile = v_tile + Tl::kRowTile;
  const int i0 = (gridDim.x - 1 - blockIdx.x) * Tl::kTile;  // the longest (latest) query tiles first
  const int h = blockIdx.y, bi = blockIdx.z;
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
  const HeadRows<const T> q_rows = head_rows(q, bi, s.t, s.hq, h, s.d);
  const HeadRows<const T> k_rows = head_rows(k, bi, s.t, s.hkv, h / (s.hq / s.hkv), s.d);
  const HeadRows<const T> v_rows = head_rows(v, bi, s.t, s.hkv, h / (s.hq / s.hkv), s.d);
  load_tile<T, kMaxD>(q_rows, i0, s.t, s.d, q_tile);

  float o[Tl::kPer][Tl::kCols] = {};
  float row_max[Tl::kPer], row_total[Tl::kPer];
#pragma unroll
  for (int a = 0; a < Tl::kPer; ++a) row_max[a] = -INFINITY, row_total[a] = 0.0f;

  const int key_end = min(i0 + Tl::kTile, s.t);
  for (int j0 = 0; j0 < key_end; j0 += Tl::kTile) {
    __syncthreads();  // the last tile's K, V and P are read
    load_tile<T, kMaxD>(k_rows, j0, s.t, s.d, k_tile);
    load_tile<T, kMaxD>(v_rows, j0, s.t, s.d, v_tile);
    __syncthreads();
    float p[Tl::kPer][Tl::kPer];
    tile_dots<kMaxD>(q_tile, k_tile, p);
#pragma unroll
    for (int a = 0; a < Tl::kPer; ++a) {
      const int i = i0 + ty + kSide * a;
      float tile_max = -INFINITY;
#pragma unroll
      for (int b = 0; b < Tl::kPer; ++b) {
        p[a][b] = visible(i, j0 + tx + kSide * b, s.t) ? p[a][b] * s.scale : -INFINITY;
        tile_max = fmaxf(tile_max, p[a][b]);
      }
      const float new_max = fmaxf(row_max[a], half_warp_max(tile_max));
      const float base = new_max == -INFINITY ? 0.0f : new_max;  // no visible key yet: weights stay 0
      const float correction = expf(row_max[a] - base);
      float tile_total = 0.0f;
#pragma unroll
      for (int b = 0; b < Tl::kPer; ++b) {
        p[a][b] = expf(p[a][b] - base);
        tile_total += p[a][b];
        p_tile[(ty + kSide * a) * Tl::kScoreStride + tx + kSide * b] = p[a][b];
      }
      row_total[a] = row_total[a] * correction + half_warp_sum(tile_total);
      row_max[a] = new_max;
#pragma unroll
      for (int c = 0; c < Tl::kCols; ++c) o[a][c] *= correction;
    }
    __syncthreads();
    accumulate_product<kMaxD, false>(p_tile, v_tile, o);  // O += P V
  }

  float inverse_total[Tl::kPer];
#pragma unroll
  for (int a = 0; a < Tl::kPer; ++a) inverse_total[a] = 1.0f / row_total[a];
  store_rows<T, kMaxD>(o, inverse_total, head_rows(out, bi, s.t, s.hq, h, s.d), i0, s.t, s.d);
  float* lse_row = lse + (int64_t{bi} * s.hq + h) * s.t;
#pragma unroll
  for (int a = 0; a < Tl::kPer; ++a) {
    const int i = i0 + ty + kSide * a;
    if (tx == 0 && i < s.t) lse_row[i] = row_max[a] + logf(row_total[a]);
  }
}

// ---- attention backward --------------------------------------------------------------------------------------------

// delta[b, h, i] = rowsum(dO * O) over D, one warp per row (rows in [B, T, H] order, coalesced).
template <typename T>
__global__ void attention_delta_kernel(const T* out, const T* dout, float* delta, int64_t rows, int64_t t, int64_t hq,
                                       int64_t d) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32; row < rows; row += warps) {
    float sum = 0.0f;
    for (int64_t c = lane; c < d; c += 32) sum += to_f32(dout[row * d + c]) * to_f32(out[row * d + c]);
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    const int64_t h = row % hq, bt = row / hq;  // bt = bi * t + i
    if (lane == 0) delta[((bt / t) * hq + h) * t + bt % t] = sum;
  }
}

// Inputs of the backward kernels.
template <typename T>
struct BackwardInputs {
  const T *q, *k, *v, *dout;
  const float *lse, *delta;
};

// For the query tile in q_tile / do_tile (rows from i0, with their lse and delta) against the key tile in
// k_tile / v_tile (keys from j0): P = exp(S scale - lse) and dS = scale P (dP - delta), 0 where masked, as
// p[a][b] and ds[a][b] (query ty + 16a, key tx + 16b).
template <int kMaxD>
__device__ void probabilities_and_grads(const float* q_tile, const float* do_tile, const float* k_tile,
                                        const float* v_tile, const float* lse_tile, const float* delta_tile, int i0,
                                        int j0, const AttentionShape& s,
                                        float (&p)[Tiling<kMaxD>::kPer][Tiling<kMaxD>::kPer],
                                        float (&ds)[Tiling<kMaxD>::kPer][Tiling<kMaxD>::kPer]) {
  using Tl = Tiling<kMaxD>;
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
  tile_dots<kMaxD>(q_tile, k_tile, p);    // S = Q K^T
  tile_dots<kMaxD>(do_tile, v_tile, ds);  // dP = dO V^T
#pragma unroll
  for (int a = 0; a < Tl::kPer; ++a) {
    const int r = ty + kSide * a;
#pragma unroll
    for (int b = 0; b < Tl::kPer; ++b) {
      const bool seen = visible(i0 + r, j0 + tx + kSide * b, s.t);
      const float prob = seen ? expf(p[a][b] * s.scale - lse_tile[r]) : 0.0f;
      ds[a][b] = seen ? s.scale * prob * (ds[a][b] - delta_tile[r]) : 0.0f;
      p[a][b] = prob;
    }
  }
}

// dK and dV: one block per (key tile, key/value head, batch), looping over the query heads that share the key/value
// head and over the query tiles at or after the key tile, dK and dV accumulated in registers (deterministic).
template <typename T, int kMaxD>
__global__ void __launch_bounds__(kThreads)
    attention_dkdv_kernel(BackwardInputs<T> in, T* dk, T* dv, AttentionShape s) {
  using Tl = Tiling<kMaxD>;
  extern __shared__ float smem[];
  float* k_tile = smem;
  float* v_tile = k_tile + Tl::kRowTile;
  float* q_tile = v_tile + Tl::kRowTile;
  float* do_tile = q_tile + Tl::kRowTile;
  float* p_tile = do_tile + Tl::kRowTile;
  float* ds_tile = p_tile + Tl::kScoreTile;
  float* lse_tile = ds_tile + Tl::kScoreTile;
  float* delta_tile = lse_tile + Tl::kTile;
  const int j0 = blockIdx.x * Tl::kTile;
  const int hk = blockIdx.y, bi = blockIdx.z;
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
  const int group = s.hq / s.hkv;
  const HeadRows<const T> k_rows = head_rows(in.k, bi, s.t, s.hkv, hk, s.d);
  const HeadRows<const T> v_rows = head_rows(in.v, bi, s.t, s.hkv, hk, s.d);
  load_tile<T, kMaxD>(k_rows, j0, s.t, s.d, k_tile);
  load_tile<T, kMaxD>(v_rows, j0, s.t, s.d, v_tile);

  float dk_acc[Tl::kPer][Tl::kCols] = {}, dv_acc[Tl::kPer][Tl::kCols] = {};
  for (int h = hk * group; h < (hk + 1) * group; ++h) {
    const HeadRows<const T> q_rows = head_rows(in.q, bi, s.t, s.hq, h, s.d);
    const HeadRows<const T> do_rows = head_rows(in.dout, bi, s.t, s.hq, h, s.d);
    const int64_t row_values = (int64_t{bi} * s.hq + h) * s.t;
    for (int i0 = j0; i0 < s.t; i0 += Tl::kTile) {  // earlier query tiles see none of these keys
      __syncthreads();                              // the last tile's Q, dO, P, dS are read
      load_tile<T, kMaxD>(q_rows, i0, s.t, s.d, q_tile);
      load_tile<T, kMaxD>(do_rows, i0, s.t, s.d, do_tile);
      load_row_values<Tl::kTile>(in.lse + row_values, i0, s.t, lse_tile);
      load_row_values<Tl::kTile>(in.delta + row_values, i0, s.t, delta_tile);
      __syncthreads();
      float p[Tl::kPer][Tl::kPer], ds[Tl::kPer][Tl::kPer];
      probabilities_and_grads<kMaxD>(q_tile, do_tile, k_tile, v_tile, lse_tile, delta_tile, i0, j0, s, p, ds);
#pragma unroll
      for (int a = 0; a < Tl::kPer; ++a)
#pragma unroll
        for (int b = 0; b < Tl::kPer; ++b) {
          const int at = (ty + kSide * a) * Tl::kScoreStride + tx + kSide * b;
          p_tile[at] = p[a][b];
          ds_tile[at] = ds[a][b];
        }
      __syncthreads();
      accumulate_product<kMaxD, true>(p_tile, do_tile, dv_acc);  // dV += P^T dO
      accumulate_product<kMaxD, true>(ds_tile, q_tile, dk_acc);  // dK += dS^T Q
    }
  }
  float unit[Tl::kPer];
#pragma unroll
  for (int a = 0; a < Tl::kPer; ++a) unit[a] = 1.0f;
  store_rows<T, kMaxD>(dk_acc, unit, head_rows(dk, bi, s.t, s.hkv, hk, s.d), j0, s.t, s.d);
  store_rows<T, kMaxD>(dv_acc, unit, head_rows(dv, bi, s.t, s.hkv, hk, s.d), j0, s.t, s.d);
}

// dQ: one block per (query tile, query head, batch), looping over the key tiles up to the causal diagonal,
// dQ accumulated in registers (deterministic; S and dP are computed again, as in the dK/dV kernel).
template <typename T, int kMaxD>
__global__ void __launch_bounds__(kThreads) attention_dq_kernel(BackwardInputs<T> in, T* dq, AttentionShape s) {
  using Tl = Tiling<kMaxD>;
  extern __shared__ float smem[];
  float* q_tile = smem;
  float* do_tile = q_tile + Tl::kRowTile;
  float* k_tile = do_tile + Tl::kRowTile;
  float* v_tile = k_tile + Tl::kRowTile;
  float* ds_tile = v_tile + Tl::kRowTile;
  float* lse_tile = ds_tile + Tl::kScoreTile;
  float* delta_tile = lse_tile + Tl::kTile;
  const int i0 = (gridDim.x - 1 - blockIdx.x) * Tl::kTile;  // the longest (latest) query tiles first
  const int h = blockIdx.y, bi = blockIdx.z;
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
  const int hk = h / (s.hq / s.hkv);
  const HeadRows<const T> q_rows = head_rows(in.q, bi, s.t, s.hq, h, s.d);
  const HeadRows<const T> do_rows = head_rows(in.dout, bi, s.t, s.hq, h, s.d);
  const HeadRows<const T> k_rows = head_rows(in.k, bi, s.t, s.hkv, hk, s.d);
  const HeadRows<const T> v_rows = head_rows(in.v, bi, s.t, s.hkv, hk, s.d);
  const int64_t row_values = (int64_t{bi} * s.hq + h) * s.t;
  load_tile<T, kMaxD>(q_rows, i0, s.t, s.d, q_tile);
  load_tile<T, kMaxD>(do_rows, i0, s.t, s.d, do_tile);
  load_row_values<Tl::kTile>(in.lse + row_values, i0, s.t, lse_tile);
  load_row_values<Tl::kTile>(in.delta + row_values, i0, s.t, delta_tile);

  float dq_acc[Tl::kPer][Tl::kCols] = {};
  const int key_end = min(i0 + Tl::kTile, s.t);
  for (int j0 = 0; j0 < key_end; j0 += Tl::kTile) {
    __syncthreads();  // the last tile's K and dS are read
    load_tile<T, kMaxD>(k_rows, j0, s.t, s.d, k_tile);
    load_tile<T, kMaxD>(v_rows, j0, s.t, s.d, v_tile);
    __syncthreads();
    float p[Tl::kPer][Tl::kPer], ds[Tl::kPer][Tl::kPer];
    probabilities_and_grads<kMaxD>(q_tile, do_tile, k_tile, v_tile, lse_tile, delta_tile, i0, j0, s, p, ds);
#pragma unroll
    for (int a = 0; a < Tl::kPer; ++a)
#pragma unroll
      for (int b = 0; b < Tl::kPer; ++b) ds_tile[(ty + kSide * a) * Tl::kScoreStride + tx + kSide * b] = ds[a][b];
    __syncthreads();
    accumulate_product<kMaxD, false>(ds_tile, k_tile, dq_acc);  // dQ += dS K
  }
  float unit[Tl::kPer];
#pragma unroll
  for (int a = 0; a < Tl::kPer; ++a) unit[a] = 1.0f;
  store_rows<T, kMaxD>(dq_acc, unit, head_rows(dq, bi, s.t, s.hq, h, s.d), i0, s.t, s.d);
}

// ---- launches ------------------------------------------------------------------------------------------------------

template <int kMaxD>
constexpr size_t forward_smem() {
  using Tl = Tiling<kMaxD>;
  return sizeof(float) * (3 * Tl::kRowTile + Tl::kScoreTile);
}
template <int kMaxD>
constexpr size_t dkdv_smem() {
  using Tl = Tiling<kMaxD>;
  return sizeof(float) * (4 * Tl::kRowTile + 2 * Tl::kScoreTile + 2 * Tl::kTile);
}
template <int kMaxD>
constexpr size_t dq_smem() {
  using Tl = Tiling<kMaxD>;
  return sizeof(float) * (4 * Tl::kRowTile + Tl::kScoreTile + 2 * Tl::kTile);
}

// Lets `kernel` take `bytes` of dynamic shared memory (over the default 48 KiB).
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes, const char* op) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)), op);
}

// Run fn with the head-size bucket (a compile-time kMaxD: 64, 128 or 256) that holds d.
template <typename Fn>
void by_head_size(int64_t d, const char* op, Fn&& fn) {
  MT_CHECK(d <= 256, "{}: the CUDA kernel takes head sizes up to 256, got {}", op, d);
  if (d <= 64) return fn(std::integral_constant<int, 64>{});
  if (d <= 128) return fn(std::integral_constant<int, 128>{});
  return fn(std::integral_constant<int, 256>{});
}

AttentionShape attention_shape(int64_t b, int64_t t, int64_t hq, int64_t hkv, int64_t d, double scale, const char* op) {
  MT_CHECK(t <= INT_MAX / 2, "{}: sequence length {} is too long for the CUDA kernel", op, t);
  MT_CHECK(b <= 65535 && hq <= 65535, "{}: batch {} and heads {} must be at most 65535 for the CUDA kernel", op, b, hq);
  MT_CHECK(hkv > 0 && hq % hkv == 0, "{}: query heads {} must be a multiple of key/value heads {}", op, hq, hkv);
  return {static_cast<int>(t), static_cast<int>(hq), static_cast<int>(hkv), static_cast<int>(d),
          static_cast<float>(scale)};
}

template <typename T>
void launch_attention(const T* q, const T* k, const T* v, T* out, float* lse, int64_t b, int64_t t, int64_t hq,
                      int64_t hkv, int64_t d, double scale, const LaunchContext& ctx) {
  if (b * t * hq == 0) return;
  const AttentionShape s = attention_shape(b, t, hq, hkv, d, scale, "attention");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (tensor_cores_take(d, {q, k, v, out}))
      return launch_attention_tensor_cores(q, k, v, out, lse, b, s, stream_of(ctx));
  }
  by_head_size(d, "attention", [&](auto max_d) {
    constexpr int kMaxD = decltype(max_d)::value;
    using Tl = Tiling<kMaxD>;
    const dim3 grid(static_cast<unsigned>((t + Tl::kTile - 1) / Tl::kTile), static_cast<unsigned>(hq),
                    static_cast<unsigned>(b));
    constexpr size_t smem = forward_smem<kMaxD>();
    allow_smem(attention_forward_kernel<T, kMaxD>, smem, "attention");
    attention_forward_kernel<T, kMaxD><<<grid, kThreads, smem, stream_of(ctx)>>>(q, k, v, out, lse, s);
    check_launch("attention");
  });
}

template <typename T>
void launch_attention_backward(const T* q, const T* k, const T* v, const T* out, const float* lse, const T* dout, T* dq,
                               T* dk, T* dv, int64_t b, int64_t t, int64_t hq, int64_t hkv, int64_t d, double scale,
                               const LaunchContext& ctx) {
  if (b * t * hq * d == 0) return;
  const AttentionShape s = attention_shape(b, t, hq, hkv, d, scale, "attention_backward");
  const int64_t rows = b * t * hq;
  float* delta = scratch_of<float>(ctx, static_cast<size_t>(rows), "attention_backward");
  attention_delta_kernel<T><<<blocks_for(rows * 32), 256, 0, stream_of(ctx)>>>(out, dout, delta, rows, t, hq, d);
  check_launch("attention_backward");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (tensor_cores_take(d, {q, k, v, dout, dq, dk, dv}))
      return launch_attention_backward_tensor_cores(q, k, v, dout, lse, delta, dq, dk, dv, b, s, stream_of(ctx));
  }
  const BackwardInputs<T> in{q, k, v, dout, lse, delta};
  by_head_size(d, "attention_backward", [&](auto max_d) {
    constexpr int kMaxD = decltype(max_d)::value;
    using Tl = Tiling<kMaxD>;
    const unsigned tiles = static_cast<unsigned>((t + Tl::kTile - 1) / Tl::kTile);
    constexpr size_t dkdv_bytes = dkdv_smem<kMaxD>(), dq_bytes = dq_smem<kMaxD>();
    allow_smem(attention_dkdv_kernel<T, kMaxD>, dkdv_bytes, "attention_backward");
    attention_dkdv_kernel<T, kMaxD>
        <<<dim3(tiles, static_cast<unsigned>(hkv), static_cast<unsigned>(b)), kThreads, dkdv_bytes, stream_of(ctx)>>>(
            in, dk, dv, s);
    check_launch("attention_backward");
    allow_smem(attention_dq_kernel<T, kMaxD>, dq_bytes, "attention_backward");
    attention_dq_kernel<T, kMaxD>
        <<<dim3(tiles, static_cast<unsigned>(hq), static_cast<unsigned>(b)), kThreads, dq_bytes, stream_of(ctx)>>>(
            in, dq, s);
    check_launch("attention_backward");
  });
}

// Context parallelism's sequence order (graph/sequence_order.h) is CPU-only so far.
void require_position_order(const KernelArgs& a, const char* op) {
  MT_CHECK(!a.attrs.has(attr::seq_chunks.name) && !a.attrs.has(attr::key_first.name) &&
               a.attrs.get_or(attr::seq_first, int64_t{0}) == 0 &&
               a.in[0]->shape()[1] == a.in[a.in.size() > 1 ? 1 : 0]->shape()[1],
           "{} on the GPU takes the whole sequence in position order: context parallelism runs on CPUs only", op);
}

}  // namespace

void add_attention_kernels(const AddKernel& add) {
  add("rope", [](const KernelArgs& a, const LaunchContext& ctx) {
    require_position_order(a, "rope");
    const auto& s = a.in[0]->shape();
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      launch_rope(in_ptr<T>(a, 0), out_ptr<T>(a), s[0], s[1], s[2], s[3], a.attrs.get(attr::theta),
                  a.attrs.get(attr::inverse), ctx);
    });
  });
  add("attention", [](const KernelArgs& a, const LaunchContext& ctx) {
    require_position_order(a, "attention");
    const auto& q = a.in[0]->shape();
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      launch_attention(in_ptr<T>(a, 0), in_ptr<T>(a, 1), in_ptr<T>(a, 2), out_ptr<T>(a, 0), out_ptr<float>(a, 1), q[0],
                       q[1], q[2], a.in[1]->shape()[2], q[3], a.attrs.get(attr::scale), ctx);
    });
  });
  add("attention_backward", [](const KernelArgs& a, const LaunchContext& ctx) {
    require_position_order(a, "attention_backward");
    const auto& q = a.in[0]->shape();
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      launch_attention_backward(in_ptr<T>(a, 0), in_ptr<T>(a, 1), in_ptr<T>(a, 2), in_ptr<T>(a, 3), in_ptr<float>(a, 4),
                                in_ptr<T>(a, 5), out_ptr<T>(a, 0), out_ptr<T>(a, 1), out_ptr<T>(a, 2), q[0], q[1], q[2],
                                a.in[1]->shape()[2], q[3], a.attrs.get(attr::scale), ctx);
    });
  });
}

}  // namespace meshtrain::kernels::cuda::ops
