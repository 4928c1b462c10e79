// Shape of a dense tensor: a list of non-negative extents, row-major.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

class Shape {
 public:
  // The most elements a shape may hold: its bytes at 8 per element (the
  // widest dtype) times a few more still fit an int64, so byte counts and
  // sums of them derived from a shape cannot overflow.
  static constexpr int64_t kMaxElements = int64_t{1} << 56;

  Shape() = default;
  // Throws for a negative extent or more than kMaxElements elements.
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::vector<int64_t> dims);

  size_t rank() const { return dims_.size(); }
  int64_t operator[](size_t i) const { return dims_[i]; }
  // Extent of dimension d; negative d counts from the end. Throws when out of range.
  int64_t dim(int64_t d) const;
  int64_t numel() const;
  const std::vector<int64_t>& dims() const { return dims_; }
  std::string to_string() const;  // "(2, 3)"
  // "18,2" (as --shape takes it); throws naming `what` and the bad item.
  static Shape parse(std::string_view text, std::string_view what = "shape");

  bool operator==(const Shape&) const = default;

 private:
  std::vector<int64_t> dims_;
};

// "4,2" as integers: comma-separated, nothing else; throws naming `what`,
// the text and the item that is not an integer of int64 range.
std::vector<int64_t> parse_integer_list(std::string_view text, std::string_view what);

// Row-major extents seen as [outer, dim, inner] around dimension d: the
// product of the extents before d, d's own, and the product of those after.
struct AroundDim {
  int64_t outer = 1, dim = 0, inner = 1;
};
AroundDim around_dim(const std::vector<int64_t>& dims, size_t d);
inline AroundDim around_dim(const Shape& s, size_t d) { return around_dim(s.dims(), d); }

}  // namespace meshtrain
