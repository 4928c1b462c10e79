// Flash-style causal GQA attention for bf16 on tensor cores (mma.sync m16n8k16, f32 accumulators), forward and
// backward. A block is 4 warps over a tile of 64 rows (queries, or keys in the dK/dV kernel), 16 rows a warp; the
// other side streams through shared memory in tiles of 64. Heads are padded with zeros to 64 or 128 columns.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16): a warp's lane L holds, of a 16x8 f32 accumulator, rows
// L/4 and L/4 + 8 at columns 2(L%4) and 2(L%4) + 1 (c[0], c[1] and c[2], c[3]); that is also where an A fragment
// wants the same rows and columns of a 16x16 operand, so the scores of two adjacent accumulators become the A
// fragment of the next product without leaving registers (as FlashAttention 2 does).
#include <cmath>

#include "kernels/cuda/ops/attention_tensor_cores.h"
#include "kernels/cuda/ops/families.h"

namespace meshtrain::kernels::cuda::ops {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;
constexpr int kBlockThreads = 32 * kWarps;
constexpr int kTileRows = 16 * kWarps;  // rows of a block's tile and of each streamed tile
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// A [64, kD] bf16 tile in shared memory, rows padded by 16 bytes so that the 8 rows an ldmatrix reads fall in
// different banks.
template <int kD>
struct Tile {
  static constexpr int kStride = kD + 8;  // elements per row
  static constexpr int kElems = kTileRows * kStride;
  static constexpr int kBytes = kElems * static_cast<int>(sizeof(bf16));
};

// One head's rows of a [B, T, H, D] tensor: row i at data + i * stride.
struct HeadRows {
  const bf16* data;
  int64_t stride;
};

__device__ HeadRows head_rows(const bf16* x, int bi, int t, int heads, int head, int d) {
  return {x + (int64_t{bi} * t * heads + head) * d, int64_t{heads} * d};
}

__device__ uint32_t shared_address(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// Asynchronous copies into shared memory (cp.async): `bytes` (4 or 16) from src, or zeros where !valid. A block
// commits the copies it issued as a group and later waits until at most kPending of its groups are in flight.
template <int kBytes>
__device__ void copy_async(void* dst, const void* src, bool valid) {
  if constexpr (kBytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(dst)), "l"(src),
                 "r"(valid ? 4 : 0));
}
__device__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Starts copying rows [row0, row0 + 64) of a head into a shared tile, zeros at rows >= t and columns >= d.
template <int kD>
__device__ void load_tile(HeadRows src, int row0, int t, int d, bf16* tile) {
  constexpr int kChunks = kD / 8;  // 16 bytes each
  for (int idx = threadIdx.x; idx < kTileRows * kChunks; idx += kBlockThreads) {
    const int r = idx / kChunks, c = (idx % kChunks) * 8;
    const bool valid = row0 + r < t && c < d;
    copy_async<16>(tile + r * Tile<kD>::kStride + c, valid ? src.data + (row0 + r) * src.stride + c : src.data, valid);
  }
}

// Starts copying lse or delta of rows [row0, row0 + 64) of a head ([B, H, T] rows), zeros at rows >= t.
__device__ void load_row_values(const float* src, int row0, int t, float* dst) {
  for (int r = threadIdx.x; r < kTileRows; r += kBlockThreads) {
    const bool valid = row0 + r < t;
    copy_async<4>(dst + r, valid ? src + row0 + r : src, valid);
  }
}

__device__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}

__device__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}

// c += a b for a 16x16 A fragment and a 16x8 B fragment (b0: k rows 0-7, b1: k rows 8-15).
__device__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as a bf16 pair, `low` in the low half (the lower column of a fragment).
__device__ uint32_t pack_bf16(float low, float high) {
  __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<uint32_t*>(&pair);
}

