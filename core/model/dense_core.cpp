#include "core/model/dense_core.h"

#include <stdexcept>
#include <string>
#include <type_traits>

#ifdef NSATRON_WITH_CUDA
#include "nsa/cuda/dense.h"
#endif

namespace nsatron {

namespace {

// Calls f(Real{}) with Real the element type of the compute dtype: float or double on the
// CPU, float or bf16 on CUDA.
template <class F> void dispatch(const Tensor& t, F&& f) {
  const bool cuda = t.device() == Device::CUDA;
  if (t.dtype() == DType::F32) return f(float{});
  if (!cuda && t.dtype() == DType::F64) return f(double{});
#ifdef NSATRON_WITH_CUDA
  if (cuda && t.dtype() == DType::BF16) return f(nsa::cuda::bf16{});
#endif
  throw std::invalid_argument("dense attention: no kernel for " + std::string(dtype_name(t.dtype())) +
                              (cuda ? " on CUDA" : " on the CPU"));
}

template <class T> const T* ptr(const Tensor& t) { return static_cast<const T*>(t.raw()); }
template <class T> T* mut(const Tensor& t) { return static_cast<T*>(t.raw()); }

#ifndef NSATRON_WITH_CUDA
[[noreturn]] void no_cuda() { throw std::runtime_error("this build of nsatron has no CUDA"); }
#endif

}  // namespace

void dense_core_forward(const nsa::DenseDims& dims, LayerActivations& a, Tensor& o, bool save) {
  const bool cuda = o.device() == Device::CUDA;
  Tensor lse = Tensor::empty({dims.B * dims.T, dims.H}, cuda ? DType::F32 : o.dtype(), o.device());
  dispatch(o, [&](auto tag) {
    using T = decltype(tag);
    if (!cuda) {
      if constexpr (std::is_floating_point_v<T>)
        nsa::dense_forward<T>(dims, ptr<T>(a.q), ptr<T>(a.k), ptr<T>(a.v), mut<T>(o), mut<T>(lse));
      return;
    }
#ifdef NSATRON_WITH_CUDA
    if constexpr (!std::is_same_v<T, double>)
      nsa::cuda::dense_forward<T>(dims, ptr<T>(a.q), ptr<T>(a.k), ptr<T>(a.v), mut<T>(o), mut<float>(lse));
#else
    no_cuda();
#endif
  });
  if (save) a.attn_lse = lse;
}

void dense_core_backward(const nsa::DenseDims& dims, const LayerActivations& a, const Tensor& d_o, Tensor& dq,
                         Tensor& dk, Tensor& dv) {
  if (!a.attn_lse.defined()) throw std::logic_error("dense attention backward without the forward's saved lse");
  const bool cuda = d_o.device() == Device::CUDA;
  dispatch(d_o, [&](auto tag) {
    using T = decltype(tag);
    if (!cuda) {
      if constexpr (std::is_floating_point_v<T>)
        nsa::dense_backward<T>(dims, ptr<T>(a.q), ptr<T>(a.k), ptr<T>(a.v), ptr<T>(a.o), ptr<T>(a.attn_lse),
                               ptr<T>(d_o), mut<T>(dq), mut<T>(dk), mut<T>(dv));
      return;
    }
#ifdef NSATRON_WITH_CUDA
    if constexpr (!std::is_same_v<T, double>)
      nsa::cuda::dense_backward<T>(dims, ptr<T>(a.q), ptr<T>(a.k), ptr<T>(a.v), ptr<T>(a.o), ptr<float>(a.attn_lse),
                                   ptr<T>(d_o), mut<T>(dq), mut<T>(dk), mut<T>(dv));
#else
    no_cuda();
#endif
  });
}

}  // namespace nsatron
