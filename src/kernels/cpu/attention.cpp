// Causal scaled-dot-product attention with grouped-query heads, forward and
// backward (declared in cpu_kernels.h), flash-attention style: blocks of
// kQueryBlock queries against blocks of at most kKeyBlock keys, stopping at
// the causal diagonal, with the softmax online across key blocks, so the
// largest buffer is kQueryBlock x kKeyBlock, never T x T. The backward pass
// recomputes the scores block by block from the saved log-sum-exp.
//
// Two implementations of the same blocks:
// - attention_blocked: any element type; block products through
//   single-threaded BLAS inside the OpenMP tasks, on Q, K, V and dO where
//   they lie (f32, f64) or on copies widened to f32 (bf16).
// - attention_bf16_dot: bf16 on CPUs with AVX512_BF16; operands stay bf16,
//   block products through gemm_bf16_pairs with f32 accumulation, and P and
//   dS are rounded to bf16 before their products, as FlashAttention does.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/kernel_support.h"

namespace meshtrain::kernels::cpu {

namespace {
constexpr int64_t kQueryBlock = 64;
constexpr int64_t kKeyBlock = 512;

// Copy `rows` rows of x (row stride `stride`), d elements each, into packed scratch, widened.
template <typename T, typename A>
void gather_rows(const T* x, int64_t stride, int64_t rows, int64_t d, A* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < d; ++c) dst[r * d + c] = load(x[r * stride + c]);
}

// Rows of one head as the block products read them: x itself where T is
// already the accumulation type A (a GEMM takes the row stride), else a
// widened packed copy in scratch slot `slot`.
template <typename A>
struct HeadRows {
  const A* data;
  int64_t stride;
  const A* row(int64_t r) const { return data + r * stride; }
};
template <typename A, typename T>
HeadRows<A> head_rows(const T* x, int64_t stride, int64_t rows, int64_t d, int slot) {
  if constexpr (std::is_same_v<T, A>) {
    return {x, stride};
  } else {
    A* dst = scratch<A>(static_cast<size_t>(rows * d), slot);
    gather_rows(x, stride, rows, d, dst);
    return {dst, d};
  }
}

// Store `rows` x d accumulators, element (r, c) at acc[r * row_step + c *
// col_step], times sc into rows of dst (row stride `stride`).
template <typename T, typename A>
void scatter_rows(const A* acc, int64_t row_step, int64_t col_step, int64_t rows, int64_t d, A sc, T* dst,
                  int64_t stride) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < d; ++c) dst[r * stride + c] = store<T>(acc[r * row_step + c * col_step] * sc);
}

// The positions of queries [i0, i0 + rows), counted from the first key's,
// into `pos` (key j is visible to row r when j <= pos[r]); returns the keys
// any of them sees: those up to the block's last position.
int64_t query_positions(const AttentionShape& shape, int64_t i0, int64_t rows, int64_t* pos) {
  int64_t last = -1;
  for (int64_t r = 0; r < rows; ++r) last = std::max(last, pos[r] = shape.queries.position(i0 + r) - shape.key_first);
  return std::min(last + 1, shape.tk);
}
// Keys [j0, j0 + n) of the `seen` keys a block of queries sees.
int64_t keys_in_block(int64_t seen, int64_t j0) { return std::min(kKeyBlock, seen - j0); }
// Keys of that block visible to the query at position `pos` (causal: j <= pos).
int64_t visible_keys(int64_t pos, int64_t j0, int64_t n) { return std::clamp<int64_t>(pos - j0 + 1, 0, n); }