// A fragment of rows [row0, row0 + 16) and columns [col0, col0 + 16) of a row-major shared tile.
template <int kD>
__device__ void load_a(uint32_t (&a)[4], const bf16* tile, int row0, int col0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4(a, tile + (row0 + lane % 16) * Tile<kD>::kStride + col0 + (lane / 16) * 8);
}

// B fragments of two adjacent 8-column tiles where B[k][n] = X[n0 + n][col0 + k] (X a row-major shared tile: the
// "K^T" of Q K^T): b[0], b[1] for columns n0..n0+7, b[2], b[3] for n0+8..n0+15.
template <int kD>
__device__ void load_b_transposed(uint32_t (&b)[4], const bf16* x, int n0, int col0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4(b, x + (n0 + lane % 8 + (lane / 16) * 8) * Tile<kD>::kStride + col0 + ((lane / 8) % 2) * 8);
}

// B fragments of two adjacent 8-column tiles where B[k][n] = Y[k0 + k][n0 + n] (Y a row-major shared tile: the V
// of P V): b[0], b[1] for columns n0..n0+7, b[2], b[3] for n0+8..n0+15.
template <int kD>
__device__ void load_b(uint32_t (&b)[4], const bf16* y, int k0, int n0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4_trans(b, y + (k0 + lane % 8 + ((lane / 8) % 2) * 8) * Tile<kD>::kStride + n0 + (lane / 16) * 8);
}

// acc[16 x 64] = rows [row0, row0 + 16) of `rows` times the 64 rows of `cols`, transposed, over kD columns.
template <int kD>
__device__ void row_dots(const bf16* rows, int row0, const bf16* cols, float (&acc)[8][4]) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    uint32_t a[4];
    load_a<kD>(a, rows, row0, kk * 16);
#pragma unroll
    for (int n2 = 0; n2 < 4; ++n2) {
      uint32_t b[4];
      load_b_transposed<kD>(b, cols, n2 * 16, kk * 16);
      mma(acc[2 * n2], a, b[0], b[1]);
      mma(acc[2 * n2 + 1], a, b[2], b[3]);
    }
  }
}

// acc[16 x kD] += w[16 x 64] y[64 x kD]: w as accumulator-layout values, rounded to bf16 on the way in.
template <int kD>
__device__ void accumulate(const float (&w)[8][4], const bf16* y, float (&acc)[kD / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint32_t a[4] = {pack_bf16(w[2 * kk][0], w[2 * kk][1]), pack_bf16(w[2 * kk][2], w[2 * kk][3]),
                           pack_bf16(w[2 * kk + 1][0], w[2 * kk + 1][1]),
                           pack_bf16(w[2 * kk + 1][2], w[2 * kk + 1][3])};
#pragma unroll
    for (int n2 = 0; n2 < kD / 16; ++n2) {
      uint32_t b[4];
      load_b<kD>(b, y, kk * 16, n2 * 16);
      mma(acc[2 * n2], a, b[0], b[1]);
      mma(acc[2 * n2 + 1], a, b[2], b[3]);
    }
  }
}

// Rows `row` (c[0], c[1]) and `row + 8` (c[2], c[3]) of an accumulator [16 x kD], times scales[0] and scales[1],
// into a head's rows of a [B, T, H, D] tensor: rows < t, columns < d.
template <int kD>
__device__ void store_rows(const float (&acc)[kD / 8][4], const float (&scales)[2], bf16* head, int64_t stride, int row,
                           int t, int d) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row + 8 * half;
    if (r >= t) continue;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      const int col = j * 8 + 2 * (lane % 4);
      if (col >= d) continue;  // d is a multiple of 8: col + 1 < d too
      *reinterpret_cast<__nv_bfloat162*>(head + r * stride + col) =
          __floats2bfloat162_rn(acc[j][2 * half] * scales[half], acc[j][2 * half + 1] * scales[half]);
    }
  }
}

