#include "graph/builder.h"

namespace meshtrain::graph {

int Builder::full(const Shape& shape, DType dtype, double value) {
  return g_.apply1("full", {}, {{"shape", shape.dims()}, {"dtype", static_cast<int64_t>(dtype)}, {"value", value}});
}
int Builder::cast(int x, DType dtype) { return g_.apply1("cast", {x}, {{"dtype", static_cast<int64_t>(dtype)}}); }
int Builder::add(int a, int b) { return g_.apply1("add", {a, b}); }
int Builder::mul(int a, int b) { return g_.apply1("mul", {a, b}); }
int Builder::scale(int a, double alpha) { return g_.apply1("scale", {a}, {{"alpha", alpha}}); }
int Builder::matmul(int a, int b, bool ta, bool tb) {
  return g_.apply1("matmul", {a, b}, {{"transpose_a", int64_t{ta}}, {"transpose_b", int64_t{tb}}});
}
int Builder::sum(int a) { return g_.apply1("sum", {a}); }
int Builder::mean(int a) { return g_.apply1("mean", {a}); }
int Builder::broadcast_scalar(int s, const Shape& shape) {
  return g_.apply1("broadcast_scalar", {s}, {{"shape", shape.dims()}});
}
int Builder::reshape(int a, const Shape& shape) { return g_.apply1("reshape", {a}, {{"shape", shape.dims()}}); }
int Builder::transpose(int a, int d0, int d1) {
  return g_.apply1("transpose", {a}, {{"dim0", int64_t{d0}}, {"dim1", int64_t{d1}}});
}
int Builder::silu(int x) { return g_.apply1("silu", {x}); }
int Builder::softmax(int x) { return g_.apply1("softmax", {x}); }
int Builder::rms_norm(int x, int w, double eps) { return g_.apply1("rms_norm", {x, w}, {{"eps", eps}}); }
int Builder::cross_entropy(int logits, int targets, int64_t ignore_index) {
  return g_.apply1("cross_entropy", {logits, targets}, {{"ignore_index", ignore_index}});
}
int Builder::embedding(int table, int ids) { return g_.apply1("embedding", {table, ids}); }

int Builder::silu_backward(int x, int dy) { return g_.apply1("silu_backward", {x, dy}); }
int Builder::softmax_backward(int y, int dy) { return g_.apply1("softmax_backward", {y, dy}); }
std::vector<int> Builder::rms_norm_backward(int x, int w, int dy, double eps) {
  return g_.apply("rms_norm_backward", {x, w, dy}, {{"eps", eps}});
}
int Builder::cross_entropy_backward(int logits, int targets, int dloss, int64_t ignore_index) {
  return g_.apply1("cross_entropy_backward", {logits, targets, dloss}, {{"ignore_index", ignore_index}});
}
int Builder::embedding_backward(int ids, int dout, int64_t vocab) {
  return g_.apply1("embedding_backward", {ids, dout}, {{"vocab", vocab}});
}

int Builder::rope(int x, double theta) { return g_.apply1("rope", {x}, {{"theta", theta}, {"inverse", int64_t{0}}}); }
int Builder::attention(int q, int k, int v, double scale) {
  return g_.apply("attention", {q, k, v}, {{"scale", scale}})[0];
}
int Builder::swiglu(int gate, int up) { return g_.apply1("swiglu", {gate, up}); }
int Builder::slice(int x, int dim, int64_t start, int64_t length) {
  return g_.apply1("slice", {x}, {{"dim", int64_t{dim}}, {"start", start}, {"length", length}});
}
int Builder::concat(const std::vector<int>& xs, int dim) { return g_.apply1("concat", xs, {{"dim", int64_t{dim}}}); }
int Builder::global_norm(const std::vector<int>& xs) { return g_.apply1("global_norm", xs); }
int Builder::clip_coefficient(int norm, double max_norm) {
  return g_.apply1("clip_coefficient", {norm}, {{"max_norm", max_norm}});
}
int Builder::scale_by(int x, int scalar) { return g_.apply1("scale_by", {x, scalar}); }
std::vector<int> Builder::adamw(int param, int grad, int m, int v, int lr, int step, double beta1, double beta2,
                                double eps, double weight_decay) {
  return g_.apply("adamw", {param, grad, m, v, lr, step},
                  {{"beta1", beta1}, {"beta2", beta2}, {"eps", eps}, {"weight_decay", weight_decay}});
}
std::vector<int> Builder::attention_backward(int q, int k, int v, int out, int lse, int dout, double scale) {
  return g_.apply("attention_backward", {q, k, v, out, lse, dout}, {{"scale", scale}});
}
std::vector<int> Builder::swiglu_backward(int gate, int up, int dout) { return g_.apply("swiglu_backward", {gate, up, dout}); }
int Builder::slice_backward(int dout, int dim, int64_t start, int64_t full_size) {
  return g_.apply1("slice_backward", {dout}, {{"dim", int64_t{dim}}, {"start", start}, {"full_size", full_size}});
}

}  // namespace meshtrain::graph
