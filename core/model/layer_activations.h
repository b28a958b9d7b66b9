// Internal to the model: what one layer keeps from its forward for its backward.
#pragma once
#include <memory>

#include "core/tensor/tensor.h"

namespace nsatron {

// What one layer keeps from its forward for its backward. Which members are set depends on
// the recompute policy; complete_for_backward() recomputes the missing ones.
struct LayerActivations {
  Tensor x;                                   // layer input [N, C]
  Tensor rstd1, xn;                           // attention pre-norm
  Tensor q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, gate;  // NSA core inputs
  std::shared_ptr<void> nsa_saved;            // the NSA core's saved state (CPU or CUDA type)
  Tensor o;                                   // NSA core output [N, H*D]
  Tensor h;                                   // after the attention residual [N, C]
  Tensor rstd2, hn;                           // MLP pre-norm
  Tensor u;                                   // [N, 2F]
  Tensor act;                                 // swiglu(u) [N, F]
};

}  // namespace nsatron
