// Shape of a dense tensor: a list of non-negative extents, row-major.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace meshtrain {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::vector<int64_t> dims);

  size_t rank() const { return dims_.size(); }
  int64_t operator[](size_t i) const { return dims_[i]; }
  // Extent of dimension d; negative d counts from the end. Throws when out of range.
  int64_t dim(int64_t d) const;
  int64_t numel() const;
  const std::vector<int64_t>& dims() const { return dims_; }
  std::string to_string() const;  // "(2, 3)"

  bool operator==(const Shape&) const = default;

 private:
  std::vector<int64_t> dims_;
};

}  // namespace meshtrain
