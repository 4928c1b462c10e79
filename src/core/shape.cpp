#include "core/shape.h"

#include <fmt/ranges.h>

#include <charconv>

#include "core/error.h"

namespace meshtrain {

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::vector<int64_t>(dims)) {}

Shape::Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {
  int64_t n = 1;
  bool too_many = false, empty = false;
  for (size_t i = 0; i < dims_.size(); ++i) {
    MT_CHECK(dims_[i] >= 0, "shape ({}) has negative extent {} at dim {}", fmt::join(dims_, ", "), dims_[i], i);
    empty |= dims_[i] == 0;
    too_many |= __builtin_mul_overflow(n, dims_[i], &n) || n > kMaxElements;
  }
  // An empty dim holds nothing, whatever the others' extents.
  MT_CHECK(!too_many || empty,
           "shape ({}) has more elements than fit in memory (over 2^56); a size derived from "
           "the input (a config key, a file header, a command-line shape) is too large",
           fmt::join(dims_, ", "));
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

std::vector<int64_t> parse_integer_list(std::string_view text, std::string_view what) {
  std::vector<int64_t> values;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string_view item = text.substr(pos, comma - pos);
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    MT_CHECK(!item.empty() && ec == std::errc() && end == item.data() + item.size(),
             "cannot read {} '{}': '{}' is not {} (expected comma-separated integers, e.g. 4,2)", what, text, item,
             ec == std::errc::result_out_of_range ? "an integer below 2^63" : "an integer");
    values.push_back(v);
    pos = comma + 1;
  }
  return values;
}

Shape Shape::parse(std::string_view text, std::string_view what) {
  auto dims = parse_integer_list(text, what);
  for (int64_t d : dims) MT_CHECK(d >= 0, "{} '{}' has a negative size {}", what, text, d);
  try {
    return Shape(std::move(dims));
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("{} '{}': {}", what, text, e.what()));
  }
}

}  // namespace meshtrain
