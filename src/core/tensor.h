// Dense, contiguous, row-major tensor in host memory or on a CUDA device
// (device()). Copies share storage (like torch.Tensor); clone() makes an
// independent copy. Element access, data(), clone() and to() are for host
// tensors; kernels/cuda copies between host and device.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"

namespace meshtrain {

// The C++ element type that stores a dtype (f16 and fp8 have none).
template <typename T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<bfloat16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, DType dtype, CachingAllocator& alloc = default_allocator());
  static Tensor zeros(const Shape& shape, DType dtype, CachingAllocator& alloc = default_allocator());
  // A tensor over memory someone else owns (and keeps alive while the view is used).
  static Tensor view(void* data, const Shape& shape, DType dtype, Device device = Device::cpu);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::cpu; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  void* raw() { return storage_ ? storage_->ptr : nullptr; }
  const void* raw() const { return storage_ ? storage_->ptr : nullptr; }

  // Typed view; throws when T does not store this tensor's dtype.
  template <typename T>
  std::span<T> data() {
    check_element_type(dtype_of<std::remove_const_t<T>>::value);
    return {static_cast<T*>(raw()), static_cast<size_t>(numel())};
  }
  template <typename T>
  std::span<const T> data() const {
    check_element_type(dtype_of<std::remove_const_t<T>>::value);
    return {static_cast<const T*>(raw()), static_cast<size_t>(numel())};
  }

  // Element i (flat index) as double, and set from double (rounded to the dtype).
  double get(int64_t i) const;
  void set(int64_t i, double v);

  Tensor clone() const;
  Tensor to(DType dtype) const;
  // Same storage, new shape with the same number of elements.
  Tensor reshape(const Shape& shape) const;
  std::string describe() const;  // "f32(2, 3)"

 private:
  struct Storage {
    Storage(CachingAllocator* a, size_t bytes) : alloc(a), ptr(a->allocate(bytes)), device(a->device()) {}
    Storage(void* borrowed, Device d) : alloc(nullptr), ptr(borrowed), device(d) {}
    Storage(const Storage&) = delete;
    Storage& operator=(const Storage&) = delete;
    ~Storage() {
      if (alloc) alloc->deallocate(ptr);
    }
    CachingAllocator* alloc;  // null for a view
    void* ptr;
    Device device;
  };
  void check_on_host(const char* what) const;
  void check_element_type(DType requested) const;
  void check_index(int64_t i) const;

  std::shared_ptr<Storage> storage_;
  Shape shape_;
  DType dtype_ = DType::f32;
};

}  // namespace meshtrain
