#include "core/ops/rmsnorm.h"

#include "core/ops/op_util.h"

namespace nsatron {

using namespace ops_detail;

namespace {
// x [.., C] with w [C] and rstd of N elements; returns C.
std::int64_t check_norm(const std::string& op, const Tensor& x, const Tensor& w,
                        const Tensor& rstd) {
  const std::int64_t C = last_dim(op, x, "x");
  require(w.ndim() == 1 && w.dim(0) == C, op, "w must be [" + std::to_string(C) + "] for x " +
                                                  x.describe() + ", got " + w.describe());
  require(rstd.numel() == rows_of(x), op,
          "rstd must hold one value per row (" + std::to_string(rows_of(x)) + "), got " +
              rstd.describe());
  return C;
}
}  // namespace

void rmsnorm_forward(const Tensor& x, const Tensor& w, Tensor& y, Tensor& rstd, double eps) {
  const std::string op = "rmsnorm_forward";
  if (x.device() == Device::CUDA) {
    same_dtype_device(op, {&x, &w, &y});
    all_on_cuda(op, {&rstd});
    cuda_compute_dtype(op, x);
    require_f32(op, rstd, "rstd");
  } else {
    same_dtype_device(op, {&x, &w, &y, &rstd});
  }
  const std::int64_t C = check_norm(op, x, w, rstd);
  same_shape(op, x, y, "y");
  require(eps >= 0, op, "eps must be >= 0");
  if (x.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    cuda::rmsnorm_forward(x.dtype(), y.raw(), rstd.data<float>(), x.raw(), w.raw(), rows_of(x), C,
                          eps);
    return;
#else
    no_cuda(op);
#endif
  }
  dispatch_cpu(op, x, [&](auto tag) {
    using T = decltype(tag);
    cpu::rmsnorm_forward<T>(y.data<T>(), rstd.data<T>(), x.data<T>(), w.data<T>(), rows_of(x), C,
                            eps);
  });
}

void add_rmsnorm_forward(const Tensor& a, const Tensor& b, const Tensor& w, Tensor& h, Tensor& y,
                         Tensor& rstd, double eps) {
  const std::string op = "add_rmsnorm_forward";
  if (a.device() == Device::CUDA) {
    same_dtype_device(op, {&a, &b, &w, &h, &y});
    all_on_cuda(op, {&rstd});
    cuda_compute_dtype(op, a);
    require_f32(op, rstd, "rstd");
  } else {
    same_dtype_device(op, {&a, &b, &w, &h, &y, &rstd});
  }
  const std::int64_t C = check_norm(op, a, w, rstd);
  same_shape(op, a, b, "b");
  same_shape(op, a, h, "h");
  same_shape(op, a, y, "y");
  require(eps >= 0, op, "eps must be >= 0");
  if (a.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    cuda::add_rmsnorm_forward(a.dtype(), h.raw(), y.raw(), rstd.data<float>(), a.raw(), b.raw(),
                              w.raw(), rows_of(a), C, eps);
    return;
#else
    no_cuda(op);
#endif
  }
  dispatch_cpu(op, a, [&](auto tag) {
    using T = decltype(tag);
    cpu::add_rmsnorm_forward<T>(h.data<T>(), y.data<T>(), rstd.data<T>(), a.data<T>(),
                                b.data<T>(), w.data<T>(), rows_of(a), C, eps);
  });
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      Tensor& dx, Tensor& dw, const Tensor* dres) {
  const std::string op = "rmsnorm_backward";
  if (x.device() == Device::CUDA) {
    same_dtype_device(op, {&dy, &x, &w, &dx});
    all_on_cuda(op, {&rstd, &dw});
    cuda_compute_dtype(op, x);
    require_f32(op, rstd, "rstd");
    grad_dtype(op, x, dw, "dw");
  } else {
    same_dtype_device(op, {&dy, &x, &w, &rstd, &dx, &dw});
  }
  const std::int64_t C = check_norm(op, x, w, rstd);
  same_shape(op, x, dy, "dy");
  same_shape(op, x, dx, "dx");
  same_shape(op, w, dw, "dw");
  if (dres) {
    same_dtype_device(op, {&x, dres});
    same_shape(op, x, *dres, "dres");
  }
  if (x.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    cuda::rmsnorm_backward(x.dtype(), dw.dtype(), dx.raw(), dw.raw(), dy.raw(), x.raw(), w.raw(),
                           rstd.data<float>(), dres ? dres->raw() : nullptr, rows_of(x), C);
    return;
#else
    no_cuda(op);
#endif
  }
  dispatch_cpu(op, x, [&](auto tag) {
    using T = decltype(tag);
    cpu::rmsnorm_backward<T>(dx.data<T>(), dw.data<T>(), dy.data<T>(), x.data<T>(), w.data<T>(),
                             rstd.data<T>(), dres ? dres->data<T>() : nullptr, rows_of(x), C);
  });
}

}  // namespace nsatron