// The largest and the sum over the 4 lanes that hold one accumulator row.
__device__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Column of element e of accumulator tile j (8 columns each) for this lane, and its row offset (0 or 8).
__device__ int column_of(int j, int e) { return j * 8 + 2 * (threadIdx.x % 4) + (e % 2); }
__device__ int row_of(int e) { return (threadIdx.x % 32) / 4 + (e / 2) * 8; }

// The K and V tiles of one key/value head streamed through two shared buffers (each a K tile then a V tile): key
// tile `tile` in buffer tile % 2, the next one copied in while the block computes on it.
template <int kD>
struct KeyTiles {
  HeadRows k, v;
  int t, d;
  bf16* buffers;

  __device__ bf16* buffer(int tile) const { return buffers + (tile % 2) * 2 * Tile<kD>::kElems; }
  // Starts copying key tile `tile` (the caller commits the copies).
  __device__ void load(int tile) const {
    load_tile<kD>(k, tile * kTileRows, t, d, buffer(tile));
    load_tile<kD>(v, tile * kTileRows, t, d, buffer(tile) + Tile<kD>::kElems);
  }
  // Starts the next of `tiles` key tiles, waits for `tile`'s and returns its K tile (its V tile follows).
  __device__ const bf16* arrive(int tile, int tiles) const {
    if (tile + 1 < tiles) load(tile + 1);
    commit_copies();
    wait_copies<1>();
    __syncthreads();
    return buffer(tile);
  }
};

// ---- forward -------------------------------------------------------------------------------------------------------

// One block per (query tile, query head, batch); key tiles up to the causal diagonal, the softmax online (each row's
// running max and total kept by its 4 lanes, in the log2 domain).
template <int kD>
__global__ void __launch_bounds__(kBlockThreads)
    forward_kernel(const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse, AttentionShape s) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* q_tile = reinterpret_cast<bf16*>(smem);
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kTileRows;  // the longest (latest) query tiles first
  const int h = blockIdx.y, bi = blockIdx.z, hk = h / (s.hq / s.hkv);
  const int warp_row = (threadIdx.x / 32) * 16;
  const KeyTiles<kD> keys{head_rows(k, bi, s.t, s.hkv, hk, s.d), head_rows(v, bi, s.t, s.hkv, hk, s.d), s.t, s.d,
                          q_tile + Tile<kD>::kElems};
  load_tile<kD>(head_rows(q, bi, s.t, s.hq, h, s.d), i0, s.t, s.d, q_tile);
  keys.load(0);
  commit_copies();

  const float scale_log2 = s.scale * kLog2e;
  float o[kD / 8][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY}, row_total[2] = {0.0f, 0.0f};
  const int key_tiles = i0 / kTileRows + 1;  // up to the causal diagonal
  for (int tile = 0; tile < key_tiles; ++tile) {
    const int j0 = tile * kTileRows;
    const bf16* k_tile = keys.arrive(tile, key_tiles);
    const bf16* v_tile = k_tile + Tile<kD>::kElems;
    float p[8][4];
    row_dots<kD>(q_tile, warp_row, k_tile, p);
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool seen = j0 + column_of(j, e) <= i0 + warp_row + row_of(e);
        p[j][e] = seen ? p[j][e] * scale_log2 : -INFINITY;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], p[j][e]);
      }
    float correction[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float new_max = fmaxf(row_max[half], quad_max(tile_max[half]));
      const float base = new_max == -INFINITY ? 0.0f : new_max;  // no visible key yet: weights stay 0
      correction[half] = exp2f(row_max[half] - base);
      row_max[half] = new_max;
      tile_max[half] = base;
    }
    float tile_total[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        p[j][e] = exp2f(p[j][e] - tile_max[e / 2]);
        tile_total[e / 2] += p[j][e];
      }
#pragma unroll
    for (int half = 0; half < 2; ++half)
      row_total[half] = row_total[half] * correction[half] + quad_sum(tile_total[half]);
