#include "core/ops/grad_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/ops/op_util.h"

namespace nsatron {

using namespace ops_detail;

namespace {
#ifdef NSATRON_WITH_CUDA
std::vector<cuda::NormBuffer> device_buffers(const std::string& op,
                                             std::span<const Tensor> buffers) {
  std::vector<cuda::NormBuffer> out;
  out.reserve(buffers.size());
  for (const Tensor& b : buffers) {
    all_on_cuda(op, {&b});
    cuda_compute_dtype(op, b);
    out.push_back({b.raw(), b.numel(), b.dtype()});
  }
  return out;
}
#endif
double host_sum_squares(const std::string& op, std::span<const Tensor> buffers) {
  double total = 0.0;
  for (const Tensor& b : buffers) {
    if (b.device() == Device::CUDA) fail(op, "a buffer is on cuda but the result on cpu");
    dispatch_cpu(op, b, [&](auto tag) {
      using T = decltype(tag);
      total += cpu::sum_squares<T>(b.data<T>(), b.numel());
    });
  }
  return total;
}
void write_scalar(const std::string& op, Tensor& out, double value) {
  require(out.numel() == 1, op, "the result must have one element, got " + out.describe());
  dispatch_cpu(op, out, [&](auto tag) {
    using T = decltype(tag);
    *out.data<T>() = T(value);
  });
}

// Sum of squares (or its root) on the GPU, written to out in device memory.
bool device_sum_squares(const std::string& op, std::span<const Tensor> buffers, Tensor& out,
                        bool take_sqrt) {
  if (out.device() != Device::CUDA) return false;
#ifdef NSATRON_WITH_CUDA
  require(out.numel() == 1, op, "the result must have one element, got " + out.describe());
  require(out.dtype() == DType::F32 || out.dtype() == DType::F64, op,
          "the result must be fp32 or fp64, got " + out.describe());
  const auto bufs = device_buffers(op, buffers);
  cuda::sum_squares(bufs, out.raw(), out.dtype(), take_sqrt);
  return true;
#else
  no_cuda(op);
#endif
}
}  // namespace

void sum_squares(std::span<const Tensor> buffers, Tensor& out) {
  const std::string op = "sum_squares";
  if (device_sum_squares(op, buffers, out, false)) return;
  write_scalar(op, out, host_sum_squares(op, buffers));
}

void global_norm(std::span<const Tensor> buffers, Tensor& out) {
  const std::string op = "global_norm";
  if (device_sum_squares(op, buffers, out, true)) return;
  write_scalar(op, out, std::sqrt(host_sum_squares(op, buffers)));
}

void scale_(std::span<const Tensor> buffers, double factor) {
  const std::string op = "scale_";
  for (const Tensor& b : buffers) {
    if (b.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
      cuda_compute_dtype(op, b);
      const cuda::NormBuffer one{b.raw(), b.numel(), b.dtype()};
      cuda::scale_(std::span<const cuda::NormBuffer>(&one, 1), factor);
      continue;
#else
      no_cuda(op);
#endif
    }
    dispatch_cpu(op, b, [&](auto tag) {
      using T = decltype(tag);
      cpu::scale<T>(b.data<T>(), b.numel(), factor);
    });
  }
}

double clip_coefficient(double norm, double max_norm) {
  if (!std::isfinite(norm)) return 1.0;
  return std::min(1.0, max_norm / (norm + 1e-6));
}

void clip_by_global_norm_(std::span<const Tensor> buffers, const Tensor& norm, double max_norm) {
  const std::string op = "clip_by_global_norm_";
  require(norm.numel() == 1, op, "norm must have one element, got " + norm.describe());
  require(max_norm > 0, op, "max_norm must be > 0");
  if (norm.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    require(norm.dtype() == DType::F32 || norm.dtype() == DType::F64, op,
            "norm must be fp32 or fp64, got " + norm.describe());
    const auto bufs = device_buffers(op, buffers);
    cuda::clip_by_norm_(bufs, norm.raw(), norm.dtype(), max_norm);
    return;
#else
    no_cuda(op);
#endif
  }
  const double c = clip_coefficient(norm.to_vector()[0], max_norm);
  if (c < 1.0) scale_(buffers, c);
}

}  // namespace nsatron
