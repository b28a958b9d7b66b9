#include "core/tensor/tensor.h"

#include <cstring>
#include <sstream>
#include <stdexcept>

#include "core/device/device.h"

namespace nsatron {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

std::int64_t shape_numel(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) {
    if (d < 0) throw std::invalid_argument("negative dimension in shape " + shape_str(s));
    n *= d;
  }
  return n;
}

Storage::Storage(std::size_t bytes, Device device) : bytes_(bytes), device_(device) {
  data_ = device == Device::CPU ? cpu_alloc(bytes) : cuda_alloc(bytes);
  note_alloc(device, bytes);
}
Storage::~Storage() {
  note_free(device_, bytes_);
  if (device_ == Device::CPU)
    cpu_free(data_);
  else
    cuda_free(data_);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = std::make_shared<Storage>(t.nbytes(), device);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

namespace {
template <class T> void convert_from_double(const double* src, T* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = T(float(src[i]));
}
template <> void convert_from_double<double>(const double* src, double* dst, std::int64_t n) {
  std::memcpy(dst, src, std::size_t(n) * 8);
}
template <class T> double as_double(T v) { return double(float(v)); }
template <> double as_double<double>(double v) { return v; }
template <> double as_double<float>(float v) { return v; }

template <class F> auto dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::F32: return f(float{});
    case DType::F64: return f(double{});
    case DType::BF16: return f(bf16{});
  }
  throw std::logic_error("bad dtype");
}
}  // namespace

Tensor Tensor::from_vector(const std::vector<double>& values, const Shape& shape, DType dtype) {
  if (std::int64_t(values.size()) != shape_numel(shape))
    throw std::invalid_argument("from_vector: " + std::to_string(values.size()) +
                                " values for shape " + shape_str(shape));
  Tensor t = empty(shape, dtype);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    convert_from_double<T>(values.data(), static_cast<T*>(t.raw()), t.numel());
  });
  return t;
}

std::int64_t Tensor::dim(int i) const {
  int n = ndim();
  if (i < 0) i += n;
  if (i < 0 || i >= n) throw std::out_of_range("dim " + std::to_string(i) + " of " + describe());
  return shape_[std::size_t(i)];
}

void* Tensor::raw() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_bytes_;
}

void Tensor::check_type(DType t) const {
  if (t != dtype_)
    throw std::invalid_argument("tensor " + describe() + " accessed as " +
                                std::string(dtype_name(t)));
}

Tensor Tensor::view(const Shape& shape) const {
  if (shape_numel(shape) != numel())
    throw std::invalid_argument("view " + shape_str(shape) + " of " + describe());
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::slice0(std::int64_t begin, std::int64_t end) const {
  if (ndim() == 0 || begin < 0 || end < begin || end > shape_[0])
    throw std::out_of_range("slice0(" + std::to_string(begin) + ", " + std::to_string(end) +
                            ") of " + describe());
  Tensor t = *this;
  std::int64_t row = numel() / (shape_[0] ? shape_[0] : 1);
  t.shape_[0] = end - begin;
  t.offset_bytes_ += std::size_t(begin * row) * dtype_size(dtype_);
  return t;
}

static CopyKind copy_kind(Device dst, Device src) {
  if (dst == Device::CPU) return src == Device::CPU ? CopyKind::HostToHost : CopyKind::DeviceToHost;
  return src == Device::CPU ? CopyKind::HostToDevice : CopyKind::DeviceToDevice;
}

void Tensor::copy_from(const Tensor& src) {
  if (src.dtype_ != dtype_ || src.numel() != numel())
    throw std::invalid_argument("copy_from: " + src.describe() + " into " + describe());
  memcpy_any(raw(), src.raw(), nbytes(), copy_kind(device_, src.device_));
}

Tensor Tensor::to(Device device) const {
  Tensor t = empty(shape_, dtype_, device);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::clone() const { return to(device_); }

Tensor Tensor::to_dtype(DType dtype) const {
  if (!is_cpu()) throw std::invalid_argument("to_dtype needs a CPU tensor, got " + describe());
  return from_vector(to_vector(), shape_, dtype);
}

void Tensor::zero_() {
  if (nbytes() == 0) return;
  if (is_cpu())
    std::memset(raw(), 0, nbytes());
  else
    memset_device(raw(), 0, nbytes());
}

std::vector<double> Tensor::to_vector() const {
  if (!is_cpu()) return to(Device::CPU).to_vector();
  std::vector<double> out(static_cast<std::size_t>(numel()));
  dispatch_dtype(dtype_, [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(raw());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = as_double<T>(p[i]);
    return 0;
  });
  return out;
}

std::string Tensor::describe() const {
  return std::string(dtype_name(dtype_)) + shape_str(shape_) + " " + std::string(device_name(device_));
}

}  // namespace nsatron