// Scores are unscaled in the products: the scale is applied where the
// softmax reads them, and dS carries it into dQ and dK.
template <typename T>
[[MESHTRAIN_AVX512_CLONES]] void attention_blocked(const T* q, const T* k, const T* v, T* out, Acc<T>* lse,
                                                   const AttentionShape& shape, double scale) {
  using A = Acc<T>;
  const int64_t b = shape.b, tq = shape.tq, tk = shape.tk, hq = shape.hq, hkv = shape.hkv, d = shape.d;
  const int64_t group = hq / hkv;
  const auto neg_inf = -std::numeric_limits<A>::infinity();
  const auto sc = static_cast<A>(scale);
  RegionErrors errors;
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t h = 0; h < hq; ++h) {
      if (errors.failed()) continue;
      try {
        const int64_t kv_offset = (bi * tk * hkv + h / group) * d;
        const HeadRows<A> ks = head_rows<A>(k + kv_offset, hkv * d, tk, d, 0);
        const HeadRows<A> vs = head_rows<A>(v + kv_offset, hkv * d, tk, d, 1);
        A* o = scratch<A>(static_cast<size_t>(kQueryBlock * d), 3);
        A* s = scratch<A>(static_cast<size_t>(kQueryBlock * kKeyBlock), 4);
        A row_max[kQueryBlock], row_total[kQueryBlock];
        int64_t row_pos[kQueryBlock];
        for (int64_t i0 = 0; i0 < tq; i0 += kQueryBlock) {
          const int64_t rows = std::min(kQueryBlock, tq - i0);
          const int64_t seen = query_positions(shape, i0, rows, row_pos);
          const HeadRows<A> qs = head_rows<A>(q + ((bi * tq + i0) * hq + h) * d, hq * d, rows, d, 2);
          std::fill(o, o + rows * d, A(0));
          std::fill(row_max, row_max + rows, neg_inf);
          std::fill(row_total, row_total + rows, A(0));
          for (int64_t j0 = 0; j0 < seen; j0 += kKeyBlock) {
            const int64_t n = keys_in_block(seen, j0);
            gemm(false, true, rows, n, d, qs.data, qs.stride, ks.row(j0), ks.stride, s, n, false);  // S = Q K^T
            for (int64_t r = 0; r < rows; ++r) {  // S row -> P row (unnormalized), in place
              A* sr = s + r * n;
              const int64_t visible = visible_keys(row_pos[r], j0, n);
              if (visible == 0) {
                std::fill(sr, sr + n, A(0));
                continue;
              }
#pragma omp simd
              for (int64_t jj = 0; jj < visible; ++jj) sr[jj] *= sc;
              const A block_max = max_of(sr, visible, row_max[r]);
              const A correction = exp_of(row_max[r] - block_max);
              A block_total = 0;
#pragma omp simd reduction(+ : block_total)
              for (int64_t jj = 0; jj < visible; ++jj) block_total += (sr[jj] = exp_of(sr[jj] - block_max));
              std::fill(sr + visible, sr + n, A(0));
              row_total[r] = row_total[r] * correction + block_total;
              row_max[r] = block_max;
              for (int64_t c = 0; c < d; ++c) o[r * d + c] *= correction;
            }
            gemm(false, false, rows, d, n, s, n, vs.row(j0), vs.stride, o, d, true);  // O += P V
          }
          for (int64_t r = 0; r < rows; ++r) {
            T* dst = out + ((bi * tq + i0 + r) * hq + h) * d;
            const bool sees = row_total[r] > 0;  // a row that sees no key: 0 and an lse of -inf
            const A inv = sees ? A(1) / row_total[r] : A(0);
            for (int64_t c = 0; c < d; ++c) dst[c] = store<T>(o[r * d + c] * inv);
            lse[(bi * hq + h) * tq + i0 + r] = sees ? row_max[r] + std::log(row_total[r]) : neg_inf;
          }
        }
      } catch (...) {
        errors.keep(std::current_exception());
      }
    }
  errors.rethrow();
}

