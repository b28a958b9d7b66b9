// The model's bridge to the NSA core on CUDA (nsa/cuda): runs it on the inputs of a layer,
// keeping the core's saved state type-erased in LayerActivations::nsa_saved. The inputs are the
// split tensors a.q ... a.gate or, with a.proj defined, column ranges of a.proj's rows, part
// by part: [q (H*D) | k_cmp (G*D) | v_cmp | k_slc | v_slc | k_win | v_win | gate (3H) | pad]
// (the core's row pitches, nsa/cuda/nsa_cuda.h).
#pragma once
#include <functional>
#include <memory>

#include "core/model/layer_activations.h"
#include "nsa/nsa.h"

namespace nsatron {

using TensorByPart = std::function<Tensor(const char* part)>;

// Writes the core's output into o ([N, H*D], the compute dtype); returns the saved state when
// `save`, else null. W gives the layer's compression parameters (compute dtype).
std::shared_ptr<void> nsa_core_forward_cuda(const nsa::NsaDims& dims, const LayerActivations& a, const TensorByPart& W,
                                            Tensor& o, bool save);
// Assigns the gradients of the eight inputs (dparts, in the order q, k_cmp, v_cmp, k_slc, v_slc,
// k_win, v_win, gate; with a.proj, into the same columns of dproj's rows, nothing else in them
// written) and accumulates the compression parameters' gradients (G: fp32 gradient views).
void nsa_core_backward_cuda(const nsa::NsaDims& dims, const LayerActivations& a, const TensorByPart& W,
                            const TensorByPart& G, const Tensor& d_o, Tensor* const dparts[8], Tensor* dproj);

}  // namespace nsatron
