// matmul: batched GEMM with optional transposes and weights shared over the
// batch; rows_matmul: the weight gradient of such a shared weight, summed
// over every leading row.
#include "graph/ops/matmul.h"

#include <algorithm>

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

std::vector<ValueId> matmul_backward(Builder& bd, const Node& node, const std::vector<ValueId>& g) {
  const ValueId a = node.inputs[0], b = node.inputs[1], dc = g[0];
  const bool ta = node.attrs.get(attr::transpose_a), tb = node.attrs.get(attr::transpose_b);
  const ValueInfo ai = bd.graph().value(a).info;  // a copy: adding nodes moves the value storage
  const bool shared = bd.graph().value(b).info.shape.rank() == 2 && ai.shape.rank() > 2;
  // C = op(A) op(B): dop(A) = dC op(B)^T, dop(B) = op(A)^T dC.
  const ValueId da = ta ? bd.matmul(b, dc, tb, true) : bd.matmul(dc, b, false, !tb);
  ValueId db;
  if (shared) {
    // B is shared over the batch: summed over every row of A and dC.
    MT_CHECK(!ta, "matmul backward with transpose_a over a batch and shared weights is not supported");
    db = tb ? bd.op("rows_matmul", {dc, a}) : bd.op("rows_matmul", {a, dc});
  } else {
    db = tb ? bd.matmul(dc, a, true, ta) : bd.matmul(a, dc, !ta, false);
  }
  return {da, db};
}

}  // namespace

void add_matmul_ops(std::vector<OpDef>& ops) {
  ops.push_back({
      .name = "matmul",
      .num_inputs = 2,
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            check_float(in[0], "matmul A");
            MT_CHECK(in[0].dtype == in[1].dtype, "dtypes differ: {} and {}", dtype_name(in[0].dtype),
                     dtype_name(in[1].dtype));
            const bool ta = at.get(attr::transpose_a), tb = at.get(attr::transpose_b);
            const MatmulDims d = matmul_dims(in[0].shape, in[1].shape, ta, tb);
            return ValueInfos{{with_last_two(in[0].shape, d.m, d.n), in[0].dtype}};
          },
      .backward = matmul_backward,
      .flops =
          [](const ValueInfos& in, const ValueInfos&, const Attrs& at) {
            const MatmulDims d =
                matmul_dims(in[0].shape, in[1].shape, at.get(attr::transpose_a), at.get(attr::transpose_b));
            return 2.0 * static_cast<double>(d.batch) * static_cast<double>(d.m) * static_cast<double>(d.n) *
                   static_cast<double>(d.k);
          },
  });
  // x [..., P] and y [..., Q] over the same leading dims -> x^T y [P, Q],
  // summed over every leading row: no reshape folds the rows, so rows split
  // on any leading dim (the batch, or the sequence under context
  // parallelism) give partial sums.
  ops.push_back({
      .name = "rows_matmul",
      .num_inputs = 2,
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            check_float(in[0], "rows_matmul x");
            MT_CHECK(
                in[0].shape.rank() >= 2 && in[1].shape.rank() == in[0].shape.rank() &&
                    std::equal(in[0].shape.dims().begin(), in[0].shape.dims().end() - 1, in[1].shape.dims().begin()) &&
                    in[0].dtype == in[1].dtype,
                "rows_matmul: x and y must be [..., P] and [..., Q] of one dtype over the same rows, got {} and {}",
                in[0].shape.to_string(), in[1].shape.to_string());
            return ValueInfos{{Shape{in[0].shape.dim(-1), in[1].shape.dim(-1)}, in[0].dtype}};
          },
      .flops =
          [](const ValueInfos& in, const ValueInfos&, const Attrs&) {
            return 2.0 * static_cast<double>(in[0].shape.numel()) * static_cast<double>(in[1].shape.dim(-1));
          },
  });
}

}  // namespace meshtrain::graph::ops