template <typename T>
[[MESHTRAIN_AVX512_CLONES]] void attention_backward_blocked(const T* q, const T* k, const T* v, const T* out,
                                                            const Acc<T>* lse, const T* dout, T* dq, T* dk, T* dv,
                                                            const AttentionShape& shape, double scale) {
  using A = Acc<T>;
  const int64_t b = shape.b, tq = shape.tq, tk = shape.tk, hq = shape.hq, hkv = shape.hkv, d = shape.d;
  const int64_t group = hq / hkv;
  const auto sc = static_cast<A>(scale);
  // One task per (batch, key/value head): it owns those dK, dV rows and the
  // dQ rows of its query heads, so tasks never write the same memory.
  RegionErrors errors;
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t hk = 0; hk < hkv; ++hk) {
      if (errors.failed()) continue;
      try {
        const int64_t kv_offset = (bi * tk * hkv + hk) * d;
        const HeadRows<A> ks = head_rows<A>(k + kv_offset, hkv * d, tk, d, 0);
        const HeadRows<A> vs = head_rows<A>(v + kv_offset, hkv * d, tk, d, 1);
        A* dk_acc = scratch<A>(static_cast<size_t>(tk * d), 2);
        A* dv_acc = scratch<A>(static_cast<size_t>(tk * d), 3);
        A* dq_acc = scratch<A>(static_cast<size_t>(kQueryBlock * d), 6);  // the block's dQ
        A* p = scratch<A>(static_cast<size_t>(kQueryBlock * kKeyBlock), 7);
        A* ds = scratch<A>(static_cast<size_t>(kQueryBlock * kKeyBlock), 8);
        A row_lse[kQueryBlock], row_delta[kQueryBlock];
        int64_t row_pos[kQueryBlock];
        std::fill(dk_acc, dk_acc + tk * d, A(0));
        std::fill(dv_acc, dv_acc + tk * d, A(0));
        for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
          for (int64_t i0 = 0; i0 < tq; i0 += kQueryBlock) {
            const int64_t rows = std::min(kQueryBlock, tq - i0);
            const int64_t seen = query_positions(shape, i0, rows, row_pos);
            const int64_t first_row = (bi * tq + i0) * hq + h;
            const HeadRows<A> qs = head_rows<A>(q + first_row * d, hq * d, rows, d, 4);
            const HeadRows<A> dos = head_rows<A>(dout + first_row * d, hq * d, rows, d, 5);
            for (int64_t r = 0; r < rows; ++r) {
              const T* o_row = out + (first_row + r * hq) * d;
              const A* do_row = dos.row(r);
              A delta = 0;  // rowsum(dO * O): the softmax backward's correction term
#pragma omp simd reduction(+ : delta)
              for (int64_t c = 0; c < d; ++c) delta += do_row[c] * load(o_row[c]);
              row_delta[r] = delta;
              row_lse[r] = lse[(bi * hq + h) * tq + i0 + r];
            }
            std::fill(dq_acc, dq_acc + rows * d, A(0));
            for (int64_t j0 = 0; j0 < seen; j0 += kKeyBlock) {
              const int64_t n = keys_in_block(seen, j0);
              gemm(false, true, rows, n, d, qs.data, qs.stride, ks.row(j0), ks.stride, p, n, false);     // S = Q K^T
              gemm(false, true, rows, n, d, dos.data, dos.stride, vs.row(j0), vs.stride, ds, n, false);  // dP = dO V^T
              // P = exp(S scale - lse) and dS = scale P (dP - delta), zero where masked.
              for (int64_t r = 0; r < rows; ++r) {
                A* __restrict pr = p + r * n;
                A* __restrict dsr = ds + r * n;
                const int64_t visible = visible_keys(row_pos[r], j0, n);
                const A lse_r = row_lse[r], delta_r = row_delta[r];
#pragma omp simd
                for (int64_t jj = 0; jj < visible; ++jj) {
                  pr[jj] = exp_of(pr[jj] * sc - lse_r);
                  dsr[jj] = sc * pr[jj] * (dsr[jj] - delta_r);
                }
                std::fill(pr + visible, pr + n, A(0));
                std::fill(dsr + visible, dsr + n, A(0));
              }
              gemm(true, false, n, d, rows, p, n, dos.data, dos.stride, dv_acc + j0 * d, d, true);  // dV += P^T dO
              gemm(true, false, n, d, rows, ds, n, qs.data, qs.stride, dk_acc + j0 * d, d, true);   // dK += dS^T Q
              gemm(false, false, rows, d, n, ds, n, ks.row(j0), ks.stride, dq_acc, d, true);        // dQ += dS K
            }
            scatter_rows(dq_acc, d, 1, rows, d, A(1), dq + first_row * d, hq * d);
          }
        scatter_rows(dk_acc, d, 1, tk, d, A(1), dk + kv_offset, hkv * d);
        scatter_rows(dv_acc, d, 1, tk, d, A(1), dv + kv_offset, hkv * d);
      } catch (...) {
        errors.keep(std::current_exception());
      }
    }
  errors.rethrow();
}

// ---- bf16 with AVX512_BF16 ------------------------------------------------------
//
// Per task, K and V are packed once into the layouts the products read
// (bf16_dot.h). Scores stay unscaled in the products; the scale is applied
// in f32 where the softmax reads them, and dS carries it into dQ and dK.

