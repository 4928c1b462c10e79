#include "core/tensor.h"

#include <cstring>

namespace meshtrain {

Tensor Tensor::empty(const Shape& shape, DType dtype, CachingAllocator& alloc) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(&alloc, t.nbytes());
  return t;
}

Tensor Tensor::view(void* data, const Shape& shape, DType dtype) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(data);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, CachingAllocator& alloc) {
  Tensor t = empty(shape, dtype, alloc);
  std::memset(t.raw(), 0, t.nbytes());
  return t;
}

void Tensor::check_element_type(DType requested) const {
  MT_CHECK(defined(), "data<{}>() on an undefined tensor", dtype_name(requested));
  MT_CHECK(requested == dtype_,
           "data<{}>() on a tensor of dtype {}: use data<> with the matching "
           "element type or convert with to()",
           dtype_name(requested), dtype_name(dtype_));
}

void Tensor::check_index(int64_t i) const {
  MT_CHECK(defined(), "element access on an undefined tensor");
  MT_CHECK(i >= 0 && i < numel(), "flat index {} out of range for tensor {}", i, describe());
}

double Tensor::get(int64_t i) const {
  check_index(i);
  return load_as_double(raw(), dtype_, static_cast<size_t>(i));
}

void Tensor::set(int64_t i, double v) {
  check_index(i);
  store_from_double(raw(), dtype_, static_cast<size_t>(i), v);
}

Tensor Tensor::clone() const {
  MT_CHECK(defined(), "clone() of an undefined tensor");
  Tensor t = empty(shape_, dtype_, storage_->alloc ? *storage_->alloc : default_allocator());
  std::memcpy(t.raw(), raw(), nbytes());
  return t;
}

Tensor Tensor::to(DType dtype) const {
  MT_CHECK(defined(), "to({}) of an undefined tensor", dtype_name(dtype));
  Tensor t = empty(shape_, dtype, storage_->alloc ? *storage_->alloc : default_allocator());
  convert(raw(), dtype_, t.raw(), dtype, static_cast<size_t>(numel()));
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  MT_CHECK(shape.numel() == numel(), "cannot reshape tensor {} to {}: {} elements vs {}", describe(), shape.to_string(),
           numel(), shape.numel());
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

std::string Tensor::describe() const { return fmt::format("{}{}", dtype_name(dtype_), shape_.to_string()); }

}  // namespace meshtrain
