// Built-in ops: each defined once, with its shape rule, backward rule, FLOP
// count and CPU kernel side by side.
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "graph/builder.h"
#include "graph/op_registry.h"
#include "kernels/cpu/cpu_kernels.h"

namespace meshtrain::graph {

namespace k = kernels::cpu;
using Infos = std::vector<ValueInfo>;

namespace {

// ---- helpers ---------------------------------------------------------------

void check_float(const ValueInfo& v, const char* what) {
  MT_CHECK(v.dtype == DType::f32 || v.dtype == DType::f64, "{} must be f32 or f64 (bf16 compute comes later), got {}",
           what, dtype_name(v.dtype));
}

void check_same(const ValueInfo& a, const ValueInfo& b) {
  MT_CHECK(a.dtype == b.dtype, "dtypes differ: {} and {}", dtype_name(a.dtype), dtype_name(b.dtype));
  MT_CHECK(a.shape == b.shape, "shapes differ: {} and {}", a.shape.to_string(), b.shape.to_string());
}

// Run fn with a zero of the C++ type that stores a float dtype.
template <typename Fn>
void by_float_type(DType t, Fn&& fn) {
  if (t == DType::f32) return fn(float{});
  if (t == DType::f64) return fn(double{});
  throw InvalidArgument(fmt::format("no CPU kernel for dtype {}", dtype_name(t)));
}

template <typename T> T* out_ptr(const KernelArgs& a, size_t i = 0) { return static_cast<T*>(a.out[i]->raw()); }
template <typename T> const T* in_ptr(const KernelArgs& a, size_t i) { return static_cast<const T*>(a.in[i]->raw()); }

double numel(const ValueInfo& v) { return static_cast<double>(v.shape.numel()); }
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

MatmulDims matmul_dims(const ValueInfo& a, const ValueInfo& b, bool ta, bool tb) {
  MT_CHECK(a.shape.rank() >= 2 && b.shape.rank() >= 2, "matmul needs operands of rank >= 2");
  const int64_t m = a.shape.dim(ta ? -1 : -2), ka = a.shape.dim(ta ? -2 : -1);
  const int64_t kb = b.shape.dim(tb ? -1 : -2), n = b.shape.dim(tb ? -2 : -1);
  MT_CHECK(ka == kb, "inner dims differ: {} vs {}", ka, kb);
  const bool shared = b.shape.rank() == 2;
  if (!shared)
    MT_CHECK(b.shape.rank() == a.shape.rank() &&
                 std::equal(a.shape.dims().begin(), a.shape.dims().end() - 2, b.shape.dims().begin()),
             "batched operands need equal batch dims: {} and {}", a.shape.to_string(), b.shape.to_string());
  return {a.shape.numel() / (a.shape.dim(-1) * a.shape.dim(-2)), m, n, ka, shared};
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
         MT_CHECK(dtype == DType::f32 || dtype == DType::f64, "full: dtype must be f32 or f64");
         at.get_float("value");
         return Infos{{Shape(at.get_ints("shape")), dtype}};
       },
       [](Builder&, const Node&, const std::vector<int>&) { return std::vector<int>{}; }, no_flops(),
       [](const KernelArgs& a) {
         by_float_type(a.out[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::fill(static_cast<T>(a.attrs.get_float("value")), out_ptr<T>(a), a.out[0]->numel());
         });
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
           k::scale(in_ptr<T>(a, 0), static_cast<T>(a.attrs.get_float("alpha")), out_ptr<T>(a), a.out[0]->numel());
         });
       }});

  def({"matmul", 2,
       [](const Infos& in, const Attrs& at) {
         check_float(in[0], "matmul A");
         MT_CHECK(in[0].dtype == in[1].dtype, "dtypes differ: {} and {}", dtype_name(in[0].dtype),
                  dtype_name(in[1].dtype));
         const bool ta = at.get_int("transpose_a") != 0, tb = at.get_int("transpose_b") != 0;
         const MatmulDims d = matmul_dims(in[0], in[1], ta, tb);
         return Infos{{with_last_two(in[0].shape, d.m, d.n), in[0].dtype}};
       },
       matmul_backward,
       [](const Infos& in, const Infos&, const Attrs& at) {
         const MatmulDims d = matmul_dims(in[0], in[1], at.get_int("transpose_a") != 0, at.get_int("transpose_b") != 0);
         return 2.0 * static_cast<double>(d.batch) * static_cast<double>(d.m) * static_cast<double>(d.n) *
                static_cast<double>(d.k);
       },
       [](const KernelArgs& a) {
         const bool ta = a.attrs.get_int("transpose_a") != 0, tb = a.attrs.get_int("transpose_b") != 0;
         const MatmulDims d = matmul_dims({a.in[0]->shape(), a.in[0]->dtype()}, {a.in[1]->shape(), a.in[1]->dtype()}, ta, tb);
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::matmul(in_ptr<T>(a, 0), in_ptr<T>(a, 1), out_ptr<T>(a), d.batch, d.m, d.n, d.k, ta, tb, d.m * d.k,
                     d.b_shared ? 0 : d.k * d.n);
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
           *out_ptr<T>(a) = k::sum(in_ptr<T>(a, 0), a.in[0]->numel());
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
           *out_ptr<T>(a) = k::sum(in_ptr<T>(a, 0), a.in[0]->numel()) / static_cast<T>(a.in[0]->numel());
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
           k::fill(*in_ptr<T>(a, 0), out_ptr<T>(a), a.out[0]->numel());
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
       no_flops(),
       [](const KernelArgs& a) { std::memcpy(a.out[0]->raw(), a.in[0]->raw(), a.in[0]->nbytes()); }});

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
         return Infos{{Shape{}, in[0].dtype}};
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
           *out_ptr<T>(a) = k::cross_entropy(in_ptr<T>(a, 0), in_ptr<int64_t>(a, 1), rows, vocab,
                                             a.attrs.get_int("ignore_index"));
         });
       }});
  def({"cross_entropy_backward", 3,
       [](const Infos& in, const Attrs&) { return Infos{in[0]}; }, nullptr, elementwise_flops(6),
       [](const KernelArgs& a) {
         const auto [rows, vocab] = rows_of(*a.in[0]);
         by_float_type(a.in[0]->dtype(), [&](auto z) {
           using T = decltype(z);
           k::cross_entropy_backward(in_ptr<T>(a, 0), in_ptr<int64_t>(a, 1), *in_ptr<T>(a, 2), out_ptr<T>(a), rows,
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

}  // namespace

const OpDef& find_op(const std::string& name) {
  static const std::map<std::string, OpDef> ops = [] {
    std::map<std::string, OpDef> m;
    register_ops(m);
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
