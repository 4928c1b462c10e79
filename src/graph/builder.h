// Builder: one typed function per op, so model code reads like the math.
// Each call adds a node to the graph and returns the output value id.
#pragma once

#include "graph/graph.h"

namespace meshtrain::graph {

class Builder {
 public:
  explicit Builder(Graph& g) : g_(g) {}
  Graph& graph() { return g_; }

  int full(const Shape& shape, DType dtype, double value);  // a constant
  int cast(int x, DType dtype);  // its backward casts the gradient back
  int add(int a, int b);
  int mul(int a, int b);
  int scale(int a, double alpha);
  // [..., M, K] @ [K, N] (weights shared over the batch) or [..., K, N];
  // transpose_a / transpose_b read a as [..., K, M], b as [N, K].
  int matmul(int a, int b, bool transpose_a = false, bool transpose_b = false);
  int sum(int a);   // all elements -> scalar
  int mean(int a);  // all elements -> scalar
  int broadcast_scalar(int scalar, const Shape& shape);
  int reshape(int a, const Shape& shape);
  int transpose(int a, int dim0, int dim1);
  int silu(int x);
  int softmax(int x);  // over the last dim
  int rms_norm(int x, int weight, double eps);  // over the last dim
  // Mean over rows whose target != ignore_index; targets i64.
  int cross_entropy(int logits, int targets, int64_t ignore_index = -100);
  int embedding(int table, int ids);  // ids i64 -> [..., dim]

  // Rotary embedding (HF rotate-half) of x [B, T, H, D] at positions 0..T-1.
  int rope(int x, double theta);
  // Causal attention, q [B, T, Hq, D], k/v [B, T, Hkv, D] -> [B, T, Hq, D].
  int attention(int q, int k, int v, double scale);
  int swiglu(int gate, int up);  // silu(gate) * up
  int slice(int x, int dim, int64_t start, int64_t length);
  int concat(const std::vector<int>& xs, int dim);
  // Optimizer-side ops (not differentiated).
  int global_norm(const std::vector<int>& xs);          // sqrt(sum of squares of all elements)
  int clip_coefficient(int norm, double max_norm);      // min(1, max_norm / (norm + 1e-6)), as PyTorch
  int scale_by(int x, int scalar);                      // x * scalar (a one-element tensor)
  // AdamW (PyTorch semantics); lr f64 and step i64 are scalar inputs -> {param, m, v} updated.
  std::vector<int> adamw(int param, int grad, int m, int v, int lr, int step, double beta1, double beta2, double eps,
                         double weight_decay);

  // Backward helpers (ops in their own right, used by backward rules).
  int silu_backward(int x, int dy);
  int softmax_backward(int y, int dy);
  std::vector<int> rms_norm_backward(int x, int weight, int dy, double eps);  // {dx, dweight}
  int cross_entropy_backward(int logits, int targets, int dloss, int64_t ignore_index);
  int embedding_backward(int ids, int dout, int64_t vocab);
  std::vector<int> attention_backward(int q, int k, int v, int out, int lse, int dout, double scale);
  std::vector<int> swiglu_backward(int gate, int up, int dout);
  int slice_backward(int dout, int dim, int64_t start, int64_t full_size);

 private:
  Graph& g_;
};

}  // namespace meshtrain::graph
