// Built-in ops: each defined once, with its shape rule, backward rule, FLOP
// count and CPU kernel side by side.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "graph/builder.h"
#include "graph/op_registry.h"
#include "kernels/cpu/bf16_matmul.h"
#include "kernels/cpu/cpu_kernels.h"

namespace meshtrain::graph {

namespace k = kernels::cpu;
using Infos = std::vector<ValueInfo>;

namespace {

// ---- helpers ---------------------------------------------------------------

void check_float(const ValueInfo& v, const char* what) {
  MT_CHECK(v.dtype == DType::f32 || v.dtype == DType::f64 || v.dtype == DType::bf16, "{} must be f32, f64 or bf16, got {}",
           what, dtype_name(v.dtype));
}

void check_same(const ValueInfo& a, const ValueInfo& b) {
  MT_CHECK(a.dtype == b.dtype, "dtypes differ: {} and {}", dtype_name(a.dtype), dtype_name(b.dtype));
  MT_CHECK(a.shape == b.shape, "shapes differ: {} and {}", a.shape.to_string(), b.shape.to_string());
}

// Run fn with a value of the C++ type that stores a float dtype (bf16: bfloat16,
// computed in f32 by the kernels).
template <typename Fn>
void by_float_type(DType t, Fn&& fn) {
  if (t == DType::f32) return fn(float{});
  if (t == DType::f64) return fn(double{});
  if (t == DType::bf16) return fn(bfloat16{});
  throw InvalidArgument(fmt::format("no CPU kernel for dtype {}", dtype_name(t)));
}

// As by_float_type, for the dtypes with a BLAS GEMM (bf16 GEMM is oneDNN's).
template <typename Fn>
void by_blas_type(DType t, Fn&& fn) {
  if (t == DType::f32) return fn(float{});
  if (t == DType::f64) return fn(double{});
  throw InvalidArgument(fmt::format("no BLAS GEMM for dtype {}", dtype_name(t)));
}

// The dtype a kernel accumulates in, as kernels::cpu::Acc: f32 for bf16, else the dtype itself.
DType accumulator_dtype(DType t) { return t == DType::bf16 ? DType::f32 : t; }

template <typename T> T* out_ptr(const KernelArgs& a, size_t i = 0) { return static_cast<T*>(a.out[i]->raw()); }
template <typename T> const T* in_ptr(const KernelArgs& a, size_t i) { return static_cast<const T*>(a.in[i]->raw()); }

double numel(const ValueInfo& v) { return static_cast<double>(v.shape.numel()); }
double bytes_of(const ValueInfo& v) { return numel(v) * static_cast<double>(dtype_size(v.dtype)); }
auto elementwise_flops(double per_element) {
  return [per_element](const Infos&, const Infos& out, const Attrs&) { return per_element * numel(out[0]); };
}
auto no_flops() {
  return [](const Infos&, const Infos&, const Attrs&) { return 0.0; };
}

// Rows and row length of a tensor reduced over its last dim.
std::pair<int64_t, int64_t> rows_of(const Tensor& t) {
  const int64_t d = t.shape().rank() ? t.shape().dim(-1) : 1;
  return {d ? t.numel() / d : 0, d};
}

Shape with_last_two(const Shape& batch_from, int64_t a, int64_t b) {
  std::vector<int64_t> dims(batch_from.dims().begin(), batch_from.dims().end() - 2);
  dims.push_back(a);
  dims.push_back(b);
  return Shape(dims);
}

// ---- matmul ------------------------------------------------------------------

struct MatmulDims {
  int64_t batch, m, n, k;
  bool b_shared;
};

MatmulDims matmul_dims(const Shape& a, const Shape& b, bool ta, bool tb) {
  MT_CHECK(a.rank() >= 2 && b.rank() >= 2, "matmul needs operands of rank >= 2");
  const int64_t m = a.dim(ta ? -1 : -2), ka = a.dim(ta ? -2 : -1);
  const int64_t kb = b.dim(tb ? -1 : -2), n = b.dim(tb ? -2 : -1);
  MT_CHECK(ka == kb, "inner dims differ: {} vs {}", ka, kb);
  const bool shared = b.rank() == 2;
  if (!shared)
    MT_CHECK(b.rank() == a.rank() &&
                 std::equal(a.dims().begin(), a.dims().end() - 2, b.dims().begin()),
             "batched operands need equal batch dims: {} and {}", a.to_string(), b.to_string());
  return {a.numel() / (a.dim(-1) * a.dim(-2)), m, n, ka, shared};
}

std::vector<int> matmul_backward(Builder& bd, const Node& node, const std::vector<int>& g) {
  const int a = node.inputs[0], b = node.inputs[1], dc = g[0];
  const bool ta = node.attrs.get_int("transpose_a") != 0, tb = node.attrs.get_int("transpose_b") != 0;
  const ValueInfo& ai = bd.graph().value(a).info;
  const bool shared = bd.graph().value(b).info.shape.rank() == 2 && ai.shape.rank() > 2;
  // C = op(A) op(B): dop(A) = dC op(B)^T, dop(B) = op(A)^T dC.
  const int da = ta ? bd.matmul(b, dc, tb, true) : bd.matmul(dc, b, false, !tb);
  int db;
  if (shared) {
    // B is shared over the batch: fold the batch into the rows of A and dC.
    MT_CHECK(!ta, "matmul backward with transpose_a over a batch and shared weights is not supported");
    const int64_t k_dim = ai.shape.dim(-1), n_dim = bd.graph().value(dc).info.shape.dim(-1);
    const int a2 = bd.reshape(a, {ai.shape.numel() / k_dim, k_dim});
    const int g2 = bd.reshape(dc, {bd.graph().value(dc).info.shape.numel() / n_dim, n_dim});
    db = tb ? bd.matmul(g2, a2, true, false) : bd.matmul(a2, g2, true, false);
  } else {
    db = tb ? bd.matmul(dc, a, true, ta) : bd.matmul(a, dc, !ta, false);
  }
  return {da, db};
}

// ---- registration ------------------------------------------------------------

void register_ops(std::map<std::string, OpDef>& ops) {
  auto def = [&](OpDef op) { ops.emplace(op.name, std::move(op)); };

  def({"full", 0,
       [](const Infos&, const Attrs& at) {
         const auto dtype = static_cast<DType>(at.get_int("dtype"));
         check_float({Shape{}, dtype}, "full dtype");
         at.get_float("value");
         return Infos{{Shape(at.get_ints("shape")), dtype}};
       },
       [](Builder&, const Node&, const std::vector<int>&) { return std::vector<int>{}; }, no_flops(),
       [](const KernelArgs& a) {
         by_float_type(a.out[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::fill(a.attrs.get_float("value"), out_ptr<T>(a), a.out[0]->numel());
         });
       }});

  def({"cast", 1,
       [](const Infos& in, const Attrs& at) {
         const auto dtype = static_cast<DType>(at.get_int("dtype"));
         check_float(in[0], "cast input");
         check_float({Shape{}, dtype}, "cast target");
         return Infos{{in[0].shape, dtype}};
       },
       [](Builder& b, const Node& n, const std::vector<int>& g) {
         return std::vector<int>{b.cast(g[0], b.graph().value(n.inputs[0]).info.dtype)};
       },
       elementwise_flops(1),
       [](const KernelArgs& a) {
         convert(a.in[0]->raw(), a.in[0]->dtype(), a.out[0]->raw(), a.out[0]->dtype(), static_cast<size_t>(a.in[0]->numel()));
       }});

  def({"add", 2,
       [](const Infos& in, const Attrs&) {
         check_float(in[0], "add input");
         check_same(in[0], in[1]);
         return Infos{in[0]};
       },
       [](Builder&, const Node&, const std::vector<int>& g) { return std::vector<int>{g[0], g[0]}; },
       elementwise_flops(1),
       [](const KernelArgs& a) {
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::add(in_ptr<T>(a, 0), in_ptr<T>(a, 1), out_ptr<T>(a), a.out[0]->numel());
         });
       }});

