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

// A tensor on CUDA: the CUDA kernels of this family are not written yet (issue 7).
[[noreturn]] inline void no_cuda(const std::string& op) {
#ifdef NSATRON_WITH_CUDA
  throw std::runtime_error(op + ": no CUDA implementation yet");
#else
  throw std::invalid_argument(op + ": tensor on CUDA, but this build has no CUDA");
#endif
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
