#include "core/ops/grad_norm.h"

#include <algorithm>
#include <cmath>

#include "core/ops/op_util.h"

namespace nsatron {

using namespace ops_detail;

namespace {
double host_sum_squares(const std::string& op, std::span<const Tensor> buffers) {
  double total = 0.0;
  for (const Tensor& b : buffers) {
    if (b.device() == Device::CUDA) no_cuda(op);
    dispatch_cpu(op, b, [&](auto tag) {
      using T = decltype(tag);
      total += cpu::sum_squares<T>(b.data<T>(), b.numel());
    });
  }
  return total;
}
void write_scalar(const std::string& op, Tensor& out, double value) {
  require(out.numel() == 1, op, "the result must have one element, got " + out.describe());
  if (out.device() == Device::CUDA) no_cuda(op);
  dispatch_cpu(op, out, [&](auto tag) {
    using T = decltype(tag);
    *out.data<T>() = T(value);
  });
}
}  // namespace

void sum_squares(std::span<const Tensor> buffers, Tensor& out) {
  const std::string op = "sum_squares";
  write_scalar(op, out, host_sum_squares(op, buffers));
}

void global_norm(std::span<const Tensor> buffers, Tensor& out) {
  const std::string op = "global_norm";
  write_scalar(op, out, std::sqrt(host_sum_squares(op, buffers)));
}

void scale_(std::span<const Tensor> buffers, double factor) {
  const std::string op = "scale_";
  for (const Tensor& b : buffers) {
    if (b.device() == Device::CUDA) no_cuda(op);
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
  if (norm.device() == Device::CUDA) no_cuda(op);
  const double c = clip_coefficient(norm.to_vector()[0], max_norm);
  if (c < 1.0) scale_(buffers, c);
}

}  // namespace nsatron