  def({"mul", 2,
       [](const Infos& in, const Attrs&) {
         check_float(in[0], "mul input");
         check_same(in[0], in[1]);
         return Infos{in[0]};
       },
       [](Builder& b, const Node& n, const std::vector<int>& g) {
         return std::vector<int>{b.mul(g[0], n.inputs[1]), b.mul(g[0], n.inputs[0])};
       },
       elementwise_flops(1),
       [](const KernelArgs& a) {
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::mul(in_ptr<T>(a, 0), in_ptr<T>(a, 1), out_ptr<T>(a), a.out[0]->numel());
         });
       }});

  def({"scale", 1,
       [](const Infos& in, const Attrs& at) {
         check_float(in[0], "scale input");
         at.get_float("alpha");
         return Infos{in[0]};
       },
       [](Builder& b, const Node& n, const std::vector<int>& g) {
         return std::vector<int>{b.scale(g[0], n.attrs.get_float("alpha"))};
       },
       elementwise_flops(1),
       [](const KernelArgs& a) {
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::scale(in_ptr<T>(a, 0), a.attrs.get_float("alpha"), out_ptr<T>(a), a.out[0]->numel());
         });
       }});

  def({"matmul", 2,
       [](const Infos& in, const Attrs& at) {
         check_float(in[0], "matmul A");
         MT_CHECK(in[0].dtype == in[1].dtype, "dtypes differ: {} and {}", dtype_name(in[0].dtype),
                  dtype_name(in[1].dtype));
         const bool ta = at.get_int("transpose_a") != 0, tb = at.get_int("transpose_b") != 0;
         const MatmulDims d = matmul_dims(in[0].shape, in[1].shape, ta, tb);
         return Infos{{with_last_two(in[0].shape, d.m, d.n), in[0].dtype}};
       },
       matmul_backward,
       [](const Infos& in, const Infos&, const Attrs& at) {
         const MatmulDims d = matmul_dims(in[0].shape, in[1].shape, at.get_int("transpose_a") != 0, at.get_int("transpose_b") != 0);
         return 2.0 * static_cast<double>(d.batch) * static_cast<double>(d.m) * static_cast<double>(d.n) *
                static_cast<double>(d.k);
       },
       [](const KernelArgs& a) {
         const bool ta = a.attrs.get_int("transpose_a") != 0, tb = a.attrs.get_int("transpose_b") != 0;
         const MatmulDims d = matmul_dims(a.in[0]->shape(), a.in[1]->shape(), ta, tb);
         const int64_t b_stride = d.b_shared ? 0 : d.k * d.n;
         if (a.in[0]->dtype() == DType::bf16)
           return k::matmul_bf16(in_ptr<uint16_t>(a, 0), in_ptr<uint16_t>(a, 1), out_ptr<uint16_t>(a), d.batch, d.m,
                                 d.n, d.k, ta, tb, d.m * d.k, b_stride);
         by_blas_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::matmul(in_ptr<T>(a, 0), in_ptr<T>(a, 1), out_ptr<T>(a), d.batch, d.m, d.n, d.k, ta, tb, d.m * d.k, b_stride);
         });
       }});

  def({"sum", 1,
       [](const Infos& in, const Attrs&) {
         check_float(in[0], "sum input");
         return Infos{{Shape{}, in[0].dtype}};
       },
       [](Builder& b, const Node& n, const std::vector<int>& g) {
         return std::vector<int>{b.broadcast_scalar(g[0], b.graph().value(n.inputs[0]).info.shape)};
       },
       [](const Infos& in, const Infos&, const Attrs&) { return numel(in[0]); },
       [](const KernelArgs& a) {
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           *out_ptr<T>(a) = k::store<T>(k::sum(in_ptr<T>(a, 0), a.in[0]->numel()));
         });
       }});

  def({"mean", 1,
       [](const Infos& in, const Attrs&) {
         check_float(in[0], "mean input");
         MT_CHECK(in[0].shape.numel() > 0, "mean of an empty tensor");
         return Infos{{Shape{}, in[0].dtype}};
       },
       [](Builder& b, const Node& n, const std::vector<int>& g) {
         const Shape& s = b.graph().value(n.inputs[0]).info.shape;
         return std::vector<int>{b.scale(b.broadcast_scalar(g[0], s), 1.0 / static_cast<double>(s.numel()))};
       },
       [](const Infos& in, const Infos&, const Attrs&) { return numel(in[0]); },
       [](const KernelArgs& a) {
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           *out_ptr<T>(a) = k::store<T>(k::sum(in_ptr<T>(a, 0), a.in[0]->numel()) / static_cast<double>(a.in[0]->numel()));
         });
       }});

  def({"broadcast_scalar", 1,
       [](const Infos& in, const Attrs& at) {
         check_float(in[0], "broadcast_scalar input");
         MT_CHECK(in[0].shape.numel() == 1, "input must hold one element, has shape {}", in[0].shape.to_string());
         return Infos{{Shape(at.get_ints("shape")), in[0].dtype}};
       },
       [](Builder& b, const Node&, const std::vector<int>& g) { return std::vector<int>{b.sum(g[0])}; },
       no_flops(),
       [](const KernelArgs& a) {
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::fill(static_cast<double>(k::load(*in_ptr<T>(a, 0))), out_ptr<T>(a), a.out[0]->numel());
         });
       }});

  def({"reshape", 1,
       [](const Infos& in, const Attrs& at) {
         const Shape s(at.get_ints("shape"));
         MT_CHECK(s.numel() == in[0].shape.numel(), "cannot reshape {} ({} elements) to {} ({} elements)",
                  in[0].shape.to_string(), in[0].shape.numel(), s.to_string(), s.numel());
         return Infos{{s, in[0].dtype}};
       },
       [](Builder& b, const Node& n, const std::vector<int>& g) {
         return std::vector<int>{b.reshape(g[0], b.graph().value(n.inputs[0]).info.shape)};
       },
       no_flops(), /*cpu_kernel=*/nullptr, /*view=*/true});

  def({"transpose", 1,
       [](const Infos& in, const Attrs& at) {
         const auto r = static_cast<int64_t>(in[0].shape.rank());
         const int64_t d0 = at.get_int("dim0"), d1 = at.get_int("dim1");
         MT_CHECK(d0 >= 0 && d0 < r && d1 >= 0 && d1 < r, "dims {} and {} out of range for rank {}", d0, d1, r);
         std::vector<int64_t> dims = in[0].shape.dims();
         std::swap(dims[d0], dims[d1]);
         return Infos{{Shape(dims), in[0].dtype}};
       },
       [](Builder& b, const Node& n, const std::vector<int>& g) {
         return std::vector<int>{b.transpose(g[0], static_cast<int>(n.attrs.get_int("dim0")),
                                             static_cast<int>(n.attrs.get_int("dim1")))};
       },
       no_flops(),
       [](const KernelArgs& a) {
         const auto& dims = a.in[0]->shape().dims();
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::transpose(in_ptr<T>(a, 0), out_ptr<T>(a), dims.data(), static_cast<int>(dims.size()),
                        static_cast<int>(a.attrs.get_int("dim0")), static_cast<int>(a.attrs.get_int("dim1")));
         });
       }});

  def({"silu", 1,
       [](const Infos& in, const Attrs&) {
         check_float(in[0], "silu input");
         return Infos{in[0]};
       },
       [](Builder& b, const Node& n, const std::vector<int>& g) {
         return std::vector<int>{b.silu_backward(n.inputs[0], g[0])};
       },
       elementwise_flops(4),
       [](const KernelArgs& a) {
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::silu(in_ptr<T>(a, 0), out_ptr<T>(a), a.out[0]->numel());
         });
       }});
  def({"silu_backward", 2,
       [](const Infos& in, const Attrs&) {
         check_same(in[0], in[1]);
         return Infos{in[0]};
       },
       nullptr, elementwise_flops(7),
       [](const KernelArgs& a) {
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::silu_backward(in_ptr<T>(a, 0), in_ptr<T>(a, 1), out_ptr<T>(a), a.out[0]->numel());
         });
       }});

  def({"softmax", 1,
       [](const Infos& in, const Attrs&) {
         check_float(in[0], "softmax input");
         MT_CHECK(in[0].shape.rank() >= 1, "softmax needs rank >= 1");
         return Infos{in[0]};
       },
       [](Builder& b, const Node& n, const std::vector<int>& g) {
         return std::vector<int>{b.softmax_backward(n.outputs[0], g[0])};
       },
       elementwise_flops(5),
       [](const KernelArgs& a) {
         const auto [rows, d] = rows_of(*a.in[0]);
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::softmax(in_ptr<T>(a, 0), out_ptr<T>(a), rows, d);
         });
       }});
  def({"softmax_backward", 2,
       [](const Infos& in, const Attrs&) {
         check_same(in[0], in[1]);
         return Infos{in[0]};
       },
       nullptr, elementwise_flops(4),
       [](const KernelArgs& a) {
         const auto [rows, d] = rows_of(*a.in[0]);
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::softmax_backward(in_ptr<T>(a, 0), in_ptr<T>(a, 1), out_ptr<T>(a), rows, d);
         });
       }});

  def({"rms_norm", 2,
       [](const Infos& in, const Attrs& at) {
         check_float(in[0], "rms_norm input");
         MT_CHECK(in[0].shape.rank() >= 1 && in[1].shape == Shape{in[0].shape.dim(-1)} && in[1].dtype == in[0].dtype,
                  "weight must be a {} vector of the last dim's size {}, got {}{}", dtype_name(in[0].dtype),
                  in[0].shape.rank() ? in[0].shape.dim(-1) : 0, dtype_name(in[1].dtype), in[1].shape.to_string());
         MT_CHECK(at.get_float("eps") >= 0, "eps must be >= 0");
         return Infos{in[0]};
       },
       [](Builder& b, const Node& n, const std::vector<int>& g) {
         return b.rms_norm_backward(n.inputs[0], n.inputs[1], g[0], n.attrs.get_float("eps"));
       },
       elementwise_flops(4),
       [](const KernelArgs& a) {
         const auto [rows, d] = rows_of(*a.in[0]);
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::rms_norm(in_ptr<T>(a, 0), in_ptr<T>(a, 1), out_ptr<T>(a), rows, d, a.attrs.get_float("eps"));
         });
       }});
  def({"rms_norm_backward", 3,
       [](const Infos& in, const Attrs&) {
         check_same(in[0], in[2]);
         return Infos{in[0], in[1]};
       },
       nullptr, elementwise_flops(8),
       [](const KernelArgs& a) {
         const auto [rows, d] = rows_of(*a.in[0]);
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::rms_norm_backward(in_ptr<T>(a, 0), in_ptr<T>(a, 1), in_ptr<T>(a, 2), out_ptr<T>(a, 0), out_ptr<T>(a, 1),
                                rows, d, a.attrs.get_float("eps"));
         });
       }});

  def({"cross_entropy", 2,
       [](const Infos& in, const Attrs& at) {
         check_float(in[0], "cross_entropy logits");
         MT_CHECK(in[1].dtype == DType::i64, "targets must be i64, got {}", dtype_name(in[1].dtype));
         MT_CHECK(in[0].shape.rank() >= 1 && in[0].shape.numel() == in[1].shape.numel() * in[0].shape.dim(-1),
                  "logits {} must be targets {} plus a vocabulary dim", in[0].shape.to_string(),
                  in[1].shape.to_string());
         at.get_int("ignore_index");
         // The loss of bf16 logits is f32, as under PyTorch's autocast.
         return Infos{{Shape{}, accumulator_dtype(in[0].dtype)}};
       },
       [](Builder& b, const Node& n, const std::vector<int>& g) {
         return std::vector<int>{
             b.cross_entropy_backward(n.inputs[0], n.inputs[1], g[0], n.attrs.get_int("ignore_index")), -1};
       },
       elementwise_flops(4),
       [](const KernelArgs& a) {
         const auto [rows, vocab] = rows_of(*a.in[0]);
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           *out_ptr<k::Acc<T>>(a) = static_cast<k::Acc<T>>(
               k::cross_entropy(in_ptr<T>(a, 0), in_ptr<int64_t>(a, 1), rows, vocab, a.attrs.get_int("ignore_index")));
         });
       }});
  def({"cross_entropy_backward", 3,
       [](const Infos& in, const Attrs&) { return Infos{in[0]}; }, nullptr, elementwise_flops(6),
       [](const KernelArgs& a) {
         const auto [rows, vocab] = rows_of(*a.in[0]);
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::cross_entropy_backward(in_ptr<T>(a, 0), in_ptr<int64_t>(a, 1), *in_ptr<k::Acc<T>>(a, 2), out_ptr<T>(a), rows,
                                     vocab, a.attrs.get_int("ignore_index"));
         });
       }});

  def({"embedding", 2,
       [](const Infos& in, const Attrs&) {
         check_float(in[0], "embedding table");
         MT_CHECK(in[0].shape.rank() == 2, "table must be [vocab, dim], got {}", in[0].shape.to_string());
         MT_CHECK(in[1].dtype == DType::i64, "ids must be i64, got {}", dtype_name(in[1].dtype));
         std::vector<int64_t> dims = in[1].shape.dims();
         dims.push_back(in[0].shape.dim(1));
         return Infos{{Shape(dims), in[0].dtype}};
       },
       [](Builder& b, const Node& n, const std::vector<int>& g) {
         const int64_t vocab = b.graph().value(n.inputs[0]).info.shape.dim(0);
         return std::vector<int>{b.embedding_backward(n.inputs[1], g[0], vocab), -1};
       },
       no_flops(),
       [](const KernelArgs& a) {
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::embedding(in_ptr<T>(a, 0), in_ptr<int64_t>(a, 1), out_ptr<T>(a), a.in[1]->numel(),
                        a.in[0]->shape().dim(0), a.in[0]->shape().dim(1));
         });
       },
       /*view=*/false,
       [](const Infos& in, const Infos& out, const Attrs&) {  // the ids and the rows gathered, not the table
         return bytes_of(in[1]) + 2 * bytes_of(out[0]);
       }});
  def({"embedding_backward", 2,
       [](const Infos& in, const Attrs& at) {
         return Infos{{Shape{at.get_int("vocab"), in[1].shape.dim(-1)}, in[1].dtype}};
       },
       nullptr, no_flops(),
       [](const KernelArgs& a) {
         by_float_type(a.in[1]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::embedding_backward(in_ptr<int64_t>(a, 0), in_ptr<T>(a, 1), out_ptr<T>(a), a.in[0]->numel(),
                                 a.out[0]->shape().dim(0), a.out[0]->shape().dim(1));
         });
       }});
}