#pragma unroll
    for (int j = 0; j < kD / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[j][e] *= correction[e / 2];
    accumulate<kD>(p, v_tile, o);  // O += P V
    __syncthreads();               // the buffer is read before the next-but-one tile goes into it
  }

  const int row = i0 + warp_row + row_of(0);
  const float inverse_total[2] = {row_total[0] > 0 ? 1.0f / row_total[0] : 0.0f,
                                  row_total[1] > 0 ? 1.0f / row_total[1] : 0.0f};
  bf16* out_head = out + (int64_t{bi} * s.t * s.hq + h) * s.d;
  store_rows<kD>(o, inverse_total, out_head, int64_t{s.hq} * s.d, row, s.t, s.d);
  float* lse_row = lse + (int64_t{bi} * s.hq + h) * s.t;
#pragma unroll
  for (int half = 0; half < 2; ++half)
    if (threadIdx.x % 4 == 0 && row + 8 * half < s.t)
      lse_row[row + 8 * half] = (row_max[half] + log2f(row_total[half])) * kLn2;
}

// ---- backward ------------------------------------------------------------------------------------------------------

struct BackwardArgs {
  const bf16 *q, *k, *v, *dout;
  const float *lse, *delta;
};

// dK and dV: one block per (key tile, key/value head, batch), each warp 16 keys, over the query heads of the group
// and the query tiles at or after the key tile: S^T = K Q^T, dP^T = V dO^T, P^T = exp(scale S^T - lse),
// dS^T = P^T (dP^T - delta); dV += P^T dO, dK += scale dS^T Q, in registers (deterministic).
template <int kD>
__global__ void __launch_bounds__(kBlockThreads) dkdv_kernel(BackwardArgs in, bf16* dk, bf16* dv, AttentionShape s) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* k_tile = reinterpret_cast<bf16*>(smem);
  bf16* v_tile = k_tile + Tile<kD>::kElems;
  bf16* query_tiles = v_tile + Tile<kD>::kElems;  // two buffers of a Q tile and a dO tile
  float* row_tiles = reinterpret_cast<float*>(query_tiles + 4 * Tile<kD>::kElems);  // two of lse and delta
  const int j0 = blockIdx.x * kTileRows;
  const int hk = blockIdx.y, bi = blockIdx.z, group = s.hq / s.hkv;
  const int warp_row = (threadIdx.x / 32) * 16;
  // Iteration `it` takes query head hk * group + it / per_head, query tile j0 + (it % per_head) * 64: earlier query
  // tiles see none of these keys.
  const int per_head = (s.t - j0 + kTileRows - 1) / kTileRows, iterations = group * per_head;
  const auto load_queries = [&](int it, int buffer) {
    const int h = hk * group + it / per_head, i0 = j0 + (it % per_head) * kTileRows;
    bf16* q_buffer = query_tiles + buffer * 2 * Tile<kD>::kElems;
    load_tile<kD>(head_rows(in.q, bi, s.t, s.hq, h, s.d), i0, s.t, s.d, q_buffer);
    load_tile<kD>(head_rows(in.dout, bi, s.t, s.hq, h, s.d), i0, s.t, s.d, q_buffer + Tile<kD>::kElems);
    const int64_t row_values = (int64_t{bi} * s.hq + h) * s.t;
    load_row_values(in.lse + row_values, i0, s.t, row_tiles + buffer * 2 * kTileRows);
    load_row_values(in.delta + row_values, i0, s.t, row_tiles + buffer * 2 * kTileRows + kTileRows);
  };
  load_tile<kD>(head_rows(in.k, bi, s.t, s.hkv, hk, s.d), j0, s.t, s.d, k_tile);
  load_tile<kD>(head_rows(in.v, bi, s.t, s.hkv, hk, s.d), j0, s.t, s.d, v_tile);
  load_queries(0, 0);
  commit_copies();

  const float scale_log2 = s.scale * kLog2e;
  float dk_acc[kD / 8][4] = {}, dv_acc[kD / 8][4] = {};
  for (int it = 0; it < iterations; ++it) {
    if (it + 1 < iterations) load_queries(it + 1, (it + 1) % 2);
    commit_copies();
    wait_copies<1>();  // this iteration's queries are in
    __syncthreads();
    {
      const int i0 = j0 + (it % per_head) * kTileRows;
      const bf16* q_tile = query_tiles + (it % 2) * 2 * Tile<kD>::kElems;
      const bf16* do_tile = q_tile + Tile<kD>::kElems;
      const float* lse_tile = row_tiles + (it % 2) * 2 * kTileRows;
      const float* delta_tile = lse_tile + kTileRows;
      float p[8][4], ds[8][4];
      row_dots<kD>(k_tile, warp_row, q_tile, p);    // S^T: keys x queries
      row_dots<kD>(v_tile, warp_row, do_tile, ds);  // dP^T
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int query = column_of(j, e);
          const bool seen = j0 + warp_row + row_of(e) <= i0 + query && i0 + query < s.t;
          const float prob = seen ? exp2f(p[j][e] * scale_log2 - lse_tile[query] * kLog2e) : 0.0f;
          ds[j][e] = prob * (ds[j][e] - delta_tile[query]);
          p[j][e] = prob;
        }
      accumulate<kD>(p, do_tile, dv_acc);  // dV += P^T dO
      accumulate<kD>(ds, q_tile, dk_acc);  // dK += dS^T Q
    }
    __syncthreads();  // the buffer is read before the next-but-one tile goes into it
  }
  const int row = j0 + warp_row + row_of(0);
  const int64_t stride = int64_t{s.hkv} * s.d, head = (int64_t{bi} * s.t * s.hkv + hk) * s.d;
  const float unit[2] = {1.0f, 1.0f}, scale[2] = {s.scale, s.scale};
  store_rows<kD>(dk_acc, scale, dk + head, stride, row, s.t, s.d);
  store_rows<kD>(dv_acc, unit, dv + head, stride, row, s.t, s.d);
}

