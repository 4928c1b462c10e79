// matmul: batched GEMM with optional transposes and weights shared over the
// batch; rows_matmul: the weight gradient of such a shared weight, summed
// over every leading row; fp8_matmul and fp8_rows_matmul: the same on FP8
// operands quantised with their current scales; fp8_quantize: an operand
// quantised ahead (FSDP's FP8 all-gather).
#include "graph/ops/matmul.h"

#include <algorithm>
#include <optional>

#include "graph/ops/families.h"
#include "graph/ops/op_support.h"

namespace meshtrain::graph::ops {

MatmulDims matmul_dims(const Shape& a, const Shape& b, bool ta, bool tb) {
  MT_CHECK(a.rank() >= 2 && b.rank() >= 2, "matmul needs operands of rank >= 2");
  const int64_t m = a.dim(ta ? -1 : -2), ka = a.dim(ta ? -2 : -1);
  const int64_t kb = b.dim(tb ? -1 : -2), n = b.dim(tb ? -2 : -1);
  MT_CHECK(ka == kb, "inner dims differ: {} vs {}", ka, kb);
  const bool shared = b.rank() == 2;
  if (!shared)
    MT_CHECK(b.rank() == a.rank() && std::equal(a.dims().begin(), a.dims().end() - 2, b.dims().begin()),
             "batched operands need equal batch dims: {} and {}", a.to_string(), b.to_string());
  int64_t batch = 1;  // the product of the leading dims (not numel / M K: either may be 0 on an empty shard)
  for (size_t d = 0; d + 2 < a.rank(); ++d) batch *= a[d];
  return {batch, m, n, ka, shared};
}

namespace {

Shape with_last_two(const Shape& batch_from, int64_t a, int64_t b) {
  std::vector<int64_t> dims(batch_from.dims().begin(), batch_from.dims().end() - 2);
  dims.push_back(a);
  dims.push_back(b);
  return Shape(dims);
}

// C = op(A) op(B): dop(A) = dC op(B)^T, dop(B) = op(A)^T dC, each by `mm`
// (x, y, transpose_x, transpose_y) or, for B shared over A's batch, summed
// over every row by `rows` (x, y). Operands are a, b and dc as the caller
// holds them (values, or FP8 operands with their amax and format).
template <typename Operand, typename Mm, typename Rows>
std::vector<ValueId> matmul_grads(const Graph& g, const Node& node, const Operand& a, const Operand& b,
                                  const Operand& dc, Mm&& mm, Rows&& rows) {
  const bool ta = node.attrs.get(attr::transpose_a), tb = node.attrs.get(attr::transpose_b);
  const bool shared = g.value(node.inputs[1]).info.shape.rank() == 2 && g.value(node.inputs[0]).info.shape.rank() > 2;
  const ValueId da = ta ? mm(b, dc, tb, true) : mm(dc, b, false, !tb);
  if (!shared) return {da, tb ? mm(dc, a, true, ta) : mm(a, dc, !ta, false)};
  MT_CHECK(!ta, "matmul backward with transpose_a over a batch and shared weights is not supported");
  return {da, tb ? rows(dc, a) : rows(a, dc)};
}

std::vector<ValueId> matmul_backward(Builder& bd, const Node& node, const std::vector<ValueId>& g) {
  return matmul_grads(
      bd.graph(), node, node.inputs[0], node.inputs[1], g[0],
      [&](ValueId x, ValueId y, bool tx, bool ty) { return bd.matmul(x, y, tx, ty); },
      [&](ValueId x, ValueId y) {
        return bd.op("rows_matmul", {x, y});
      });
}

// An operand of an FP8 GEMM: its value, amax, format and role in the layer.
struct Fp8Operand {
  ValueId value, amax;
  DType format;
  std::string role;
};

// The FP8 GEMMs of dA and dB (torchao's and TransformerEngine's recipe): dC
// quantised to the gradient format with its own amax, A and B as the forward
// quantised them (straight through: no gradient reaches the amaxes).
std::vector<ValueId> fp8_matmul_backward(Builder& bd, const Node& node, const std::vector<ValueId>& g) {
  const Attrs& at = node.attrs;
  const std::string& layer = at.get(attr::tensor);
  const Fp8Operand a{node.inputs[0], node.inputs[2], at.get(attr::format_a), at.get(attr::operand_a)};
  const Fp8Operand b{node.inputs[1], node.inputs[3], at.get(attr::format_b), at.get(attr::operand_b)};
  const Fp8Operand dc{g[0], bd.amax(g[0], layer + " output gradient"), at.get(attr::grad_format), "output gradient"};
  auto fp8_attrs = [&](const Fp8Operand& x, const Fp8Operand& y) {
    return Attrs{attr::format_a(x.format),
                 attr::format_b(y.format),
                 attr::grad_format(at.get(attr::grad_format)),
                 attr::pow2_scale(at.get(attr::pow2_scale)),
                 attr::tensor(layer),
                 attr::operand_a(x.role),
                 attr::operand_b(y.role)};
  };
  std::vector<ValueId> grads = matmul_grads(
      bd.graph(), node, a, b, dc,
      [&](const Fp8Operand& x, const Fp8Operand& y, bool tx, bool ty) {
        return bd.fp8_matmul(x.value, y.value, x.amax, y.amax, tx, ty, fp8_attrs(x, y));
      },
      [&](const Fp8Operand& x, const Fp8Operand& y) {
        return bd.op("fp8_rows_matmul", {x.value, y.value, x.amax, y.amax}, fp8_attrs(x, y));
      });
  grads.resize(4);  // none for the amaxes
  return grads;
}

ValueInfos matmul_infer(const ValueInfos& in, const Attrs& at) {
  check_float(in[0], "matmul A");
  MT_CHECK(in[0].dtype == in[1].dtype, "dtypes differ: {} and {}", dtype_name(in[0].dtype), dtype_name(in[1].dtype));
  const bool ta = at.get(attr::transpose_a), tb = at.get(attr::transpose_b);
  const MatmulDims d = matmul_dims(in[0].shape, in[1].shape, ta, tb);
  return ValueInfos{{with_last_two(in[0].shape, d.m, d.n), in[0].dtype}};
}

double matmul_flops(const ValueInfos& in, const ValueInfos&, const Attrs& at) {
  const MatmulDims d = matmul_dims(in[0].shape, in[1].shape, at.get(attr::transpose_a), at.get(attr::transpose_b));
  return 2.0 * static_cast<double>(d.batch) * static_cast<double>(d.m) * static_cast<double>(d.n) *
         static_cast<double>(d.k);
}

ValueInfos rows_matmul_infer(const ValueInfos& in, const Attrs&) {
  check_float(in[0], "rows_matmul x");
  MT_CHECK(in[0].shape.rank() >= 2 && in[1].shape.rank() == in[0].shape.rank() &&
               std::equal(in[0].shape.dims().begin(), in[0].shape.dims().end() - 1, in[1].shape.dims().begin()) &&
               in[0].dtype == in[1].dtype,
           "rows_matmul: x and y must be [..., P] and [..., Q] of one dtype over the same rows, got {} and {}",
           in[0].shape.to_string(), in[1].shape.to_string());
  return ValueInfos{{Shape{in[0].shape.dim(-1), in[1].shape.dim(-1)}, in[0].dtype}};
}

bool is_fp8(DType t) { return t == DType::f8e4m3 || t == DType::f8e5m2; }

// FP8 operands: each in a float compute dtype (f32 or bf16, both the same),
// or already quantised (fp8_quantize) to its format; FP8 formats; amaxes f32
// scalars. Returns the output's dtype: the compute dtype.
DType check_fp8_operands(const ValueInfos& in, const Attrs& at) {
  for (const auto& key : {attr::format_a, attr::format_b, attr::grad_format})
    MT_CHECK(is_fp8(at.get(key)), "{} must be f8e4m3 or f8e5m2, got {}", key.name, dtype_name(at.get(key)));
  const DType formats[] = {at.get(attr::format_a), at.get(attr::format_b)};
  std::optional<DType> compute;
  for (size_t i = 0; i < 2; ++i) {
    if (is_fp8(in[i].dtype)) {
      MT_CHECK(in[i].dtype == formats[i], "FP8 GEMM operand {} is {}, not its format {}", i, dtype_name(in[i].dtype),
               dtype_name(formats[i]));
      continue;
    }
    MT_CHECK(in[i].dtype == DType::f32 || in[i].dtype == DType::bf16, "FP8 GEMM operands must be f32 or bf16, got {}",
             dtype_name(in[i].dtype));
    MT_CHECK(!compute || *compute == in[i].dtype, "dtypes differ: {} and {}", dtype_name(*compute),
             dtype_name(in[i].dtype));
    compute = in[i].dtype;
  }
  MT_CHECK(compute.has_value(), "an FP8 GEMM needs one operand in the compute dtype, got two FP8 ones");
  for (size_t i = 2; i < 4; ++i)
    MT_CHECK(in[i].dtype == DType::f32 && in[i].shape.rank() == 0, "an FP8 GEMM's amax must be an f32 scalar, got {}",
             dtype_name(in[i].dtype));
  return *compute;
}

// An FP8 GEMM's output info: the plain GEMM's shape, in the compute dtype.
ValueInfos fp8_gemm_infer(const ValueInfos& in, const Attrs& at, bool rows) {
  const DType compute = check_fp8_operands(in, at);
  ValueInfos as_compute = in;
  as_compute[0].dtype = as_compute[1].dtype = compute;
  return rows ? rows_matmul_infer(as_compute, at) : matmul_infer(as_compute, at);
}

// An FP8 GEMM's traffic: each operand read in its dtype and written in FP8
// (the quantisation), read again by the GEMM (one quantised ahead: read
// once), and the output written.
double fp8_gemm_bytes(const ValueInfos& in, const ValueInfos& out, const Attrs&) {
  double bytes = bytes_of(out[0]);
  for (size_t i = 0; i < 2; ++i) bytes += is_fp8(in[i].dtype) ? numel(in[i]) : bytes_of(in[i]) + 2 * numel(in[i]);
  return bytes;
}

double rows_matmul_flops(const ValueInfos& in, const ValueInfos&, const Attrs&) {
  return 2.0 * static_cast<double>(in[0].shape.numel()) * static_cast<double>(in[1].shape.dim(-1));
}

}  // namespace

void add_matmul_ops(std::vector<OpDef>& ops) {
  ops.push_back(
      {.name = "matmul", .num_inputs = 2, .infer = matmul_infer, .backward = matmul_backward, .flops = matmul_flops});
  // x [..., P] and y [..., Q] over the same leading dims -> x^T y [P, Q],
  // summed over every leading row: no reshape folds the rows, so rows split
  // on any leading dim (the batch, or the sequence under context
  // parallelism) give partial sums.
  ops.push_back({.name = "rows_matmul", .num_inputs = 2, .infer = rows_matmul_infer, .flops = rows_matmul_flops});
  // FP8 training's GEMMs: matmul and rows_matmul of (a, b, amax_a, amax_b),
  // each operand quantised to its format (format_a, format_b) with the scale
  // of its amax (core/fp8.h), products summed in f32, the sum times both
  // inverse scales in the operands' dtype. What an FP8 tensor core computes.
  ops.push_back({
      .name = "fp8_matmul",
      .num_inputs = 4,
      .infer = [](const ValueInfos& in, const Attrs& at) { return fp8_gemm_infer(in, at, false); },
      .backward = fp8_matmul_backward,
      .flops = matmul_flops,
      .bytes = fp8_gemm_bytes,
  });
  ops.push_back({
      .name = "fp8_rows_matmul",
      .num_inputs = 4,
      .infer = [](const ValueInfos& in, const Attrs& at) { return fp8_gemm_infer(in, at, true); },
      .flops = rows_matmul_flops,
      .bytes = fp8_gemm_bytes,
  });
  // x quantised with the scale of its amax to FP8 (attr dtype: the format),
  // for an FP8 GEMM to take as it is: what FSDP gathers in FP8
  // (training.fp8_all_gather). Its gradient passes straight through.
  ops.push_back({
      .name = "fp8_quantize",
      .num_inputs = 2,
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            check_float(in[0], "fp8_quantize input");
            MT_CHECK(is_fp8(at.get(attr::dtype)), "fp8_quantize's format must be f8e4m3 or f8e5m2, got {}",
                     dtype_name(at.get(attr::dtype)));
            MT_CHECK(in[1].dtype == DType::f32 && in[1].shape.rank() == 0, "fp8_quantize's amax must be an f32 scalar");
            return ValueInfos{{in[0].shape, at.get(attr::dtype)}};
          },
      .backward =
          [](Builder&, const Node&, const std::vector<ValueId>& g) {
            return std::vector<ValueId>{g[0], {}};
          },
      .flops = elementwise_flops(1),
  });
}

}  // namespace meshtrain::graph::ops