// [outer, dim, inner] around dim d of a shape.
struct AroundDim {
  int64_t outer = 1, dim = 0, inner = 1;
};
AroundDim around(const Shape& s, int64_t d) {
  AroundDim a;
  for (int64_t k = 0; k < d; ++k) a.outer *= s[static_cast<size_t>(k)];
  a.dim = s[static_cast<size_t>(d)];
  for (size_t k = static_cast<size_t>(d) + 1; k < s.rank(); ++k) a.inner *= s[k];
  return a;
}

void check_attention(const Infos& in) {
  for (const auto& v : in) MT_CHECK(v.shape.rank() == 4, "q, k, v must be [B, T, H, D], got {}", v.shape.to_string());
  MT_CHECK(in[1].shape == in[2].shape, "k {} and v {} differ", in[1].shape.to_string(), in[2].shape.to_string());
  const auto& q = in[0].shape;
  const auto& k = in[1].shape;
  MT_CHECK(q[0] == k[0] && q[1] == k[1] && q[3] == k[3], "q {} and k {} must agree on B, T and D", q.to_string(),
           k.to_string());
  MT_CHECK(k[2] > 0 && q[2] % k[2] == 0, "query heads {} must be a multiple of key/value heads {}", q[2], k[2]);
}

void register_more_ops(std::map<std::string, OpDef>& ops) {
  auto def = [&](OpDef op) { ops.emplace(op.name, std::move(op)); };

  def({"rope", 1,
       [](const Infos& in, const Attrs& at) {
         check_float(in[0], "rope input");
         MT_CHECK(in[0].shape.rank() == 4 && in[0].shape[3] % 2 == 0, "x must be [B, T, H, D] with D even, got {}",
                  in[0].shape.to_string());
         MT_CHECK(at.get_float("theta") > 0, "theta must be positive");
         return Infos{in[0]};
       },
       [](Builder& b, const Node& n, const std::vector<int>& g) {
         // The rotation's transpose is the rotation by the opposite angle.
         return std::vector<int>{b.graph().apply1("rope", {g[0]}, {{"theta", n.attrs.get_float("theta")},
                                                                  {"inverse", int64_t{1 - n.attrs.get_int("inverse")}}})};
       },
       elementwise_flops(3),
       [](const KernelArgs& a) {
         const auto& s = a.in[0]->shape();
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::rope(in_ptr<T>(a, 0), out_ptr<T>(a), s[0], s[1], s[2], s[3], a.attrs.get_float("theta"),
                   a.attrs.get_int("inverse") != 0);
         });
       }});

  def({"attention", 3,
       [](const Infos& in, const Attrs& at) {
         check_float(in[0], "attention q");
         check_attention(in);
         at.get_float("scale");
         const auto& q = in[0].shape;
         // out, and the row log-sum-exp, kept in f32 for bf16 (as flash attention does)
         return Infos{in[0], {Shape{q[0], q[2], q[1]}, accumulator_dtype(in[0].dtype)}};
       },
       [](Builder& b, const Node& n, const std::vector<int>& g) {
         return b.attention_backward(n.inputs[0], n.inputs[1], n.inputs[2], n.outputs[0], n.outputs[1], g[0],
                                     n.attrs.get_float("scale"));
       },
       [](const Infos& in, const Infos&, const Attrs&) {
         const auto& q = in[0].shape;  // QK^T and PV over the causal half
         return 2.0 * static_cast<double>(q[0] * q[2] * q[3]) * static_cast<double>(q[1]) * static_cast<double>(q[1] + 1);
       },
       [](const KernelArgs& a) {
         const auto& q = a.in[0]->shape();
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::attention(in_ptr<T>(a, 0), in_ptr<T>(a, 1), in_ptr<T>(a, 2), out_ptr<T>(a, 0), out_ptr<k::Acc<T>>(a, 1), q[0], q[1],
                        q[2], a.in[1]->shape()[2], q[3], a.attrs.get_float("scale"));
         });
       }});
  def({"attention_backward", 6,
       [](const Infos& in, const Attrs&) { return Infos{in[0], in[1], in[2]}; }, nullptr,
       [](const Infos& in, const Infos&, const Attrs&) {
         const auto& q = in[0].shape;
         return 4.0 * static_cast<double>(q[0] * q[2] * q[3]) * static_cast<double>(q[1]) * static_cast<double>(q[1] + 1);
       },
       [](const KernelArgs& a) {
         const auto& q = a.in[0]->shape();
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::attention_backward(in_ptr<T>(a, 0), in_ptr<T>(a, 1), in_ptr<T>(a, 2), in_ptr<T>(a, 3), in_ptr<k::Acc<T>>(a, 4),
                                 in_ptr<T>(a, 5), out_ptr<T>(a, 0), out_ptr<T>(a, 1), out_ptr<T>(a, 2), q[0], q[1], q[2],
                                 a.in[1]->shape()[2], q[3], a.attrs.get_float("scale"));
         });
       }});

  def({"swiglu", 2,
       [](const Infos& in, const Attrs&) {
         check_float(in[0], "swiglu gate");
         check_same(in[0], in[1]);
         return Infos{in[0]};
       },
       [](Builder& b, const Node& n, const std::vector<int>& g) {
         return b.swiglu_backward(n.inputs[0], n.inputs[1], g[0]);
       },
       elementwise_flops(5),
       [](const KernelArgs& a) {
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::swiglu(in_ptr<T>(a, 0), in_ptr<T>(a, 1), out_ptr<T>(a), a.out[0]->numel());
         });
       }});
  def({"swiglu_backward", 3,
       [](const Infos& in, const Attrs&) { return Infos{in[0], in[1]}; }, nullptr, elementwise_flops(9),
       [](const KernelArgs& a) {
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::swiglu_backward(in_ptr<T>(a, 0), in_ptr<T>(a, 1), in_ptr<T>(a, 2), out_ptr<T>(a, 0), out_ptr<T>(a, 1),
                              a.out[0]->numel());
         });
       }});

  def({"slice", 1,
       [](const Infos& in, const Attrs& at) {
         const int64_t d = at.get_int("dim"), start = at.get_int("start"), len = at.get_int("length");
         MT_CHECK(d >= 0 && d < static_cast<int64_t>(in[0].shape.rank()), "dim {} out of range", d);
         MT_CHECK(start >= 0 && len >= 0 && start + len <= in[0].shape[static_cast<size_t>(d)],
                  "[{}, {}) is outside dim {} of size {}", start, start + len, d, in[0].shape[static_cast<size_t>(d)]);
         std::vector<int64_t> dims = in[0].shape.dims();
         dims[static_cast<size_t>(d)] = len;
         return Infos{{Shape(dims), in[0].dtype}};
       },
       [](Builder& b, const Node& n, const std::vector<int>& g) {
         const int64_t d = n.attrs.get_int("dim");
         return std::vector<int>{b.slice_backward(g[0], static_cast<int>(d), n.attrs.get_int("start"),
                                                  b.graph().value(n.inputs[0]).info.shape[static_cast<size_t>(d)])};
       },
       no_flops(),
       [](const KernelArgs& a) {
         const int64_t d = a.attrs.get_int("dim");
         const AroundDim s = around(a.in[0]->shape(), d);
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::copy_slice(in_ptr<T>(a, 0), out_ptr<T>(a), s.outer, s.dim, a.attrs.get_int("length"),
                         a.attrs.get_int("start"), 0, a.attrs.get_int("length"), s.inner);
         });
       },
       /*view=*/false,
       [](const Infos&, const Infos& out, const Attrs&) { return 2 * bytes_of(out[0]); }});  // the slice only
  def({"slice_backward", 1,
       [](const Infos& in, const Attrs& at) {
         std::vector<int64_t> dims = in[0].shape.dims();
         dims[static_cast<size_t>(at.get_int("dim"))] = at.get_int("full_size");
         return Infos{{Shape(dims), in[0].dtype}};
       },
       nullptr, no_flops(),
       [](const KernelArgs& a) {
         const int64_t d = a.attrs.get_int("dim");
         const AroundDim s = around(a.in[0]->shape(), d);
         std::memset(a.out[0]->raw(), 0, a.out[0]->nbytes());
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::copy_slice(in_ptr<T>(a, 0), out_ptr<T>(a), s.outer, s.dim, a.attrs.get_int("full_size"), 0,
                         a.attrs.get_int("start"), s.dim, s.inner);
         });
       }});

  def({"concat", -1,
       [](const Infos& in, const Attrs& at) {
         MT_CHECK(!in.empty(), "concat needs at least one input");
         const int64_t d = at.get_int("dim");
         MT_CHECK(d >= 0 && d < static_cast<int64_t>(in[0].shape.rank()), "dim {} out of range", d);
         std::vector<int64_t> dims = in[0].shape.dims();
         dims[static_cast<size_t>(d)] = 0;
         for (const auto& v : in) {
           MT_CHECK(v.dtype == in[0].dtype && v.shape.rank() == in[0].shape.rank(), "inputs differ in dtype or rank");
           for (size_t k2 = 0; k2 < dims.size(); ++k2)
             MT_CHECK(static_cast<int64_t>(k2) == d || v.shape[k2] == in[0].shape[k2],
                      "inputs differ outside dim {}: {} vs {}", d, v.shape.to_string(), in[0].shape.to_string());
           dims[static_cast<size_t>(d)] += v.shape[static_cast<size_t>(d)];
         }
         return Infos{{Shape(dims), in[0].dtype}};
       },
       [](Builder& b, const Node& n, const std::vector<int>& g) {
         const int64_t d = n.attrs.get_int("dim");
         std::vector<int> grads;
         int64_t start = 0;
         for (int x : n.inputs) {
           const int64_t len = b.graph().value(x).info.shape[static_cast<size_t>(d)];
           grads.push_back(b.slice(g[0], static_cast<int>(d), start, len));
           start += len;
         }
         return grads;
       },
       no_flops(),
       [](const KernelArgs& a) {
         const int64_t d = a.attrs.get_int("dim");
         const AroundDim o = around(a.out[0]->shape(), d);
         int64_t start = 0;
         for (const Tensor* x : a.in) {
           const AroundDim s = around(x->shape(), d);
           by_float_type(x->dtype(), [&](auto z) {
             using T = decltype(z);
             k::copy_slice(static_cast<const T*>(x->raw()), out_ptr<T>(a), s.outer, s.dim, o.dim, 0, start, s.dim, s.inner);
           });
           start += s.dim;
         }
       }});

  def({"global_norm", -1,
       [](const Infos& in, const Attrs&) {
         MT_CHECK(!in.empty(), "global_norm needs at least one tensor");
         for (const auto& v : in) check_float(v, "global_norm input");
         return Infos{{Shape{}, in[0].dtype}};
       },
       nullptr,
       [](const Infos& in, const Infos&, const Attrs&) {
         double n = 0;
         for (const auto& v : in) n += 2 * numel(v);
         return n;
       },
       [](const KernelArgs& a) {
         double total = 0;
         for (const Tensor* x : a.in)
           by_float_type(x->dtype(), [&](auto z) {
             using T = decltype(z);
             total += k::sum_squares(static_cast<const T*>(x->raw()), x->numel());
           });
         a.out[0]->set(0, std::sqrt(total));
       }});
  def({"clip_coefficient", 1,
       [](const Infos& in, const Attrs& at) {
         MT_CHECK(in[0].shape.numel() == 1, "norm must be a scalar");
         MT_CHECK(at.get_float("max_norm") > 0, "max_norm must be positive");
         return Infos{in[0]};
       },
       nullptr, no_flops(),
       [](const KernelArgs& a) {
         // torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), clamped to at most 1.
         a.out[0]->set(0, std::min(1.0, a.attrs.get_float("max_norm") / (a.in[0]->get(0) + 1e-6)));
       }});
  def({"scale_by", 2,
       [](const Infos& in, const Attrs&) {
         check_float(in[0], "scale_by input");
         MT_CHECK(in[1].shape.numel() == 1, "the scale must be one element, got {}", in[1].shape.to_string());
         return Infos{in[0]};
       },
       nullptr, elementwise_flops(1),
       [](const KernelArgs& a) {
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::scale(in_ptr<T>(a, 0), a.in[1]->get(0), out_ptr<T>(a), a.out[0]->numel());
         });
       }});

  def({"adamw", 6,
       [](const Infos& in, const Attrs& at) {
         check_float(in[0], "adamw param");
         check_same(in[0], in[1]);
         // Moments: the param's dtype, or bf16 for f32 params (f32 math either way).
         MT_CHECK(in[2].shape == in[0].shape && in[3] == in[2], "moments must have the param's shape {}, got {} and {}",
                  in[0].shape.to_string(), in[2].shape.to_string(), in[3].shape.to_string());
         MT_CHECK(in[2].dtype == in[0].dtype || (in[0].dtype == DType::f32 && in[2].dtype == DType::bf16),
                  "moments of a {} param must be {}{}, got {}", dtype_name(in[0].dtype), dtype_name(in[0].dtype),
                  in[0].dtype == DType::f32 ? " or bf16" : "", dtype_name(in[2].dtype));
         MT_CHECK(in[4].shape.numel() == 1 && in[4].dtype == DType::f64, "lr must be one f64 element");
         MT_CHECK(in[5].shape.numel() == 1 && in[5].dtype == DType::i64, "step must be one i64 element");
         for (const char* key : {"beta1", "beta2", "eps", "weight_decay"}) at.get_float(key);
         return Infos{in[0], in[2], in[3]};  // param, m, v after the step
       },
       nullptr, elementwise_flops(12),
       [](const KernelArgs& a) {
         const int64_t step = static_cast<const int64_t*>(a.in[5]->raw())[0];
         MT_CHECK(step >= 1, "adamw: step must be >= 1 (bias correction), got {}", step);
         // The graph is functional: update copies (the trainer writes them back).
         std::memcpy(a.out[0]->raw(), a.in[0]->raw(), a.in[0]->nbytes());  // param
         std::memcpy(a.out[1]->raw(), a.in[2]->raw(), a.in[2]->nbytes());  // m
         std::memcpy(a.out[2]->raw(), a.in[3]->raw(), a.in[3]->nbytes());  // v
         const double lr = static_cast<const double*>(a.in[4]->raw())[0];
         auto run = [&](auto param_type, auto state_type) {
           using T = decltype(param_type);
           using S = decltype(state_type);
           k::adamw(out_ptr<T>(a, 0), in_ptr<T>(a, 1), out_ptr<S>(a, 1), out_ptr<S>(a, 2), a.in[0]->numel(), lr,
                    a.attrs.get_float("beta1"), a.attrs.get_float("beta2"), a.attrs.get_float("eps"),
                    a.attrs.get_float("weight_decay"), step);
         };
         if (a.in[0]->dtype() == DType::f32 && a.in[2]->dtype() == DType::bf16) return run(float{}, bfloat16{});
         by_float_type(a.in[0]->dtype(), [&](auto z) { run(z, z); });
       }});
}

}  // namespace

