#include "core/tensor.h"

#include <cstring>

#include "core/copy.h"

namespace meshtrain {

Tensor Tensor::empty(const Shape& shape, DType dtype, CachingAllocator& alloc) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(&alloc, t.nbytes());
  return t;
}

Tensor Tensor::view(void* data, const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(data, device);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, CachingAllocator& alloc) {
  MT_CHECK(alloc.device() == Device::cpu, "Tensor::zeros on {}: fill device memory with a kernel",
           device_name(alloc.device()));
  Tensor t = empty(shape, dtype, alloc);
  std::memset(t.raw(), 0, t.nbytes());
  return t;
}

void Tensor::check_on_host(const char* what) const {
  MT_CHECK(device() == Device::cpu, "{} of tensor {} on {}: copy it to the host first", what, describe(),
           device_name(device()));
}

void Tensor::check_element_type(DType requested) const {
  MT_CHECK(defined(), "data<{}>() on an undefined tensor", dtype_name(requested));
  check_on_host("data()");
  MT_CHECK(requested == dtype_,
           "data<{}>() on a tensor of dtype {}: use data<> with the matching "
           "element type or convert with to()",
           dtype_name(requested), dtype_name(dtype_));
}

void Tensor::check_index(int64_t i) const {
  MT_CHECK(defined(), "element access on an undefined tensor");
  check_on_host("element access");
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
  check_on_host("clone()");
  Tensor t = empty(shape_, dtype_, storage_->alloc ? *storage_->alloc : default_allocator());
  copy_bytes(t.raw(), raw(), nbytes());
  return t;
}

Tensor Tensor::to(DType dtype) const {
  MT_CHECK(defined(), "to({}) of an undefined tensor", dtype_name(dtype));
  check_on_host("to()");
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

std::string Tensor::describe() const {
  const std::string where = device() == Device::cpu ? "" : fmt::format(" on {}", device_name(device()));
  return fmt::format("{}{}{}", dtype_name(dtype_), shape_.to_string(), where);
}

}  // namespace meshtrain
