#include "core/model/nsa_core_cuda.h"

#include <stdexcept>
#include <vector>

#ifdef NSATRON_WITH_CUDA
#include "core/device/device.h"
#include "nsa/cuda/nsa_cuda.h"
#endif

namespace nsatron {

#ifdef NSATRON_WITH_CUDA

namespace {

std::vector<std::unique_ptr<nsa::cuda::NsaSavedCuda>>& saved_pool(int dev) {
  thread_local std::vector<std::vector<std::unique_ptr<nsa::cuda::NsaSavedCuda>>> per_device;
  if (per_device.size() <= std::size_t(dev)) per_device.resize(std::size_t(dev) + 1);
  return per_device[std::size_t(dev)];
}

// Calls f(float{}) or f(__nv_bfloat16{}) for the compute dtype of the CUDA model.
template <class F> void dispatch_cuda(DType t, F&& f) {
  if (t == DType::F32) return f(float{});
  if (t == DType::BF16) return f(nsa::cuda::bf16{});
  throw std::invalid_argument("the NSA core on CUDA computes in fp32 or bf16");
}

// Released saved states, kept for the next forward (per host thread and device): an
// NsaSavedCuda owns a cudaMalloc'ed block, and cudaFree waits for the whole device, so a fresh
// one per layer and micro-batch put a host synchronisation in every layer's backward. Reused
// in stream order (everything runs on the default stream), as the Tensor allocator's blocks
// are; their memory, like that allocator's cache, is not counted while pooled.
std::unique_ptr<nsa::cuda::NsaSavedCuda> take_saved() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) throw std::runtime_error("cudaGetDevice failed");
  auto& pool = saved_pool(dev);
  if (pool.empty()) return std::make_unique<nsa::cuda::NsaSavedCuda>();
  auto s = std::move(pool.back());
  pool.pop_back();
  return s;
}

template <class T> const T* ptr(const Tensor& t) { return static_cast<const T*>(t.raw()); }
template <class T> T* mut(const Tensor& t) { return static_cast<T*>(t.raw()); }

template <class T>
nsa::NsaInputs<T> inputs(const LayerActivations& a, const TensorByPart& W) {
  return {ptr<T>(a.q),     ptr<T>(a.k_cmp), ptr<T>(a.v_cmp),        ptr<T>(a.k_slc),        ptr<T>(a.v_slc),
          ptr<T>(a.k_win), ptr<T>(a.v_win), ptr<T>(a.gate),         ptr<T>(W("attn/cmp_wk")), ptr<T>(W("attn/cmp_wv")),
          ptr<T>(W("attn/cmp_pk")), ptr<T>(W("attn/cmp_pv"))};
}

}  // namespace

std::shared_ptr<void> nsa_core_forward_cuda(const nsa::NsaDims& dims, const LayerActivations& a, const TensorByPart& W,
                                            Tensor& o, bool save) {
  std::shared_ptr<void> kept;
  dispatch_cuda(o.dtype(), [&](auto tag) {
    using T = decltype(tag);
    auto saved = save ? take_saved() : nullptr;
    nsa::cuda::nsa_forward<T>(dims, inputs<T>(a, W), mut<T>(o), saved.get());
    if (!saved) return;
    // The saved state is device memory outside the Tensor allocator: count it while held.
    const std::size_t bytes = saved->bytes();
    note_alloc(Device::CUDA, bytes);
    kept = std::shared_ptr<void>(saved.release(), [bytes](void* p) {
      auto* s = static_cast<nsa::cuda::NsaSavedCuda*>(p);
      note_free(Device::CUDA, bytes);
      int dev = 0;
      if (cudaGetDevice(&dev) != cudaSuccess) {  // the runtime is going away: no reuse
        delete s;
        return;
      }
      saved_pool(dev).emplace_back(s);
    });
  });
  return kept;
}

void nsa_core_backward_cuda(const nsa::NsaDims& dims, const LayerActivations& a, const TensorByPart& W,
                            const TensorByPart& G, const Tensor& d_o, Tensor* const dparts[8]) {
  dispatch_cuda(d_o.dtype(), [&](auto tag) {
    using T = decltype(tag);
    nsa::cuda::NsaGradsCuda<T> g;
    g.q = mut<T>(*dparts[0]);
    g.k_cmp = mut<T>(*dparts[1]);
    g.v_cmp = mut<T>(*dparts[2]);
    g.k_slc = mut<T>(*dparts[3]);
    g.v_slc = mut<T>(*dparts[4]);
    g.k_win = mut<T>(*dparts[5]);
    g.v_win = mut<T>(*dparts[6]);
    g.gate = mut<T>(*dparts[7]);
    g.cmp_wk = G("attn/cmp_wk").data<float>();
    g.cmp_wv = G("attn/cmp_wv").data<float>();
    g.cmp_pk = G("attn/cmp_pk").data<float>();
    g.cmp_pv = G("attn/cmp_pv").data<float>();
    const auto& saved = *static_cast<const nsa::cuda::NsaSavedCuda*>(a.nsa_saved.get());
    nsa::cuda::nsa_backward<T>(dims, inputs<T>(a, W), saved, ptr<T>(d_o), g);
  });
}

#else

std::shared_ptr<void> nsa_core_forward_cuda(const nsa::NsaDims&, const LayerActivations&, const TensorByPart&, Tensor&,
                                            bool) {
  throw std::runtime_error("this build of nsatron has no CUDA");
}

void nsa_core_backward_cuda(const nsa::NsaDims&, const LayerActivations&, const TensorByPart&, const TensorByPart&,
                            const Tensor&, Tensor* const[8]) {
  throw std::runtime_error("this build of nsatron has no CUDA");
}

#endif

}  // namespace nsatron
