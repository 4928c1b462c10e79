// embedding: rows of a [vocab, dim] table gathered by i64 ids.
#include "graph/ops/families.h"
#include "graph/ops/op_support.h"

namespace meshtrain::graph::ops {

void add_embedding_ops(std::vector<OpDef>& ops) {
  ops.push_back({
      .name = "embedding",
      .num_inputs = 2,
      .infer =
          [](const ValueInfos& in, const Attrs&) {
            check_float(in[0], "embedding table");
            MT_CHECK(in[0].shape.rank() == 2, "table must be [vocab, dim], got {}", in[0].shape.to_string());
            MT_CHECK(in[1].dtype == DType::i64, "ids must be i64, got {}", dtype_name(in[1].dtype));
            std::vector<int64_t> dims = in[1].shape.dims();
            dims.push_back(in[0].shape.dim(1));
            return ValueInfos{{Shape(dims), in[0].dtype}};
          },
      .backward =
          [](Builder& b, const Node& n, const std::vector<ValueId>& g) {
            const int64_t vocab = b.graph().value(n.inputs[0]).info.shape.dim(0);
            return std::vector<ValueId>{b.embedding_backward(n.inputs[1], g[0], vocab), ValueId{}};
          },
      .bytes =
          [](const ValueInfos& in, const ValueInfos& out,
             const Attrs&) {  // the ids and the rows gathered, not the table
            return bytes_of(in[1]) + 2 * bytes_of(out[0]);
          },
  });
  ops.push_back({
      .name = "embedding_backward",
      .num_inputs = 2,
      .infer =
          [](const ValueInfos& in, const Attrs& at) {
            return ValueInfos{{Shape{at.get(attr::vocab), in[1].shape.dim(-1)}, in[1].dtype}};
          },
  });
}

}  // namespace meshtrain::graph::ops
