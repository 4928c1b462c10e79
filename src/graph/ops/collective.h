// A bucket's member shapes as bucket_unpack carries them
// (attr::member_shapes), shared by the op's definition and the pass that
// builds buckets.
#pragma once

#include <vector>

#include "core/shape.h"
#include "graph/attrs.h"

namespace meshtrain::graph::ops {

std::vector<Shape> bucket_member_shapes(const Attrs& at);
// The attribute value for `shapes`: each shape's rank, then its dims.
std::vector<int64_t> bucket_member_shapes_attr(const std::vector<Shape>& shapes);

}  // namespace meshtrain::graph::ops