[[MESHTRAIN_AVX512_BF16]] void attention_bf16_dot(const bfloat16* q, const bfloat16* k, const bfloat16* v,
                                                  bfloat16* out, float* lse, const AttentionShape& shape,
                                                  double scale) {
  const int64_t b = shape.b, tq = shape.tq, tk = shape.tk, hq = shape.hq, hkv = shape.hkv, d = shape.d;
  const int64_t group = hq / hkv, d_pairs = (d + 1) / 2;
  const auto sc = static_cast<float>(scale);
  RegionErrors errors;
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t h = 0; h < hq; ++h) {
      if (errors.failed()) continue;
      try {
        const int64_t kv_offset = (bi * tk * hkv + h / group) * d;
        uint32_t* k_t = scratch<uint32_t>(static_cast<size_t>(d_pairs * tk), 0);      // K^T, for S = Q K^T
        uint32_t* v_p = scratch<uint32_t>(static_cast<size_t>((tk + 1) / 2 * d), 1);  // V, for O += P V
        uint32_t* q_a = scratch<uint32_t>(static_cast<size_t>(kQueryBlock * d_pairs), 2);
        uint32_t* p_a = scratch<uint32_t>(static_cast<size_t>(kQueryBlock * kKeyBlock / 2), 3);  // P in bf16
        float* s = scratch<float>(static_cast<size_t>(kQueryBlock * kKeyBlock), 0);
        float* o = scratch<float>(static_cast<size_t>(kQueryBlock * d), 1);
        float row_max[kQueryBlock], row_total[kQueryBlock];
        int64_t row_pos[kQueryBlock];
        pack_pairs_transposed(k + kv_offset, hkv * d, tk, d, k_t);
        pack_pairs(v + kv_offset, hkv * d, tk, d, v_p);
        for (int64_t i0 = 0; i0 < tq; i0 += kQueryBlock) {
          const int64_t rows = std::min(kQueryBlock, tq - i0);
          const int64_t seen = query_positions(shape, i0, rows, row_pos);
          pack_rows(q + ((bi * tq + i0) * hq + h) * d, hq * d, rows, d, q_a);
          std::fill(o, o + rows * d, 0.0f);
          std::fill(row_max, row_max + rows, -std::numeric_limits<float>::infinity());
          std::fill(row_total, row_total + rows, 0.0f);
          for (int64_t j0 = 0; j0 < seen; j0 += kKeyBlock) {
            const int64_t n = keys_in_block(seen, j0), n_pairs = (n + 1) / 2;
            gemm_bf16_pairs(rows, n, d_pairs, q_a, d_pairs, k_t + j0, tk, s, n, false);  // S = Q K^T
            for (int64_t r = 0; r < rows; ++r) {  // S row -> P row (f32, unnormalized), in place
              float* sr = s + r * n;
              const int64_t visible = visible_keys(row_pos[r], j0, n);
              float block_max = row_max[r];
#pragma omp simd reduction(max : block_max)
              for (int64_t jj = 0; jj < visible; ++jj) block_max = std::max(block_max, sr[jj] * sc);
              const float correction = visible ? exp_fast(row_max[r] - block_max) : 1.0f;
              float block_total = 0;
#pragma omp simd reduction(+ : block_total)
              for (int64_t jj = 0; jj < visible; ++jj) block_total += (sr[jj] = exp_fast(sr[jj] * sc - block_max));
              std::fill(sr + visible, sr + n, 0.0f);
              row_total[r] = row_total[r] * correction + block_total;
              row_max[r] = block_max;
              for (int64_t c = 0; c < d; ++c) o[r * d + c] *= correction;
            }
            pack_rows(s, n, rows, n, p_a);
            gemm_bf16_pairs(rows, d, n_pairs, p_a, n_pairs, v_p + j0 / 2 * d, d, o, d, true);  // O += P V
          }
          for (int64_t r = 0; r < rows; ++r) {
            bfloat16* dst = out + ((bi * tq + i0 + r) * hq + h) * d;
            const bool sees = row_total[r] > 0;  // a row that sees no key: 0 and an lse of -inf
            const float inv = sees ? 1.0f / row_total[r] : 0.0f;
            for (int64_t c = 0; c < d; ++c) dst[c] = store<bfloat16>(o[r * d + c] * inv);
            lse[(bi * hq + h) * tq + i0 + r] =
                sees ? row_max[r] + std::log(row_total[r]) : -std::numeric_limits<float>::infinity();
          }
        }
      } catch (...) {
        errors.keep(std::current_exception());
      }
    }
  errors.rethrow();
}