// dQ: one block per (query tile, query head, batch), key tiles up to the causal diagonal; S and dP computed again as
// in the dK/dV kernel, dQ += scale dS K in registers (deterministic).
template <int kD>
__global__ void __launch_bounds__(kBlockThreads) dq_kernel(BackwardArgs in, bf16* dq, AttentionShape s) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* q_tile = reinterpret_cast<bf16*>(smem);
  bf16* do_tile = q_tile + Tile<kD>::kElems;
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kTileRows;  // the longest (latest) query tiles first
  const int h = blockIdx.y, bi = blockIdx.z, hk = h / (s.hq / s.hkv);
  const int warp_row = (threadIdx.x / 32) * 16;
  const KeyTiles<kD> keys{head_rows(in.k, bi, s.t, s.hkv, hk, s.d), head_rows(in.v, bi, s.t, s.hkv, hk, s.d), s.t, s.d,
                          do_tile + Tile<kD>::kElems};
  load_tile<kD>(head_rows(in.q, bi, s.t, s.hq, h, s.d), i0, s.t, s.d, q_tile);
  load_tile<kD>(head_rows(in.dout, bi, s.t, s.hq, h, s.d), i0, s.t, s.d, do_tile);
  keys.load(0);
  commit_copies();
  const int row = i0 + warp_row + row_of(0);
  const int64_t row_values = (int64_t{bi} * s.hq + h) * s.t;
  float row_lse[2], row_delta[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const bool inside = row + 8 * half < s.t;
    row_lse[half] = inside ? in.lse[row_values + row + 8 * half] * kLog2e : 0.0f;
    row_delta[half] = inside ? in.delta[row_values + row + 8 * half] : 0.0f;
  }

  const float scale_log2 = s.scale * kLog2e;
  float dq_acc[kD / 8][4] = {};
  const int key_tiles = i0 / kTileRows + 1;  // up to the causal diagonal
  for (int tile = 0; tile < key_tiles; ++tile) {
    const int j0 = tile * kTileRows;
    const bf16* k_tile = keys.arrive(tile, key_tiles);
    const bf16* v_tile = k_tile + Tile<kD>::kElems;
    float p[8][4], ds[8][4];
    row_dots<kD>(q_tile, warp_row, k_tile, p);    // S
    row_dots<kD>(do_tile, warp_row, v_tile, ds);  // dP
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int query = row + 8 * (e / 2);
        const bool seen = j0 + column_of(j, e) <= query && query < s.t;
        const float prob = seen ? exp2f(p[j][e] * scale_log2 - row_lse[e / 2]) : 0.0f;
        ds[j][e] = prob * (ds[j][e] - row_delta[e / 2]);
      }
    accumulate<kD>(ds, k_tile, dq_acc);  // dQ += dS K
    __syncthreads();                     // the buffer is read before the next-but-one tile goes into it
  }
  const float scale[2] = {s.scale, s.scale};
  store_rows<kD>(dq_acc, scale, dq + (int64_t{bi} * s.t * s.hq + h) * s.d, int64_t{s.hq} * s.d, row, s.t, s.d);
}

