// The model's bridge to the dense attention core (nsa/dense.h on the CPU, nsa/cuda/dense.h on
// CUDA) for a layer with model.attention = "dense": runs it on the layer's split q, k, v.
#pragma once
#include "core/model/layer_activations.h"
#include "nsa/dense.h"

namespace nsatron {

// o = attention(a.q, a.k, a.v) ([N, H*D], the compute dtype). With `save`, a.attn_lse gets the
// per-row log-sum-exp the backward needs ([N, H]: fp32 on CUDA, the compute dtype on the CPU).
void dense_core_forward(const nsa::DenseDims& dims, LayerActivations& a, Tensor& o, bool save);
// Assigns dq, dk, dv from d_o, the saved a.attn_lse and the core's output a.o.
void dense_core_backward(const nsa::DenseDims& dims, const LayerActivations& a, const Tensor& d_o, Tensor& dq,
                         Tensor& dk, Tensor& dv);

}  // namespace nsatron
