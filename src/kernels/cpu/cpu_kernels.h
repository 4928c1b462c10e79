// CPU compute kernels: plain loops over contiguous row-major buffers, one
// function per kernel, readable top to bottom (llm.c style), vectorized by
// the compiler and threaded with OpenMP. GEMM calls BLAS (bf16 GEMM:
// bf16_matmul.h).
//
// Templated on the element type T: float, double (float64 references for
// gradient checks) or bfloat16. bf16 elements are widened on load and rounded
// once on store; the math runs in Acc<T> (float for bf16 and float, double
// for double), so a bf16 kernel computes what the f32 kernel computes on the
// same (bf16-representable) values, up to the final rounding.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "graph/sequence_order.h"

namespace meshtrain::kernels::cpu {

using meshtrain::bfloat16;

template <typename T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

[[gnu::always_inline]] inline float load(bfloat16 x) { return bf16_to_f32(x); }
inline float load(float x) { return x; }
inline double load(double x) { return x; }
template <typename T, typename V>
[[gnu::always_inline]] inline T store(V v) {
  if constexpr (std::is_same_v<T, bfloat16>)
    return f32_to_bf16(static_cast<float>(v));
  else
    return static_cast<T>(v);
}

// C[b] = op(A[b]) @ op(B[b]) for b in [0, batch); op transposes when asked.
// A is M x K (K x M if transpose_a), B is K x N (N x K if transpose_b);
// a_stride / b_stride: elements between batches (0: shared across batches).
// float and double only; bf16 GEMM is matmul_bf16 (oneDNN).
template <typename T>
void matmul(const T* a, const T* b, T* c, int64_t batch, int64_t m, int64_t n, int64_t k, bool transpose_a,
            bool transpose_b, int64_t a_stride, int64_t b_stride, bool accumulate = false);

template <typename T>
void add(const T* a, const T* b, T* out, int64_t n);
template <typename T>
void mul(const T* a, const T* b, T* out, int64_t n);
template <typename T>
void scale(const T* a, double alpha, T* out, int64_t n);
template <typename T>
void fill(double value, T* out, int64_t n);
template <typename T>
double sum(const T* a, int64_t n);  // accumulates in double
template <typename T>
double sum_squares(const T* a, int64_t n);  // accumulates in double
// Swap dims d0 < d1 of a row-major tensor of the given shape.
template <typename T>
void transpose(const T* a, T* out, const int64_t* shape, int rank, int d0, int d1);

template <typename T>
void silu(const T* x, T* y, int64_t n);
template <typename T>
void silu_backward(const T* x, const T* dy, T* dx, int64_t n);

// Over rows of length d.
template <typename T>
void softmax(const T* x, T* y, int64_t rows, int64_t d);
template <typename T>
void softmax_backward(const T* y, const T* dy, T* dx, int64_t rows, int64_t d);
// y = x / rms(x) * w, rms = sqrt(mean(x^2) + eps).
template <typename T>
void rms_norm(const T* x, const T* w, T* y, int64_t rows, int64_t d, double eps);
template <typename T>
void rms_norm_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, int64_t rows, int64_t d, double eps);

// Sum over non-ignored rows of -log softmax(logits)[target], in double;
// targets are int64. Backward: dlogits = (softmax - onehot(target)) * scale
// on those rows, zero on ignored ones.
template <typename T>
double cross_entropy(const T* logits, const int64_t* targets, int64_t rows, int64_t vocab, int64_t ignore_index);
template <typename T>
void cross_entropy_backward(const T* logits, const int64_t* targets, double scale, T* dlogits, int64_t rows,
                            int64_t vocab, int64_t ignore_index);

// out[i, :] = table[ids[i] - first_row, :] for a table holding rows
// [first_row, first_row + rows) of `total_rows` (a vocab-parallel part;
// the whole table: 0 and rows); zeros for another part's ids. Backward
// accumulates the rows of this part into dtable.
template <typename T>
void embedding(const T* table, const int64_t* ids, T* out, int64_t n, int64_t rows, int64_t dim, int64_t first_row,
               int64_t total_rows);
template <typename T>
void embedding_backward(const int64_t* ids, const T* dout, T* dtable, int64_t n, int64_t rows, int64_t dim,
                        int64_t first_row);

// Rotary embedding, Hugging Face Llama's rotate-half convention, on x
// [B, T, H, D], row t at position order.position(t) (0..T-1 by default):
// out = x * cos + rotate_half(x) * sin, with angle pos * theta^(-2i/D) for
// i < D/2 shared by both halves.
template <typename T>
void rope(const T* x, T* out, int64_t b, int64_t t, int64_t h, int64_t d, double theta, bool inverse,
          const graph::SequenceOrder& order = {});

// The shapes of causal attention: q [B, Tq, Hq, D], k and v [B, Tk, Hkv, D],
// Hq a multiple of Hkv; query row i at position `queries.position(i)` sees
// the keys at positions 0 to its own (the keys are in position order).
struct AttentionShape {
  int64_t b, tq, tk, hq, hkv, d;
  graph::SequenceOrder queries;
  int64_t key_first = 0;  // the position of key 0; the keys are tk contiguous positions from it
};
// Causal scaled-dot-product attention with grouped-query heads,
// flash-attention style: blocks of queries against blocks of keys with an
// online softmax, so no Tq x Tk buffer exists. Writes out [B, Tq, Hq, D] and
// the row log-sum-exp lse [B, Hq, Tq] (in Acc<T>) for the backward pass,
// which recomputes the scores block by block. A query that sees none of the
// keys (all after it) gets 0 and an lse of -inf.
template <typename T>
void attention(const T* q, const T* k, const T* v, T* out, Acc<T>* lse, const AttentionShape& shape, double scale);
template <typename T>
void attention_backward(const T* q, const T* k, const T* v, const T* out, const Acc<T>* lse, const T* dout, T* dq,
                        T* dk, T* dv, const AttentionShape& shape, double scale);

// out = silu(gate) * up, and its backward.
template <typename T>
void swiglu(const T* gate, const T* up, T* out, int64_t n);
template <typename T>
void swiglu_backward(const T* gate, const T* up, const T* dout, T* dgate, T* dup, int64_t n);

// Copy rows [start, start + len) of dim d (seen as [outer, dim, inner]) to or from a packed block.
template <typename T>
void copy_slice(const T* src, T* dst, int64_t outer, int64_t src_dim, int64_t dst_dim, int64_t src_start,
                int64_t dst_start, int64_t len, int64_t inner);

// PyTorch's torch.optim.AdamW step on n elements (decoupled weight decay, bias
// correction); math in Acc<T> (f32 for f32 and bf16 params, as PyTorch's;
// f64 for f64); the moments are stored as S (T, or bf16 for f32 params).
template <typename T, typename S>
void adamw(T* param, const T* grad, S* m, S* v, int64_t n, double lr, double beta1, double beta2, double eps,
           double weight_decay, int64_t step);

}  // namespace meshtrain::kernels::cpu