// Run fn with the padded head size (64 or 128) that holds d.
template <typename Fn>
void by_padded_head(int d, Fn&& fn) {
  if (d <= 64) return fn(std::integral_constant<int, 64>{});
  return fn(std::integral_constant<int, 128>{});
}

template <typename Kernel>
void launch_with_smem(Kernel kernel, dim3 grid, size_t bytes, cudaStream_t stream, const char* op, auto&&... args) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)), op);
  kernel<<<grid, kBlockThreads, bytes, stream>>>(args...);
  check_launch(op);
}

unsigned tiles_of(int t) { return static_cast<unsigned>((t + kTileRows - 1) / kTileRows); }

}  // namespace

bool tensor_cores_take(int64_t d, std::initializer_list<const void*> ptrs) {
  bool ok = d > 0 && d <= 128 && d % 8 == 0;
  for (const void* p : ptrs) ok = ok && aligned16(p);
  return ok;
}

void launch_attention_tensor_cores(const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse, int64_t b,
                                   const AttentionShape& s, cudaStream_t stream) {
  by_padded_head(s.d, [&](auto padded) {
    constexpr int kD = decltype(padded)::value;
    const dim3 grid(tiles_of(s.t), static_cast<unsigned>(s.hq), static_cast<unsigned>(b));
    launch_with_smem(forward_kernel<kD>, grid, 5 * Tile<kD>::kBytes, stream, "attention", q, k, v, out, lse, s);
  });
}

void launch_attention_backward_tensor_cores(const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                                            const float* lse, const float* delta, bf16* dq, bf16* dk, bf16* dv,
                                            int64_t b, const AttentionShape& s, cudaStream_t stream) {
  const BackwardArgs in{q, k, v, dout, lse, delta};
  by_padded_head(s.d, [&](auto padded) {
    constexpr int kD = decltype(padded)::value;
    const size_t dkdv_bytes = 6 * Tile<kD>::kBytes + 4 * kTileRows * sizeof(float);
    launch_with_smem(dkdv_kernel<kD>, dim3(tiles_of(s.t), static_cast<unsigned>(s.hkv), static_cast<unsigned>(b)),
                     dkdv_bytes, stream, "attention_backward", in, dk, dv, s);
    launch_with_smem(dq_kernel<kD>, dim3(tiles_of(s.t), static_cast<unsigned>(s.hq), static_cast<unsigned>(b)),
                     6 * Tile<kD>::kBytes, stream, "attention_backward", in, dq, s);
  });
}

}  // namespace meshtrain::kernels::cuda::ops
