// Internal helpers for the Tensor-level entry points of the op families (not a public API):
// argument checks with messages that name the op and the tensors, the CPU dtype dispatch
// (fp32 and fp64; bf16 is a GPU compute type and has no CPU path outside matmul), and the
// one place that says "no CUDA implementation yet".
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/tensor/tensor.h"

namespace nsatron::ops_detail {

[[noreturn]] inline void fail(const std::string& op, const std::string& why) {
  throw std::invalid_argument(op + ": " + why);
}
inline void require(bool ok, const std::string& op, const std::string& why) {
  if (!ok) fail(op, why);
}

// t has the shape of ref (`name` says which argument t is).
inline void same_shape(const std::string& op, const Tensor& ref, const Tensor& t, const char* name) {
  require(t.shape() == ref.shape(), op,
          std::string(name) + " must have the shape of " + ref.describe() + ", got " + t.describe());
}

// All tensors share the dtype and device of the first.
inline void same_dtype_device(const std::string& op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = *ts.begin();
  for (const Tensor* t : ts) {
    if (t->dtype() != first->dtype())
      fail(op, "dtypes differ: " + first->describe() + " vs " + t->describe());
    if (t->device() != first->device())
      fail(op, "devices differ: " + first->describe() + " vs " + t->describe());
  }
}

// Size of the last dimension and the number of rows (product of the leading dimensions).
inline std::int64_t last_dim(const std::string& op, const Tensor& t, const char* name) {
  if (t.ndim() < 1) fail(op, std::string(name) + " must have at least one dimension, got " + t.describe());
  return t.dim(-1);
}
inline std::int64_t rows_of(const Tensor& t) {
  const std::int64_t c = t.ndim() ? t.dim(-1) : 1;
  return c ? t.numel() / c : 0;
}

// A tensor on CUDA in a build without CUDA (or, with CUDA, an op without a CUDA path).
[[noreturn]] inline void no_cuda(const std::string& op) {
#ifdef NSATRON_WITH_CUDA
  throw std::runtime_error(op + ": no CUDA implementation yet");
#else
  throw std::invalid_argument(op + ": tensor on CUDA, but this build has no CUDA");
#endif
}

// CUDA dtype rules (mixed precision). Activations and compute weights share one dtype, fp32
// or bf16 ("the compute dtype"); saved row statistics (rstd, lse) and scalar results (loss,
// norm) are fp32; parameter gradients are fp32 or the compute dtype.
inline void all_on_cuda(const std::string& op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->device() != Device::CUDA)
      fail(op, "devices differ: expected every tensor on cuda, got " + t->describe());
}
inline void cuda_compute_dtype(const std::string& op, const Tensor& t) {
  require(t.dtype() == DType::F32 || t.dtype() == DType::BF16, op,
          "on CUDA the compute dtype is fp32 or bf16, got " + t.describe());
}
inline void require_f32(const std::string& op, const Tensor& t, const char* name) {
  require(t.dtype() == DType::F32, op,
          std::string(name) + " must be fp32 on CUDA, got " + t.describe());
}
inline void grad_dtype(const std::string& op, const Tensor& act, const Tensor& grad,
                       const char* name) {
  require(grad.dtype() == act.dtype() || grad.dtype() == DType::F32, op,
          std::string(name) + " must be fp32 or " + std::string(dtype_name(act.dtype())) +
              " on CUDA, got " + grad.describe());
}

// Calls f(float{}) or f(double{}) for a CPU tensor's dtype; bf16 is refused.
template <class F> void dispatch_cpu(const std::string& op, const Tensor& t, F&& f) {
  switch (t.dtype()) {
    case DType::F32: f(float{}); return;
    case DType::F64: f(double{}); return;
    case DType::BF16:
      fail(op, "bf16 has no CPU implementation (the CPU path computes in fp32 or fp64), got " +
                   t.describe());
  }
  fail(op, "unknown dtype");
}

}  // namespace nsatron::ops_detail
