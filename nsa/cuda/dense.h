// Dense causal attention on CUDA: the same function as the CPU reference (nsa/dense.h) on
// device pointers, through the NSA window branch's flash-style kernels with the window
// covering the whole sequence (w = T) and no gate (the branch's gate is 1). Built only with
// CUDA (NSATRON_WITH_CUDA).
//
//   q, out, d_out, dq [B,T,H,D]; k, v, dk, dv [B,T,G,D] (T: float or bf16, as nsa_cuda.h);
//   lse fp32 [B,T,H], written by the forward and read by the backward.
// The forward: padded K/V copies (bf16: rotated keys for the tensor cores) and the row kernel,
// tiles of keys in the query's causal range only. The backward: the row side (P from lse,
// dq) and the key side (dk, dv; dk rotated back), with delta = do . o per row: in bf16 from
// the forward's output `out` (as flash attention computes it; the row side then makes one pass
// over the keys), in fp32 recomputed in the row side's single pass as sum_j p_j (do . v_j)
// (out unread). Every gradient is ASSIGNED; dq, dk and dv are all required.
// Limits, streams, the workspace and determinism as in nsa_cuda.h (D <= 128; bit-identical
// from run to run on the same GPU model).
#pragma once
#include <cuda_runtime.h>

#include "nsa/cuda/nsa_cuda.h"
#include "nsa/dense.h"

namespace nsatron::nsa::cuda {

template <class T>
void dense_forward(const DenseDims& dims, const T* q, const T* k, const T* v, T* out, float* lse,
                   cudaStream_t stream = nullptr);

template <class T>
void dense_backward(const DenseDims& dims, const T* q, const T* k, const T* v, const T* out,
                    const float* lse, const T* d_out, T* dq, T* dk, T* dv,
                    cudaStream_t stream = nullptr);

}  // namespace nsatron::nsa::cuda
