#include "core/shape.h"

#include <fmt/ranges.h>

#include "core/error.h"

namespace meshtrain {

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::vector<int64_t>(dims)) {}

Shape::Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {
  int64_t n = 1;
  bool too_many = false, empty = false;
  for (size_t i = 0; i < dims_.size(); ++i) {
    MT_CHECK(dims_[i] >= 0, "shape ({}) has negative extent {} at dim {}", fmt::join(dims_, ", "),
             dims_[i], i);
    empty |= dims_[i] == 0;
    too_many |= __builtin_mul_overflow(n, dims_[i], &n) || n > kMaxElements;
  }
  // An empty dim holds nothing, whatever the others' extents.
  MT_CHECK(!too_many || empty, "shape ({}) has more elements than fit in memory (over 2^56); a size derived from "
           "the input (a config key, a file header, a command-line shape) is too large", fmt::join(dims_, ", "));
}

int64_t Shape::dim(int64_t d) const {
  const auto r = static_cast<int64_t>(rank());
  MT_CHECK(d >= -r && d < r, "dim {} out of range for shape {} of rank {}", d, to_string(), r);
  return dims_[static_cast<size_t>(d < 0 ? d + r : d)];
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (auto d : dims_) n *= d;
  return n;
}

AroundDim around_dim(const std::vector<int64_t>& dims, size_t d) {
  MT_CHECK(d < dims.size(), "dim {} out of range for rank {}", d, dims.size());
  AroundDim a;
  for (size_t k = 0; k < d; ++k) a.outer *= dims[k];
  a.dim = dims[d];
  for (size_t k = d + 1; k < dims.size(); ++k) a.inner *= dims[k];
  return a;
}

std::string Shape::to_string() const { return fmt::format("({})", fmt::join(dims_, ", ")); }

}  // namespace meshtrain