[[MESHTRAIN_AVX512_BF16]] void attention_backward_bf16_dot(const bfloat16* q, const bfloat16* k, const bfloat16* v,
                                                           const bfloat16* out, const float* lse, const bfloat16* dout,
                                                           bfloat16* dq, bfloat16* dk, bfloat16* dv,
                                                           const AttentionShape& shape, double scale) {
  const int64_t b = shape.b, tq = shape.tq, tk = shape.tk, hq = shape.hq, hkv = shape.hkv, d = shape.d;
  const int64_t group = hq / hkv, d_pairs = (d + 1) / 2;
  const auto sc = static_cast<float>(scale);
  // One task per (batch, key/value head), as in attention_backward_blocked.
  RegionErrors errors;
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t hk = 0; hk < hkv; ++hk) {
      if (errors.failed()) continue;
      try {
        const int64_t kv_offset = (bi * tk * hkv + hk) * d;
        const int64_t half_t = (tk + 1) / 2, half_block = kQueryBlock / 2;
        uint32_t* k_t = scratch<uint32_t>(static_cast<size_t>(d_pairs * tk), 0);             // K^T, for S = Q K^T
        uint32_t* v_t = scratch<uint32_t>(static_cast<size_t>(d_pairs * tk), 1);             // V^T, for dP = dO V^T
        uint32_t* k_p = scratch<uint32_t>(static_cast<size_t>(half_t * d), 2);               // K, for dQ += dS K
        uint32_t* q_a = scratch<uint32_t>(static_cast<size_t>(kQueryBlock * d_pairs), 3);    // Q, for S
        uint32_t* do_a = scratch<uint32_t>(static_cast<size_t>(kQueryBlock * d_pairs), 4);   // dO, for dP
        uint32_t* q_c = scratch<uint32_t>(static_cast<size_t>(d * half_block), 5);           // Q^T, for dK^T
        uint32_t* do_c = scratch<uint32_t>(static_cast<size_t>(d * half_block), 6);          // dO^T, for dV^T
        uint32_t* p_b = scratch<uint32_t>(static_cast<size_t>(half_block * kKeyBlock), 7);   // P, for dV^T
        uint32_t* ds_b = scratch<uint32_t>(static_cast<size_t>(half_block * kKeyBlock), 8);  // dS, for dK^T
        uint32_t* ds_a = scratch<uint32_t>(static_cast<size_t>(kQueryBlock * kKeyBlock / 2), 9);  // dS, for dQ
        float* s = scratch<float>(static_cast<size_t>(kQueryBlock * kKeyBlock), 0);               // S, then P
        float* dp = scratch<float>(static_cast<size_t>(kQueryBlock * kKeyBlock), 1);              // dP, then dS
        // dK and dV are accumulated transposed, [D, T]: as dK^T += Q^T dS and
        // dV^T += dO^T P, whose operands pack without transposing the blocks.
        float* dk_t = scratch<float>(static_cast<size_t>(tk * d), 2);
        float* dv_t = scratch<float>(static_cast<size_t>(tk * d), 3);
        float* dq_acc = scratch<float>(static_cast<size_t>(kQueryBlock * d), 4);
        float row_lse[kQueryBlock], row_delta[kQueryBlock];
        int64_t row_pos[kQueryBlock];
        pack_pairs_transposed(k + kv_offset, hkv * d, tk, d, k_t);
        pack_pairs_transposed(v + kv_offset, hkv * d, tk, d, v_t);
        pack_pairs(k + kv_offset, hkv * d, tk, d, k_p);
        std::fill(dk_t, dk_t + tk * d, 0.0f);
        std::fill(dv_t, dv_t + tk * d, 0.0f);
        for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
          for (int64_t i0 = 0; i0 < tq; i0 += kQueryBlock) {
            const int64_t rows = std::min(kQueryBlock, tq - i0), row_pairs = (rows + 1) / 2;
            const int64_t seen = query_positions(shape, i0, rows, row_pos);
            const int64_t first_row = (bi * tq + i0) * hq + h;
            pack_rows(q + first_row * d, hq * d, rows, d, q_a);
            pack_rows(dout + first_row * d, hq * d, rows, d, do_a);
            pack_columns(q + first_row * d, hq * d, rows, d, q_c);
            pack_columns(dout + first_row * d, hq * d, rows, d, do_c);
            for (int64_t r = 0; r < rows; ++r) {
              const bfloat16* o_row = out + (first_row + r * hq) * d;
              const bfloat16* do_row = dout + (first_row + r * hq) * d;
              float delta = 0;  // rowsum(dO * O): the softmax backward's correction term
#pragma omp simd reduction(+ : delta)
              for (int64_t c = 0; c < d; ++c) delta += load(do_row[c]) * load(o_row[c]);
              row_delta[r] = delta;
              row_lse[r] = lse[(bi * hq + h) * tq + i0 + r];
            }
            std::fill(dq_acc, dq_acc + rows * d, 0.0f);
            for (int64_t j0 = 0; j0 < seen; j0 += kKeyBlock) {
              const int64_t n = keys_in_block(seen, j0), n_pairs = (n + 1) / 2;
              gemm_bf16_pairs(rows, n, d_pairs, q_a, d_pairs, k_t + j0, tk, s, n, false);    // S = Q K^T
              gemm_bf16_pairs(rows, n, d_pairs, do_a, d_pairs, v_t + j0, tk, dp, n, false);  // dP = dO V^T
              // P = exp(S scale - lse) and dS = scale P (dP - delta), in place; 0 where masked.
              for (int64_t r = 0; r < rows; ++r) {
                float* pr = s + r * n;
                float* dsr = dp + r * n;
                const int64_t visible = visible_keys(row_pos[r], j0, n);
                const float lse_r = row_lse[r], delta_r = row_delta[r];
#pragma omp simd
                for (int64_t jj = 0; jj < visible; ++jj) {
                  pr[jj] = exp_fast(pr[jj] * sc - lse_r);
                  dsr[jj] = sc * pr[jj] * (dsr[jj] - delta_r);
                }
                std::fill(pr + visible, pr + n, 0.0f);
                std::fill(dsr + visible, dsr + n, 0.0f);
              }
              pack_pairs(s, n, rows, n, p_b);
              pack_pairs(dp, n, rows, n, ds_b);
              pack_rows(dp, n, rows, n, ds_a);
              gemm_bf16_pairs(d, n, row_pairs, do_c, row_pairs, p_b, n, dv_t + j0, tk, true);          // dV^T += dO^T P
              gemm_bf16_pairs(d, n, row_pairs, q_c, row_pairs, ds_b, n, dk_t + j0, tk, true);          // dK^T += Q^T dS
              gemm_bf16_pairs(rows, d, n_pairs, ds_a, n_pairs, k_p + j0 / 2 * d, d, dq_acc, d, true);  // dQ += dS K
            }
            scatter_rows(dq_acc, d, 1, rows, d, 1.0f, dq + first_row * d, hq * d);
          }
        scatter_rows(dk_t, 1, tk, tk, d, 1.0f, dk + kv_offset, hkv * d);  // from [D, T]
        scatter_rows(dv_t, 1, tk, tk, d, 1.0f, dv + kv_offset, hkv * d);
      } catch (...) {
        errors.keep(std::current_exception());
      }
    }
  errors.rethrow();
}
}  // namespace

