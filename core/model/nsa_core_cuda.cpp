#include "core/model/nsa_core_cuda.h"

#include <array>
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

// The first column of each of the eight inputs in a.proj's part-major rows (nsa_core_cuda.h).
std::array<std::int64_t, 8> proj_columns(const nsa::NsaDims& d) {
  const std::array<std::int64_t, 8> widths = d.input_widths();
  std::array<std::int64_t, 8> at{};
  for (int k = 1; k < 8; ++k) at[k] = at[k - 1] + d.G * widths[k - 1];
  return at;
}

// The eight per-token tensors (or gradients) of the core: `parts` (split), else the columns
// of `rows` (with their pitches).
template <class T>
std::array<T*, 8> token_tensors(const nsa::NsaDims& d, const Tensor* const parts[8], const Tensor* rows,
                                nsa::cuda::TokenPitches& pitches) {
  std::array<T*, 8> p{};
  if (!rows) {
    for (int k = 0; k < 8; ++k) p[k] = parts[k] ? mut<T>(*parts[k]) : nullptr;
    pitches = {};
    return p;
  }
  const std::array<std::int64_t, 8> at = proj_columns(d);
  if (rows->ndim() != 2 || rows->dim(0) != d.B * d.T || rows->dim(1) < at[7] + d.G * d.input_widths()[7])
    throw std::invalid_argument("the NSA core's projection rows: " + rows->describe() + " for " + d.str());
  const std::int64_t pitch = rows->dim(1);
  for (int k = 0; k < 8; ++k) p[k] = mut<T>(*rows) + at[k];
  pitches = {pitch, pitch, pitch};
  return p;
}

template <class T>
nsa::NsaInputs<T> inputs(const nsa::NsaDims& d, const LayerActivations& a, const TensorByPart& W,
                         nsa::cuda::TokenPitches& pitches) {
  const Tensor* parts[8] = {&a.q, &a.k_cmp, &a.v_cmp, &a.k_slc, &a.v_slc, &a.k_win, &a.v_win, &a.gate};
  const std::array<T*, 8> x = token_tensors<T>(d, parts, a.proj.defined() ? &a.proj : nullptr, pitches);
  return {x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7], ptr<T>(W("attn/cmp_wk")), ptr<T>(W("attn/cmp_wv")),
          ptr<T>(W("attn/cmp_pk")), ptr<T>(W("attn/cmp_pv"))};
}

}  // namespace

std::shared_ptr<void> nsa_core_forward_cuda(const nsa::NsaDims& dims, const LayerActivations& a, const TensorByPart& W,
                                            Tensor& o, bool save) {
  std::shared_ptr<void> kept;
  dispatch_cuda(o.dtype(), [&](auto tag) {
    using T = decltype(tag);
    auto saved = save ? take_saved() : nullptr;
    nsa::cuda::TokenPitches pitches;
    const nsa::NsaInputs<T> in = inputs<T>(dims, a, W, pitches);
    nsa::cuda::nsa_forward<T>(dims, in, mut<T>(o), saved.get(), nullptr, pitches);
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
                            const TensorByPart& G, const Tensor& d_o, Tensor* const dparts[8], Tensor* dproj) {
  if (a.proj.defined() != (dproj != nullptr))
    throw std::invalid_argument("nsa_core_backward_cuda: the gradients go where the inputs were (split or in place)");
  dispatch_cuda(d_o.dtype(), [&](auto tag) {
    using T = decltype(tag);
    nsa::cuda::TokenPitches pitches, grad_pitches;
    const nsa::NsaInputs<T> in = inputs<T>(dims, a, W, pitches);
    const Tensor* gparts[8] = {};
    if (dparts)
      for (int k = 0; k < 8; ++k) gparts[k] = dparts[k];
    const std::array<T*, 8> d = token_tensors<T>(dims, gparts, dproj, grad_pitches);
    if (dproj && dproj->dim(1) != a.proj.dim(1))
      throw std::invalid_argument("nsa_core_backward_cuda: dproj " + dproj->describe() + " has other rows than a.proj " +
                                  a.proj.describe());
    nsa::cuda::NsaGradsCuda<T> g;
    g.q = d[0];
    g.k_cmp = d[1];
    g.v_cmp = d[2];
    g.k_slc = d[3];
    g.v_slc = d[4];
    g.k_win = d[5];
    g.v_win = d[6];
    g.gate = d[7];
    g.cmp_wk = G("attn/cmp_wk").data<float>();
    g.cmp_wv = G("attn/cmp_wv").data<float>();
    g.cmp_pk = G("attn/cmp_pk").data<float>();
    g.cmp_pv = G("attn/cmp_pv").data<float>();
    const auto& saved = *static_cast<const nsa::cuda::NsaSavedCuda*>(a.nsa_saved.get());
    nsa::cuda::nsa_backward<T>(dims, in, saved, ptr<T>(d_o), g, nullptr, pitches);
  });
}

#else

std::shared_ptr<void> nsa_core_forward_cuda(const nsa::NsaDims&, const LayerActivations&, const TensorByPart&, Tensor&,
                                            bool) {
  throw std::runtime_error("this build of nsatron has no CUDA");
}

void nsa_core_backward_cuda(const nsa::NsaDims&, const LayerActivations&, const TensorByPart&, const TensorByPart&,
                            const Tensor&, Tensor* const[8], Tensor*) {
  throw std::runtime_error("this build of nsatron has no CUDA");
}

#endif

}  // namespace nsatron
