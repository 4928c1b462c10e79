// Ops that move elements without arithmetic: reshape (a view), transpose,
// slice and concat.
#include "graph/ops/families.h"
#include "graph/ops/op_support.h"

namespace meshtrain::graph::ops {

void add_shape_ops(std::vector<OpDef>& ops) {
  ops.push_back({
      .name = "reshape",
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            const Shape s(at.get(attr::shape));
            MT_CHECK(s.numel() == in[0].shape.numel(), "cannot reshape {} ({} elements) to {} ({} elements)",
                     in[0].shape.to_string(), in[0].shape.numel(), s.to_string(), s.numel());
            return ValueInfos{{s, in[0].dtype}};
          },
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            return std::vector<ValueId>{b.reshape(g[0], b.graph().value(n.inputs[0]).info.shape)};
          },
      .is_view = true,
  });

  ops.push_back({
      .name = "transpose",
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            const auto r = static_cast<int64_t>(in[0].shape.rank());
            const int64_t d0 = at.get(attr::dim0), d1 = at.get(attr::dim1);
            MT_CHECK(d0 >= 0 && d0 < r && d1 >= 0 && d1 < r, "dims {} and {} out of range for rank {}", d0, d1, r);
            std::vector<int64_t> dims = in[0].shape.dims();
            std::swap(dims[d0], dims[d1]);
            return ValueInfos{{Shape(dims), in[0].dtype}};
          },
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            return std::vector<ValueId>{b.transpose(g[0], static_cast<int>(n.attrs.get(attr::dim0)),
                                                    static_cast<int>(n.attrs.get(attr::dim1)))};
          },
  });

  ops.push_back({
      .name = "slice",
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            const int64_t d = at.get(attr::dim), start = at.get(attr::start), len = at.get(attr::length);
            MT_CHECK(d >= 0 && d < static_cast<int64_t>(in[0].shape.rank()), "dim {} out of range", d);
            MT_CHECK(start >= 0 && len >= 0 && start + len <= in[0].shape[static_cast<size_t>(d)],
                     "[{}, {}) is outside dim {} of size {}", start, start + len, d,
                     in[0].shape[static_cast<size_t>(d)]);
            std::vector<int64_t> dims = in[0].shape.dims();
            dims[static_cast<size_t>(d)] = len;
            return ValueInfos{{Shape(dims), in[0].dtype}};
          },
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            const int64_t d = n.attrs.get(attr::dim);
            return std::vector<ValueId>{
                b.slice_backward(g[0], static_cast<int>(d), n.attrs.get(attr::start),
                                 b.graph().value(n.inputs[0]).info.shape[static_cast<size_t>(d)])};
          },
      .bytes = [](const ValueInfos&, const ValueInfos& out,
                  const Attrs&) { return 2 * bytes_of(out[0]); },  // the slice only
  });
  ops.push_back({
      .name = "slice_backward",
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            std::vector<int64_t> dims = in[0].shape.dims();
            dims[static_cast<size_t>(at.get(attr::dim))] = at.get(attr::full_size);
            return ValueInfos{{Shape(dims), in[0].dtype}};
          },
  });

  ops.push_back({
      .name = "concat",
      .num_inputs = OpDef::kVariadic,
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            MT_CHECK(!in.empty(), "concat needs at least one input");
            const int64_t d = at.get(attr::dim);
            MT_CHECK(d >= 0 && d < static_cast<int64_t>(in[0].shape.rank()), "dim {} out of range", d);
            std::vector<int64_t> dims = in[0].shape.dims();
            dims[static_cast<size_t>(d)] = 0;
            for (const auto& v : in) {
              MT_CHECK(v.dtype == in[0].dtype && v.shape.rank() == in[0].shape.rank(),
                       "inputs differ in dtype or rank");
              for (size_t k = 0; k < dims.size(); ++k)
                MT_CHECK(static_cast<int64_t>(k) == d || v.shape[k] == in[0].shape[k],
                         "inputs differ outside dim {}: {} vs {}", d, v.shape.to_string(), in[0].shape.to_string());
              dims[static_cast<size_t>(d)] += v.shape[static_cast<size_t>(d)];
            }
            return ValueInfos{{Shape(dims), in[0].dtype}};
          },
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            const int64_t d = n.attrs.get(attr::dim);
            std::vector<ValueId> grads;
            int64_t start = 0;
            for (ValueId x : n.inputs) {
              const int64_t len = b.graph().value(x).info.shape[static_cast<size_t>(d)];
              grads.push_back(b.slice(g[0], static_cast<int>(d), start, len));
              start += len;
            }
            return grads;
          },
  });
}

}  // namespace meshtrain::graph::ops
