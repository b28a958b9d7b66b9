// Benchmark-only hook (bench/nsa_gpu.cpp): the NSA window branch alone, with the same kernels
// and the same preparation as inside nsa_forward / nsa_backward. With dims.window = dims.T
// the window [t-w+1, t] covers every earlier key, so this is dense causal attention (RoPE on
// q and k, GQA with H/G query heads per key head) through the engine's flash-style kernels;
// the benchmark uses it as the dense baseline. Not used by the engine; nsa_forward and
// nsa_backward are unchanged.
//
//   q, d_out, o [B,T,H,D]; k, v [B,T,G,D]; gate [B,T,H,3] (the backward scales by
//   sigmoid(gate[..., 2]), as the NSA window branch does); lse fp32 [B,T,H] from
//   window_forward; dq, dk, dv [B,T,H,D] / [B,T,G,D] (assigned). Scratch comes from the NSA
//   workspace (same rules as nsa_cuda.h).
#pragma once
#include "nsa/cuda/nsa_cuda.h"

namespace nsatron::nsa::cuda::bench {

template <class T>
void window_forward(const NsaDims& dims, const T* q, const T* k, const T* v, T* o, float* lse,
                    cudaStream_t stream = nullptr);

template <class T>
void window_backward(const NsaDims& dims, const T* q, const T* k, const T* v, const T* gate,
                     const float* lse, const T* d_out, T* dq, T* dk, T* dv,
                     cudaStream_t stream = nullptr);

}  // namespace nsatron::nsa::cuda::bench
