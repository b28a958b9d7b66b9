#include "core/ops/elementwise.h"

#include "core/ops/op_util.h"

namespace nsatron {

using namespace ops_detail;

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  const std::string op = "add";
  same_dtype_device(op, {&a, &b, &out});
  require(a.shape() == b.shape() && a.shape() == out.shape(), op,
          "shapes differ: " + a.describe() + " + " + b.describe() + " -> " + out.describe());
  if (a.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    cuda_compute_dtype(op, a);
    cuda::add(a.dtype(), out.raw(), a.raw(), b.raw(), a.numel());
    return;
#else
    no_cuda(op);
#endif
  }
  dispatch_cpu(op, a, [&](auto tag) {
    using T = decltype(tag);
    cpu::add<T>(out.data<T>(), a.data<T>(), b.data<T>(), a.numel());
  });
}

void add_(Tensor& acc, const Tensor& x) {
  const std::string op = "add_";
  same_dtype_device(op, {&acc, &x});
  require(acc.shape() == x.shape(), op, "shapes differ: " + acc.describe() + " += " + x.describe());
  if (acc.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    cuda_compute_dtype(op, acc);
    cuda::add_(acc.dtype(), acc.raw(), x.raw(), acc.numel());
    return;
#else
    no_cuda(op);
#endif
  }
  dispatch_cpu(op, acc, [&](auto tag) {
    using T = decltype(tag);
    cpu::add_<T>(acc.data<T>(), x.data<T>(), acc.numel());
  });
}

}  // namespace nsatron
