// Internal to the model: what one layer keeps from its forward for its backward.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/tensor/tensor.h"

namespace nsatron {

// What one layer keeps from its forward for its backward. Which members are set depends on
// the recompute policy; complete_for_backward() recomputes the missing ones.
struct LayerActivations {
  Tensor x;                                   // layer input [N, C]
  Tensor rstd1, xn;                           // attention pre-norm
  Tensor q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, gate;  // NSA core inputs (split)
  Tensor proj;                                // or the projection p whose columns they are (CUDA:
                                              //   NsaTransformer::projection_in_place)
  std::shared_ptr<void> nsa_saved;            // the NSA core's saved state (CPU or CUDA type)
  Tensor k, v;                                // dense attention's keys and values [N, G*D] (q as above)
  Tensor attn_lse;                            // dense attention's saved log-sum-exp [N, H]
  Tensor o;                                   // attention core output [N, H*D]
  Tensor h;                                   // after the attention residual [N, C]
  Tensor rstd2, hn;                           // MLP pre-norm
  Tensor u;                                   // [N, 2F]
  Tensor act;                                 // swiglu(u) [N, F]

  // The attention core's saved state (NSA's or dense attention's) is held.
  bool core_saved() const { return nsa_saved != nullptr || attn_lse.defined(); }
  void drop_core_saved() {
    nsa_saved.reset();
    attn_lse = Tensor();
  }
};

// Token ids where the ops read them: the caller's host memory (or a copy) on the CPU, a device
// copy on CUDA (global ids; a vocab-parallel rank's ops take its vocabulary rows as options).
// The span points into the vector or device copy held here, so the struct moves but does not
// copy.
struct DeviceIds {
  std::span<const std::int32_t> span;  // the global ids
  std::vector<std::int32_t> host_copy;
  std::vector<std::shared_ptr<void>> device_copies;
  DeviceIds() = default;
  DeviceIds(DeviceIds&&) = default;
  DeviceIds& operator=(DeviceIds&&) = default;
  DeviceIds(const DeviceIds&) = delete;
  DeviceIds& operator=(const DeviceIds&) = delete;
};

// One micro-batch on one pipeline stage, from its forward to its backward.
struct StageState {
  std::int64_t micro_batch = 0;         // the caller's index (the pipeline checks its order)
  int chunk = 0;                        // the rank's model chunk it ran on
  std::int64_t B = 0, T = 0;
  double grad_scale = 1.0;
  DeviceIds ids;                        // first stage: the tokens (embedding backward)
  std::vector<LayerActivations> acts;   // this chunk's layers
  Tensor output;                        // not the last stage: the last layer's output [N, C]
  Tensor d_last;                        // last stage: the gradient of the last layer's output
  Tensor loss;                          // last stage: the micro-batch's mean loss, one element on
                                        // the model's device, not read yet (reading waits for it)
};

}  // namespace nsatron
