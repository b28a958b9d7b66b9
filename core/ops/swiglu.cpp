#include "core/ops/swiglu.h"

#include "core/ops/op_util.h"

namespace nsatron {

using namespace ops_detail;

namespace {
// u [.., 2F] and out [.., F] with the same leading dimensions; returns F.
std::int64_t check_fused(const std::string& op, const Tensor& u, const Tensor& out) {
  const std::int64_t two_f = last_dim(op, u, "u");
  require(two_f % 2 == 0, op, "the fused input's last dimension must be even (2F), got " +
                                  u.describe());
  const std::int64_t F = two_f / 2;
  Shape want = u.shape();
  want.back() = F;
  require(out.shape() == want, op,
          "expected [.., F] = " + shape_str(want) + " for " + u.describe() + ", got " +
              out.describe());
  return F;
}
}  // namespace

void swiglu_forward(const Tensor& u, Tensor& out) {
  const std::string op = "swiglu_forward(fused)";
  same_dtype_device(op, {&u, &out});
  const std::int64_t F = check_fused(op, u, out);
  if (u.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    cuda_compute_dtype(op, u);
    const char* p = static_cast<const char*>(u.raw());
    cuda::swiglu_forward(u.dtype(), out.raw(), p, p + F * dtype_size(u.dtype()), rows_of(u), F,
                         2 * F, F);
    return;
#else
    no_cuda(op);
#endif
  }
  dispatch_cpu(op, u, [&](auto tag) {
    using T = decltype(tag);
    const T* p = u.data<T>();
    cpu::swiglu_forward<T>(out.data<T>(), p, p + F, rows_of(u), F, 2 * F, F);
  });
}

void swiglu_backward(const Tensor& dout, const Tensor& u, Tensor& du) {
  const std::string op = "swiglu_backward(fused)";
  same_dtype_device(op, {&dout, &u, &du});
  const std::int64_t F = check_fused(op, u, dout);
  same_shape(op, u, du, "du");
  if (u.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    cuda_compute_dtype(op, u);
    const std::size_t half = std::size_t(F) * dtype_size(u.dtype());
    const char* p = static_cast<const char*>(u.raw());
    char* d = static_cast<char*>(du.raw());
    cuda::swiglu_backward(u.dtype(), d, d + half, dout.raw(), p, p + half, rows_of(u), F, 2 * F,
                          F);
    return;
#else
    no_cuda(op);
#endif
  }
  dispatch_cpu(op, u, [&](auto tag) {
    using T = decltype(tag);
    const T* p = u.data<T>();
    T* d = du.data<T>();
    cpu::swiglu_backward<T>(d, d + F, dout.data<T>(), p, p + F, rows_of(u), F, 2 * F, F);
  });
}

void swiglu_forward(const Tensor& a, const Tensor& b, Tensor& out) {
  const std::string op = "swiglu_forward(split)";
  same_dtype_device(op, {&a, &b, &out});
  const std::int64_t F = last_dim(op, a, "a");
  same_shape(op, a, b, "b");
  same_shape(op, a, out, "out");
  if (a.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    cuda_compute_dtype(op, a);
    cuda::swiglu_forward(a.dtype(), out.raw(), a.raw(), b.raw(), rows_of(a), F, F, F);
    return;
#else
    no_cuda(op);
#endif
  }
  dispatch_cpu(op, a, [&](auto tag) {
    using T = decltype(tag);
    cpu::swiglu_forward<T>(out.data<T>(), a.data<T>(), b.data<T>(), rows_of(a), F, F, F);
  });
}

void swiglu_backward(const Tensor& dout, const Tensor& a, const Tensor& b, Tensor& da,
                     Tensor& db) {
  const std::string op = "swiglu_backward(split)";
  same_dtype_device(op, {&dout, &a, &b, &da, &db});
  const std::int64_t F = last_dim(op, a, "a");
  same_shape(op, a, b, "b");
  same_shape(op, a, dout, "dout");
  same_shape(op, a, da, "da");
  same_shape(op, a, db, "db");
  if (a.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    cuda_compute_dtype(op, a);
    cuda::swiglu_backward(a.dtype(), da.raw(), db.raw(), dout.raw(), a.raw(), b.raw(), rows_of(a),
                          F, F, F);
    return;
#else
    no_cuda(op);
#endif
  }
  dispatch_cpu(op, a, [&](auto tag) {
    using T = decltype(tag);
    cpu::swiglu_backward<T>(da.data<T>(), db.data<T>(), dout.data<T>(), a.data<T>(), b.data<T>(),
                            rows_of(a), F, F, F);
  });
}

}  // namespace nsatron
