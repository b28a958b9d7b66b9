// Tensor: a contiguous, row-major array with a shape, an element type and a device, owning
// (a share of) its storage. Views (`view`, `slice0`) share the storage of their source.
//
// Ops never allocate behind the caller's back: they take the output tensors they write.
// The op families under core/ops/ follow one pattern: a header with the math, a CPU
// implementation in cpu/, a CUDA implementation in cuda/, and a Tensor-level entry point
// that checks shapes and dispatches on the device.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor/dtype.h"

namespace nsatron {

using Shape = std::vector<std::int64_t>;
std::string shape_str(const Shape& s);
std::int64_t shape_numel(const Shape& s);

class Storage {
 public:
  Storage(std::size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  Device device_;
};

class Tensor {
 public:
  Tensor() = default;
  // Uninitialised storage.
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::CPU);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::CPU);
  // A CPU tensor holding a copy of `values` (converted to dtype).
  static Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype);

  // False for a default-constructed handle (no storage, not even an empty one).
  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return int(shape_.size()); }
  std::int64_t dim(int i) const;  // negative i counts from the end
  std::int64_t numel() const { return shape_numel(shape_); }
  std::size_t nbytes() const { return std::size_t(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool is_cpu() const { return device_ == Device::CPU; }

  void* raw() const;
  // Typed pointer; throws if T does not match dtype().
  template <class T> T* data() const {
    check_type(dtype_of<T>());
    return static_cast<T*>(raw());
  }

  // Same storage, new shape with the same element count.
  Tensor view(const Shape& shape) const;
  // Rows [begin, end) of the first dimension, sharing storage.
  Tensor slice0(std::int64_t begin, std::int64_t end) const;

  // A copy on `device` (same dtype).
  Tensor to(Device device) const;
  // A copy with elements converted to `dtype` (CPU only).
  Tensor to_dtype(DType dtype) const;
  Tensor clone() const;
  // Copies src into this tensor: same dtype and element count, any pair of devices.
  void copy_from(const Tensor& src);
  void zero_();
  // Elements as doubles (copied to the CPU first if needed); for tests and logs.
  std::vector<double> to_vector() const;

  std::string describe() const;  // "fp32[4, 8] cpu"

 private:
  void check_type(DType t) const;
  std::shared_ptr<Storage> storage_;
  std::size_t offset_bytes_ = 0;
  Shape shape_;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
};

}  // namespace nsatron