template <typename T>
void attention(const T* q, const T* k, const T* v, T* out, Acc<T>* lse, const AttentionShape& shape, double scale) {
  if constexpr (std::is_same_v<T, bfloat16>)
    if (bf16_dot_enabled()) return attention_bf16_dot(q, k, v, out, lse, shape, scale);
  attention_blocked(q, k, v, out, lse, shape, scale);
}

template <typename T>
void attention_backward(const T* q, const T* k, const T* v, const T* out, const Acc<T>* lse, const T* dout, T* dq,
                        T* dk, T* dv, const AttentionShape& shape, double scale) {
  if constexpr (std::is_same_v<T, bfloat16>)
    if (bf16_dot_enabled()) return attention_backward_bf16_dot(q, k, v, out, lse, dout, dq, dk, dv, shape, scale);
  attention_backward_blocked(q, k, v, out, lse, dout, dq, dk, dv, shape, scale);
}

#define MESHTRAIN_INSTANTIATE(T)                                                                                   \
  template void attention<T>(const T*, const T*, const T*, T*, Acc<T>*, const AttentionShape&, double);            \
  template void attention_backward<T>(const T*, const T*, const T*, const T*, const Acc<T>*, const T*, T*, T*, T*, \
                                      const AttentionShape&, double);
MESHTRAIN_INSTANTIATE(float)
MESHTRAIN_INSTANTIATE(double)
MESHTRAIN_INSTANTIATE(bfloat16)
#undef MESHTRAIN_INSTANTIATE

}  // namespace meshtrain::kernels::cpu