double op_flops(const OpDef& op, const Infos& in, const Infos& out, const Attrs& attrs) {
  return op.flops ? op.flops(in, out, attrs) : 0.0;
}

double op_bytes(const OpDef& op, const Infos& in, const Infos& out, const Attrs& attrs) {
  if (op.view) return 0;
  if (op.bytes) return op.bytes(in, out, attrs);
  double total = 0;
  for (const ValueInfo& v : in) total += bytes_of(v);
  for (const ValueInfo& v : out) total += bytes_of(v);
  return total;
}

void run_cpu_kernel(const OpDef& op, const KernelArgs& args) {
  MT_CHECK(static_cast<bool>(op.cpu_kernel), "op {} has no CPU kernel", op.name);
  op.cpu_kernel(args);
}

const OpDef& find_op(const std::string& name) {
  static const std::map<std::string, OpDef> ops = [] {
    std::map<std::string, OpDef> m;
    register_ops(m);
    register_more_ops(m);
    return m;
  }();
  auto it = ops.find(name);
  if (it == ops.end()) {
    std::string known;
    for (const auto& [n, _] : ops) known += (known.empty() ? "" : ", ") + n;
    throw InvalidArgument(fmt::format("unknown op '{}'; registered ops: {}", name, known));
  }
  return it->second;
}

}  // namespace meshtrain::graph
