// CPU loops of the mixture-of-experts ops (graph/ops/moe.cpp): routing,
// the permutation into expert runs and back, and the grouped GEMM over the
// runs. Tokens come in `groups` of n tokens (each sorted on its own); each
// token has k slots, slot s = t k + j, and a group's m = n k permuted rows.
// Templated on float, double and bfloat16 (computed in f32, rounded once).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace meshtrain::kernels::cpu {

// For each of `rows` rows of e probabilities: the k largest's indices, in
// descending order, ties to the lower index.
template <typename T>
void moe_topk(const T* probs, int64_t* experts, int64_t rows, int64_t e, int64_t k);
// weights[r, j] = probs[r, experts[r, j]] / sum over j of the same.
template <typename T>
void moe_route_weights(const T* probs, const int64_t* experts, T* weights, int64_t rows, int64_t e, int64_t k);
template <typename T>
void moe_route_weights_backward(const T* probs, const int64_t* experts, const T* dweights, T* dprobs, int64_t rows,
                                int64_t e, int64_t k);

// Each group's slots stably sorted by expert: order[p] the slot of row p,
// row_expert[p] its expert. capacity_factor > 0 keeps at most
// ceil(capacity_factor n k / e) slots per expert and group (the first in slot
// order); the rest go last with row_expert = e. Returns the slots dropped.
int64_t moe_sort(const int64_t* experts, int64_t* order, int64_t* row_expert, int64_t groups, int64_t n, int64_t k,
                 int64_t e, double capacity_factor);
// counts[x] = how many of the `count` entries equal x, for x in [0, e).
void moe_expert_counts(const int64_t* experts, float* counts, int64_t count, int64_t e);

// rows[p] = w[order[p]] x[order[p] / k] (w null: 1), each row d long.
template <typename T>
void moe_permute(const T* x, const int64_t* order, const T* w, T* rows, int64_t groups, int64_t n, int64_t k,
                 int64_t d);
// out[t] = sum over j of w[t k + j] rows[p], p the row holding slot t k + j (w null: 1).
template <typename T>
void moe_combine(const T* rows, const int64_t* order, const T* w, T* out, int64_t groups, int64_t n, int64_t k,
                 int64_t d);
// out[t k + j] = a[t] . rows[p], p the row holding slot t k + j.
template <typename T>
void moe_combine_weight_grad(const T* a, const T* rows, const int64_t* order, T* out, int64_t groups, int64_t n,
                             int64_t k, int64_t d);

// Each group's m rows (row_len long, in expert order) of block b, experts
// [b e / blocks, (b + 1) e / blocks), to the front of out[b, group] ([blocks,
// groups, m, row_len]), `fill` after them; undispatch puts them back, and
// the dropped rows (expert >= e) are 0.
template <typename T>
void moe_dispatch(const T* rows, const int64_t* row_expert, T* out, int64_t groups, int64_t m, int64_t row_len,
                  int64_t e, int64_t blocks, T fill);
template <typename T>
void moe_undispatch(const T* in, const int64_t* row_expert, T* rows, int64_t groups, int64_t m, int64_t row_len,
                    int64_t e, int64_t blocks);

// out[r] = x[r] @ w[row_expert[r] - first]^T (w [e, n_out, k_in], experts
// first .. first + e - 1) or @ w[...] (w [e, k_in, n_out]) over runs of one
// expert; rows of other experts (dropped, or another rank's) are 0.
template <typename T>
void grouped_matmul(const T* x, const T* w, const int64_t* row_expert, T* out, int64_t rows, int64_t e, int64_t n_out,
                    int64_t k_in, bool transpose_b, int64_t first = 0);
// out[x] = sum over rows r of expert first + x of a[r]^T b[r] ([e, p, q]).
template <typename T>
void grouped_matmul_wgrad(const T* a, const T* b, const int64_t* row_expert, T* out, int64_t rows, int64_t e, int64_t p,
                          int64_t q, int64_t first = 0);

}  // namespace meshtrain::kernels::cpu
